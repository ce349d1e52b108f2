"""``providers.discord`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  discord:
    enabled: true
    token_env: DISCORD_BOT_TOKEN         # the variable that holds the bot token
    guild_messages: mentions             # mentions: in servers, answer when @mentioned or
                                         # replied to; all: every message goes to routes.yaml
    message_content_intent: true         # needs "Message Content Intent" on in the portal
    max_download_mb: 25                  # files users send, larger ones are refused
    # another Discord API / gateway: a proxy, a test fake (process-wide for discord.py)
    api_base: https://discord.com/api/v10
    gateway_url: wss://gateway.discord.gg/
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import ENV_NAME, ProviderSettings, http_url, ws_url


class DiscordSettings(ProviderSettings):
    token_env: str = Field(default="DISCORD_BOT_TOKEN", pattern=ENV_NAME)
    guild_messages: Literal["mentions", "all"] = "mentions"
    message_content_intent: bool = True
    max_download_mb: float = Field(default=25, gt=0, le=500)
    api_base: str | None = None
    gateway_url: str | None = None
    guild_ready_timeout: float = Field(default=2.0, ge=0, le=60)

    @field_validator("api_base")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = http_url(v)
        return v if "/api/v" in v else f"{v}/api/v10"

    @field_validator("gateway_url")
    @classmethod
    def _ws_url(cls, v: str | None) -> str | None:
        return None if v is None else ws_url(v)


def load_settings(ctx: ProviderContext) -> tuple[DiscordSettings, str]:
    """The settings and the bot token; ConfigError naming the field when something is off."""
    settings = provider_settings(DiscordSettings, ctx.config.model_dump(), "discord")
    return settings, required_env(settings.token_env, "discord", "token_env", "the bot token")
