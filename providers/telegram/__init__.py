"""Telegram: a bot through the Bot API (python-telegram-bot), by long polling or a webhook."""

from providers.telegram.provider import TelegramProvider
from providers.telegram.settings import TelegramSettings

__all__ = ["TelegramProvider", "TelegramSettings"]
