"""Rate limits (``5/minute`` per user, ``30/minute`` per chat) and notices sent once.

A limit is a token bucket: ``count`` messages, refilled evenly over ``seconds``. When a message
is over a limit, the sender is told once — one polite notice per streak of limited messages,
not one per message; the next admitted message ends the streak. Buckets that are full again are
forgotten, so idle users cost nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*(?:/|per)\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*$", re.I)


@dataclass(frozen=True, slots=True)
class Rate:
    count: int
    seconds: float

    def __str__(self) -> str:
        for unit, secs in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0)):
            if self.seconds == secs:
                return f"{self.count} per {unit}"
        return f"{self.count} per {self.seconds:g} seconds"


def parse_rate(text: object) -> Rate:
    """``"5/minute"``, ``"100 per hour"``, ``"3/10s"`` → :class:`Rate`; ValueError otherwise."""
    m = _RATE.match(str(text)) if isinstance(text, (str, int)) else None
    unit = m and _UNITS.get(m.group(3).lower())
    if m is None or unit is None:
        raise ValueError(f"expected a rate like '5/minute', '100/hour' or '3/10s', got {text!r}")
    count, seconds = int(m.group(1)), float(m.group(2) or 1) * unit
    if count < 1 or seconds <= 0:
        raise ValueError(f"a rate needs at least 1 message per a positive time, got {text!r}")
    return Rate(count, seconds)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    noticed: bool = False


@dataclass(frozen=True, slots=True)
class Limited:
    """A message over a limit: which one, how long until the next is admitted, and whether
    this is the first of the streak (the one that gets a notice)."""

    key: Hashable
    rate: Rate
    retry_after: float
    notify: bool


class RateLimiter:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000):
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[Hashable, _Bucket] = {}
        self._since_prune = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def acquire(self, limits: Sequence[tuple[Hashable, Rate]]) -> Limited | None:
        """Take one message from every bucket, or from none when one of them is empty."""
        now = self.clock()
        self._maybe_prune(now)
        buckets = [(key, rate, self._refill(key, rate, now)) for key, rate in limits]
        for key, rate, bucket in buckets:
            if bucket.tokens < 1:
                wait = (1 - bucket.tokens) * rate.seconds / rate.count
                first, bucket.noticed = not bucket.noticed, True
                return Limited(key, rate, wait, first)
        for _, _, bucket in buckets:
            bucket.tokens -= 1
            bucket.noticed = False
        return None

    def _refill(self, key: Hashable, rate: Rate, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(rate.count), now)
            return bucket
        bucket.tokens = min(float(rate.count),
                            bucket.tokens + (now - bucket.updated) * rate.count / rate.seconds)
        bucket.updated = now
        return bucket

    def _maybe_prune(self, now: float) -> None:
        self._since_prune += 1
        if self._since_prune < 1000 and len(self._buckets) < self.max_keys:
            return
        self._since_prune = 0
        # a bucket idle for a day is full again for any sane rate; also cap memory
        stale = [k for k, b in self._buckets.items() if now - b.updated > 86400.0]
        for k in stale:
            del self._buckets[k]
        while len(self._buckets) >= self.max_keys:
            del self._buckets[next(iter(self._buckets))]


class SharedRateLimiter:
    """The same limits kept in the database (several instances): a user's 5/minute holds
    whichever instance their messages reach."""

    def __init__(self, buckets: Any):  # pluto.storage.ports.RateBucketStore
        self.buckets = buckets

    async def acquire(self, limits: Sequence[tuple[Hashable, Rate]]) -> Limited | None:
        taken = await self.buckets.take([(repr(key), rate.count, rate.seconds)
                                         for key, rate in limits])
        if taken is None:
            return None
        i, wait, first = taken
        key, rate = limits[i]
        return Limited(key, rate, wait, first)


class OncePer:
    """Says yes to a key at most once per ``window`` seconds (refusals, pairing reminders)."""

    def __init__(self, window: float, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000):
        self.window = window
        self.clock = clock
        self.max_keys = max_keys
        self._last: dict[Hashable, float] = {}

    def __len__(self) -> int:
        """How many keys it remembers (bounded by ``max_keys``)."""
        return len(self._last)

    def due(self, key: Hashable) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        if len(self._last) >= self.max_keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.window}
            while len(self._last) >= self.max_keys:
                del self._last[next(iter(self._last))]
        self._last[key] = now
        return True


def limited_notice(limited: Limited, scope: str) -> str:
    wait = max(1, round(limited.retry_after))
    who = "You are" if scope == "user" else "This chat is"
    return (f"{who} sending messages faster than I can answer (limit: {limited.rate}). "
            f"Please wait about {wait} second{'s' if wait != 1 else ''}; messages sent until "
            f"then are not answered.")
