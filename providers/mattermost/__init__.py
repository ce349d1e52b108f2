"""Mattermost: a bot account on any Mattermost server (API v4), by its WebSocket and REST."""

from pluto.providers.mattermost.provider import MattermostProvider
from pluto.providers.mattermost.settings import MattermostSettings

__all__ = ["MattermostProvider", "MattermostSettings"]
