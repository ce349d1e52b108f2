"""Telegram: a bot through the Bot API (python-telegram-bot), by long polling or a webhook."""

from pluto.providers.telegram.provider import TelegramProvider
from pluto.providers.telegram.settings import TelegramSettings

__all__ = ["TelegramProvider", "TelegramSettings"]
