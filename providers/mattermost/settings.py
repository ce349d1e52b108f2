"""``providers.mattermost`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  mattermost:
    enabled: true
    url: https://chat.example.com        # the Mattermost server (its API is <url>/api/v4)
    token_env: MATTERMOST_TOKEN           # the bot account's access token
    channel_messages: mentions            # mentions: in channels and group messages, answer
                                          # @mentions and threads the bot takes part in;
                                          # all: every channel message goes to routes.yaml
    reply_in_thread: true                 # in channels, answer a top-level post in a thread
    ignore_bots: true                     # never answer other bots' posts (no loops)
    max_download_mb: 50                   # files users send, larger ones are refused
    request_timeout_seconds: 30           # one REST call, at most
    actions_url: https://pluto.example.com/mattermost/actions
                                          # approval buttons: where the Mattermost server
                                          # posts a click (this gateway's HTTP server, as the
                                          # Mattermost server reaches it; its path is mounted).
                                          # Unset, or without pluto serve: the commands to
                                          # reply with are written instead of buttons. (A
                                          # private address must be in Mattermost's
                                          # AllowedUntrustedInternalConnections.)
```
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import ENV_NAME, ProviderSettings, http_url

URL_PATH_RE = re.compile(r"/[A-Za-z0-9._~/-]*")


class MattermostSettings(ProviderSettings):
    url: str = "http://localhost:8065"
    token_env: str = Field(default="MATTERMOST_TOKEN", pattern=ENV_NAME)
    channel_messages: Literal["mentions", "all"] = "mentions"
    reply_in_thread: bool = True
    ignore_bots: bool = True
    max_download_mb: float = Field(default=50, gt=0, le=1000)
    request_timeout_seconds: float = Field(default=30, gt=0, le=600)
    actions_url: str | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        return http_url(v).removesuffix("/api/v4")

    @field_validator("actions_url")
    @classmethod
    def _actions_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = http_url(v)
        if not URL_PATH_RE.fullmatch(urlsplit(v).path or "/"):
            raise ValueError("its path must be a plain URL path, such as /mattermost/actions")
        return v

    @property
    def actions_path(self) -> str | None:
        return (urlsplit(self.actions_url).path or "/") if self.actions_url else None

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v4"

    @property
    def websocket_url(self) -> str:
        return "ws" + self.api_url.removeprefix("http") + "/websocket"


def load_settings(ctx: ProviderContext) -> tuple[MattermostSettings, str]:
    """The settings and the bot token; ConfigError when something is off."""
    settings = provider_settings(MattermostSettings, ctx.config.model_dump(), "mattermost")
    token = required_env(settings.token_env, "mattermost", "token_env",
                         "the bot account's access token")
    return settings, token
