"""Flood control: one state per chat that every send consults (previews, finals, notices, the
outbox), kept in storage so that a restart inside a platform's retry-after window waits too.

No test measures a duration: each compares when a send happened with the deadline the
platform set (a send may never come before it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.errors import RateLimited
from pluto.gateway.delivery.delivery import Delivery
from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.delivery.outbox import Outbox
from pluto.gateway.delivery.streaming import EditThrottle
from pluto.providers.telegram.markup import TELEGRAM_HTML
from pluto.storage.sqlite import SqliteStore
from pluto.types import (Capabilities, IncomingMessage, MessageDelta, MessageFinal,
                         OutgoingMessage, RunEnd, RunEvent, RunStart)
from tests.helpers.gateway import RecordingProvider

EDITS = Capabilities(max_message_length=200, markup=TELEGRAM_HTML, can_edit=True)


class TimedProvider(RecordingProvider):
    """Records when each message or edit reached the platform (wall clock)."""

    def __init__(self, *args: object, **kw: object):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.at: list[tuple[str, float]] = []  # (text, time.time())

    async def send(self, message: OutgoingMessage) -> str | None:
        result = await super().send(message)
        self.at.append((message.text, time.time()))
        return result

    async def edit(self, message: OutgoingMessage) -> None:
        await super().edit(message)
        self.at.append((message.text, time.time()))


def incoming(chat: str = "c1") -> IncomingMessage:
    return IncomingMessage(provider="test", chat_id=chat, user_id="u1", text="hi",
                           message_id=f"{chat}:1", is_direct=True)


async def run_events(provider: RecordingProvider) -> AsyncIterator[RunEvent]:
    yield RunStart(run_id="r1", session_id="s", agent="default")
    yield MessageDelta(run_id="r1", text="Thinking")
    async with asyncio.timeout(10):
        while provider.failures:  # the preview's first send met the 429
            await asyncio.sleep(0.005)
    yield MessageFinal(run_id="r1", text="Thinking done.")
    yield RunEnd(run_id="r1", outcome="ok")


async def test_a_429_on_the_first_preview_holds_the_final(data_dir: Path):
    async with SqliteStore(data_dir / "pluto.db") as store:
        p = TimedProvider(capabilities=EDITS)
        flood = FloodControl(store.flood)
        outbox = Outbox(store.outbox, {"test": p}, throttle=EditThrottle(0), sweep_seconds=0,
                        flood=flood)
        await outbox.open()
        delivery = Delivery(outbox, data_dir=data_dir, throttle=EditThrottle(0))
        p.fail_next(RateLimited("Too Many Requests: retry after 1", retry_after=1.0))
        await delivery.run(p, incoming(), run_events(p))
        await outbox.idle()
        [(_, _, until)] = await store.flood.holds(0)
        assert [text for text, _ in p.at] == ["Thinking done."]  # the preview never showed
        assert p.at[0][1] >= until  # the final waited out the platform's window
        assert p.sent[0].edit_of is None  # there was no preview message to edit


async def test_a_restart_inside_the_window_still_waits(data_dir: Path):
    path = data_dir / "pluto.db"
    async with SqliteStore(path) as store:
        p = TimedProvider()
        outbox = Outbox(store.outbox, {"test": p}, sweep_seconds=0, owner="first",
                        flood=FloodControl(store.flood))
        await outbox.open()
        p.fail_next(RateLimited("Too Many Requests: retry after 2", retry_after=2.0))
        await Delivery(outbox, data_dir=data_dir, throttle=EditThrottle(0)).reply(
            p, incoming(), "an answer that has to wait")
        async with asyncio.timeout(10):
            while not await store.flood.holds(0):
                await asyncio.sleep(0.005)
        await outbox.close(grace=0)  # the process stops inside the window
        [(_, _, until)] = await store.flood.holds(0)
        assert p.sent == []
    async with SqliteStore(path) as store:  # the next process
        q = TimedProvider()
        flood = FloodControl(store.flood)
        outbox = Outbox(store.outbox, {"test": q}, sweep_seconds=0, owner="second",
                        flood=flood)
        await outbox.open()
        assert flood.remaining(("test", "c1")) > 0
        assert await outbox.flush(q) == 1
        await outbox.idle()
        assert [text for text, _ in q.at] == ["an answer that has to wait"]
        assert q.at[0][1] >= until


async def test_a_held_chat_never_holds_up_another(data_dir: Path):
    async with SqliteStore(data_dir / "pluto.db") as store:
        p = TimedProvider()
        flood = FloodControl(store.flood)
        outbox = Outbox(store.outbox, {"test": p}, sweep_seconds=0, flood=flood)
        await outbox.open()
        delivery = Delivery(outbox, data_dir=data_dir, throttle=EditThrottle(0))
        await flood.hold(("test", "held"), 30)
        held = await delivery.reply(p, incoming("held"), "a notice for the held chat")
        free = await delivery.reply(p, incoming("free"), "a notice for another chat")
        assert await asyncio.wait_for(free, 10) is True
        assert not held.done() and [m.chat_id for m in p.sent] == ["free"]
        await outbox.close(grace=0)


async def test_holds_are_kept_latest_first_and_pruned(data_dir: Path):
    async with SqliteStore(data_dir / "pluto.db") as store:
        await store.flood.hold("test", "a", 2000.0)
        await store.flood.hold("test", "a", 1500.0)  # an earlier deadline never shortens it
        await store.flood.hold("test", "b", 1000.0)
        assert sorted(await store.flood.holds(1200.0)) == [("test", "a", 2000.0)]
        assert await store.flood.prune(1200.0) == 1
        assert await store.flood.holds(0) == [("test", "a", 2000.0)]


@pytest.mark.parametrize("seconds", [0.0, -5.0])
async def test_no_wait_when_there_is_nothing_to_wait_for(seconds):
    flood = FloodControl()
    await flood.hold(("test", "c"), seconds)
    assert flood.remaining(("test", "c")) == 0
    await flood.wait(("test", "c"))  # returns at once
