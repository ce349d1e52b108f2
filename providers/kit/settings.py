"""Settings fields and checks that providers' ``pluto.yaml`` blocks share.

Use in a provider's settings model (a :class:`ProviderSettings`)::

    token_env: str = Field(default="X_TOKEN", pattern=ENV_NAME)
    webhook_path: str = Field(default="/x/webhook", pattern=URL_PATH)
    api_base: HttpUrl = "https://api.example.com"

Values written by an admin are checked once, at load; defaults are taken as written.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from pluto.errors import ConfigError
from pluto.gateway.ports import ProviderContext

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # the name of an environment variable
URL_PATH = r"^/[A-Za-z0-9/_.-]*$"  # a path on the gateway's HTTP server (a webhook)
WHERE = "pluto.yaml"


class ProviderSettings(BaseModel):
    """What every provider's block has: ``enabled``; a key the model does not name is refused
    (a typo is an error, not a default), and the settings are frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False


def http_url(value: str) -> str:
    """An http(s) URL without its trailing slash; ValueError for anything else."""
    value = value.strip().rstrip("/")
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value


def ws_url(value: str) -> str:
    """A ws(s) URL, ending in a slash; ValueError for anything else."""
    value = value.strip()
    if not value.startswith(("ws://", "wss://")):
        raise ValueError("must be a ws:// or wss:// URL")
    return value if value.endswith("/") else f"{value}/"


HttpUrl = Annotated[str, AfterValidator(http_url)]  # a field checked by http_url


def needs_http_server(ctx: ProviderContext, provider: str, field: str, why: str) -> None:
    """ConfigError naming ``providers.<provider>.<field>`` when the gateway runs without its
    HTTP server (a webhook has nowhere to arrive): ``why`` says what needs it."""
    if ctx.http is None:
        name = f"providers.{provider}" + (f".{field}" if field else "")
        raise ConfigError([(WHERE, None, name, why)])
