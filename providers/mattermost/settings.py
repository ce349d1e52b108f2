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
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import ENV_NAME, ProviderSettings, http_url


class MattermostSettings(ProviderSettings):
    url: str = "http://localhost:8065"
    token_env: str = Field(default="MATTERMOST_TOKEN", pattern=ENV_NAME)
    channel_messages: Literal["mentions", "all"] = "mentions"
    reply_in_thread: bool = True
    ignore_bots: bool = True
    max_download_mb: float = Field(default=50, gt=0, le=1000)
    request_timeout_seconds: float = Field(default=30, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        return http_url(v).removesuffix("/api/v4")

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
