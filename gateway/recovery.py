"""What brings the gateway back by itself after storage failed, and what readiness reads.

- **The data dir's disk.** Its free space, read off the loop (``statvfs``) and cached a few
  seconds: below :data:`DISK_LOW_BYTES` the gateway is not ready (a full disk refuses commits).
- **The probe.** While the store's engine reports a problem, a cheap commit every
  :data:`PROBE_SECONDS`, so readiness returns when storage does, with no traffic needed.
- **The sweep** (one process per database, SQLite): runs left ``queued`` or ``running`` that no
  task of this process runs any more (their commits failed for good, so they could not even be
  ended) are recorded interrupted and their messages answered again; messages the inbox holds
  unhandled that nothing here is handling (a hand-over whose handling met a storage error) are
  handled again; answers that were saved but whose reply could not be recorded are sent. It
  runs every :data:`SWEEP_SECONDS`, and soon after an outage ends. At start the
  gateway recovers what a dead process left (``recover_interrupted``); this is the same for a
  process that lives on. Several instances (PostgreSQL) have the cluster's own take-over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pluto.events import RunEvent
from pluto.types import IncomingMessage

log = logging.getLogger(__name__)

DISK_LOW_BYTES = 8 * 1024 * 1024  # free space under this: not ready
DISK_CACHE_SECONDS = 3.0
PROBE_SECONDS = 2.0
SWEEP_SECONDS = 180.0
SETTLE_SECONDS = 5.0  # a run or a message younger than this is left alone by the sweep


Resend = Callable[[str, IncomingMessage, RunEvent], Awaitable[object]]


class Requeue(Protocol):
    """A provider's intake, as the sweep sees it."""

    def requeue(self, payloads: list[dict[str, Any]], busy: Collection[str]) -> int: ...


@dataclass(slots=True)
class Disk:
    free: int | None = None  # bytes available to us; None: unknown
    checked: float = 0.0  # monotonic


class Recovery:
    def __init__(self, store: Any, data_dir: Path, *, live: Callable[[], Mapping[str, Any]],
                 intakes: Mapping[str, Requeue], publish: Callable[[RunEvent], None],
                 resend: Resend | None = None, sweep: bool = True):
        self.store = store
        self.data_dir = data_dir
        self.live = live  # run id -> message id (or None) of each run this process holds
        self.intakes = intakes
        self.publish = publish
        self.resend = resend  # (provider, message, answer): a saved answer, to the outbox
        # runs whose end or reply storage could not record: run id -> (provider, message)
        self.stranded: dict[str, tuple[str, IncomingMessage]] = {}
        self.sweeps = sweep  # False with several instances: the cluster takes over
        self.disk = Disk()
        self._task: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[bool] | None = None
        self._wake = asyncio.Event()

    # readiness ------------------------------------------------------------------------------

    def problems(self) -> dict[str, dict[str, str]]:
        """What keeps the gateway from being ready: name -> {"state": a word, "reason": one
        sentence} (public callers see the state only)."""
        found: dict[str, dict[str, str]] = {}
        health = getattr(getattr(self.store, "engine", None), "health", None)
        if health is not None and health.problem is not None:
            found["storage"] = {"state": "failing", "reason": f"storage cannot commit: "
                                                              f"{health.problem}"}
        free = self.disk.free
        if free is not None and free < DISK_LOW_BYTES:
            found["disk"] = {"state": "full", "reason": f"the data dir's disk is full "
                                                        f"({free / 1e6:.1f} MB free)"}
        return found

    async def refresh(self) -> None:
        """The disk's free space, read again when the cached figure is a few seconds old."""
        if time.monotonic() - self.disk.checked < DISK_CACHE_SECONDS:
            return
        self.disk.checked = time.monotonic()
        try:
            self.disk.free = await asyncio.to_thread(_free_bytes, self.data_dir)
        except OSError as e:
            log.debug("recovery: statvfs of the data dir failed: %s", e)
            self.disk.free = None

    # the loop --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="recovery")

    async def stop(self) -> None:
        for task in (self._task, self._probing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._probing = None

    def soon(self) -> None:
        """Sweep at the next tick."""
        self._wake.set()

    def strand(self, run_id: str, provider: str, msg: IncomingMessage) -> None:
        """A run whose end or reply storage could not record: seen to at the next sweep."""
        self.stranded[run_id] = (provider, msg)
        self._wake.set()

    async def _run(self) -> None:
        last_sweep = time.monotonic()
        owed = False  # a sweep is owed: an outage ended, or a run could not be ended
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), PROBE_SECONDS)
            owed = owed or self._wake.is_set()
            self._wake.clear()
            try:
                await self.refresh()
                if self._probe():
                    owed = True
                    continue
                if self.sweeps and (owed or time.monotonic() - last_sweep >= SWEEP_SECONDS):
                    last_sweep = time.monotonic()
                    await self.sweep()
                    owed = False
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - storage is away: next time
                log.warning("recovery: %s", e)

    def _probe(self) -> bool:
        """Whether storage reports a problem; if so, a probe is on its way (one at a time)."""
        engine = getattr(self.store, "engine", None)
        health = getattr(engine, "health", None)
        if engine is None or health is None or health.problem is None:
            return False
        if self._probing is None or self._probing.done():
            self._probing = asyncio.create_task(engine.probe(), name="recovery:probe")
        return True

    # the sweep -------------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Runs nobody here runs any more, and messages nobody here handles: answered again.
        Returns how many messages were queued again."""
        live = dict(self.live())
        conversations = self.store.conversations
        stuck = [r for r in await conversations.unfinished_runs(time.time() - SETTLE_SECONDS)
                 if r not in live]
        if stuck:
            for end in await conversations.recover_runs(stuck):
                self.publish(end)
            log.warning("recovery: %d run(s) could not be finished (storage failed); their "
                        "messages are answered again", len(stuck))
        await self._send_saved(live)
        busy = {m for m in live.values() if m}
        queued = 0
        for name, intake in self.intakes.items():
            payloads = await self.store.inbound.unhandled(name, older_than=SETTLE_SECONDS)
            queued += intake.requeue(payloads, busy)
        if queued:
            log.warning("recovery: %d message(s) whose handling storage had cut short are "
                        "handled again", queued)
        return queued

    async def _send_saved(self, live: Mapping[str, Any]) -> None:
        """Answers that were saved but whose reply could not be recorded: sent now (under the
        run's id, so once)."""
        for run_id, (provider, msg) in list(self.stranded.items()):
            if run_id in live:
                continue
            answer = await self.store.conversations.undelivered_answer(run_id)
            if answer is not None and self.resend is not None:
                log.warning("recovery: sending the saved answer of run %s, whose reply storage "
                            "could not record", run_id)
                await self.resend(provider, msg, answer)
            del self.stranded[run_id]


def _free_bytes(path: Path) -> int:
    while not path.exists() and path.parent != path:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
