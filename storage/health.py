"""Whether storage can commit right now: an engine's health, shared by both engines.

An engine that meets a failure it retries (the disk is full, the database is locked or out of
reach) says so here; the next commit that works ends the outage. ``problem`` is None while
commits work, else one short sentence ("the disk is full") with the time it started
(``since``, wall clock): what readiness reports. The start and the end of an outage are
logged once each, never per statement. Thread-safe (PostgreSQL commits in worker threads).
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("pluto.storage")


class StorageHealth:
    def __init__(self, what: str):
        self.what = what  # "SQLite" / "PostgreSQL", for the log lines
        self.problem: str | None = None
        self.since: float | None = None  # wall clock
        self._started = 0.0  # monotonic, for the outage's length
        self.given_up = 0  # changes that failed for good during this outage
        self._lock = threading.Lock()

    @property
    def ok(self) -> bool:
        return self.problem is None

    def failing(self, problem: str, detail: str) -> None:
        """A commit failed with an error worth retrying; the first one starts an outage."""
        with self._lock:
            if self.problem is not None:
                self.problem = problem  # (the latest cause; logged once already)
                return
            self.problem, self.since, self._started = problem, time.time(), time.monotonic()
            self.given_up = 0
        log.error("storage: %s cannot commit: %s (%s); retrying, and refusing what cannot "
                  "wait", self.what, problem, detail)

    def gave_up(self, count: int = 1) -> None:
        with self._lock:
            self.given_up += count

    def working(self) -> None:
        """A commit worked: the outage, if any, is over."""
        if self.problem is None:  # (the common case: no lock)
            return
        with self._lock:
            if self.problem is None:
                return
            problem, lasted, lost = self.problem, time.monotonic() - self._started, \
                self.given_up
            self.problem = self.since = None
        log.info("storage: %s commits work again after %.1f s (%s); %d change(s) could not "
                 "be saved meanwhile", self.what, lasted, problem, lost)

    def report(self) -> dict[str, object] | None:
        if self.problem is None:
            return None
        return {"problem": self.problem, "since": self.since}
