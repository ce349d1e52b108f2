"""The outbox and the inbox on SQLite: recorded before sent, sent exactly once and in order per
chat, behind the caller; retried by the platform's rules; resumed after a restart. Messages
recorded before they are handled: redeliveries caught, nothing lost, the table bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import pluto.gateway.delivery.flood as flood_module
import pluto.gateway.delivery.outbox as outbox_module
from pluto.errors import DeliveryRefused, ProviderError, RateLimited, StorageError
from pluto.gateway.delivery.outbox import Outbox, RetryPolicy
from pluto.gateway.cluster import Cluster
from pluto.gateway.pipeline.intake import IntakeQueue, Shared
from pluto.gateway.ports import Provider
from pluto.storage.sqlite import SqliteStore
from pluto.storage.sql.inbound import SqliteInbound
from pluto.types import (Accepted, Attachment, Dropped, Duplicate, IncomingMessage,
                         OutgoingMessage, Outcome)
from tests.helpers.gateway import RecordingProvider
from tests.helpers.inspect_store import age_inbound, age_outbox


@pytest.fixture
async def store(data_dir: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(data_dir / "pluto.db") as s:
        yield s


@pytest.fixture
def providers() -> dict[str, Provider]:
    return {}


@pytest.fixture
async def outbox(store: SqliteStore, providers: dict[str, Provider]) -> Outbox:
    box = Outbox(store.outbox, providers, retry=RetryPolicy(attempts=3, base_delay=0.5),
                 sweep_seconds=0)
    await box.open()
    return box


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The outbox's waits, recorded instead of slept."""
    waited: list[float] = []
    clock = [time.time()]  # flood control's clock: a recorded wait lets that time pass

    async def fake_sleep(seconds: float) -> None:
        waited.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(outbox_module.asyncio, "sleep", fake_sleep)
    monkeypatch.setattr(flood_module, "_now", lambda: clock[0])
    return waited


def running(providers: dict[str, Provider], provider: RecordingProvider) -> RecordingProvider:
    providers[provider.name] = provider
    return provider


def chunks(*texts: str, chat: str = "c1") -> list[OutgoingMessage]:
    return [OutgoingMessage(chat_id=chat, text=t, markup="markdown") for t in texts]


async def statuses(store: SqliteStore, *replies: str) -> list[tuple[int, str, str | None]]:
    """(chunk, status, platform_id) of each reply's chunks, reply by reply."""
    return [(r.chunk, r.status, r.platform_id) for reply in replies
            for r in await store.outbox.reply(reply)]


async def sent(outbox: Outbox, provider: Provider, reply_id: str,
               messages: list[OutgoingMessage]) -> bool:
    """Deliver and wait until the reply is out (or given up)."""
    return await (await outbox.deliver(provider, reply_id, messages))


async def test_chunks_are_recorded_then_sent_and_marked(outbox, store, providers):
    provider = running(providers, RecordingProvider())
    assert await sent(outbox, provider, "run1", chunks("one", "two"))
    assert [m.text for m in provider.sent] == ["one", "two"]
    assert await statuses(store, "run1") == [(0, "sent", "1"), (1, "sent", "2")]
    # the same reply again (a retried delivery): nothing is sent twice
    assert await sent(outbox, provider, "run1", chunks("one", "two"))
    assert len(provider.sent) == 2


async def test_deliver_returns_once_recorded_and_sends_behind_the_caller(outbox, store,
                                                                         providers):
    release = asyncio.Event()

    class Slow(RecordingProvider):
        async def send(self, message: OutgoingMessage) -> str | None:
            await release.wait()
            return await super().send(message)

    provider = running(providers, Slow())
    done = await outbox.deliver(provider, "run1", chunks("hello"))
    assert not done.done() and await statuses(store, "run1") == [(0, "pending", None)]
    release.set()
    assert await done and await statuses(store, "run1") == [(0, "sent", "1")]


async def test_a_flood_controlled_chat_never_holds_up_another(outbox, store, providers):
    release = asyncio.Event()

    class FloodedInA(RecordingProvider):
        async def send(self, message: OutgoingMessage) -> str | None:
            if message.chat_id == "A":
                await release.wait()  # the platform makes chat A wait
            return await super().send(message)

    provider = running(providers, FloodedInA())
    in_a = await outbox.deliver(provider, "ra", chunks("to A", chat="A"))
    assert await asyncio.wait_for(sent(outbox, provider, "rb", chunks("to B", chat="B")), 2)
    assert [m.chat_id for m in provider.sent] == ["B"]
    release.set()
    assert await in_a


async def test_replies_to_one_chat_keep_their_order(outbox, store, providers, sleeps):
    provider = running(providers, RecordingProvider())
    provider.fail_next(RateLimited("slow down", retry_after=3))
    first = await outbox.deliver(provider, "r1", chunks("first"))
    second = await outbox.deliver(provider, "r2", chunks("second"))
    assert await first and await second
    assert [m.text for m in provider.sent] == ["first", "second"] and sleeps == [3]


async def test_everything_needed_to_send_after_a_restart_is_kept(outbox, store, tmp_path,
                                                                    sleeps, providers):
    chart = tmp_path / "chart.png"
    message = OutgoingMessage(chat_id="-100", thread_id="9", reply_to="-100:5", kind="error",
                              run_id="run1", seq=4, answers="-100:5",
                              markup="telegram_html", text="<b>x</b>", attachments=(
                                  Attachment(filename="chart.png", path=chart, kind="image",
                                             size=3, mime_type="image/png"),))
    provider = running(providers, RecordingProvider())
    provider.fail_next(ProviderError("down"), times=3)
    assert not await sent(outbox, provider, "run1", [message])
    later = Outbox(store.outbox, providers, sweep_seconds=0)  # a new process
    await later.open()
    assert await later.flush(provider) == 1
    await later.idle()
    assert provider.sent == [message]


async def test_retry_after_is_honoured_and_other_errors_back_off(outbox, store, sleeps,
                                                                  providers):
    provider = running(providers, RecordingProvider())
    provider.fail_next(RateLimited("slow down", retry_after=7))
    provider.fail_next(ProviderError("flaky network"))
    assert await sent(outbox, provider, "run1", chunks("hello"))
    assert sleeps == [7, 1.0]  # the platform's wait, then backoff (0.5 * 2 ** 1)
    assert [m.text for m in provider.sent] == ["hello"]
    # three calls counted, the one the platform refused (429) taken back
    assert [(r.attempts, r.error) for r in await store.outbox.reply("run1")] == [(2, None)]


async def test_a_rate_limit_holds_the_chats_edits_too(outbox, store, providers, sleeps):
    provider = running(providers, RecordingProvider())
    provider.fail_next(RateLimited("slow down", retry_after=9))
    held: list[tuple] = []
    real_hold = outbox.flood.hold

    async def hold(key: tuple[str, str], seconds: float) -> None:
        held.append((key, seconds))
        await real_hold(key, seconds)

    outbox.flood.hold = hold  # type: ignore[method-assign]
    assert await sent(outbox, provider, "run1", chunks("hello"))
    assert held == [(("test", "c1"), 9)] and sleeps == [pytest.approx(9)]  # previews share it


async def test_a_long_retry_after_is_capped(store, sleeps, providers):
    box = Outbox(store.outbox, providers, retry=RetryPolicy(max_delay=30), sweep_seconds=0)
    await box.open()
    provider = running(providers, RecordingProvider())
    provider.fail_next(RateLimited("flood", retry_after=86400))
    assert await sent(box, provider, "run1", chunks("x"))
    assert sleeps == [30]


async def test_a_permanent_error_stops_the_reply_and_is_recorded(outbox, store, sleeps,
                                                                  providers):
    provider = running(providers, RecordingProvider())
    assert await sent(outbox, provider, "run0", chunks("earlier"))
    provider.fail_next(DeliveryRefused("bot was blocked by the user"))
    assert not await sent(outbox, provider, "run1", chunks("a", "b", "c"))
    assert sleeps == []
    rows = await store.outbox.reply("run1")
    assert [(r.status, r.error) for r in rows] == [("failed", "bot was blocked by the user")] * 3
    assert await outbox.flush(provider) == 0  # failed chunks are not retried later
    assert [m.text for m in provider.sent] == ["earlier"]


async def test_out_of_retries_the_reply_rests_until_the_next_sweep(outbox, store, sleeps,
                                                                   providers):
    provider = running(providers, RecordingProvider())
    assert await sent(outbox, provider, "run1", chunks("first"))
    provider.fail_next(ProviderError("platform down"), times=3)
    assert not await sent(outbox, provider, "run2", chunks("a", "b"))
    assert await statuses(store, "run1", "run2") == [(0, "sent", "1"), (0, "pending", None),
                                                     (1, "pending", None)]
    assert await outbox.flush(provider) == 2
    await outbox.idle()
    assert [m.text for m in provider.sent] == ["first", "a", "b"]
    assert await outbox.flush(provider) == 0  # sent ones never again


async def test_the_sweep_sends_what_rested(store, providers):
    box = Outbox(store.outbox, providers, retry=RetryPolicy(attempts=1), sweep_seconds=0.01)
    await box.open()
    provider = running(providers, RecordingProvider())
    provider.fail_next(ProviderError("platform down"))
    assert not await sent(box, provider, "run1", chunks("a"))  # out of retries: it rests
    box.start()
    try:
        async with asyncio.timeout(5):
            while not provider.sent:
                await asyncio.sleep(0.01)
        assert [m.text for m in provider.sent] == ["a"]
    finally:
        await box.close()


async def test_a_crash_between_send_and_mark_resends_and_says_so(outbox, store, caplog,
                                                                  providers):
    provider = running(providers, RecordingProvider())
    await outbox.rows.record([outbox_module._to_row("test", "run1", 0, chunks("x")[0])])
    [row] = await outbox.rows.reply("run1")
    assert row.id is not None
    await outbox.rows.attempted(row.id)  # the process died right after this platform call
    assert await outbox.flush(provider) == 1
    await outbox.idle()
    assert "may have been delivered before a crash" in caplog.text
    assert [m.text for m in provider.sent] == ["x"]


@pytest.mark.parametrize("error", [
    ProviderError("could not reach the platform (ClientConnectorError)", unsent=True),
    RateLimited("the platform asked to slow down for 1s", retry_after=1),
])
async def test_calls_the_platform_refused_are_not_taken_for_maybe_delivered(
        store, providers, sleeps, caplog, error):
    """A call the platform certainly did not take (it said no, or no connection was made):
    the attempt counted before it is taken back, so neither this instance's next try nor a
    new process after a restart warns of a duplicate that cannot be."""
    box = Outbox(store.outbox, providers, retry=RetryPolicy(attempts=1), sweep_seconds=0)
    await box.open()
    provider = running(providers, RecordingProvider())
    provider.fail_next(error, times=outbox_module.MAX_HOLDS if isinstance(error, RateLimited)
                       else 1)  # (a rate limit has more tries)
    assert not await sent(box, provider, "run1", chunks("a", "b"))  # out of tries: it rests
    assert [r.attempts for r in await store.outbox.reply("run1")] == [0, 0]
    restarted = Outbox(store.outbox, providers, retry=RetryPolicy(attempts=1), sweep_seconds=0)
    await restarted.open()
    assert await restarted.flush(provider) == 2  # (its two chunks)
    await restarted.idle()
    assert [m.text for m in provider.sent] == ["a", "b"]
    assert "may have been delivered" not in caplog.text


async def test_a_crash_mid_reply_says_maybe_delivered_of_the_chunk_in_flight_only(
        outbox, store, providers, caplog):
    """The process died while the first of three chunks was being sent: that chunk may have
    been delivered, the two after it were never called — only the first is said."""
    provider = running(providers, RecordingProvider())
    rows, claimed = await store.outbox.record_claimed(
        [outbox_module._to_row("test", "run1", i, m) for i, m in
         enumerate(chunks("a", "b", "c"))], "gone-process", 60)  # counted, then the crash
    assert claimed and [r.attempts for r in rows] == [1, 0, 0]
    assert [r.attempts for r in await store.outbox.reply("run1")] == [1, 0, 0]
    await store.outbox.release("run1", "gone-process")
    assert await outbox.flush(provider) == 3
    await outbox.idle()
    assert [m.text for m in provider.sent] == ["a", "b", "c"]
    assert "chunk 0 of reply run1 may have been delivered" in caplog.text
    assert "chunk 1 of reply" not in caplog.text and "chunk 2 of reply" not in caplog.text


async def test_a_call_that_may_have_been_made_is_still_said(store, providers, sleeps, caplog):
    """A timeout after the request was written: the platform may have taken it — the next
    try says so."""
    box = Outbox(store.outbox, providers, retry=RetryPolicy(attempts=1), sweep_seconds=0)
    await box.open()
    provider = running(providers, RecordingProvider())
    provider.fail_next(ProviderError("the platform did not answer in time"))
    assert not await sent(box, provider, "run1", chunks("a"))
    assert [r.attempts for r in await store.outbox.reply("run1")] == [1]
    assert await box.flush(provider) == 1
    await box.idle()
    assert "chunk 0 of reply run1 may have been delivered before a crash" in caplog.text
    assert [m.text for m in provider.sent] == ["a"]


async def test_a_reply_being_delivered_is_not_flushed_twice(outbox, store, providers):
    started, release = asyncio.Event(), asyncio.Event()

    class Slow(RecordingProvider):
        async def send(self, message: OutgoingMessage) -> str | None:
            started.set()
            await release.wait()
            return await super().send(message)

    provider = running(providers, Slow())
    done = await outbox.deliver(provider, "run1", chunks("a", "b"))
    await started.wait()  # recorded, the first send in flight
    assert await outbox.flush(provider) == 0  # the live sender owns this reply
    release.set()
    assert await done
    assert [m.text for m in provider.sent] == ["a", "b"]


async def test_a_reply_claimed_by_another_sender_is_left_to_it(outbox, store, providers):
    provider = running(providers, RecordingProvider())
    await outbox.rows.record([outbox_module._to_row("test", "run1", 0, chunks("x")[0])])
    assert await store.outbox.claim("run1", "another-instance", 60)
    assert await outbox.flush(provider) == 1
    await outbox.idle()
    assert provider.sent == []  # its owner sends it
    await store.outbox.release("run1", "another-instance")
    assert await outbox.flush(provider) == 1
    await outbox.idle()
    assert [m.text for m in provider.sent] == ["x"]


async def test_edit_of_a_message_that_is_gone_sends_it_anew(outbox, store, providers):
    provider = running(providers, RecordingProvider())
    provider.fail_next(DeliveryRefused("message to edit not found"))
    msg = OutgoingMessage(chat_id="c1", text="final", edit_of="41")
    assert await sent(outbox, provider, "run1", [msg])
    assert provider.sent[0].edit_of is None and provider.sent[0].text == "final"
    ok = OutgoingMessage(chat_id="c1", text="final", edit_of="1")
    assert await sent(outbox, provider, "run2", [ok])
    assert [m.text for m in provider.edits] == ["final"]


async def test_a_provider_bug_is_a_permanent_failure(outbox, store, providers):
    class Broken(RecordingProvider):
        async def send(self, message: OutgoingMessage) -> str | None:
            raise KeyError("oops")

    assert not await sent(outbox, running(providers, Broken()), "run1", chunks("x"))
    assert await statuses(store, "run1") == [(0, "failed", None)]
    [row] = await store.outbox.reply("run1")
    assert row.error == "the provider failed: KeyError"


async def test_a_provider_that_is_not_running_gets_its_replies_when_it_starts(outbox, store,
                                                                              providers):
    provider = RecordingProvider()  # recorded while it is down
    assert not await sent(outbox, provider, "run1", chunks("later"))
    running(providers, provider)
    assert await outbox.flush(provider) == 1
    await outbox.idle()
    assert [m.text for m in provider.sent] == ["later"]


async def test_flush_only_sends_its_own_providers_chunks(outbox, store, sleeps, providers):
    a = running(providers, RecordingProvider("a"))
    b = running(providers, RecordingProvider("b"))
    for p in (a, b):
        p.fail_next(ProviderError("down"), times=3)
        assert not await sent(outbox, p, f"run-{p.name}", chunks(f"for {p.name}"))
    assert await outbox.flush(a) == 1
    await outbox.idle()
    assert [m.text for m in a.sent] == ["for a"] and b.sent == []


async def test_old_rows_are_pruned_recent_pending_ones_kept(outbox, store, sleeps, providers):
    provider = running(providers, RecordingProvider())
    assert await sent(outbox, provider, "old", chunks("x"))
    provider.fail_next(ProviderError("down"), times=6)
    for reply in ("stale", "waiting"):
        assert not await sent(outbox, provider, reply, chunks("y"))
    month_ago = time.time() - 30 * 86400
    await age_outbox(store, month_ago, except_reply="waiting")
    assert await outbox.rows.prune(7 * 86400) == 1  # the delivered one
    assert [r.reply_id for r in await outbox.rows.pending("test")] == ["waiting"]
    [stale] = await outbox.rows.reply("stale")
    assert (stale.status, stale.error) == ("failed", "expired: never sent")


# the inbox: recorded at intake, dedupe, nothing lost --------------------------------------------

def incoming(message_id: str | None, provider: str = "telegram",
             chat: str = "1") -> IncomingMessage:
    return IncomingMessage(provider=provider, chat_id=chat, user_id="1", text="hi",
                           message_id=message_id)


def intake(store: SqliteStore, handled: list[IncomingMessage], name: str = "telegram",
           **kw: object) -> IntakeQueue:
    async def handle(msg: IncomingMessage) -> Outcome:
        handled.append(msg)
        await store.inbound.handled(msg.provider, msg.message_id or "")
        return Accepted("run")
    return IntakeQueue(name, handle, store.inbound, **kw)  # type: ignore[arg-type]


async def test_a_redelivery_is_recognised_across_restarts(data_dir):
    handled: list[IncomingMessage] = []
    async with SqliteStore(data_dir / "pluto.db") as store:
        queue = intake(store, handled)
        assert isinstance(await (await queue.submit(incoming("1:5"))).outcome(), Accepted)
        assert isinstance(await (await queue.submit(incoming("1:5"))).outcome(), Duplicate)
        other = intake(store, handled, name="slack")
        assert isinstance(await (await other.submit(incoming("1:5", provider="slack")))
                          .outcome(), Accepted)  # per provider
        for _ in range(2):  # no id: nothing to recognise it by
            assert isinstance(await (await queue.submit(incoming(None))).outcome(), Accepted)
    async with SqliteStore(data_dir / "pluto.db") as store:
        queue = intake(store, handled)
        assert isinstance(await (await queue.submit(incoming("1:5"))).outcome(), Duplicate)
    assert len(handled) == 4


async def test_a_message_taken_but_never_handled_is_handled_after_a_restart(data_dir):
    async with SqliteStore(data_dir / "pluto.db") as store:
        assert await store.inbound.accept("telegram", "1:7", {
            "provider": "telegram", "chat_id": "1", "user_id": "1", "text": "still here?",
            "message_id": "1:7", "attachments": []})  # the process died after this
    handled: list[IncomingMessage] = []
    async with SqliteStore(data_dir / "pluto.db") as store:
        queue = intake(store, handled)
        assert await queue.replay() == 1
        assert await queue.replay() == 0  # once per process
        await queue.close(5)
        assert [m.text for m in handled] == ["still here?"]
        assert await store.inbound.unhandled("telegram") == []
        assert isinstance(await (await intake(store, []).submit(incoming("1:7"))).outcome(),
                          Duplicate)


async def test_intake_never_waits_for_a_slow_chat(store):
    release = asyncio.Event()
    handled: list[str] = []

    async def handle(msg: IncomingMessage) -> Outcome:
        if msg.chat_id == "slow":
            await release.wait()
        handled.append(msg.chat_id)
        return Accepted("run")

    queue = IntakeQueue("p", handle, store.inbound)
    slow = await queue.submit(incoming("a", chat="slow"))
    fast = await queue.submit(incoming("b", chat="fast"))
    assert isinstance(await asyncio.wait_for(fast.outcome(), 2), Accepted)
    assert handled == ["fast"] and not slow.done()
    release.set()
    assert isinstance(await slow.outcome(), Accepted)


async def test_a_message_the_chats_holder_takes_before_its_ticket_is_queued_is_decided_at_once(
        store):
    """Several instances: the holder of a chat takes its messages from the inbox, so it may
    take one while the provider that received it is still handing it over. That provider's
    ticket is decided when the holder decides (Accepted), not when the run ends."""
    runs = {"1": asyncio.Event(), "2": asyncio.Event()}  # set: the run has ended
    decided: list[str] = []

    async def handle(msg: IncomingMessage) -> Outcome:
        await store.inbound.handled(msg.provider, msg.message_id or "")  # (the run's start)
        decided.append(msg.message_id or "")
        return Accepted(msg.message_id or "")

    class SlowInbox(SqliteInbound):  # recorded, then slow to say so
        handing_over = asyncio.Event()

        async def accept(self, provider: str, message_id: str, payload: dict) -> bool:
            fresh = await super().accept(provider, message_id, payload)
            if message_id == "2":
                await self.handing_over.wait()
            return fresh

    inbox = SlowInbox(store.engine)
    shared = Shared(Cluster(None, "me"), take_over=lambda provider, chat: asyncio.sleep(0),
                    finished=lambda run_id: runs[run_id].wait())
    queue = IntakeQueue("p", handle, inbox, shared=shared)  # type: ignore[arg-type]
    first = await queue.submit(incoming("1", provider="p"))
    assert await asyncio.wait_for(first.outcome(), 2) == Accepted("1")
    second = asyncio.create_task(queue.submit(incoming("2", provider="p")))
    async with asyncio.timeout(5):
        while "2" not in await _unhandled_ids(inbox):
            await asyncio.sleep(0.01)
        runs["1"].set()  # the holder goes on to the chat's next message: "2", from the inbox
        while decided != ["1", "2"]:
            await asyncio.sleep(0.01)
    inbox.handing_over.set()
    ticket = await asyncio.wait_for(second, 2)
    assert await asyncio.wait_for(ticket.outcome(), 2) == Accepted("2")  # run "2" goes on
    assert queue.waiting == 0 and not runs["2"].is_set()
    runs["2"].set()
    await queue.close(2)
    assert queue.free == queue.capacity  # every message taken was given back


async def _unhandled_ids(inbox: SqliteInbound) -> list[str]:
    return [m["message_id"] for m in await inbox.unhandled_in_chat("p", "1")]


async def test_a_full_intake_pushes_back_and_drops_nothing(store, monkeypatch):
    release = asyncio.Event()
    taken: list[str] = []  # messages handed to the inbox
    accept = store.inbound.accept

    async def handle(msg: IncomingMessage) -> Outcome:
        await release.wait()
        return Accepted("run")

    async def recorded(provider: str, message_id: str, payload: dict) -> bool:
        taken.append(message_id)
        return await accept(provider, message_id, payload)

    monkeypatch.setattr(store.inbound, "accept", recorded)
    queue = IntakeQueue("p", handle, store.inbound, capacity=2)
    tickets = [await queue.submit(incoming(str(i), chat=str(i))) for i in range(2)]
    assert await queue.offer(incoming("x", chat="x")) is None  # a webhook answers 503
    waiting = asyncio.create_task(queue.submit(incoming("y", chat="y")))
    await asyncio.sleep(0)  # one turn of the loop: the submit runs until it waits
    assert taken == ["0", "1"] and not waiting.done()  # back-pressure: long polling waits for room
    release.set()
    tickets.append(await waiting)
    assert [type(await t.outcome()) for t in tickets] == [Accepted] * 3


async def test_messages_handed_over_while_stopping_are_refused_not_lost(store):
    async def handle(msg: IncomingMessage) -> Outcome:
        return Accepted("run")

    queue = IntakeQueue("p", handle, store.inbound)
    await queue.close(1)
    outcome = await (await queue.submit(incoming("late"))).outcome()
    assert isinstance(outcome, Dropped)
    assert await store.inbound.unhandled("p") == []  # not taken: the platform keeps it


async def test_a_message_that_starts_a_prune_is_not_held_up_by_it(store, caplog):
    """The prune runs beside intake: the message that starts it is recorded and answered at
    once, a failed prune is a warning (the next one prunes), and closing gives it up."""
    seen = SqliteInbound(store.engine, prune_every=2)
    gate = asyncio.Event()
    prunes: list[str] = []

    async def prune() -> int:
        prunes.append("started")
        await gate.wait()
        raise StorageError("disk I/O error")

    seen.prune = prune  # type: ignore[method-assign]
    assert await seen.first_time("p", "1")
    assert await seen.first_time("p", "2")  # the second starts a prune, which waits
    assert await seen.first_time("p", "3") and await seen.first_time("p", "4")
    assert prunes == ["started"]  # (one at a time: the fourth started none beside it)
    gate.set()
    with caplog.at_level("WARNING"):
        await seen.pruned()
    assert "could not forget old message ids" in caplog.text
    gate.clear()
    assert await seen.first_time("p", "5") and await seen.first_time("p", "6")
    assert prunes == ["started", "started"]
    await seen.close()  # the prune waiting on the gate is given up
    assert await seen.count() == 6


async def test_the_inbox_is_bounded(store):
    seen = SqliteInbound(store.engine, max_rows=5, prune_every=3)
    for i in range(12):
        assert await seen.first_time("p", str(i))
        await seen.pruned()  # (a prune runs beside the message that starts it)
    assert await seen.count() <= 5 + 3
    await age_inbound(store)
    assert await seen.prune() > 0 and await seen.count() == 0


async def test_pending_replies_come_in_the_order_they_were_recorded_whatever_the_clocks(
        store):
    """Instances' clocks differ: pending replies are listed in recording order (the row ids),
    never by their creation time."""
    await store.outbox.record([outbox_module._to_row("test", "r1", i, m)
                               for i, m in enumerate(chunks("a", "b"))])
    await store.outbox.record([outbox_module._to_row("test", "r2", 0, chunks("c")[0])])
    # r2 recorded by an instance whose clock is far behind
    await store.engine.write(("UPDATE outbox SET created_at = 0 WHERE reply_id = 'r2'", ()))
    order = [(r.reply_id, r.chunk) for r in await store.outbox.pending("test")]
    assert order == [("r1", 0), ("r1", 1), ("r2", 0)]
    assert [(r.reply_id, r.chunk) for r in await store.outbox.pending_all()] == order
