"""Supervised tasks: a provider that crashes is restarted with backoff and reported, never
silently dropped."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pluto.errors import ConfigError, DeliveryRefused, PlutoError, ProviderUnusable

# failures that restarting cannot fix: the task is reported and stopped
PERMANENT = (ProviderUnusable, DeliveryRefused, ConfigError)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TaskHealth:
    name: str
    state: str = "starting"  # starting | running | restarting | done | failed
    restarts: int = 0
    last_error: str | None = None


async def supervise(health: TaskHealth, start: Callable[[], Awaitable[None]], *,
                    min_backoff: float = 1.0, max_backoff: float = 60.0,
                    max_restarts: int | None = None) -> None:
    """Run ``start()`` until it returns; when it raises, log it and start it again, waiting
    twice as long after each quick failure (up to ``max_backoff``)."""
    backoff = min_backoff
    while True:
        began = time.monotonic()
        health.state = "running"
        try:
            await start()
            health.state = "done"
            return
        except asyncio.CancelledError:
            health.state = "done"
            raise
        except Exception as e:
            health.last_error = f"{type(e).__name__}: {e}"
            if isinstance(e, PERMANENT):  # e.g. a rejected token: restarting cannot help
                health.state = "failed"
                log.error("%s stopped: %s", health.name, e)
                return
            if max_restarts is not None and health.restarts >= max_restarts:
                health.state = "failed"
                log.error("%s failed and will not be restarted: %s", health.name,
                          health.last_error)
                raise
            if time.monotonic() - began > max_backoff:
                backoff = min_backoff  # it ran fine for a while: a fresh failure
            health.state = "restarting"
            health.restarts += 1
            expected = isinstance(e, (OSError, TimeoutError, PlutoError))
            log.error("%s crashed (%s); restart %d in %.0fs", health.name, health.last_error,
                      health.restarts, backoff, exc_info=not expected)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
