"""The run feed: stored then live, each event once and in order — and a run just accepted in
this process is followed without reading storage unless it has to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from pathlib import Path

import pytest

from pluto.events import MessageDelta, MessageFinal, RunEnd, RunEvent, RunStart
from pluto.gateway.feed import WAKE, LocalRunFeed, SharedRunFeed
from pluto.storage.postgres import PostgresStore
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore
from pluto.storage.sql.conversations import PREVIEWS_AHEAD
from tests.helpers.pg import fresh_schema
from tests.helpers.served import wait_for


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
    await wait_for(lambda: feed.watched(evs[0].run_id))  # the watcher is subscribed
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


class Following(Runs):
    """Runs that record who follows them elsewhere (a shared database's ``run_follows``)."""

    def __init__(self, stored: list[RunEvent] = (), *, fails: bool = False):
        super().__init__(stored)
        self.follows: list[tuple[str, bool]] = []
        self.fails = fails

    async def follow_elsewhere(self, run_id: str, following: bool = True) -> None:
        self.follows.append((run_id, following))
        if self.fails:
            raise ConnectionError("the database is away")


class Bus:
    def __init__(self) -> None:
        self.heard: Callable[[str | None], None] = lambda payload: None

    def subscribe(self, channel, callback) -> None:  # type: ignore[no-untyped-def]
        self.heard = callback

    async def publish(self, channel, payloads) -> None: ...  # type: ignore[no-untyped-def]


async def test_a_run_followed_elsewhere_is_on_the_record_while_followed_and_told_by_notes():
    """Several instances: a watcher here of a run executing elsewhere records the follow
    before it reads storage (the executing instance's writes notify only followed runs),
    once for all its watchers here, and takes it back after the last."""
    evs = events()
    runs = Following(evs[:1])
    bus = Bus()
    feed = SharedRunFeed(runs, bus, "i1")
    feed.start()
    first = asyncio.ensure_future(follow(feed))
    second = asyncio.ensure_future(follow(feed))
    await wait_for(lambda: runs.reads >= 2)  # (both read storage, after the record)
    assert runs.follows == [("r", True)]
    runs.stored = evs  # the rest committed elsewhere, and noted
    bus.heard("i2|r")
    assert [e.seq for e in await asyncio.wait_for(first, 5)] == [1, 2, 3, 4]
    assert [e.seq for e in await asyncio.wait_for(second, 5)] == [1, 2, 3, 4]
    await wait_for(lambda: len(runs.follows) == 2)
    assert runs.follows == [("r", True), ("r", False)]


async def test_a_watcher_gone_while_its_follow_is_recorded_takes_it_back():
    runs = Following()
    gate = asyncio.Event()
    record = runs.follow_elsewhere

    async def slow(run_id: str, following: bool = True) -> None:
        await record(run_id, following)
        if following:
            await gate.wait()  # (the database is slow to answer)

    runs.follow_elsewhere = slow  # type: ignore[method-assign]
    feed = SharedRunFeed(runs, Bus(), "i1")
    feed.start()
    watching = asyncio.ensure_future(follow(feed))
    await wait_for(lambda: runs.follows == [("r", True)])
    watching.cancel()  # (the tab closed meanwhile)
    gate.set()  # (the database answers: the removal follows the record)
    await wait_for(lambda: runs.follows == [("r", True), ("r", False)])
    assert feed._following == {}  # (a later watcher records it again)


async def test_a_run_followed_elsewhere_is_read_again_without_a_note(monkeypatch):
    """A write whose statement began before the follow was recorded notifies nobody (and the
    record itself may fail): the watcher reads storage again now and then all the same."""
    from pluto.gateway import feed as feed_module
    monkeypatch.setattr(feed_module, "FOLLOW_CHECK", 0.5)
    evs = events()
    runs = Following(evs[:1], fails=True)
    feed = SharedRunFeed(runs, Bus(), "i1")
    feed.start()
    watching = asyncio.ensure_future(follow(feed))
    await wait_for(lambda: runs.reads >= 1)
    runs.stored = evs  # committed elsewhere, no note heard
    assert [e.seq for e in await asyncio.wait_for(watching, 5)] == [1, 2, 3, 4]


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


async def test_a_run_listened_to_is_read_from_storage_after_the_notes_may_have_been_missed():
    """A run listened to here may be taken over and ended elsewhere while this instance could
    not hear (stopped, its listening connection cut): the note that said so is lost. The
    listener, told notes were missed, gets the wake-up (no next seq: its cue to read storage),
    as a watcher does — else a tab showed that answer unfinished for ever (found by
    tests/test_cluster_chaos_web.py)."""
    class Bus:
        def __init__(self) -> None:
            self.heard: Callable[[str | None], None] | None = None

        def subscribe(self, channel, callback) -> None:
            self.heard = callback

        async def publish(self, channel, payloads) -> None: ...

    bus = Bus()
    feed = SharedRunFeed(Runs(), bus, "i1")
    feed.start(local=lambda run_id: run_id == "r")
    heard: list[int] = []
    assert feed.listen("r", lambda e: heard.append(e.seq)) is not None
    feed.publish(events()[0])
    assert bus.heard is not None
    bus.heard("i1|r")  # its own note: nothing to do
    assert heard == [1]
    bus.heard(None)  # the listening connection is back: notes may have been missed
    assert heard == [1, WAKE.seq]


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


# a seq is never reused; the end of an ended run is found from anywhere (issue 29, item 9) ---

class NeverCommits:
    """An engine whose writes never finish (the process dies before its commit): each call is
    recorded with its statements."""

    def __init__(self, engine: object) -> None:
        self._engine = engine
        self.calls: list[tuple[object, ...]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    async def write(self, *statements: object) -> int:
        self.calls.append(statements)
        await asyncio.Event().wait()  # the crash comes first
        return 0

    write_together = write


@contextlib.asynccontextmanager
async def opened(engine: str, where: str) -> AsyncIterator[SqlStore]:
    store = SqliteStore(Path(where) / "pluto.db") if engine == "sqlite" else PostgresStore(where)
    async with store:
        yield store


@contextlib.contextmanager
def database(engine: str, tmp_path: Path) -> Iterator[str]:
    if engine == "sqlite":
        yield str(tmp_path)
    else:
        with fresh_schema() as url:
            yield url


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_previews_shown_then_lost_in_a_crash_never_lend_their_seqs(engine, tmp_path):
    with database(engine, tmp_path) as where:
        async with opened(engine, where) as first:  # the process that crashes
            conv = first.conversations
            session = await conv.session("k", "a")
            start = await conv.start_run("r", session.id, "a", "hi",
                                         RunStart(run_id="r", session_id=session.id, agent="a"))
            blocked = NeverCommits(conv.engine)
            conv.engine = blocked  # from here nothing of this run reaches the disk
            feed = LocalRunFeed(conv)
            seen: list[RunEvent] = []
            feed.listen("r", seen.append)
            feed.publish(start)
            for i in range(PREVIEWS_AHEAD):  # shown at once, committed behind the run
                feed.publish(await conv.append_event(MessageDelta(run_id="r", text=f"{i} "),
                                                     durable=False))
            shown = max(e.seq for e in seen)
            assert shown == 1 + PREVIEWS_AHEAD and not await first.conversations.events(
                "r", after=1)  # (read through the real engine: nothing of them committed)
            # one more would be a window ahead of the last commit: it waits for its own
            beyond = asyncio.ensure_future(conv.append_event(
                MessageDelta(run_id="r", text="more"), durable=False))
            await wait_until(lambda: any(len(c) > 1 for c in blocked.calls))
            assert not beyond.done()
            beyond.cancel()
            for task in asyncio.all_tasks():  # the process dies: its writes die with it
                if task.get_coro().__qualname__.startswith("SqliteConversations"):
                    task.cancel()
            conv.engine = blocked._engine

        async with opened(engine, where) as restarted:  # the next process
            ended = await restarted.conversations.recover_interrupted()
            assert [e.run_id for e in ended] == ["r"]
            end = ended[0]
            assert end.seq > shown  # a fresh number: nobody who saw a preview misses it
            stored = await restarted.conversations.events("r")
            assert [e.seq for e in stored] == [1, end.seq] and isinstance(stored[-1], RunEnd)
            feed = LocalRunFeed(restarted.conversations)
            for after in (0, 1, shown - 1, shown, end.seq, end.seq + 1, 10**15):
                got = await asyncio.wait_for(follow(feed, after=after), 5)
                assert got[-1] == end and all(e.seq > after for e in got[:-1]), after
                assert [e.seq for e in got] == ([1, end.seq] if after == 0 else [end.seq])


async def test_following_an_ended_run_from_anywhere_ends_with_its_end_at_once(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        conv = store.conversations
        session = await conv.session("k", "a")
        start = await conv.start_run("r", session.id, "a", "hi",
                                     RunStart(run_id="r", session_id=session.id, agent="a"))
        delta = await conv.append_event(MessageDelta(run_id="r", text="he"))
        final, end = await conv.complete_run("r", session.id,
                                             MessageFinal(run_id="r", text="hello"),
                                             RunEnd(run_id="r", outcome="ok"), usage={})
        feed = LocalRunFeed(conv)
        everything = [start, delta, final, end]
        for after in range(0, 9):
            got = await asyncio.wait_for(follow(feed, after=after), 5)
            assert got == (everything[after:] if after < 4 else [end]), after


async def test_a_watcher_past_the_end_of_a_running_run_gets_its_end_when_it_comes(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        conv = store.conversations
        session = await conv.session("k", "a")
        feed = LocalRunFeed(conv)
        feed.publish(await conv.start_run("r", session.id, "a", "hi",
                                          RunStart(run_id="r", session_id=session.id, agent="a")))
        watching = asyncio.ensure_future(follow(feed, after=500))  # a client's odd id
        await wait_until(lambda: feed.watched("r"))
        feed.publish(await conv.append_event(MessageDelta(run_id="r", text="he")))
        assert not watching.done()
        _, end = await conv.complete_run("r", session.id, MessageFinal(run_id="r", text="he"),
                                         RunEnd(run_id="r", outcome="ok"), usage={})
        feed.publish(end)
        assert await asyncio.wait_for(watching, 5) == [end]


async def wait_until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0)


async def test_a_run_ending_while_its_events_are_read_is_read_whole_or_not_yet(tmp_path):
    """A follower past the run's start reads while the run ends (its answer and end committed
    together): it gets both, or neither yet (the end's notice wakes it again) — never the end
    without the answer before it."""
    async with SqliteStore(tmp_path / "pluto.db") as store:
        conv = store.conversations
        session = await conv.session("k", "a")
        await conv.start_run("r", session.id, "a", "hi",
                             RunStart(run_id="r", session_id=session.id, agent="a"))
        fetchall, fetchone = store.engine.fetchall, store.engine.fetchone
        ending: list[asyncio.Task[object]] = []

        async def then_end(*args: object) -> object:  # the run ends right after this read
            rows = await fetchall(*args)  # type: ignore[arg-type]
            if not ending:
                ending.append(asyncio.ensure_future(conv.complete_run(
                    "r", session.id, MessageFinal(run_id="r", text="hello"),
                    RunEnd(run_id="r", outcome="ok"), usage={})))
                await ending[0]
            return rows

        async def after_the_end(*args: object) -> object:
            if ending:
                await ending[0]
            return await fetchone(*args)  # type: ignore[arg-type]

        store.engine.fetchall = then_end  # type: ignore[method-assign]
        store.engine.fetchone = after_the_end  # type: ignore[method-assign]
        first = await conv.events("r", after=1)
        store.engine.fetchall = fetchall  # type: ignore[method-assign]
        store.engine.fetchone = fetchone  # type: ignore[method-assign]
        assert [e.type for e in first] in ([], ["message.final", "run.end"])
        assert [e.type for e in await conv.events("r", after=1)] == ["message.final", "run.end"]


async def test_a_follow_taken_back_while_still_being_recorded_is_taken_back_after_it():
    """The record of a follow is slow to commit and its watcher leaves meanwhile: the removal
    waits for the record (it used to commit first, then the record: a follow nobody took back,
    every write of the run noting this instance until the run ended)."""
    gate = asyncio.Event()
    following: set[str] = set()  # what the database holds once each write commits
    writes: list[bool] = []

    class Slow(Following):
        async def follow_elsewhere(self, run_id: str, follow: bool = True) -> None:
            writes.append(follow)
            if follow:
                await gate.wait()  # (the record commits when the database answers)
                following.add(run_id)
            else:
                following.discard(run_id)

    feed = SharedRunFeed(Slow(), Bus(), "i1")
    feed.start()
    watching = asyncio.ensure_future(follow(feed))
    await wait_for(lambda: writes == [True])
    watching.cancel()  # (the tab closed while the record is on its way)
    await asyncio.sleep(0.05)
    assert writes == [True]  # the removal waits for the record
    gate.set()
    await wait_for(lambda: writes == [True, False])
    await wait_for(lambda: not feed._writing)
    assert following == set() and feed._following == {}
