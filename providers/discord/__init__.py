"""Discord: a bot on the gateway websocket and the REST API (discord.py)."""

from providers.discord.provider import DiscordProvider
from providers.discord.settings import DiscordSettings

__all__ = ["DiscordProvider", "DiscordSettings"]
