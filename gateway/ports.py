"""The provider interface: what every chat platform adapter implements.

A provider only translates: platform events into :class:`IncomingMessage` (handed to the
gateway's inbox) and :class:`OutgoingMessage` into platform calls. It raises on failure; retries
and restarts live in the gateway.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from pluto.errors import ConfigError
from pluto.settings import ProviderConfig
from pluto.types import Capabilities, IncomingMessage, OutgoingMessage

if TYPE_CHECKING:
    from pluto.gateway.http.server import HttpServer

Inbox = Callable[[IncomingMessage], Awaitable[None]]


class Provider(ABC):
    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()

    @abstractmethod
    async def run(self, inbox: Inbox) -> None:
        """Receive messages and pass each to ``inbox`` until cancelled.

        Returning means the provider is done (a one-shot terminal turn, the user left the chat);
        raising means it failed and the gateway restarts it with backoff.
        """

    @abstractmethod
    async def send(self, message: OutgoingMessage) -> str | None:
        """Send one message; return the platform's id for it (needed to edit it later)."""

    async def edit(self, message: OutgoingMessage) -> None:
        """Replace the text of ``message.edit_of``. Only called when ``can_edit`` is declared."""
        await self.send(message)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        """Show that a reply is being written, where the platform can."""

    async def close(self) -> None:
        """Release connections. Called once, after ``run`` has ended."""


@dataclass(frozen=True, slots=True)
class ProviderContext:
    """What a provider gets from the gateway when it is built from ``pluto.yaml``."""

    config: ProviderConfig
    data_dir: Path
    http: HttpServer | None  # mount webhooks / websockets here (``pluto serve`` only)

    def secret(self, field: str, default_env: str) -> str | None:
        """The secret named by ``<field>`` in the provider's config (an env var name)."""
        extra = self.config.model_extra or {}
        return os.environ.get(str(extra.get(field) or default_env)) or None

    def option(self, name: str, default: Any = None) -> Any:
        return (self.config.model_extra or {}).get(name, default)


S = TypeVar("S", bound=BaseModel)


def provider_settings(model: type[S], raw: dict[str, Any], name: str) -> S:
    """A provider's ``pluto.yaml`` block validated into its settings model; errors name
    ``providers.<name>.<field>``."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError([("pluto.yaml", None, f"providers.{name}." + ".".join(
            str(p) for p in err["loc"]), err["msg"]) for err in e.errors()]) from None


def required_env(env: str, name: str, field: str, what: str) -> str:
    """The value of a secret's environment variable; a ConfigError naming it when unset."""
    value = os.environ.get(env, "").strip()
    if not value:
        raise ConfigError([("pluto.yaml", None, f"providers.{name}.{field}",
                            f"the environment variable {env} that should hold {what} is not set")])
    return value
