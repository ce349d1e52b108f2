"""The run feed: every watcher of a run (the web widget, the API's SSE and ``wait``, the terminal)
follows it the same way — "events of run R after seq N, then live".

The runner commits each event (storage gives it its ``seq``) and then publishes it here, in
order. :meth:`LocalRunFeed.follow` registers the live subscription *before* it reads storage, so
no event falls between the two, and skips any live event whose ``seq`` it has already yielded:
each event comes once, in ``seq`` order, and the stream ends after ``run.end``. A watcher
that brings a seq at or past the end of an ended run (a reconnect after the end, a number of a
preview lost in a crash: numbers are skipped then, never reused) gets that ``run.end`` at once
and its stream ends.
:meth:`LocalRunFeed.listen` is the same promise without a task: for a run just accepted here,
each event is handed to a function in the very call that publishes it (a chat front-end shows
a streamed batch without a wake-up of its own per batch).

:class:`LocalRunFeed` lives in one process. With several instances on one database,
:class:`SharedRunFeed` hears from the others, over the database's notifications (sent by the
very statements that commit the events), that a run has a new event; a watcher here of a run executing elsewhere then reads the new events from
storage — in ``seq`` order, each once, with no gap even across a reconnect to yet another
instance (``after`` is all a watcher needs to bring).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict
from collections.abc import AsyncGenerator, Callable
from typing import Any

from pluto.events import RunEnd, RunEvent
from pluto.storage.ports import Bus, RunReader

log = logging.getLogger(__name__)

MAX_BACKLOG = 10_000  # live events a stalled watcher may hold before it is cut off
PUBLISHED_KEPT = 5_000  # the runs with an event published here, most recent (their ids only)
UNREAD_CHECK = 2.0  # a fresh run silent this long is looked up in storage all the same
CHANNEL = "pluto_runs"
FOLLOW_CHECK = 5.0  # seconds: at most this long between looks at a run followed elsewhere


class _Wake:
    """Put in a watcher's queue: events were committed elsewhere, read storage again."""

    seq = -1


WAKE: Any = _Wake()


class _Watcher:
    __slots__ = ("queue", "overflowed")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RunEvent] = asyncio.Queue()
        self.overflowed = False


class LocalRunFeed:
    def __init__(self, runs: RunReader):
        self.runs = runs
        self._watchers: dict[str, set[_Watcher]] = defaultdict(set)
        self._listeners: dict[str, list[Callable[[RunEvent], None]]] = {}
        self._published: OrderedDict[str, None] = OrderedDict()

    def publish(self, event: RunEvent) -> None:
        """Hand a committed event (with its ``seq``) to the run's live watchers."""
        if event.run_id not in self._published:
            self._published[event.run_id] = None
            if len(self._published) > PUBLISHED_KEPT:
                self._published.popitem(last=False)
        for w in self._watchers.get(event.run_id, ()):
            if w.queue.qsize() >= MAX_BACKLOG:
                w.overflowed = True  # it re-reads storage when it catches up
            else:
                w.queue.put_nowait(event)
        listeners = self._listeners.get(event.run_id)
        if listeners:
            for listener in list(listeners):
                try:
                    listener(event)
                except Exception:  # (a listener's fault never reaches the run publishing)
                    log.exception("feed: a listener of run %s failed; it is dropped",
                                  event.run_id)
                    self._unlisten(event.run_id, listener)

    def here(self, run_id: str) -> bool:
        """Whether the run's events are published here (every run is, in one process)."""
        return True

    def watched(self, run_id: str) -> bool:
        return bool(self._watchers.get(run_id) or self._listeners.get(run_id))

    def listen(self, run_id: str,
               listener: Callable[[RunEvent], None]) -> Callable[[], None] | None:
        """Hand each event of ``run_id`` to ``listener`` in the call that publishes it, in
        ``seq`` order, from the first — for a run accepted in this process and not started
        yet. None when that cannot be promised (the run has published here already, or it may
        execute on another instance): :meth:`follow` it then. ``listener`` must return at
        once and not raise; an event whose ``seq`` it did not expect (a start it missed) is
        its cue to :meth:`follow` from there. Returns the function that stops listening."""
        if not self.here(run_id) or run_id in self._published:
            return None
        self._listeners.setdefault(run_id, []).append(listener)
        return lambda: self._unlisten(run_id, listener)

    def _unlisten(self, run_id: str, listener: Callable[[RunEvent], None]) -> None:
        listeners = self._listeners.get(run_id)
        if listeners is not None and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self._listeners[run_id]

    async def follow(self, run_id: str, after: int = 0, *,
                     fresh: bool = False) -> AsyncGenerator[RunEvent, None]:
        """``fresh``: the run was just accepted in this process. If nothing of it has been
        published yet, nothing of it is stored either: storage is not read (a database trip
        fewer on the way to a new answer's first words), unless a gap says otherwise."""
        watcher = _Watcher()
        self._watchers[run_id].add(watcher)
        last = after
        unread = fresh and self.here(run_id) and run_id not in self._published
        try:
            while True:
                for event in [] if unread else await self.runs.events(run_id, after=last):
                    last = event.seq
                    yield event
                    if isinstance(event, RunEnd):
                        return
                watcher.overflowed = False
                while not watcher.overflowed:
                    if unread:  # (its id forgotten by a flood of others: storage tells)
                        unread = False
                        try:
                            async with asyncio.timeout(UNREAD_CHECK):
                                event = await watcher.queue.get()
                        except TimeoutError:
                            break
                    else:
                        event = await watcher.queue.get()
                    if event is WAKE:
                        break  # committed by another instance: storage has it
                    if event.seq <= last:
                        if isinstance(event, RunEnd):
                            yield event  # it ended before where the watcher is: say so
                            return
                        continue  # storage already gave it
                    if event.seq > last + 1:
                        break  # a gap (published before we subscribed, or cut off): re-read
                    last = event.seq
                    yield event
                    if isinstance(event, RunEnd):
                        return
        finally:
            watchers = self._watchers.get(run_id)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del self._watchers[run_id]


class SharedRunFeed(LocalRunFeed):
    """The run feed of one instance among several: local watchers as :class:`LocalRunFeed`,
    plus a wake-up for local watchers of runs executing elsewhere. The other instances are
    told of each run's new events by storage itself: every statement that writes events
    notifies ``instance|run`` on :data:`CHANNEL` as it commits (``ConversationStore.
    notify_channel``, set by the gateway) — no statement of its own, and never before the
    events can be read."""

    def __init__(self, runs: RunReader, bus: Bus, instance: str):
        super().__init__(runs)
        self.bus = bus
        self.instance = instance
        self._local: Callable[[str], bool] = lambda run_id: False
        # runs followed here that execute elsewhere: how many watchers each (the first
        # records the follow, so that the executing instance's writes notify; the last
        # removes it)
        self._following: dict[str, int] = {}
        # each run's last write of its follow (record or removal): the next one waits for it,
        # so they commit in the order they were asked for (a removal that overtook the record
        # still being written left a follow nobody took back)
        self._writing: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, local: Callable[[str], bool] | None = None) -> None:
        """``local``: whether a run was accepted here and has not ended (its events are
        published here: listened to, or followed without reading storage first)."""
        if local is not None:
            self._local = local
        self.bus.subscribe(CHANNEL, self._heard)

    def here(self, run_id: str) -> bool:
        return self._local(run_id)

    async def follow(self, run_id: str, after: int = 0, *,
                     fresh: bool = False) -> AsyncGenerator[RunEvent, None]:
        """As :meth:`LocalRunFeed.follow`; a run executing elsewhere is followed on the record
        (``follow_elsewhere``) before storage is read, so the executing instance's writes
        notify — a write whose statement began before the record was committed may not, so
        such a watcher also reads storage again now and then (after 0.25 s, doubling up to
        every :data:`FOLLOW_CHECK` seconds) until the run ends."""
        if self.here(run_id) or not hasattr(self.runs, "follow_elsewhere"):
            async for event in super().follow(run_id, after, fresh=fresh):
                yield event
            return
        checks: asyncio.Task[None] | None = None
        try:
            await self._follows(run_id, +1)  # (counted before it waits: undone in any case)
            checks = asyncio.get_running_loop().create_task(self._checks(run_id),
                                                            name=f"feed:check:{run_id}")
            async for event in super().follow(run_id, after, fresh=fresh):
                yield event
        finally:
            if checks is not None:
                checks.cancel()
            self._spawn(self._follows(run_id, -1))

    async def _follows(self, run_id: str, change: int) -> None:
        """Count a watcher here of a run executing elsewhere in (+1) or out (-1): the first
        records the follow, the last takes it back."""
        count = self._following.get(run_id, 0) + change
        if count > 0:
            self._following[run_id] = count
        else:
            self._following.pop(run_id, None)
        if (change > 0 and count == 1) or count <= 0:
            # (a task of its own: a watcher cancelled meanwhile does not cut the chain short)
            await asyncio.shield(self._write_follow(run_id, count > 0))

    def _write_follow(self, run_id: str, following: bool) -> asyncio.Task[None]:
        before = self._writing.get(run_id)

        async def write() -> None:
            if before is not None:
                await asyncio.wait([before])  # (never cancels it)
            try:
                await self.runs.follow_elsewhere(run_id, following)  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - the checks read storage all the same
                log.warning("feed: could not %s following run %s (%s)",
                            "record" if following else "take back", run_id, e)

        task = self._writing[run_id] = self._spawn(write())
        task.add_done_callback(
            lambda _: self._writing.pop(run_id) if self._writing.get(run_id) is task else None)
        return task

    async def _checks(self, run_id: str) -> None:
        delay = 0.25
        while True:
            await asyncio.sleep(delay)
            delay = min(FOLLOW_CHECK, delay * 2)
            for watcher in list(self._watchers.get(run_id, ())):
                watcher.queue.put_nowait(WAKE)

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _heard(self, payload: str | None) -> None:
        if payload is None:  # the listener was away: wake every watcher and listener (a
            targets = [w for ws in self._watchers.values() for w in ws]  # run listened to
            runs = list(self._listeners)  # may have been taken over and ended elsewhere
        else:  # meanwhile — the note that said so was lost; found by
            sender, _, run_id = payload.partition("|")  # tests/test_cluster_chaos_web.py)
            if sender == self.instance:
                return  # ours: local watchers have it already
            targets = list(self._watchers.get(run_id, ()))
            runs = [run_id]
        # a run listened to here went on elsewhere (handed over): WAKE's seq is no next
        # seq, the listener's cue to follow it from storage
        for run_id in runs:
            for listener in list(self._listeners.get(run_id, ())):
                try:
                    listener(WAKE)
                except Exception:  # (as in publish: a listener's fault is its own)
                    log.exception("feed: a listener of run %s failed; it is dropped", run_id)
                    self._unlisten(run_id, listener)
        for watcher in targets:
            watcher.queue.put_nowait(WAKE)
