"""Discord: a bot on the gateway websocket and the REST API (discord.py)."""

from pluto.providers.discord.provider import DiscordProvider
from pluto.providers.discord.settings import DiscordSettings

__all__ = ["DiscordProvider", "DiscordSettings"]
