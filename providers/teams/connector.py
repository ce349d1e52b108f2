"""The Bot Connector's REST API, the few calls the provider makes, and its errors.

``POST {serviceUrl}/v3/conversations/{id}/activities`` (a new message, a typing activity),
``POST …/activities/{replyToId}`` (a reply in a channel thread), ``PUT …/activities/{id}`` (an
update: streaming), ``DELETE …/activities/{id}``. Each call carries the app's access token; a
401 fetches a new one and tries once more. Refusals become :class:`ProviderError`s: 429 is
:class:`RateLimited` with its ``Retry-After``; 413 and 400 (a message too large or malformed),
403 and 404 (the bot is not in the conversation) are permanent.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp

from pluto.errors import DeliveryRefused, PlutoError, ProviderError, ProviderUnusable
from pluto.providers.kit.errors import rate_limited, retry_after_header, transport_error
from pluto.providers.teams.auth import AppToken, SessionFactory, fetch_json

NETWORK = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


class ConnectorError(PlutoError):
    """One refused Connector call, as the service said it."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None):
        super().__init__(f"{message} ({code or 'no code'}, HTTP {status})")
        self.status, self.code, self.retry_after = status, code, retry_after


def _error(status: int, body: Any, headers: Any) -> ConnectorError:
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    top = body if isinstance(body, dict) else {}
    message = str(err.get("message") or top.get("message") or f"HTTP {status}")
    return ConnectorError(status, str(err.get("code") or "")[:80], message[:300],
                          retry_after_header(headers))


def provider_error(exc: BaseException, default_wait: float) -> ProviderError:
    """One plain sentence, and whether trying again can help."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ConnectorError):
        if exc.status == 429:
            wait = exc.retry_after if exc.retry_after is not None else default_wait
            return rate_limited("Teams", wait)
        if exc.status == 401:
            return ProviderUnusable(f"the Bot Connector refused the bot's token: {exc}")
        if exc.status in (400, 403, 404, 413):
            return DeliveryRefused(f"Teams refused the message: {exc}")
        return ProviderError(f"Teams answered with an error: {exc}")
    return transport_error(exc, "Teams") or ProviderError(f"Teams error: {type(exc).__name__}")


class Connector:
    def __init__(self, session: SessionFactory, token: AppToken, default_wait: float):
        self.session, self.token, self.default_wait = session, token, default_wait

    @staticmethod
    def url(service_url: str, conversation: str, activity: str | None = None) -> str:
        base = f"{service_url.rstrip('/')}/v3/conversations/{quote(conversation, safe='')}"
        return f"{base}/activities" + (f"/{quote(activity, safe='')}" if activity else "")

    async def post(self, service_url: str, conversation: str, activity: dict[str, Any],
                   reply_to: str | None = None) -> str:
        body = await self._call("POST", self.url(service_url, conversation, reply_to), activity)
        return str(body.get("id") or "") if isinstance(body, dict) else ""

    async def update(self, service_url: str, conversation: str, activity_id: str,
                     activity: dict[str, Any]) -> None:
        await self._call("PUT", self.url(service_url, conversation, activity_id),
                         {**activity, "id": activity_id})

    async def delete(self, service_url: str, conversation: str, activity_id: str) -> None:
        """Remove a message (one already gone counts as removed)."""
        await self._call("DELETE", self.url(service_url, conversation, activity_id), None,
                         gone_ok=True)

    async def _call(self, method: str, url: str, payload: dict[str, Any] | None, *,
                    gone_ok: bool = False) -> Any:
        try:
            for attempt in (1, 2):
                token = await self.token.get()
                status, body, headers = await self._send(method, url, payload, token)
                if status == 401 and attempt == 1:
                    self.token.invalidate(token)  # expired or revoked early: a new one, once
                    continue
                if status >= 400 and not (gone_ok and status == 404):
                    raise _error(status, body, headers)
                return body
        except (ConnectorError, *NETWORK) as e:
            raise provider_error(e, self.default_wait) from None

    async def _send(self, method: str, url: str, payload: dict[str, Any] | None,
                    token: str) -> tuple[int, Any, Any]:
        return await fetch_json(self.session(), method, url, json=payload,
                                headers={"Authorization": f"Bearer {token}"})
