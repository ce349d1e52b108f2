"""Socket Mode: events over a websocket the app opens, with the app-level token (``xapp-…``).

The first websocket URL is asked for here (``apps.connections.open``), so a rejected app token
or an unreachable Slack fails the provider's start with one clear sentence instead of the SDK's
endless "retrying" loop; from then on the SDK's client keeps the connection: it reconnects when
Slack asks (``disconnect`` messages, refreshes) or the connection drops. Envelopes are
acknowledged once bolt has acknowledged the event: after intake recorded its message (an
envelope whose message could not be recorded is not acknowledged, so Slack sends it again).
"""

from __future__ import annotations

import asyncio
import logging

from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable
from pluto.providers.slack.errors import provider_error

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0


class _OneLine(logging.Filter):
    """The SDK logs each failed (re)connection with a traceback; one line says as much."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            record.exc_info, record.exc_text = None, None
        return True


SDK_LOG = logging.getLogger("pluto.providers.slack.socket_mode.sdk")
SDK_LOG.addFilter(_OneLine())


async def serve_socket_mode(app: AsyncApp, client: AsyncWebClient, app_token: str,
                            token_env: str) -> None:
    """Receive events until cancelled; raises :class:`ProviderError` when it cannot start."""
    handler = AsyncSocketModeHandler(app, app_token, logger=SDK_LOG)  # in the running loop:
    try:  # it opens an aiohttp session at once, closed below whatever happens
        handler.client.wss_uri = await _first_url(client, app_token, token_env)
        try:
            await asyncio.wait_for(handler.connect_async(), CONNECT_TIMEOUT)
        except asyncio.TimeoutError:
            raise ProviderError("could not open the Socket Mode connection to Slack") from None
        await asyncio.Event().wait()
    finally:
        await handler.close_async()


async def _first_url(client: AsyncWebClient, app_token: str, token_env: str) -> str:
    try:
        found = await client.apps_connections_open(app_token=app_token)
    except SlackApiError as e:
        error = provider_error(e)
        if isinstance(error, (ProviderUnusable, DeliveryRefused)):
            raise ProviderUnusable(f"{error} (the app-level token in {token_env})") from None
        raise error from None
    except (SlackClientError, OSError, asyncio.TimeoutError) as e:
        raise provider_error(e) from None
    url = found.get("url")
    if not isinstance(url, str) or not url:
        raise ProviderError("Slack gave no Socket Mode address")
    return url
