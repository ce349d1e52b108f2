"""Garbage collection in a gateway that runs for weeks.

CPython's cycle collector stops the event loop while it walks the objects it tracks, and a full
collection walks all of them: the libraries, pydantic's schemas, the agents, every open socket.
Measured in `pluto serve` under a burst of 200 new conversations: 30–45 ms, falling among their
first words. So once the gateway is up, :func:`settle` collects once and freezes what exists
(it lives as long as the process; reference counting still frees what is let go, and the
collector never walks it again).

Then the collections are paced by the event loop (:class:`Pacer`). The collector's own trigger
counts objects made and not yet freed; in a burst (1,000 questions at once) that count is
mostly the burst's own live state — requests, sockets, coroutines in flight — so collection
after collection walked the same live objects, and moved them on to be walked again in the
older generations: 35 young and 3 middle collections, ~230 ms of a stopped loop in
`python -m bench --only streaming`'s burst while questions waited for their model requests;
a single deferred collection of 200,000 live objects still stopped it for 70–90 ms. Reference
counting frees nearly all of it once the answers end, and a collection made then walks only
what is left. So a young collection is made on a tick of the loop (every :data:`TICK`) once
:data:`YOUNG` objects came, if the loop is quiet: the tick came on time and the loop's thread
used under half of the time since the last one (a burst waiting on the database is idle for
a moment, not mostly). A busy loop defers it up to :data:`BUSY_YOUNG` objects: a load that
never eases still gets its collection, one pause of ~0.1–0.2 s. The middle and full
collections follow the young ones as CPython's own do (after ten of the younger). The
collector's own trigger stays, at :data:`BACKSTOP`, for objects made while the loop is not there
to pace (a long piece of work in a thread).
"""

from __future__ import annotations

import asyncio
import gc
import time

YOUNG = 10_000  # objects made (and alive) since the last young collection, before the next
BUSY_YOUNG = 500_000  # ... made even when the loop is busy
BACKSTOP = 1_000_000  # the collector's own trigger, for objects made while the loop is away
TICK = 0.1  # seconds between the pacer's looks
LATE = 0.01  # a tick later than this: the loop is busy
BUSY_SHARE = 0.5  # ... or the loop's thread was on the CPU this share of the last tick's time


class Pacer:
    """Collects on the loop's ticks (see the module's docstring); :meth:`stop` gives the
    collector its own trigger back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, restore: tuple[int, ...]):
        self.loop = loop
        self.restore = restore
        self.collections = [0, 0, 0]  # made by the pacer, per generation
        self._last, self._cpu = loop.time(), time.thread_time()
        self._due = self._last + TICK
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        # The loop was idle for a moment (the tick came on time) and mostly (its thread's
        # CPU): a burst waiting on the database is idle for a moment but not mostly.
        now, cpu = self.loop.time(), time.thread_time()
        busy = now - self._due > LATE or cpu - self._cpu > BUSY_SHARE * (now - self._last)
        self.look(busy)
        self._last, self._cpu = self.loop.time(), time.thread_time()
        self._due = self._last + TICK
        self._handle = self.loop.call_at(self._due, self._tick)

    def look(self, busy: bool) -> int | None:
        """Collect now if it is due; the generation collected, or None."""
        young, middle, full = gc.get_count()
        if young < (BUSY_YOUNG if busy else YOUNG):
            return None
        _, every_middle, every_full = self.restore  # as CPython's own trigger chooses
        generation = 2 if full > every_full else 1 if middle > every_middle else 0
        gc.collect(generation)
        self.collections[generation] += 1
        return generation

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        gc.set_threshold(*self.restore)


def settle(loop: asyncio.AbstractEventLoop | None = None) -> Pacer | None:
    """Freeze what the started gateway holds; from then on, collect on the loop's quiet
    ticks (with ``loop``, or the running one; without a loop, only less often)."""
    gc.collect()
    gc.freeze()
    restore = gc.get_threshold()
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            gc.set_threshold(YOUNG, *restore[1:])
            return None
    gc.set_threshold(BACKSTOP, *restore[1:])
    return Pacer(loop, restore)
