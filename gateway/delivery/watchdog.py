"""A provider's send path that stopped working for good is noticed, reported and rebuilt.

The outbox tells :class:`SendWatchdog` the outcome of every platform call. A provider whose
calls have all failed for ``window`` seconds is *wedged*: ``/readyz`` names it (503), and its
client is rebuilt (:meth:`~pluto.gateway.ports.Provider.reset`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pluto.errors import ProviderError

log = logging.getLogger(__name__)


class SendWatchdog:
    def __init__(self, *, window: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.clock = clock
        self._first_failure: dict[str, float] = {}  # provider → first failure since a success
        self._last_error: dict[str, str] = {}

    def succeeded(self, provider: str) -> None:
        self._first_failure.pop(provider, None)
        self._last_error.pop(provider, None)

    def failed(self, provider: str, error: ProviderError) -> None:
        self._first_failure.setdefault(provider, self.clock())
        self._last_error[provider] = str(error)

    def wedged(self) -> dict[str, str]:
        """Providers whose every call failed for ``window`` seconds, with the last error."""
        now = self.clock()
        return {name: self._last_error.get(name, "sends fail")
                for name, since in self._first_failure.items() if now - since >= self.window}
