"""``providers.matrix`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  matrix:
    enabled: true
    homeserver: https://matrix.example.org   # the client-server API (a proxy, a test fake)
    access_token_env: MATRIX_ACCESS_TOKEN     # the bot account's access token
    user_id: "@pluto:example.org"             # optional: checked against the token's owner
    room_messages: mentions                   # mentions: in rooms, answer mentions, replies to
                                              # the bot and threads it takes part in; all: every
                                              # room message goes to routes.yaml
    auto_join: true                           # accept room invitations
    sync_timeout_seconds: 30                  # how long one /sync waits for news
    max_download_mb: 50                       # files users send, larger ones are refused
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import ENV_NAME, HttpUrl, ProviderSettings


class MatrixSettings(ProviderSettings):
    homeserver: HttpUrl = "https://matrix.org"
    access_token_env: str = Field(default="MATRIX_ACCESS_TOKEN", pattern=ENV_NAME)
    user_id: str | None = Field(default=None, pattern=r"^@[^:\s]+:\S+$")
    room_messages: Literal["mentions", "all"] = "mentions"
    auto_join: bool = True
    sync_timeout_seconds: float = Field(default=30, ge=0, le=120)
    max_download_mb: float = Field(default=50, gt=0, le=1000)


def load_settings(ctx: ProviderContext) -> tuple[MatrixSettings, str]:
    """The settings and the access token; ConfigError when something is off."""
    settings = provider_settings(MatrixSettings, ctx.config.model_dump(), "matrix")
    token = required_env(settings.access_token_env, "matrix", "access_token_env",
                         "the bot account's access token")
    return settings, token
