"""Side effects of an instance that cannot renew its leases stop before anyone may take over.

Several instances: a lease is good on the database until its last renewal + ttl. An instance
acts only until its last *successful* renewal (as asked, on its own monotonic clock) + ttl −
margin, so a paused process (SIGSTOP) or one cut off from the database goes silent first; a
run's previews and typing also stop for good once the chat's lease it ran under was lost —
even after the instance renews again — and the outbox sends no reply while silent (the reply
stays recorded, sent once when it may).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import pluto.gateway.cluster as cluster_module
from pluto.gateway.cluster import Cluster
from pluto.gateway.delivery.delivery import Delivery
from pluto.gateway.delivery.outbox import Outbox, RetryPolicy
from pluto.gateway.delivery.streaming import EditThrottle
from pluto.storage.sqlite import SqliteStore
from pluto.types import Capabilities, IncomingMessage, MessageDelta, MessageFinal, OutgoingMessage
from pluto.errors import ProviderError
from pluto.events import RunEnd, RunEvent, RunStart
from tests.helpers.gateway import RecordingProvider

EDITS = Capabilities(max_message_length=200, can_edit=True, has_typing=True)


class Leases:
    """A lease store in memory: renewals succeed, fail (the database is away) or report the
    leases another instance took."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.away = False
        self.taken: set[str] = set()

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        if self.away:
            raise ConnectionError("the database is away")
        self.tokens[name] = self.tokens.get(name, 0) + 1
        return self.tokens[name]

    async def renew_all(self, owner: str, tokens: dict[str, int], ttl: float) -> set[str]:
        if self.away:
            raise ConnectionError("the database is away")
        lost, self.taken = self.taken & set(tokens), set()
        return lost

    async def release(self, name: str, owner: str, token: int) -> bool:
        return True

    async def holder(self, name: str) -> Any:
        return None

    async def held(self, prefix: str) -> list[Any]:
        return []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(cluster_module.time, "monotonic", c)
    return c


async def beat(cluster: Cluster) -> None:
    """One heartbeat, now (what the heartbeat task does every ttl / 3)."""
    assert cluster.leases is not None
    asked = cluster_module.time.monotonic()
    tokens = dict(cluster._held)
    try:
        lost = await cluster.leases.renew_all(cluster.id, tokens, cluster.ttl)
    except ConnectionError:
        return
    for name in lost:
        cluster._held.pop(name, None)
    await cluster._renewed(asked, lost)


async def test_one_process_always_acts() -> None:
    cluster = Cluster(None, "solo")
    assert cluster.fresh() and cluster.fence("chat:t:1")()


async def test_an_instance_acts_only_until_its_last_renewal_plus_ttl_minus_margin(clock):
    leases = Leases()
    cluster = Cluster(leases, "a", ttl=10.0)  # type: ignore[arg-type]
    assert not cluster.fresh()  # not joined yet
    await cluster.acquire("instance:a")
    cluster._renewed_at = clock.now
    assert cluster.fresh()
    clock.now += 7.4
    assert cluster.fresh()
    clock.now += 0.2  # 7.6 s: past 10 - 2.5, before anyone could take a lease over
    assert not cluster.fresh()
    leases.away = True  # the database is away: renewals fail, the instance stays silent
    await beat(cluster)
    assert not cluster.fresh()
    leases.away = False
    await beat(cluster)
    assert cluster.fresh()


async def test_a_paused_instance_whose_leases_were_taken_never_acts_for_that_chat_again(clock):
    leases = Leases()
    cluster = Cluster(leases, "a", ttl=10.0)  # type: ignore[arg-type]
    await cluster.acquire("instance:a")
    cluster._renewed_at = clock.now
    await cluster.acquire("chat:t:1")
    fence = cluster.fence("chat:t:1")
    assert fence()
    clock.now += 25  # SIGSTOP for 25 s: the others took the instance and its chat for dead
    assert not fence() and not cluster.fresh()
    leases.taken = {"instance:a", "chat:t:1"}
    await beat(cluster)  # SIGCONT: the renewal says both were lost; the instance joins again
    assert cluster.fresh()
    assert not fence()  # but the run that held the chat stays silent
    await cluster.acquire("chat:t:1")  # even with the chat taken back under a new token
    assert not fence() and cluster.fence("chat:t:1")()


@pytest.fixture
async def store(data_dir: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(data_dir / "pluto.db") as s:
        yield s


async def test_the_outbox_sends_no_reply_while_silent_and_sends_it_once_after(store) -> None:
    p = RecordingProvider()
    silent = [True]
    outbox = Outbox(store.outbox, {"test": p}, sweep_seconds=0, may_send=lambda: not silent[0])
    await outbox.open()
    done = await outbox.deliver(p, "r1", [OutgoingMessage(chat_id="c1", text="the answer")])
    assert await done is False  # not sent: left recorded, for the sweep
    assert p.sent == []
    silent[0] = False
    assert await outbox.flush(p) == 1
    await outbox.idle()
    assert [m.text for m in p.sent] == ["the answer"]
    await outbox.flush(p)
    await outbox.idle()
    assert len(p.sent) == 1


async def test_a_silenced_try_counts_no_attempt_so_no_false_crash_warning(store, caplog) -> None:
    """"May have been delivered before a crash" is said only when a call may have been made:
    tries refused by the fence (here 3) add no attempt to the one counted with the record."""
    p = RecordingProvider()
    silent = [True]
    outbox = Outbox(store.outbox, {"test": p}, sweep_seconds=0, may_send=lambda: not silent[0])
    await outbox.open()
    done = await outbox.deliver(p, "r1", [OutgoingMessage(chat_id="c1", text="the answer")])
    assert await done is False
    for _ in range(2):
        await outbox.flush(p)
        await outbox.idle()
    assert p.sent == []
    [row] = await store.outbox.reply("r1")
    assert row.status == "pending" and row.attempts == 1  # the call to come, counted at once
    silent[0] = False
    await sent_once_unflagged(outbox, p, store, caplog, attempts=1)


async def test_a_fence_closing_while_the_attempt_is_recorded_sends_nothing_then_once(
        store, caplog) -> None:
    """The fence is checked again after a call is counted: closed meanwhile, nothing is sent;
    the next try here counts no second attempt for that call and warns of no crash."""
    p = RecordingProvider()
    p.failures.append(ProviderError("timed out"))  # the first call fails: the retry is counted
    open_ = [True]
    outbox = Outbox(store.outbox, {"test": p}, sweep_seconds=0, may_send=lambda: open_[0],
                    retry=RetryPolicy(attempts=3, base_delay=0.0))
    await outbox.open()
    attempted = store.outbox.attempted

    async def closing(row_id: int) -> None:
        await attempted(row_id)
        open_[0] = False  # the lease ran out during this statement

    store.outbox.attempted = closing  # type: ignore[method-assign]
    done = await outbox.deliver(p, "r1", [OutgoingMessage(chat_id="c1", text="the answer")])
    assert await done is False and p.sent == []
    [row] = await store.outbox.reply("r1")
    assert row.attempts == 2  # the failed call and the one the fence stopped
    store.outbox.attempted = attempted  # type: ignore[method-assign]
    open_[0] = True
    await sent_once_unflagged(outbox, p, store, caplog, attempts=2)


async def sent_once_unflagged(outbox: Outbox, p: RecordingProvider, store: SqliteStore,
                              caplog: pytest.LogCaptureFixture, *, attempts: int) -> None:
    """The fence open again: the sweep sends reply r1 once, with no "maybe sent" warning, and
    its chunk has counted ``attempts`` calls."""
    with caplog.at_level("WARNING", logger="pluto"):
        assert await outbox.flush(p) == 1
        await outbox.idle()
    assert [m.text for m in p.sent] == ["the answer"]
    assert "may have been delivered" not in caplog.text
    [row] = await store.outbox.reply("r1")
    assert row.status == "sent" and row.attempts == attempts


async def test_a_runs_previews_and_typing_stop_once_its_fence_closes(store, data_dir) -> None:
    p = RecordingProvider(capabilities=EDITS)
    outbox = Outbox(store.outbox, {"test": p}, throttle=EditThrottle(0), sweep_seconds=0)
    await outbox.open()
    delivery = Delivery(outbox, data_dir=data_dir, throttle=EditThrottle(0),
                        typing_interval=0.01)
    open_ = [True]
    msg = IncomingMessage(provider="test", chat_id="c1", user_id="u", text="hi",
                          message_id="c1:1", is_direct=True)

    async def events() -> AsyncIterator[RunEvent]:
        yield RunStart(run_id="r", session_id="s", agent="default")
        yield MessageDelta(run_id="r", text="Half an")
        async with asyncio.timeout(5):
            while not p.sent or len(p.typing_calls) < 2:
                await asyncio.sleep(0.005)
        open_[0] = False  # the instance was paused past its lease: another took the chat
        typed = len(p.typing_calls)
        yield MessageDelta(run_id="r", text=" answer that goes on")
        # five typing intervals pass: the clock passing is the check (an indicator or a
        # preview still going would have shown by then), not a wait for an event
        await asyncio.sleep(0.05)
        assert len(p.typing_calls) == typed and p.edits == []
        yield RunEnd(run_id="r", outcome="cancelled")

    await delivery.run(p, msg, events(), fence=lambda: open_[0])
    await outbox.idle()
    assert [m.text for m in p.sent] == ["Half an"] and p.edits == []


async def test_a_run_whose_fence_stays_open_shows_its_answer(store, data_dir) -> None:
    p = RecordingProvider(capabilities=EDITS)
    outbox = Outbox(store.outbox, {"test": p}, throttle=EditThrottle(0), sweep_seconds=0)
    await outbox.open()
    delivery = Delivery(outbox, data_dir=data_dir, throttle=EditThrottle(0))
    msg = IncomingMessage(provider="test", chat_id="c1", user_id="u", text="hi",
                          message_id="c1:1", is_direct=True)

    async def events() -> AsyncIterator[RunEvent]:
        yield RunStart(run_id="r", session_id="s", agent="default")
        yield MessageFinal(run_id="r", text="all of it")
        yield RunEnd(run_id="r", outcome="ok")

    await delivery.run(p, msg, events(), fence=lambda: True)
    await outbox.idle()
    assert [m.text for m in p.sent] == ["all of it"]


async def test_a_preview_withdrawn_while_the_chat_rests_is_still_deleted(store) -> None:
    """A run cut short by an outage left a preview holding its whole answer; its message is
    answered again (maybe by another instance). The preview's removal is posted to the chat
    while the chat rests — its reply could not go, the instance being silenced — and must not
    be dropped with the previews and typing calls a resting chat refuses: left there, it reads
    as the answer given twice."""
    p = RecordingProvider()
    silent = [True]
    outbox = Outbox(store.outbox, {"test": p}, sweep_seconds=0, may_send=lambda: not silent[0])
    await outbox.open()
    done = await outbox.deliver(p, "r1", [OutgoingMessage(chat_id="c1", text="the answer")])
    assert await done is False  # silenced: the chat rests, its reply recorded for the sweep
    delivery = Delivery(outbox, data_dir=Path("."), throttle=EditThrottle(0), replace_left=True)
    msg = IncomingMessage(provider="test", chat_id="c1", user_id="u", user_name="u",
                          text="question", message_id="m1")
    delivery._previews[("test", "m1")] = "preview-7"
    assert delivery.withdraw_left(p, msg)
    await outbox.idle()
    assert p.deleted == ["preview-7"]
    assert p.sent == []  # (the reply still waits for the fence)
    silent[0] = False
    await outbox.flush(p)
    await outbox.idle()
    assert [m.text for m in p.sent] == ["the answer"]
