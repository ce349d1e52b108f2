"""A provider's send path that stopped working for good is noticed, reported and rebuilt.

The outbox tells :class:`SendWatchdog` the outcome of every platform call. A provider whose
calls have all failed for ``window`` seconds is *wedged*: ``/readyz`` names it (503), and its
client is rebuilt (:meth:`~pluto.gateway.ports.Provider.reset`) by :meth:`SendWatchdog.run`.
After a reset the provider gets another window; if its calls still all fail, it is reset again.
A refusal or a rate limit is the platform answering, so it never counts as a failure here.
One log line when a provider wedges, one when its sends work again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pluto.errors import DeliveryRefused, ProviderError, RateLimited
from pluto.gateway.ports import Provider

log = logging.getLogger(__name__)

MAX_CHECK_INTERVAL = 5.0  # seconds between looks at most (a tenth of the window when shorter)


@dataclass(slots=True)
class _Wedge:
    since: float  # first failure of the episode
    resets: int = 0
    last_reset: float | None = None


class SendWatchdog:
    def __init__(self, *, window: float | Callable[[], float] = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_reset: Callable[[str], None] | None = None):
        self._window = window  # a number, or a function read each time (live reload)
        self.clock = clock
        self.on_reset = on_reset  # told each reset made (a metric)
        self._first_failure: dict[str, float] = {}  # provider → first failure since a success
        self._last_error: dict[str, str] = {}
        self._last_failure: dict[str, float] = {}
        self._wedges: dict[str, _Wedge] = {}  # providers found wedged, until a call succeeds

    @property
    def window(self) -> float:
        """Seconds of nothing but failures that make a provider wedged (0: never)."""
        return float(self._window() if callable(self._window) else self._window)

    # told by the outbox ----------------------------------------------------------------------

    def succeeded(self, provider: str) -> None:
        self._forget(provider, why="sends work again")

    def failed(self, provider: str, error: ProviderError) -> None:
        if isinstance(error, (DeliveryRefused, RateLimited)):
            self.succeeded(provider)  # the platform answered: the send path works
            return
        now = self.clock()
        self._first_failure.setdefault(provider, now)
        self._last_failure[provider] = now
        self._last_error[provider] = str(error)

    # asked by /readyz --------------------------------------------------------------------------

    def wedged(self) -> dict[str, str]:
        """Providers whose every call failed for ``window`` seconds, with the last error."""
        window = self.window
        if window <= 0:
            return {}
        now = self.clock()
        names = {name for name, since in self._first_failure.items() if now - since >= window}
        return {name: self._last_error.get(name, "sends fail")
                for name in sorted(names | self._wedges.keys())}

    # the supervising loop ----------------------------------------------------------------------

    async def run(self, providers: Mapping[str, Provider]) -> None:
        """Until cancelled: look every few seconds, reset what is wedged (``providers`` is
        read at each look: the running ones, by name)."""
        while True:
            window = self.window
            await asyncio.sleep(min(MAX_CHECK_INTERVAL, window / 10) if window > 0
                                else MAX_CHECK_INTERVAL)
            try:
                await self.check(providers)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug here must not end the watch
                log.exception("send watchdog: checking the providers failed")

    async def check(self, providers: Mapping[str, Provider]) -> list[str]:
        """Reset each wedged provider whose last reset (if any) had its window; returns them."""
        for gone in {*self._first_failure, *self._wedges} - providers.keys():
            self._forget(gone)
        window, now, reset = self.window, self.clock(), []
        for name, quiet in list(self._wedges.items()):  # a reset followed by a quiet window
            if (quiet.last_reset is not None and now - quiet.last_reset >= window
                    and self._last_failure.get(name, 0.0) < quiet.last_reset):
                self._forget(name, why="no send failed since its client was rebuilt")
        for name, reason in self.wedged().items():
            wedge = self._wedges.get(name)
            if wedge is None:
                wedge = self._wedges[name] = _Wedge(since=self._first_failure.get(name, now))
                log.error("%s: every send failed for %.0fs (last: %s); rebuilding its client",
                          name, now - wedge.since, reason)
            elif wedge.last_reset is not None and now - wedge.last_reset < window:
                continue  # the last reset still has its window
            provider = providers.get(name)
            if provider is not None:
                await self._reset(name, provider, wedge)
                reset.append(name)
        return reset

    async def _reset(self, name: str, provider: Provider, wedge: _Wedge) -> None:
        wedge.resets += 1
        wedge.last_reset = self.clock()
        if self.on_reset is not None:
            self.on_reset(name)
        try:
            await provider.reset()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - tried again after another window
            log.debug("%s: rebuilding the client failed (%s); trying again in %.0fs", name,
                      e, self.window)

    def _forget(self, provider: str, why: str | None = None) -> None:
        self._first_failure.pop(provider, None)
        self._last_failure.pop(provider, None)
        self._last_error.pop(provider, None)
        wedge = self._wedges.pop(provider, None)
        if wedge is not None and why is not None:
            log.warning("%s: %s (%.0fs after it wedged; %d client reset(s))", provider, why,
                        self.clock() - wedge.since, wedge.resets)
