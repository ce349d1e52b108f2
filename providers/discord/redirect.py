"""The one place that points discord.py at another Discord (a proxy, a test fake).

discord.py reads two class attributes: ``discord.http.Route.BASE`` when each request's route is
built, and ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` at connect and after a session
is invalidated. Both are process-global, so they are set for the life of the process (one
Discord bot per process), and only when ``pluto.yaml`` asks for it.
"""

from __future__ import annotations

import logging

import discord.gateway
import discord.http
import yarl

log = logging.getLogger(__name__)


def point_discord_at(api_base: str | None, gateway_url: str | None) -> None:
    """Send discord.py's REST calls to ``api_base`` (``…/api/v10``) and open its gateway
    websocket at ``gateway_url``; ``None`` leaves that one as it is."""
    if api_base is not None:
        discord.http.Route.BASE = api_base
        log.info("discord: REST API at %s", api_base)
    if gateway_url is not None:
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)
        log.info("discord: gateway at %s", gateway_url)
