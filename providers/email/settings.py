"""``providers.email`` in ``pluto.yaml``, validated once into typed settings.

```yaml
providers:
  email:
    enabled: true
    username: bot@example.com          # the mailbox account (IMAP and, by default, SMTP login)
    password_env: EMAIL_PASSWORD       # the variable holding its (app) password
    address: bot@example.com           # From: of replies (default: username)
    display_name: Pluto                # the name shown with it (optional)
    imap_host: imap.example.com
    imap_port: 993
    imap_security: ssl                 # ssl (993) or none (a local bridge, a test server)
    folder: INBOX                      # the folder read for new (unseen) mail
    smtp_host: smtp.example.com
    smtp_port: 587
    smtp_security: starttls            # starttls (587), ssl (465) or none
    require_authenticated: false       # true: senders without an aligned dkim=pass,
                                       # spf=pass or dmarc=pass are refused (never answered)
    authserv_ids: []                   # trust Authentication-Results only from these servers
                                       # (empty: the topmost header, added by your server)
    idle_seconds: 300                  # an IDLE is renewed this often
    max_message_mb: 25                 # larger mail is not downloaded (the sender is told)
    max_attachment_mb: 20              # files both ways, each
    retry_seconds: 60                  # wait after an SMTP 4xx that names no time
    max_age_days: 7                    # unseen mail older than this is not answered (0: all)
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pluto.gateway.ports import ProviderContext, provider_settings, required_env
from pluto.providers.kit.settings import ENV_NAME, ProviderSettings

HOST = r"^[A-Za-z0-9.:\[\]-]+$"
ADDRESS = r"^[^@\s<>]+@[^@\s<>]+$"


class EmailSettings(ProviderSettings):
    username: str = Field(min_length=1, max_length=320)
    password_env: str = Field(default="EMAIL_PASSWORD", pattern=ENV_NAME)
    address: str | None = Field(default=None, pattern=ADDRESS)
    display_name: str | None = Field(default=None, max_length=100, pattern=r"^[^\r\n<>@]+$")
    imap_host: str = Field(pattern=HOST)
    imap_port: int = Field(default=993, ge=1, le=65535)
    imap_security: Literal["ssl", "none"] = "ssl"
    folder: str = Field(default="INBOX", min_length=1, max_length=200, pattern=r"^[^\r\n\"]+$")
    smtp_host: str = Field(pattern=HOST)
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_security: Literal["starttls", "ssl", "none"] = "starttls"
    smtp_username: str | None = Field(default=None, max_length=320)
    smtp_login: bool = True  # false: a relay that takes mail without AUTH
    smtp_password_env: str | None = Field(default=None, pattern=ENV_NAME)
    require_authenticated: bool = False
    authserv_ids: list[str] = Field(default_factory=list, max_length=20)
    idle_seconds: float = Field(default=300, gt=0, le=1740)
    poll_seconds: float = Field(default=60, gt=0, le=3600)  # a server without IDLE
    timeout_seconds: float = Field(default=30, gt=0, le=300)
    max_message_mb: float = Field(default=25, gt=0, le=200)
    max_attachment_mb: float = Field(default=20, gt=0, le=200)
    retry_seconds: float = Field(default=60, ge=0, le=3600)
    max_age_days: float = Field(default=7, ge=0, le=3650)  # older unseen mail: not answered

    @model_validator(mode="after")
    def _from_address(self) -> EmailSettings:
        if self.address is None and "@" not in self.username:
            raise ValueError("address: the username is not an email address; give the "
                             "address replies come from")
        return self

    @property
    def from_address(self) -> str:
        return (self.address or self.username).strip()

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * 1024 * 1024)

    @property
    def max_attachment_bytes(self) -> int:
        return int(self.max_attachment_mb * 1024 * 1024)


def load_settings(ctx: ProviderContext) -> tuple[EmailSettings, str, str]:
    """The settings, the IMAP password and the SMTP password; ConfigError when off."""
    settings = provider_settings(EmailSettings, ctx.config.model_dump(), "email")
    password = required_env(settings.password_env, "email", "password_env",
                            "the mailbox password")
    smtp_password = password
    if settings.smtp_password_env:
        smtp_password = required_env(settings.smtp_password_env, "email", "smtp_password_env",
                                     "the SMTP password")
    return settings, password, smtp_password
