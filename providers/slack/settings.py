"""``providers.slack`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  slack:
    enabled: true
    mode: http                          # http: Slack posts events to <this server><events_path>
                                        # socket: Socket Mode, no public address needed
    bot_token_env: SLACK_BOT_TOKEN      # xoxb-…: the Web API (both modes)
    signing_secret_env: SLACK_SIGNING_SECRET  # checks every event post (http mode)
    app_token_env: SLACK_APP_TOKEN      # xapp-… with connections:write (socket mode)
    events_path: /slack/events          # (http mode: set the app's Interactivity Request
                                        # URL to it too, for approval buttons)
    api_base: https://slack.com/api/    # another Web API server: a proxy, a test fake
    channel_messages: mentions          # mentions: in channels, answer @mentions and threads
                                        # the bot takes part in; all: every channel message
                                        # goes to routes.yaml
    reply_in_thread: true               # in channels, answer a top-level message in a thread
    max_download_mb: 50                 # files users send, larger ones are refused
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import (ENV_NAME, URL_PATH, ProviderSettings, http_url,
                                          needs_http_server)


class SlackSettings(ProviderSettings):
    mode: Literal["http", "socket"] = "http"
    bot_token_env: str = Field(default="SLACK_BOT_TOKEN", pattern=ENV_NAME)
    signing_secret_env: str = Field(default="SLACK_SIGNING_SECRET", pattern=ENV_NAME)
    app_token_env: str = Field(default="SLACK_APP_TOKEN", pattern=ENV_NAME)
    events_path: str = Field(default="/slack/events", pattern=URL_PATH)
    api_base: str = "https://slack.com/api/"
    channel_messages: Literal["mentions", "all"] = "mentions"
    reply_in_thread: bool = True
    max_download_mb: float = Field(default=50, gt=0, le=1000)

    @field_validator("api_base")
    @classmethod
    def _http_url(cls, v: str) -> str:
        return http_url(v) + "/"  # slack_sdk appends the method name to it


@dataclass(frozen=True, slots=True, repr=False)
class SlackSecrets:
    """The credentials, read from the environment; never printed (no repr)."""

    bot_token: str
    signing_secret: str | None = None
    app_token: str | None = None

    def values(self) -> list[str]:
        return [s for s in (self.bot_token, self.signing_secret, self.app_token) if s]


def load_settings(ctx: ProviderContext) -> tuple[SlackSettings, SlackSecrets]:
    """The settings and the credentials their mode needs; ConfigError when something is off."""
    settings = provider_settings(SlackSettings, ctx.config.model_dump(), "slack")
    bot_token = _required(settings.bot_token_env, "bot_token_env", "the bot token (xoxb-…)")
    if settings.mode == "socket":
        app_token = _required(settings.app_token_env, "app_token_env",
                              "the app-level token (xapp-…) Socket Mode needs")
        return settings, SlackSecrets(bot_token, app_token=app_token)
    secret = _required(settings.signing_secret_env, "signing_secret_env",
                       "the signing secret that checks Slack's event posts")
    needs_http_server(ctx, "slack", "mode",
                      "http mode needs the HTTP server (pluto serve); use mode: socket otherwise")
    return settings, SlackSecrets(bot_token, signing_secret=secret)


def _required(env: str, field: str, what: str) -> str:
    return required_env(env, "slack", field, what)
