"""The run feed: every watcher of a run (the web widget, the API's SSE and ``wait``, the terminal)
follows it the same way — "events of run R after seq N, then live".

The runner commits each event (storage gives it its ``seq``) and then publishes it here, in
order. :meth:`LocalRunFeed.follow` registers the live subscription *before* it reads storage, so
no event falls between the two, and skips any live event whose ``seq`` it has already yielded:
each event comes once, in ``seq`` order, and the stream ends after ``run.end``.

This feed lives in one process: a run executing elsewhere is not seen live here (the cluster
engine replaces it with one fed by the database).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator

from pluto.events import RunEnd, RunEvent
from pluto.storage.ports import RunReader

log = logging.getLogger(__name__)

MAX_BACKLOG = 10_000  # live events a stalled watcher may hold before it is cut off


class _Watcher:
    __slots__ = ("queue", "overflowed")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RunEvent] = asyncio.Queue()
        self.overflowed = False


class LocalRunFeed:
    def __init__(self, runs: RunReader):
        self.runs = runs
        self._watchers: dict[str, set[_Watcher]] = defaultdict(set)

    def publish(self, event: RunEvent) -> None:
        """Hand a committed event (with its ``seq``) to the run's live watchers."""
        watchers = self._watchers.get(event.run_id)
        if not watchers:
            return
        for w in watchers:
            if w.queue.qsize() >= MAX_BACKLOG:
                w.overflowed = True  # it re-reads storage when it catches up
            else:
                w.queue.put_nowait(event)

    def watched(self, run_id: str) -> bool:
        return bool(self._watchers.get(run_id))

    async def follow(self, run_id: str, after: int = 0) -> AsyncIterator[RunEvent]:
        watcher = _Watcher()
        self._watchers[run_id].add(watcher)
        last = after
        try:
            while True:
                for event in await self.runs.events(run_id, after=last):
                    last = event.seq
                    yield event
                    if isinstance(event, RunEnd):
                        return
                watcher.overflowed = False
                while not watcher.overflowed:
                    event = await watcher.queue.get()
                    if event.seq <= last:
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
