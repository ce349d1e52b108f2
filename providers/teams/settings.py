"""``providers.teams`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  teams:
    enabled: true
    app_id: "8f2c…"                        # the Azure Bot's Microsoft App ID
    app_password_env: TEAMS_APP_PASSWORD   # its client secret (Certificates & secrets)
    messaging_path: /teams/messages        # the messaging endpoint: <public address><path>
    group_messages: mentions               # groups and channels: only @mentions and replies
    # single-tenant bots: https://login.microsoftonline.com/<tenant id>/oauth2/v2.0/token
    token_url: https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token
    openid_metadata_url: https://login.botframework.com/v1/.well-known/openidconfiguration
    service_url: null                      # for proactive messages to a conversation never seen
    max_download_mb: 25                    # files users send, larger ones are refused
    rate_limit_wait_seconds: 1             # a 429 without Retry-After
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pluto.errors import ConfigError
from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import ENV_NAME, URL_PATH, HttpUrl, needs_http_server

FIELD = "providers.teams"
OPENID = "https://login.botframework.com/v1/.well-known/openidconfiguration"
TOKEN_URL = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"


class TeamsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    app_id: str = Field(default="", pattern=r"^[A-Za-z0-9-]*$", max_length=64)
    app_password_env: str = Field(default="TEAMS_APP_PASSWORD", pattern=ENV_NAME)
    messaging_path: str = Field(default="/teams/messages", pattern=URL_PATH)
    group_messages: Literal["mentions", "all"] = "mentions"
    openid_metadata_url: HttpUrl = OPENID
    token_url: HttpUrl = TOKEN_URL
    token_scope: str = "https://api.botframework.com/.default"
    issuer: str = "https://api.botframework.com"
    clock_skew_seconds: float = Field(default=300, ge=0, le=900)
    # a token with an unknown key id fetches the keys again at most this often
    key_refresh_min_seconds: float = Field(default=30, ge=0, le=3600)
    service_url: HttpUrl | None = None
    max_download_mb: float = Field(default=25, gt=0, le=1000)
    max_inline_image_kb: int = Field(default=18, ge=1, le=1024)
    rate_limit_wait_seconds: float = Field(default=1.0, gt=0, le=3600)


@dataclass(frozen=True, slots=True, repr=False)
class TeamsSecrets:
    """The app password, read from the environment; never printed (no repr)."""

    app_password: str


def load_settings(ctx: ProviderContext) -> tuple[TeamsSettings, TeamsSecrets]:
    """The settings and the app password; ConfigError when something is off."""
    settings = provider_settings(TeamsSettings, ctx.config.model_dump(), "teams")
    if not settings.app_id:
        raise ConfigError([("pluto.yaml", None, f"{FIELD}.app_id",
                            "the bot's Microsoft App ID is required (Azure portal → the Azure "
                            "Bot → Configuration)")])
    secrets = TeamsSecrets(required_env(settings.app_password_env, "teams", "app_password_env",
                                        "the bot's client secret"))
    needs_http_server(ctx, "teams", "", "Teams delivers messages to a messaging endpoint: it "
                      "needs the HTTP server (pluto serve)")
    return settings, secrets
