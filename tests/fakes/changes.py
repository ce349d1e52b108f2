"""What a fake platform changed, for tests to wait on: every fake's state notes each change
(:meth:`Changes._notify`), and a test waits for a condition (:meth:`Changes.wait_until`), woken
by the changes — never by a fixed sleep."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Changes:
    """Mixin for a fake's state, which sets ``self._changed = asyncio.Event()`` in its
    ``__init__`` and names itself in :attr:`FAKE` (for the timeout's message)."""

    FAKE = "platform"
    _changed: asyncio.Event

    def _notify(self) -> None:
        """Something changed: wake whoever waits."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_change(self, timeout: float | None) -> None:
        """Until the next change, or ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):  # (no change in time: the caller looks again)
            await asyncio.wait_for(self._changed.wait(), timeout)

    _wait_change = wait_change

    async def wait_until(self, check: Callable[[], T], timeout: float = 5.0,
                         what: str = "the condition") -> T:
        """``check()``'s first truthy value; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (value := check()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"fake {self.FAKE}: {what} did not happen in {timeout}s")
            await self.wait_change(min(remaining, 0.05))
        return value
