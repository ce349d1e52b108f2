"""The outbox and inbound dedupe on SQLite: recorded before sent, sent exactly once, retried by
the platform's rules, resumed after a restart; redeliveries caught, the table bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import pluto.gateway.delivery.outbox as outbox_module
from pluto.gateway.pipeline.dedupe import InboundDedupe
from pluto.gateway.delivery.outbox import Outbox, RetryPolicy
from pluto.errors import DeliveryRefused, RateLimited, ProviderError
from tests.helpers.gateway import permanent
from pluto.types import Attachment, IncomingMessage, OutgoingMessage
from pluto.storage.inbound import InboundStore
from pluto.storage.sqlite import SqliteStore
from tests.helpers.gateway import RecordingProvider


@pytest.fixture
async def store(data_dir: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(data_dir / "pluto.db") as s:
        yield s


@pytest.fixture
async def outbox(store: SqliteStore) -> Outbox:
    box = Outbox(store, RetryPolicy(attempts=3, base_delay=0.5))
    await box.open()
    return box


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The outbox's waits, recorded instead of slept."""
    waited: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(outbox_module.asyncio, "sleep", fake_sleep)
    return waited


def chunks(*texts: str, chat: str = "c1") -> list[OutgoingMessage]:
    return [OutgoingMessage(chat_id=chat, text=t, markup="markdown") for t in texts]


async def statuses(store: SqliteStore) -> list[tuple[int, str, str | None]]:
    rows = await store.db.execute_fetchall(
        "SELECT chunk, status, platform_id FROM outbox ORDER BY reply_id, chunk")
    return [(r[0], r[1], r[2]) for r in rows]


async def test_chunks_are_recorded_then_sent_and_marked(outbox, store):
    provider = RecordingProvider()
    ids = await outbox.deliver(provider, "run1", chunks("one", "two"))
    assert ids == ["1", "2"] and [m.text for m in provider.sent] == ["one", "two"]
    assert await statuses(store) == [(0, "sent", "1"), (1, "sent", "2")]
    # the same reply again (a retried delivery): nothing is sent twice
    assert await outbox.deliver(provider, "run1", chunks("one", "two")) == []
    assert len(provider.sent) == 2


async def test_everything_needed_to_send_after_a_restart_is_kept(outbox, store, tmp_path,
                                                                    sleeps):
    chart = tmp_path / "chart.png"
    message = OutgoingMessage(chat_id="-100", thread_id="9", reply_to="-100:5", kind="error",
                              run_id="run1",
                              markup="telegram_html", text="<b>x</b>", attachments=(
                                  Attachment(filename="chart.png", path=chart, kind="image",
                                             size=3, mime_type="image/png"),))
    provider = RecordingProvider()
    provider.fail_next(ProviderError("down"), times=3)
    with pytest.raises(ProviderError):
        await outbox.deliver(provider, "run1", [message])
    later = Outbox(store)  # a new process
    await later.open()
    assert await later.flush(provider) == 1
    assert provider.sent == [message]


async def test_retry_after_is_honoured_and_other_errors_back_off(outbox, store, sleeps):
    provider = RecordingProvider()
    provider.fail_next(RateLimited("slow down", retry_after=7))
    provider.fail_next(ProviderError("flaky network"))
    await outbox.deliver(provider, "run1", chunks("hello"))
    assert sleeps == [7, 1.0]  # the platform's wait, then backoff (0.5 * 2 ** 1)
    assert [m.text for m in provider.sent] == ["hello"]
    rows = await store.db.execute_fetchall("SELECT attempts, error FROM outbox")
    assert [(r[0], r[1]) for r in rows] == [(3, None)]


async def test_a_long_retry_after_is_capped(store, sleeps):
    box = Outbox(store, RetryPolicy(max_delay=30))
    await box.open()
    provider = RecordingProvider()
    provider.fail_next(RateLimited("flood", retry_after=86400))
    await box.deliver(provider, "run1", chunks("x"))
    assert sleeps == [30]


async def test_a_permanent_error_stops_the_reply_and_is_recorded(outbox, store, sleeps):
    provider = RecordingProvider()
    await outbox.deliver(provider, "run0", chunks("earlier"))
    provider.fail_next(DeliveryRefused("bot was blocked by the user"))
    with pytest.raises(ProviderError, match="blocked"):
        await outbox.deliver(provider, "run1", chunks("a", "b", "c"))
    assert sleeps == []
    rows = await store.db.execute_fetchall(
        "SELECT status, error FROM outbox WHERE reply_id = 'run1' ORDER BY chunk")
    assert [(r[0], r[1]) for r in rows] == [("failed", "bot was blocked by the user")] * 3
    assert await outbox.flush(provider) == 0  # failed chunks are not retried later
    assert [m.text for m in provider.sent] == ["earlier"]


async def test_out_of_retries_the_rest_waits_for_the_next_start(outbox, store, sleeps):
    provider = RecordingProvider()
    await outbox.deliver(provider, "run1", chunks("first"))
    provider.fail_next(ProviderError("platform down"), times=3)
    with pytest.raises(ProviderError, match="platform down"):
        await outbox.deliver(provider, "run2", chunks("a", "b"))
    assert await statuses(store) == [(0, "sent", "1"), (0, "pending", None),
                                     (1, "pending", None)]
    assert await outbox.flush(provider) == 2
    assert [m.text for m in provider.sent] == ["first", "a", "b"]
    assert await outbox.flush(provider) == 0  # sent ones never again


async def test_a_crash_between_send_and_mark_resends_and_says_so(outbox, store, caplog):
    provider = RecordingProvider()
    await outbox.rows.record([outbox_module._to_row("test", "run1", 0, chunks("x")[0])])
    [row] = await outbox.rows.reply("run1")
    assert row.id is not None
    await outbox.rows.attempted(row.id)  # the process died right after this platform call
    assert await outbox.flush(provider) == 1
    assert "may have been delivered before a crash" in caplog.text


async def test_a_reply_being_delivered_is_not_flushed_twice(outbox, store):
    started, release = asyncio.Event(), asyncio.Event()

    class Slow(RecordingProvider):
        async def send(self, message: OutgoingMessage) -> str | None:
            started.set()
            await release.wait()
            return await super().send(message)

    provider = Slow()
    delivering = asyncio.create_task(outbox.deliver(provider, "run1", chunks("a", "b")))
    await started.wait()  # recorded, the first send in flight
    assert await outbox.flush(provider) == 0  # the live delivery owns this reply
    release.set()
    await delivering
    assert [m.text for m in provider.sent] == ["a", "b"]


async def test_edit_of_a_message_that_is_gone_sends_it_anew(outbox, store):
    provider = RecordingProvider()
    provider.fail_next(DeliveryRefused("message to edit not found"))
    msg = OutgoingMessage(chat_id="c1", text="final", edit_of="41")
    assert await outbox.deliver(provider, "run1", [msg]) == ["1"]
    assert provider.sent[0].edit_of is None and provider.sent[0].text == "final"
    ok = OutgoingMessage(chat_id="c1", text="final", edit_of="1")
    assert await outbox.deliver(provider, "run2", [ok]) == ["1"]
    assert [m.text for m in provider.edits] == ["final"]


async def test_a_provider_bug_is_a_permanent_failure(outbox, store):
    class Broken(RecordingProvider):
        async def send(self, message: OutgoingMessage) -> str | None:
            raise KeyError("oops")

    with pytest.raises(ProviderError, match="the provider failed: KeyError") as info:
        await outbox.deliver(Broken(), "run1", chunks("x"))
    assert permanent(info.value)
    assert await statuses(store) == [(0, "failed", None)]


async def test_flush_only_sends_its_own_providers_chunks(outbox, store, sleeps):
    a, b = RecordingProvider("a"), RecordingProvider("b")
    for p in (a, b):
        p.fail_next(ProviderError("down"), times=3)
        with pytest.raises(ProviderError):
            await outbox.deliver(p, f"run-{p.name}", chunks(f"for {p.name}"))
    assert await outbox.flush(a) == 1
    assert [m.text for m in a.sent] == ["for a"] and b.sent == []


async def test_old_rows_are_pruned_recent_pending_ones_kept(outbox, store, sleeps):
    provider = RecordingProvider()
    await outbox.deliver(provider, "old", chunks("x"))
    provider.fail_next(ProviderError("down"), times=6)
    for reply in ("stale", "waiting"):
        with pytest.raises(ProviderError):
            await outbox.deliver(provider, reply, chunks("y"))
    month_ago = time.time() - 30 * 86400
    await store.db.execute("UPDATE outbox SET updated_at = ?, created_at = ? WHERE reply_id !="
                           " 'waiting'", (month_ago, month_ago))
    await store.db.commit()
    assert await outbox.rows.prune(7 * 86400) == 1  # the delivered one
    assert [r.reply_id for r in await outbox.rows.pending("test")] == ["waiting"]
    [stale] = await outbox.rows.reply("stale")
    assert (stale.status, stale.error) == ("failed", "expired: never sent")


# inbound dedupe ------------------------------------------------------------------------------

def incoming(message_id: str | None, provider: str = "telegram") -> IncomingMessage:
    return IncomingMessage(provider=provider, chat_id="1", user_id="1", text="hi",
                           message_id=message_id)


async def test_dedupe_remembers_across_restarts(data_dir):
    async with SqliteStore(data_dir / "pluto.db") as store:
        dedupe = InboundDedupe(store)
        await dedupe.open()
        assert await dedupe.first_time(incoming("1:5"))
        assert not await dedupe.first_time(incoming("1:5"))
        assert await dedupe.first_time(incoming("1:5", provider="slack"))  # per provider
        assert await dedupe.first_time(incoming(None)) and await dedupe.first_time(incoming(None))
    async with SqliteStore(data_dir / "pluto.db") as store:
        dedupe = InboundDedupe(store)
        await dedupe.open()
        assert not await dedupe.first_time(incoming("1:5"))


async def test_dedupe_table_is_bounded(store):
    seen = InboundStore(store, max_rows=5, prune_every=3)
    await seen.open()
    for i in range(12):
        assert await seen.first_time("p", str(i))
    assert await seen.count() <= 5 + 3
    await store.db.execute("UPDATE inbound_seen SET seen_at = 0")
    await store.db.commit()
    assert await seen.prune() > 0 and await seen.count() == 0
