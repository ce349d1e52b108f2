"""Mattermost's errors as :class:`ProviderError`s, and a token that never reaches a log line.

A refused API v4 call answers ``{"id": "api.…", "message": "…", "status_code": N}``. A rate
limit is ``429`` with ``X-Ratelimit-Reset``: the seconds until the limit resets (the server's
throttling also sends ``Retry-After``); the outbox waits that long for the chat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp

from pluto.errors import DeliveryRefused, PlutoError, ProviderError
from pluto.gateway.logs import MaskSecrets
from pluto.providers.kit.errors import by_status, rate_limited, retry_after_header, transport_error

WHO = "Mattermost"

REFUSED = {403: "the bot may not do this here (not a member of the channel, or a missing "
                "permission)",
           404: "the channel, post or file was not found",
           413: "the message or file is too large",
           400: "the request was not accepted"}


class ApiError(PlutoError):
    """One refused API call, as the server said it (turned into a ProviderError by
    :func:`provider_error` before it leaves the provider)."""

    def __init__(self, status: int, error_id: str, message: str,
                 retry_after: float | None = None):
        super().__init__(f"{message} ({error_id or 'no id'}, HTTP {status})")
        self.status, self.error_id, self.message = status, error_id, message
        self.retry_after = retry_after


def api_error(status: int, body: Any, headers: Mapping[str, str]) -> ApiError:
    data = body if isinstance(body, dict) else {}
    wait = None
    if status == 429:
        reset = {"Retry-After": headers.get("X-Ratelimit-Reset")}  # seconds until it resets
        wait = retry_after_header(reset) or retry_after_header(headers)
    return ApiError(status, str(data.get("id") or "")[:100],
                    str(data.get("message") or f"HTTP {status}")[:300], wait)


def provider_error(exc: BaseException, token_env: str = "the token") -> ProviderError:
    """One plain sentence, and whether retrying can help."""
    if isinstance(exc, ApiError):
        if exc.status == 429:
            return rate_limited(WHO, 1.0 if exc.retry_after is None else exc.retry_after)
        if exc.status in REFUSED:
            what = exc.error_id or exc.status
            return DeliveryRefused(f"Mattermost refused: {REFUSED[exc.status]} ({what})")
        return by_status(exc.status, refused=f"Mattermost refused the request: {exc}",
                         failed=f"Mattermost answered with an error: {exc}",
                         unusable=f"Mattermost refused the bot token (check {token_env}): "
                                  f"{exc.message}")
    return transport_error(exc, WHO) or ProviderError(f"Mattermost error: {type(exc).__name__}")


# what a call can fail with (an answer that is not JSON: ValueError)
FAILURES = (ApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError)

_MASK = MaskSecrets(placeholder="<secret>")


def redact_secrets_in_logs(secrets: list[str]) -> None:
    """Mask ``secrets`` in this provider's and aiohttp's records (``pluto serve`` masks every
    configured secret at its handlers as well)."""
    _MASK.add(*secrets)
    _MASK.attach("pluto.providers.mattermost", "aiohttp.client", "aiohttp.websocket")
