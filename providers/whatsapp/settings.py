"""``providers.whatsapp`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  whatsapp:
    enabled: true
    phone_number_id: "106540352242922"     # the business number's id (Meta's WhatsApp Manager)
    token_env: WHATSAPP_TOKEN              # a system user's access token (whatsapp_business_messaging)
    app_secret_env: WHATSAPP_APP_SECRET    # checks X-Hub-Signature-256 on every webhook post
    verify_token_env: WHATSAPP_VERIFY_TOKEN  # what Meta sends back in the subscribe handshake
    webhook_path: /whatsapp/webhook        # Meta's callback URL: <public address><webhook_path>
    api_base: https://graph.facebook.com   # another Graph API server: a proxy, a test fake
    api_version: v21.0
    admin_number: "4915123456789"          # told when a reply cannot be delivered (24-hour window)
    window_template:                       # outside the 24-hour window, a reply goes out as this
      name: pluto_update                   # approved template: its body's one {{1}} is the reply
      language: en                         # (unset: such a reply is refused and logged)
    pair_rate_wait_seconds: 6              # 131056: one message per ~6 s to the same person
    throughput_wait_seconds: 1             # 130429: the number's messages-per-second limit
    max_download_mb: 100                   # documents users send, larger ones are refused
```
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pluto.errors import ConfigError
from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import (ENV_NAME, URL_PATH, HttpUrl, ProviderSettings,
                                          needs_http_server)
FIELD = "providers.whatsapp"


class WindowTemplate(BaseModel):
    """An approved message template (WhatsApp Manager) whose body has one variable, ``{{1}}``:
    what reaches a person once their 24-hour window has closed (a scheduled answer, most
    often), the reply's text in place of the variable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_]{1,512}$")
    language: str = Field(default="en", pattern=r"^[a-z]{2,3}(_[A-Z]{2})?$")
    max_chars: int = Field(default=1024, ge=16, le=1024)  # a variable's text, at most


class WhatsAppSettings(ProviderSettings):
    phone_number_id: str = Field(default="", pattern=r"^[0-9]*$")
    token_env: str = Field(default="WHATSAPP_TOKEN", pattern=ENV_NAME)
    app_secret_env: str = Field(default="WHATSAPP_APP_SECRET", pattern=ENV_NAME)
    verify_token_env: str = Field(default="WHATSAPP_VERIFY_TOKEN", pattern=ENV_NAME)
    webhook_path: str = Field(default="/whatsapp/webhook", pattern=URL_PATH)
    api_base: HttpUrl = "https://graph.facebook.com"
    api_version: str = Field(default="v21.0", pattern=r"^v[0-9]+\.[0-9]+$")
    admin_number: str | None = Field(default=None, pattern=r"^[0-9]{6,20}$")
    window_template: WindowTemplate | None = None
    pair_rate_wait_seconds: float = Field(default=6.0, gt=0, le=3600)
    throughput_wait_seconds: float = Field(default=1.0, gt=0, le=3600)
    max_download_mb: float = Field(default=100, gt=0, le=1000)

    @field_validator("phone_number_id", "admin_number", mode="before")
    @classmethod
    def _digits(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v  # YAML reads a bare number as an int

    @property
    def api_url(self) -> str:
        """The Graph API root with its version: ``<api_base>/<api_version>``."""
        return f"{self.api_base}/{self.api_version}"


@dataclass(frozen=True, slots=True, repr=False)
class WhatsAppSecrets:
    """The credentials, read from the environment; never printed (no repr)."""

    token: str
    app_secret: str
    verify_token: str

    def values(self) -> list[str]:
        return [self.token, self.app_secret, self.verify_token]


def load_settings(ctx: ProviderContext) -> tuple[WhatsAppSettings, WhatsAppSecrets]:
    """The settings and the three secrets; ConfigError when something is off."""
    settings = provider_settings(WhatsAppSettings, ctx.config.model_dump(), "whatsapp")
    if not settings.phone_number_id:
        raise ConfigError([("pluto.yaml", None, f"{FIELD}.phone_number_id",
                            "the id of the business phone number is required (WhatsApp "
                            "Manager → API setup)")])
    secrets = WhatsAppSecrets(
        token=required_env(settings.token_env, "whatsapp", "token_env", "the access token"),
        app_secret=required_env(settings.app_secret_env, "whatsapp", "app_secret_env",
                                "the app secret that checks Meta's webhook posts"),
        verify_token=required_env(settings.verify_token_env, "whatsapp", "verify_token_env",
                                  "the verify token of the webhook subscription"))
    needs_http_server(ctx, "whatsapp", "", "WhatsApp delivers messages by webhook: it needs "
                      "the HTTP server (pluto serve)")
    return settings, secrets
