"""The run feed: stored then live, each event once and in order — and a run just accepted in
this process is followed without reading storage unless it has to."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from pluto.events import MessageDelta, RunEnd, RunEvent, RunStart
from pluto.gateway.feed import LocalRunFeed, SharedRunFeed


class Runs:
    """A RunReader over a list, counting the reads."""

    def __init__(self, stored: list[RunEvent] = ()):
        self.stored = list(stored)
        self.reads = 0

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        self.reads += 1
        return [e for e in self.stored if e.run_id == run_id and e.seq > after]


def events(run_id: str = "r") -> list[RunEvent]:
    return [RunStart(run_id=run_id, session_id="s", agent="a", seq=1),
            MessageDelta(run_id=run_id, text="Hel", seq=2),
            MessageDelta(run_id=run_id, text="lo", seq=3),
            RunEnd(run_id=run_id, outcome="ok", seq=4)]


async def follow(feed: LocalRunFeed, run_id: str = "r", **kw) -> list[RunEvent]:
    async with aclosing(feed.follow(run_id, **kw)) as stream:
        return [e async for e in stream]


async def publish_soon(feed: LocalRunFeed, evs: list[RunEvent]) -> None:
    await asyncio.sleep(0.01)  # the watcher is subscribed by then
    for e in evs:
        feed.publish(e)
        await asyncio.sleep(0)


async def test_a_fresh_run_is_followed_live_without_reading_storage():
    runs = Runs()
    feed = LocalRunFeed(runs)
    watching = asyncio.ensure_future(follow(feed, fresh=True))
    await publish_soon(feed, events())
    assert [e.seq for e in await asyncio.wait_for(watching, 5)] == [1, 2, 3, 4]
    assert runs.reads == 0


async def test_a_fresh_run_that_already_published_is_read_from_storage_once():
    evs = events()
    runs = Runs(evs[:2])
    feed = LocalRunFeed(runs)
    for e in evs[:2]:  # published (and stored) before the watcher came
        feed.publish(e)
    watching = asyncio.ensure_future(follow(feed, fresh=True))
    await publish_soon(feed, evs[2:])
    assert [e.seq for e in await asyncio.wait_for(watching, 5)] == [1, 2, 3, 4]
    assert runs.reads == 1


async def test_a_gap_in_a_fresh_run_is_filled_from_storage():
    evs = events()
    runs = Runs(evs)
    feed = LocalRunFeed(runs)
    watching = asyncio.ensure_future(follow(feed, fresh=True))
    await publish_soon(feed, evs[2:])  # seq 1 and 2 never reached it live
    assert [e.seq for e in await asyncio.wait_for(watching, 5)] == [1, 2, 3, 4]
    assert runs.reads == 1


async def test_a_run_that_is_not_fresh_and_a_feed_of_several_instances_read_storage():
    evs = events()
    runs = Runs(evs)
    assert [e.seq for e in await follow(LocalRunFeed(runs))] == [1, 2, 3, 4]

    class Bus:
        def subscribe(self, channel, callback) -> None: ...
        async def publish(self, channel, payloads) -> None: ...

    shared = SharedRunFeed(runs, Bus(), "i1")  # the run may execute on another instance
    assert [e.seq for e in await follow(shared, fresh=True)] == [1, 2, 3, 4]
    assert runs.reads == 2


async def test_a_fresh_run_forgotten_by_a_flood_of_others_is_found_in_storage(monkeypatch):
    from pluto.gateway import feed as feed_module
    monkeypatch.setattr(feed_module, "PUBLISHED_KEPT", 3)
    monkeypatch.setattr(feed_module, "UNREAD_CHECK", 0.05)
    evs = events()
    runs = Runs(evs)
    feed = LocalRunFeed(runs)
    for e in evs:  # the whole run was published (and stored) before anybody followed it ...
        feed.publish(e)
    for i in range(5):  # ... and then its id was pushed out by others
        feed.publish(RunStart(run_id=f"other{i}", session_id="s", agent="a", seq=1))
    got = await asyncio.wait_for(follow(feed, fresh=True), 5)  # never waits for ever
    assert [e.seq for e in got] == [1, 2, 3, 4] and runs.reads == 1


async def test_a_listener_gets_each_event_in_the_call_that_publishes_it():
    feed = LocalRunFeed(Runs())
    heard: list[int] = []
    stop = feed.listen("r", lambda e: heard.append(e.seq))
    assert stop is not None and feed.watched("r")
    for e in events()[:2]:
        feed.publish(e)
        assert heard[-1] == e.seq  # no task, no queue: already shown when publish returns
    stop()
    feed.publish(events()[2])
    assert heard == [1, 2] and not feed.watched("r")


async def test_listening_is_refused_when_every_event_cannot_be_promised():
    feed = LocalRunFeed(Runs())
    feed.publish(events()[0])  # the run has published here already: follow it instead
    assert feed.listen("r", lambda e: None) is None

    class Bus:
        def subscribe(self, channel, callback) -> None: ...
        async def publish(self, channel, payloads) -> None: ...

    shared = SharedRunFeed(Runs(), Bus(), "i1")  # it may execute on another instance
    assert shared.listen("r", lambda e: None) is None


async def test_a_listener_that_fails_is_dropped_and_the_run_goes_on(caplog):
    feed = LocalRunFeed(Runs())
    heard: list[int] = []

    def broken(event: RunEvent) -> None:
        raise ValueError("a bug in a watcher")

    feed.listen("r", broken)
    feed.listen("r", lambda e: heard.append(e.seq))
    for e in events():
        feed.publish(e)  # never raises into the run that publishes
    assert heard == [1, 2, 3, 4]
    assert "a listener of run r failed" in caplog.text and feed.watched("r")
