"""The web provider's settings (``providers.web`` in ``pluto.yaml``), validated once."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from pluto.gateway.ports import provider_settings
from pluto.providers.kit.settings import ENV_NAME, ProviderSettings


class WebSettings(ProviderSettings):
    title: str = Field(default="Pluto", min_length=1, max_length=80)
    # Pages on other origins that may open the chat socket (scheme://host[:port]), or "*".
    # The gateway's own origin, 127.0.0.1 and localhost are always allowed.
    allowed_origins: list[str] = Field(default_factory=list)
    session_secret_env: str = Field(default="PLUTO_WEB_SECRET", pattern=ENV_NAME)
    session_days: float = Field(default=30, gt=0, le=3650)
    max_message_chars: int = Field(default=4000, ge=1, le=100_000)
    rate_messages: int = Field(default=20, ge=1, le=10_000)  # frames a connection may send
    rate_seconds: float = Field(default=60, gt=0, le=86_400)  # ... per this many seconds
    max_sockets_per_visitor: int = Field(default=10, ge=1, le=1000)
    hello_timeout_seconds: float = Field(default=10, gt=0, le=300)
    max_upload_mb: float = Field(default=20, gt=0, le=2000)  # a file sent in the chat
    # a tab that hears nothing this long pings; with no answer this long after it (or after a
    # message it sent) it takes the connection for dead and opens another (docs/widget.md)
    ping_seconds: float = Field(default=15, ge=1, le=300)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        out = []
        for origin in v:
            if origin == "*":
                out.append(origin)
                continue
            parts = urlsplit(origin.strip())
            if parts.scheme not in ("http", "https") or not parts.hostname or (
                    parts.path not in ("", "/")) or parts.query or parts.fragment:
                raise ValueError(f"'{origin}' is not an origin like https://example.com")
            out.append(f"{parts.scheme}://{parts.netloc.lower()}")
        return out

    @property
    def max_frame_bytes(self) -> int:
        """Frames above this size close the connection (1009); below it, a long message gets
        an error frame and the connection stays."""
        return max(64 * 1024, self.max_message_chars * 8)


def load_settings(raw: dict[str, Any]) -> WebSettings:
    return provider_settings(WebSettings, raw, "web")
