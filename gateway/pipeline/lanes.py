"""One run at a time per session: messages for a busy session wait in order in its lane;
different sessions run concurrently, as many at once as there are run slots (a lane whose next
job finds none waits in line for one: see :mod:`.overload`). A lane exists only while it has
work, so idle sessions cost nothing."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pluto.errors import StorageError
from pluto.gateway.pipeline.overload import Load

log = logging.getLogger(__name__)

J = TypeVar("J")


@dataclass(slots=True)
class _Lane(Generic[J]):
    queue: deque[J] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    running: bool = False  # a job runs (in the worker: no task of its own)
    stopping: bool = False  # the worker was cancelled to stop its job, not the lane
    slot: asyncio.Future[None] | None = None  # the slot for its next job, or its place in line


class SessionLanes(Generic[J]):
    def __init__(self, handler: Callable[[J], Awaitable[None]], *, max_queued: int = 50,
                 guard: Callable[[str], AbstractAsyncContextManager[Any]] | None = None,
                 slots: Load | None = None):
        self.handler = handler
        self.max_queued = max_queued
        self.slots = slots  # unset: no limit on lanes running at once
        # Several instances: a lane runs only while it holds its session (a lease: no other
        # instance runs that session meanwhile); losing it cancels the running job.
        self.guard = guard
        self._lanes: dict[str, _Lane[J]] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._lanes)

    def busy(self, key: str) -> bool:
        return key in self._lanes

    async def idle(self) -> None:
        """Wait until no session has work left."""
        while workers := [lane.worker for lane in self._lanes.values() if lane.worker]:
            await asyncio.wait(workers)

    def full(self, key: str) -> bool:
        """Whether a job submitted for ``key`` now would be refused."""
        lane = self._lanes.get(key)
        return self._closed or (lane is not None and len(lane.queue) >= self.max_queued)

    def submit(self, key: str, job: J) -> bool:
        """Queue a job for a session; False when the session's queue is full or we are closing."""
        if self._closed:
            return False
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        if len(lane.queue) >= self.max_queued:
            return False
        lane.queue.append(job)
        if lane.worker is None:
            self._take(lane)  # in line at once, so the next message sees it waiting
            lane.worker = asyncio.create_task(self._work(key, lane), name=f"lane:{key}")
        return True

    async def _work(self, key: str, lane: _Lane[J]) -> None:
        try:
            # checked again after the guard lets go (which awaits): a job submitted meanwhile
            # joined this lane, whose worker must not end before it ran
            while lane.queue:
                if self.guard is None:
                    await self._drain(lane)
                else:
                    async with self.guard(key):
                        await self._drain(lane)
        finally:
            self._give_back(lane)
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    async def _drain(self, lane: _Lane[J]) -> None:
        while lane.queue:
            self._take(lane)
            if lane.slot is not None:
                await lane.slot  # behind the lanes that asked first
            job = lane.queue.popleft()
            lane.running = True
            try:
                await self._guarded(job)
            except asyncio.CancelledError:
                if not lane.stopping:  # the lane itself (shutdown): not only its job
                    raise
            finally:
                lane.running = False
            if lane.stopping:  # the job was stopped (whether or not it let that show):
                lane.stopping = False  # the cancellation ends here, the lane goes on
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
            self._give_back(lane)  # the next job gets back in line, behind other sessions

    def _take(self, lane: _Lane[J]) -> None:
        if self.slots is not None and lane.slot is None:
            lane.slot = self.slots.take()

    def _give_back(self, lane: _Lane[J]) -> None:
        if lane.slot is not None:
            assert self.slots is not None
            self.slots.give_back(lane.slot)
            lane.slot = None

    def _abandon(self, key: str, lane: _Lane[J]) -> None:
        """End a lane that waits (for a slot or its session's lease) with nothing left to run:
        its place in line goes now, and a new job for the session starts a new lane."""
        self._give_back(lane)
        if lane.worker is not None:
            lane.worker.cancel()
        if self._lanes.get(key) is lane:
            del self._lanes[key]

    @staticmethod
    def _stop_job(lane: _Lane[J]) -> None:
        """Cancel the running job: the cancellation reaches it in the lane's worker, which goes
        on with the next job."""
        assert lane.worker is not None
        lane.stopping = True
        lane.worker.cancel()

    async def _guarded(self, job: J) -> None:
        try:
            await self.handler(job)
        except asyncio.CancelledError:
            raise
        except StorageError as e:  # (storage said why: no traceback; its message is taken
            log.error("a job in its session lane met a storage failure: %s", e)  # again)
        except Exception:
            log.exception("a job failed in its session lane")

    def cancel(self, key: str, *, drop_queued: bool = True) -> tuple[bool, list[J]]:
        """Cancel the session's running job; returns (was one running, the queued jobs
        dropped)."""
        lane = self._lanes.get(key)
        if lane is None:
            return False, []
        dropped: list[J] = []
        if drop_queued:
            dropped = list(lane.queue)
            lane.queue.clear()
        running = lane.running and not lane.stopping
        if running:
            self._stop_job(lane)
        elif dropped:
            self._abandon(key, lane)
        return running, dropped

    async def close(self, grace: float) -> list[J]:
        """Stop taking jobs; let queued and running ones finish for ``grace`` seconds, then
        cancel what is left (a cancelled run is recorded as such by the runner). Returns the
        queued jobs that never started."""
        self._closed = True
        workers = [lane.worker for lane in self._lanes.values() if lane.worker]
        if not workers:
            return []
        _, pending = await asyncio.wait(workers, timeout=grace)
        dropped: list[J] = []
        if pending:
            log.warning("cancelling %d run(s) still going at shutdown", len(pending))
            for key, lane in list(self._lanes.items()):
                dropped += lane.queue
                lane.queue.clear()
                if lane.running:
                    self._stop_job(lane)
                else:
                    self._abandon(key, lane)
            await asyncio.wait(pending, timeout=5)
        return dropped
