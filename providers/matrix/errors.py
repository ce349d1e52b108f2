"""Matrix's errors as :class:`ProviderError`s, and an HTTP client that keeps what mautrix drops.

A homeserver answers a refused call with ``{"errcode": "M_…", "error": "…"}``; a rate limit is
``429 M_LIMIT_EXCEEDED`` with ``retry_after_ms`` in the body (and, since Matrix 1.10, a
``Retry-After`` header). mautrix raises typed errors but does not keep ``retry_after_ms``:
:class:`HomeserverApi` reads it into the error (``retry_after``) so the outbox waits as long as
the homeserver asked.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import ClientResponse
from mautrix.api import HTTPAPI, Method
from mautrix.errors import MatrixError, MatrixRequestError, make_request_error
from yarl import URL

from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable
from pluto.providers.kit.errors import (by_status, rate_limited, retry_after_header,
                                        transport_error)
from pluto.gateway.logs import MaskSecrets

CREDENTIALS = {"M_UNKNOWN_TOKEN": "the access token was rejected (expired, logged out or wrong)",
               "M_MISSING_TOKEN": "no access token was sent",
               "M_USER_DEACTIVATED": "the bot's account is deactivated"}
PERMANENT = {"M_FORBIDDEN": "the bot may not do this here (not in the room, or no permission)",
             "M_NOT_FOUND": "the room or event was not found",
             "M_TOO_LARGE": "the message or file is too large",
             "M_BAD_JSON": "the request was malformed", "M_NOT_JSON": "the request was malformed",
             "M_INVALID_PARAM": "a parameter is not valid",
             "M_UNKNOWN_ENDPOINT": "the homeserver does not offer this API"}


class HomeserverApi(HTTPAPI):
    """mautrix's HTTP client, plus the wait a rate limit asks for (``error.retry_after``)."""

    async def _send(self, method: Method, url: URL, content: Any, query_params: dict[str, str],
                    headers: dict[str, str]) -> tuple[Any, ClientResponse]:
        request = self.session.request(str(method), url, data=content, params=query_params,
                                       headers=headers)
        async with request as response:
            if 200 <= response.status < 300:
                return await response.json(content_type=None), response
            text = await response.text()
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            data = data if isinstance(data, dict) else {}
            error = make_request_error(http_status=response.status, text=text,
                                       errcode=data.get("errcode"), message=data.get("error"))
            error.retry_after = _retry_after(data, response)  # type: ignore[attr-defined]
            raise error


def _retry_after(data: dict[str, Any], response: ClientResponse) -> float | None:
    ms = data.get("retry_after_ms")
    if isinstance(ms, (int, float)) and ms >= 0:
        return ms / 1000
    return retry_after_header(response.headers)


def errcode(exc: MatrixRequestError) -> str:
    return str(getattr(exc, "errcode", None) or "")


def provider_error(exc: BaseException) -> ProviderError:
    """One plain sentence, and whether retrying can help."""
    if isinstance(exc, MatrixRequestError):
        code, status = errcode(exc), getattr(exc, "http_status", 0)
        if code == "M_LIMIT_EXCEEDED" or status == 429:
            wait = getattr(exc, "retry_after", None)
            wait = 1.0 if wait is None else wait  # the spec's field is optional
            return rate_limited("the Matrix homeserver", wait)
        if code in CREDENTIALS or status == 401:
            return ProviderUnusable(f"Matrix refused: {CREDENTIALS.get(code, 'unauthorized')} "
                                    f"({code or status})")
        if code in PERMANENT:
            return DeliveryRefused(f"Matrix refused: {PERMANENT[code]} ({code})")
        return by_status(
            status, refused=f"Matrix refused the request ({code or status})",
            failed=f"the Matrix homeserver answered with an error ({code or status})")
    if (transport := transport_error(exc, "the Matrix homeserver")) is not None:
        return transport
    if isinstance(exc, MatrixError):
        return ProviderError(f"the Matrix request failed ({type(exc).__name__})")
    return ProviderError(f"Matrix error: {type(exc).__name__}")


# what a homeserver call can fail with (a reply that is not JSON: ValueError)
FAILURES = (MatrixError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError)


async def call(coro: Any) -> Any:
    """Await a homeserver call; its failure as a :class:`ProviderError`."""
    try:
        return await coro
    except FAILURES as e:
        raise provider_error(e) from None


_MASK = MaskSecrets(placeholder="<secret>")


def redact_secrets_in_logs(secrets: list[str]) -> None:
    """Mask ``secrets`` in the records of mautrix and this provider (``pluto serve`` masks every
    configured secret at its handlers as well)."""
    _MASK.add(*secrets)
    _MASK.attach("mau", "mautrix", "pluto.providers.matrix")
