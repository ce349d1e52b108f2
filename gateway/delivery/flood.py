"""Flood control: one state per destination that every send consults.

When a platform answers "too many requests, retry after N seconds" for a chat, nothing goes to
that chat until the time is up — not the live preview's next edit, not the final reply, not a
notice, not a reply the outbox takes up again after a restart. The deadline is kept in storage
(:class:`~pluto.storage.ports.FloodStore`) as wall-clock time, so a gateway restarted inside
the window still waits it out. Other chats are never held up.

Several instances (PostgreSQL): the statement that keeps a hold tells every instance at once
(``NOTIFY``), and each takes it up (:meth:`FloodControl.heard`) — a reply another instance
sends to the chat meanwhile waits too, and no instance reads the holds now and then.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pluto.storage.ports import FloodStore

log = logging.getLogger(__name__)

ChatKey = tuple[str, str]  # (provider name, chat id)
MAX_KEYS = 10_000  # expired holds are dropped from memory past this many
_now = time.time  # wall clock: a deadline is kept across restarts (tests may replace it)


class FloodControl:
    def __init__(self, store: FloodStore | None = None):
        self.store = store
        self._until: dict[ChatKey, float] = {}  # epoch seconds
        # set when holds kept elsewhere come as notes (:meth:`heard`): the outbox's sweep need
        # not read them now and then
        self.followed = False
        self._reading: asyncio.Task[int] | None = None

    async def load(self) -> int:
        """Take up the holds still in force (at start); returns how many."""
        if self.store is None:
            return 0
        now = _now()
        try:
            holds = await self.store.current(now)
        except Exception as e:  # noqa: BLE001 - storage trouble never stops a send
            log.error("flood control: the kept holds could not be read: %s", e)
            return 0
        for provider, chat_id, until in holds:
            key = (provider, chat_id)
            self._until[key] = max(self._until.get(key, 0.0), until)
        if holds:
            log.info("flood control: %d chat(s) still inside a platform's retry-after window",
                     len(holds))
        return len(holds)

    def remaining(self, key: ChatKey) -> float:
        """Seconds before anything may be sent to ``key`` (0 when it may now)."""
        until = self._until.get(key)
        if until is None:
            return 0.0
        left = until - _now()
        if left <= 0:
            del self._until[key]
            return 0.0
        return left

    async def wait(self, key: ChatKey) -> None:
        """Return once ``key`` may be sent to (a hold made meanwhile is waited out too)."""
        while (left := self.remaining(key)) > 0:
            await asyncio.sleep(left)

    async def hold(self, key: ChatKey, seconds: float) -> None:
        """The platform asked to wait ``seconds`` before the next call for ``key``; kept."""
        until = _now() + max(0.0, seconds)
        if until <= self._until.get(key, 0.0):
            return
        self._until[key] = until
        if len(self._until) > MAX_KEYS:
            now = _now()
            self._until = {k: t for k, t in self._until.items() if t > now}
        log.info("%s: chat %s is flood controlled for %.1fs", key[0], key[1], seconds)
        if self.store is not None:
            try:
                await self.store.hold(key[0], key[1], until)
            except Exception as e:  # noqa: BLE001 - storage trouble never stops a send  # held in memory all the same
                log.error("flood control: a hold could not be kept: %s", e)

    def heard(self, payload: str | None) -> None:
        """A note from the database: ``hold|<provider>|<chat>|<seconds left>`` — a hold some
        instance kept (this one's too: the later deadline wins) — or None: notes may have been
        missed, so every hold in force is read again."""
        if payload is None:
            if self._reading is None or self._reading.done():
                self._reading = asyncio.get_running_loop().create_task(
                    self.load(), name="flood:load")
            return
        kind, _, rest = payload.partition("|")
        provider, _, rest = rest.partition("|")
        chat_id, _, left = rest.rpartition("|")
        try:
            seconds = float(left)
        except ValueError:
            seconds = float("nan")
        if kind != "hold" or not provider or not chat_id or not math.isfinite(seconds):
            log.warning("flood control: a note that is not a hold was ignored: %.80r", payload)
            return
        key = (provider, chat_id)
        until = _now() + max(0.0, seconds)
        if until > self._until.get(key, 0.0):
            self._until[key] = until
