"""A platform's refusals as typed :class:`~pluto.errors.ProviderError`\\ s.

The outbox, the one place retries live, reads the type: :class:`RateLimited` waits its
``retry_after``, :class:`DeliveryRefused` is final for the message, :class:`ProviderUnusable`
stops the provider (credentials), any other :class:`ProviderError` is tried again. Each
provider keeps its own table of the platform's error codes; these are the parts all share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp

from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable, RateLimited


def retry_after_header(headers: Mapping[str, Any] | None) -> float | None:
    """Seconds in a ``Retry-After`` header (any case; never negative), or None."""
    for name, value in dict(headers or {}).items():
        if str(name).lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return None
    return None


def by_status(status: int, *, refused: str, failed: str,
              unusable: str | None = None) -> ProviderError:
    """An HTTP status the platform answered with, past its own error codes: 401 (with an
    ``unusable`` sentence) → :class:`ProviderUnusable`; other 4xx → :class:`DeliveryRefused`
    (``refused``); anything else → :class:`ProviderError` (``failed``), tried again."""
    if status == 401 and unusable is not None:
        return ProviderUnusable(unusable)
    if 400 <= status < 500:
        return DeliveryRefused(refused)
    return ProviderError(failed)


def rate_limited(who: str, wait: float) -> RateLimited:
    """``<who> asked to slow down for Ns``, with that wait."""
    return RateLimited(f"{who} asked to slow down for {wait:g}s", retry_after=wait)


def transport_error(exc: BaseException, who: str) -> ProviderError | None:
    """A timeout or a failed connection to ``who`` (``"Slack"``, ``"the Matrix homeserver"``)
    as a ProviderError to try again; None for anything else."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return ProviderError(f"{who} did not answer in time")
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        # no connection made: the request never left; anything later (a dropped connection,
        # a broken answer) may have been taken
        unsent = isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError))
        return ProviderError(f"could not reach {who} ({type(exc).__name__})", unsent=unsent)
    return None
