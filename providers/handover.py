"""Handing a received message to intake, and what to do when it cannot be recorded.

A platform's update is confirmed (a polling offset, a webhook's 2xx, a Socket Mode ack, a sync
token) only once intake has recorded the message in the inbox: :meth:`Intake.submit` and
:meth:`Intake.offer` return only after the inbox committed it. When they raise — the database
cannot commit, the disk is full — the message was *not* recorded, and the provider must not
confirm it: the platform delivers it again (a webhook answered 5xx, an offset kept), or, where
the platform never redelivers, the provider keeps it and tries again itself
(:meth:`HandOver.persist`).

:class:`HandOver` wraps each hand-over. A failure becomes :class:`NotRecorded` (the cause
chained, never shown to a user), and an outage is logged twice, not once per message: an error
line when recording first fails, an info line when it works again. :meth:`HandOver.pause` is
the backoff between tries while it fails (a poll loop waits instead of spinning).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pluto.errors import PlutoError
from pluto.gateway.ports import Intake, Ticket
from pluto.types import IncomingMessage

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_PAUSE = 0.25  # seconds before the first try again
MAX_PAUSE = 5.0  # storage back: every provider is receiving again within this
GIVE_UP_AFTER = 60.0  # persist(): a message the platform never sends again is kept this long

NOT_TAKEN = ("I could not take your message just now (a problem on our side); "
             "please send it again in a minute.")


class NotRecorded(PlutoError):
    """Intake could not record a message (its storage failed): it must not be confirmed to
    the platform. ``str()`` is one plain sentence; the cause is chained."""


def _cause(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class HandOver:
    """One provider's hand-overs to intake, and the state of a storage outage."""

    def __init__(self, provider: str):
        self.provider = provider
        self.failing_since: float | None = None  # monotonic; None while recording works
        self.failures = 0  # consecutive failed hand-overs
        self.refused = 0  # hand-overs refused during the current outage

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    async def __call__(self, hand: Callable[[IncomingMessage], Awaitable[T]],
                       msg: IncomingMessage) -> T:
        """``hand(msg)`` (an intake's ``submit`` or ``offer``); :class:`NotRecorded` when it
        raised — the message is not in the inbox."""
        try:
            result = await hand(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._failed(e)
            raise NotRecorded("the message could not be recorded") from e
        self._worked()
        return result

    def guard(self, intake: Intake) -> Intake:
        """``intake`` whose ``submit`` and ``offer`` go through this hand-over (raising
        :class:`NotRecorded` when the message was not recorded)."""
        return _Guarded(intake, self)

    async def persist(self, hand: Callable[[IncomingMessage], Awaitable[T]],
                      msg: IncomingMessage, *, give_up_after: float | None = None) -> T:
        """For a platform that never delivers a message again: keep trying (with backoff)
        while the outage is younger than ``give_up_after`` seconds; past that, each message
        is tried once, and :class:`NotRecorded` means: tell the person to send it again."""
        limit = GIVE_UP_AFTER if give_up_after is None else give_up_after
        while True:
            try:
                return await self(hand, msg)
            except NotRecorded:
                since = self.failing_since
                if since is None or time.monotonic() - since >= limit:
                    raise
            await self.pause()

    def backoff(self) -> float:
        """Seconds to wait before trying again, growing with each failure in a row."""
        if not self.failures:
            return 0.0
        return min(MAX_PAUSE, FIRST_PAUSE * 2 ** min(self.failures - 1, 10))

    async def pause(self) -> None:
        await asyncio.sleep(self.backoff())

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        self.refused += 1
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.error("%s: incoming messages cannot be recorded (%s); they are not confirmed "
                      "to the platform and are taken again once storage works", self.provider,
                      _cause(error))

    def _worked(self) -> None:
        if self.failing_since is not None:
            log.info("%s: incoming messages are recorded again, after %.1fs (%d hand-over(s) "
                     "refused meanwhile)", self.provider, time.monotonic() - self.failing_since,
                     self.refused)
        self.failing_since, self.failures, self.refused = None, 0, 0


class _Guarded:
    """An :class:`Intake` whose hand-overs go through a :class:`HandOver`."""

    def __init__(self, intake: Intake, handover: HandOver):
        self.intake, self.handover = intake, handover

    async def submit(self, msg: IncomingMessage) -> Ticket:
        return await self.handover(self.intake.submit, msg)

    async def offer(self, msg: IncomingMessage) -> Ticket | None:
        return await self.handover(self.intake.offer, msg)
