"""Overload: say so early rather than take work that cannot finish in its budget.

:class:`Load` holds the gateway's run slots (``gateway.max_running`` runs at once; a session
lane whose next run finds none waits in line for one, in arrival order) and watches how late
the event loop wakes. :meth:`Load.refusal` says, in O(1), whether a new message should get the
one-line busy notice instead: runs really wait beyond the line (``max_waiting``), or the loop
has been late by ``busy_lag_seconds`` or more on each of its last ``LATE_IN_A_ROW`` wake-ups
*and* runs are waiting for a slot. A one-off stall (a slow import, a long GC pause) makes one
wake-up late and refuses nothing; neither does a late loop with nobody in line (the lag is not
the runs' doing, and a slot is free for the new message). The pipeline asks it for every
message after commands, so ``/stop`` and ``/help`` are never refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from pluto.settings import GatewayLimits

log = logging.getLogger(__name__)

Reason = Literal["waiting", "lag"]

TICK = 0.1  # seconds between the lag monitor's wake-ups
WINDOW = 10  # ticks: the lag is the worst of about the last second
LATE_IN_A_ROW = 3  # wake-ups each at least busy_lag_seconds late: the loop is late persistently
LOG_EVERY = 10.0  # seconds: refusals are logged at most this often, summed
WHY = {"waiting": "runs waiting (max_waiting)", "lag": "a late event loop (busy_lag_seconds)"}


class Load:
    """Run slots, the line for them, and the event loop's lag."""

    def __init__(self, limits: Callable[[], GatewayLimits], *,
                 clock: Callable[[], float] = time.monotonic):
        self.limits = limits  # the settings in force (live reload swaps them)
        self.clock = clock
        self.running = 0  # slots held
        self.lag = 0.0  # seconds: how late the loop woke, at worst, in the last ~1 s
        self.sustained_lag = 0.0  # seconds: the least late of the last LATE_IN_A_ROW wake-ups
        self._recent: deque[float] = deque(maxlen=WINDOW)  # how late each recent wake-up was
        self._line: deque[asyncio.Future[None]] = deque()
        self._monitor: asyncio.Task[None] | None = None
        self._refused: dict[str, int] = {}  # since the last warning
        self._logged = float("-inf")

    @property
    def waiting(self) -> int:
        return len(self._line)

    # slots ----------------------------------------------------------------------------------

    def take(self) -> asyncio.Future[None]:
        """Ask for a slot: the future is done once it is the caller's (at once when one is
        free). Until then the caller waits in line, and counts as waiting."""
        fut = asyncio.get_running_loop().create_future()
        self._line.append(fut)
        self._hand_over()
        return fut

    def give_back(self, fut: asyncio.Future[None]) -> None:
        """Return a slot taken with :meth:`take`, or leave the line if it was not handed over
        yet (a stopped or cancelled wait)."""
        if fut.done() and not fut.cancelled():
            self.running -= 1
        else:
            fut.cancel()
            with contextlib.suppress(ValueError):  # (already skipped by a hand-over)
                self._line.remove(fut)
        self._hand_over()

    def _hand_over(self) -> None:
        limit = self.limits().max_running
        while self._line and self.running < limit:
            fut = self._line.popleft()
            if not fut.done():  # a cancelled wait leaves the line when given back
                self.running += 1
                fut.set_result(None)

    # refusals -------------------------------------------------------------------------------

    def refusal(self) -> Reason | None:
        """Why a new message should get the busy notice now, or None to take it."""
        limits = self.limits()
        if self.running >= limits.max_running and len(self._line) >= limits.max_waiting:
            return "waiting"
        if (limits.busy_lag_seconds and self._line
                and self.sustained_lag >= limits.busy_lag_seconds):
            return "lag"  # late persistently, and runs already wait for a slot
        return None

    def refused(self, reason: Reason) -> None:
        """Note a refusal, for the warning (at most one every ``LOG_EVERY`` seconds)."""
        self._refused[reason] = self._refused.get(reason, 0) + 1
        self._warn()

    def _warn(self) -> None:
        now = self.clock()
        if not self._refused or now - self._logged < LOG_EVERY:
            return
        counts = ", ".join(f"{n} for {WHY[reason]}" for reason, n in self._refused.items())
        log.warning("overloaded: %d message(s) answered with the busy notice (%s); now %d "
                    "running, %d waiting for a slot, the loop up to %.0f ms late",
                    sum(self._refused.values()), counts, self.running, len(self._line),
                    self.lag * 1000)
        self._refused.clear()
        self._logged = now

    def report(self) -> dict[str, float]:
        """For ``/readyz``: informative; load never makes the gateway unready."""
        return {"running": self.running, "waiting": len(self._line),
                "lag_ms": round(self.lag * 1000, 1)}

    # the lag monitor ------------------------------------------------------------------------

    def start(self) -> None:
        if self._monitor is None:
            self._monitor = asyncio.create_task(self._watch(), name="overload:lag")

    async def stop(self) -> None:
        task, self._monitor = self._monitor, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        """Sleep a tick and see how late the loop wakes: the time other work held it."""
        while True:
            before = self.clock()
            await asyncio.sleep(TICK)
            self.woke_late(max(0.0, self.clock() - before - TICK))

    def woke_late(self, seconds: float) -> None:
        """The monitor woke ``seconds`` late (tests call it to drive the lag)."""
        self._recent.append(seconds)
        self.lag = max(self._recent)
        if len(self._recent) >= LATE_IN_A_ROW:
            self.sustained_lag = min(list(self._recent)[-LATE_IN_A_ROW:])
        self._warn()  # what was refused since the last warning, once it is due
