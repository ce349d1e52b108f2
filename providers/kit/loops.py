"""The loops a provider runs: polling or reconnecting with backoff, and following a run's feed.

:func:`retry_until_done` is the body of a poll loop (Telegram's getUpdates, Matrix's /sync): one
call tried until it works — a rate limit waits as long as the platform asked, other failures
wait 2, 4, 8 … seconds (at most 30), credentials that no retry can fix end the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from pluto.errors import ProviderError, ProviderUnusable, RateLimited

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)
Sleep = Callable[[float], Awaitable[object]]


class Backoff:
    """Waits that grow with each failure in a row: ``first * 2**(n-1)``, at most ``cap``
    seconds; :meth:`reset` after a success."""

    def __init__(self, first: float = 2.0, cap: float = 30.0):
        self.first, self.cap = first, cap
        self.failures = 0

    def next(self) -> float:
        """Count a failure; the seconds to wait before trying again."""
        self.failures += 1
        return min(self.cap, self.first * 2.0 ** min(self.failures - 1, 60))

    def reset(self) -> None:
        self.failures = 0


async def retry_until_done(attempt: Callable[[], Awaitable[T]], *,
                           failures: tuple[type[E], ...],
                           typed: Callable[[E], ProviderError],
                           backoff: Backoff, what: str, log: logging.Logger,
                           at_once: tuple[type[BaseException], ...] = (),
                           sleep: Sleep = asyncio.sleep) -> T:
    """``await attempt()`` until it returns (the backoff is then reset). One of ``failures`` is
    typed by ``typed``: :class:`ProviderUnusable` is raised; :class:`RateLimited` waits its
    ``retry_after``, any other ``backoff.next()``, logged to ``log`` as ``<what> failed (…);
    retrying in Ns``. One of ``at_once`` (a long poll that timed out) is tried again at once."""
    while True:
        try:
            result = await attempt()
        except asyncio.CancelledError:
            raise
        except at_once:
            continue
        except failures as e:
            error = typed(e)
            if isinstance(error, ProviderUnusable):
                raise error from None
            delay = error.retry_after if isinstance(error, RateLimited) else backoff.next()
            log.warning("%s failed (%s); retrying in %.0fs", what, error, delay)
            await sleep(delay)
            continue
        backoff.reset()
        return result


async def follow(events: AsyncGenerator[T, None], handle: Callable[[T], object], *,
                 what: str, log: logging.Logger,
                 passing: tuple[type[Exception], ...] = ()) -> None:
    """Hand each of ``events`` (a run's feed) to ``handle`` until it ends; the generator is
    closed whatever happens. A failure is logged to ``log`` (``<what> failed``) and ends the
    following — one of ``passing`` is raised to the caller instead (it reads on); so is
    cancellation."""
    try:
        async with contextlib.aclosing(events) as items:
            async for item in items:
                handle(item)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        if isinstance(e, passing):
            raise
        log.exception("%s failed", what)
