"""``providers.telegram`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  telegram:
    enabled: true
    token_env: TELEGRAM_BOT_TOKEN        # the variable that holds the bot token
    mode: polling                        # or webhook
    base_url: https://api.telegram.org   # another Bot API server: a local one, a proxy, a fake
    group_messages: mentions             # mentions: answer in groups when @mentioned or replied to
                                         # all: every group message goes to the routing table
    # webhook mode: Telegram posts to <public_url><webhook_path> on the gateway's HTTP server
    public_url: https://bot.example.com
    webhook_path: /telegram/webhook
    secret_env: TELEGRAM_WEBHOOK_SECRET  # unset: a random secret for each start
```
"""

from __future__ import annotations

import os
import secrets
from typing import Literal

from pydantic import Field

from pluto.errors import ConfigError
from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import (ENV_NAME, URL_PATH, WHERE, HttpUrl, ProviderSettings,
                                          needs_http_server)


class TelegramSettings(ProviderSettings):
    token_env: str = Field(default="TELEGRAM_BOT_TOKEN", pattern=ENV_NAME)
    mode: Literal["polling", "webhook"] = "polling"
    base_url: HttpUrl = "https://api.telegram.org"
    base_file_url: HttpUrl | None = None
    group_messages: Literal["mentions", "all"] = "mentions"
    poll_timeout: int = Field(default=30, ge=0, le=50)
    public_url: HttpUrl | None = None
    webhook_path: str = Field(default="/telegram/webhook", pattern=URL_PATH)
    secret_env: str = Field(default="TELEGRAM_WEBHOOK_SECRET", pattern=ENV_NAME)
    max_download_mb: float = Field(default=20, gt=0, le=2000)

    @property
    def api_url(self) -> str:
        """For python-telegram-bot, which appends the token and the method."""
        root = self.base_url.removesuffix("/bot")
        return f"{root}/bot"

    @property
    def file_url(self) -> str:
        if self.base_file_url:
            return self.base_file_url if self.base_file_url.endswith("/bot") else (
                f"{self.base_file_url}/bot")
        return f"{self.base_url.removesuffix('/bot')}/file/bot"

    @property
    def webhook_url(self) -> str:
        assert self.public_url is not None
        return self.public_url + self.webhook_path


def load_settings(ctx: ProviderContext) -> tuple[TelegramSettings, str, str]:
    """The settings, the bot token and the webhook secret; ConfigError when something is off."""
    settings = provider_settings(TelegramSettings, ctx.config.model_dump(), "telegram")
    token = required_env(settings.token_env, "telegram", "token_env", "the bot token")
    if settings.mode == "webhook":
        if not settings.public_url:
            raise ConfigError([(WHERE, None, "providers.telegram.public_url",
                                "webhook mode needs the public URL Telegram can reach")])
        needs_http_server(ctx, "telegram", "mode",
                          "webhook mode needs the HTTP server (pluto serve)")
    secret = os.environ.get(settings.secret_env, "").strip() or secrets.token_urlsafe(32)
    return settings, token, secret
