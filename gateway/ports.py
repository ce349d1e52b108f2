"""The provider seam: what every chat platform adapter implements, and what it is given.

A provider only translates: platform events into :class:`IncomingMessage` (handed to its
:class:`Intake`) and :class:`OutgoingMessage` into platform calls. It raises on failure
(:mod:`pluto.errors`); retries, restarts and delivery order live in the gateway.

It is built from a :class:`ProviderContext`: its settings, the data dir, the run feed, and —
only where it needs them — an HTTP mount, a chat directory (routing and transcripts) and the
readers of runs and API tasks. It never gets the gateway itself.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableSequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from pluto.errors import ConfigError
from pluto.events import RunEvent
from pluto.settings import ProviderConfig
from pluto.types import Capabilities, IncomingMessage, OutgoingMessage, Outcome, Route

if TYPE_CHECKING:
    from aiohttp import web

    from pluto.storage.ports import IdempotencyStore, RunReader, TaskStore


# what a provider gets ---------------------------------------------------------------------------

class Ticket(Protocol):
    """A message handed to intake. Awaiting :meth:`outcome` is optional (the API does; a chat
    platform need not): it resolves once the pipeline has decided what becomes of the message."""

    message: IncomingMessage

    async def outcome(self) -> Outcome: ...

    def when_decided(self, callback: Callable[[Outcome], None]) -> None:
        """``callback(outcome)`` once decided: the same without a task of one's own."""


class Intake(Protocol):
    """Where a provider hands messages over. Handing over never waits for routing, a model or
    delivery: only for the message to be recorded (so it cannot be lost, and a redelivery is
    recognised) and, when the gateway is flooded, for room in the provider's bounded queue."""

    async def submit(self, msg: IncomingMessage) -> Ticket:
        """Queue ``msg`` (waiting for room when full: back-pressure) and return at once."""
        ...

    async def offer(self, msg: IncomingMessage) -> Ticket | None:
        """Queue ``msg`` if there is room now; None when full (answer the platform "busy, try
        again", e.g. HTTP 503, so that it redelivers — nothing is dropped silently)."""
        ...


class RunFeed(Protocol):
    """The one way to watch a run: its committed events after ``seq`` N, then the live ones,
    each once and in order, until its ``run.end``."""

    def follow(self, run_id: str, after: int = 0, *,
               fresh: bool = False) -> AsyncGenerator[RunEvent, None]:
        """The events (an async generator: close it, e.g. with ``contextlib.aclosing``, when
        stopping early)."""
        ...

    def listen(self, run_id: str,
               listener: Callable[[RunEvent], None]) -> Callable[[], None] | None:
        """Each event of a run accepted here and not started yet, handed to ``listener`` as it
        is published (no task); returns the function that stops it, or None when every event
        cannot be promised that way (then :meth:`follow` it)."""
        ...


@dataclass(frozen=True, slots=True)
class TranscriptItem:
    """One thing a chat shows: a user's message, an answer, or a tool result's details."""

    role: Literal["user", "assistant", "tool"]
    text: str
    run_id: str | None
    ts: float
    name: str | None = None  # the tool, for role "tool"
    message_id: str | None = None  # for role "user": the message's id on its platform
    details: Any = None  # what the tool showed people (a table, a chart), for role "tool"


@dataclass(frozen=True, slots=True)
class AgentInfo:
    name: str
    description: str | None
    available: bool  # its files load


class ChatDirectory(Protocol):
    """What live chat front-ends (web, API) may ask of the gateway's routing and history."""

    def route(self, probe: IncomingMessage) -> Route | None:
        """The route a message like ``probe`` would take (None: it would get no answer)."""
        ...

    async def transcript(self, probe: IncomingMessage,
                         limit: int = 200) -> list[TranscriptItem]:
        """The active conversation of the chat ``probe`` comes from, as its people saw it."""
        ...

    async def waiting(self, probe: IncomingMessage) -> list[IncomingMessage]:
        """The messages of the chat ``probe`` comes from that wait for their turn (recorded,
        not yet taken up or queued behind the running one: in no transcript yet)."""
        ...

    async def conversation(self, probe: IncomingMessage, limit: int = 200
                           ) -> tuple[list[TranscriptItem], list[IncomingMessage]]:
        """:meth:`transcript` and :meth:`waiting` as at one moment: each message of the chat
        is in one of them (or begins between the reads: then in both)."""
        ...

    async def outcome(self, provider: str, message_id: str) -> Outcome | None:
        """What became of a recorded message (its run, once started); None while it waits."""
        ...

    async def agents(self) -> list[AgentInfo]: ...


@dataclass(frozen=True, slots=True)
class HttpMount:
    """Where a provider mounts its webhooks, sockets and pages on the gateway's HTTP server."""

    router: web.UrlDispatcher
    # the application's shutdown signal (an aiohttp ``Signal``): append a coroutine function
    on_shutdown: MutableSequence[Callable[[web.Application], Awaitable[object]]]


class SharedFileReader(Protocol):
    """Files of the data dir (charts, results) any instance may have made: a provider that
    serves them finds them here, fetched from the shared file store when missing."""

    @property
    def shared(self) -> bool: ...

    def key(self, path: str | Path) -> str | None:
        """The file's path relative to the data dir, or None when it is no shareable file."""
        ...

    async def local(self, path: str | Path) -> Path | None:
        """The file in this data dir (fetched when missing); None when it is nowhere."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderContext:
    """What a provider gets when the gateway builds it from ``pluto.yaml``."""

    name: str
    config: ProviderConfig
    data_dir: Path
    feed: RunFeed
    http: HttpMount | None = None  # ``pluto serve`` only
    chats: ChatDirectory | None = None
    runs: RunReader | None = None
    tasks: TaskStore | None = None
    idempotency: IdempotencyStore | None = None  # the HTTP API's Idempotency-Key records
    files: SharedFileReader | None = None  # the data dir's files, fetched when another made them
    # whether a person may decide an approval request, asked before a button's click is
    # handed over (providers/kit/buttons.py): (provider, chat, user, approval id) -> None
    # when they may, else the sentence to show them privately
    approvals: Callable[[str, str, str, str], Awaitable[str | None]] | None = None

    def secret(self, field_name: str, default_env: str) -> str | None:
        """The secret named by ``<field_name>`` in the provider's config (an env var name)."""
        extra = self.config.model_extra or {}
        return os.environ.get(str(extra.get(field_name) or default_env)) or None

    def option(self, name: str, default: Any = None) -> Any:
        return (self.config.model_extra or {}).get(name, default)


# what a provider implements ---------------------------------------------------------------------

class Provider(ABC):
    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()

    @classmethod
    @abstractmethod
    def from_context(cls, ctx: ProviderContext) -> Provider:
        """Build the provider from its settings, validating them (ConfigError naming
        ``providers.<name>.<field>``): nothing is connected yet."""

    @abstractmethod
    async def run(self, intake: Intake) -> None:
        """Receive messages and hand each to ``intake`` until cancelled.

        Returning means the provider is done (a one-shot terminal turn, the user left the chat);
        raising means it failed and the gateway restarts it with backoff (unless the error is
        one no restart can fix: :class:`~pluto.errors.ProviderUnusable`).
        """

    @abstractmethod
    async def send(self, message: OutgoingMessage) -> str | None:
        """Send one message; return the platform's id for it (needed to edit it later)."""

    async def edit(self, message: OutgoingMessage) -> None:
        """Replace the text of ``message.edit_of``. Only called when ``can_edit`` is declared."""
        await self.send(message)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        """Show that a reply is being written, where the platform can."""

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        """Remove a message the bot sent (a live preview an interrupted run left behind);
        True once it is gone (a message already gone counts), False where the platform
        cannot delete."""
        return False

    async def reset(self) -> None:
        """Rebuild the client that talks to the platform (new connections, new session): the
        gateway's send watchdog calls it when every send has failed for a while, in case the
        old client is stuck (a leaked connection pool). Sending works during and after it.
        Where a client cannot get stuck that way, there is nothing to do."""

    def single_owner(self) -> bool:
        """Whether only one process at a time may hold this provider's connection (a long
        poll, a gateway session, a socket). With several instances on one database, one of
        them holds it through a lease and another takes over when it dies; the others still
        send replies. Webhook-style intake (False) works on every instance."""
        return False

    def own_route(self, msg: IncomingMessage) -> Route | None:
        """Where this message goes when the provider itself decides it: only the console's
        test chat (gateway/console/trychat.py), whose callers the admin API has checked, names
        the agent for its messages. None — every platform — means the routing table and the
        access rules decide."""
        return None

    def run_started(self, msg: IncomingMessage, run_id: str) -> None:
        """A run began in one of this provider's chats for a message the gateway made itself
        (a schedule's firing, an approval decided without a click here: it expired) — a
        provider that shows runs from the run feed (``answers_from_feed``) follows it; the
        others get its reply through delivery as always. Called on the instance running it."""
        return None

    async def close(self) -> None:
        """Release connections. Called once, after ``run`` has ended."""


S = TypeVar("S", bound=BaseModel)


def provider_settings(model: type[S], raw: dict[str, Any], name: str) -> S:
    """A provider's ``pluto.yaml`` block validated into its settings model; errors name
    ``providers.<name>.<field>``."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError([("pluto.yaml", None, f"providers.{name}." + ".".join(
            str(p) for p in err["loc"]), err["msg"]) for err in e.errors()]) from None


def required_env(env: str, name: str, field_name: str, what: str) -> str:
    """The value of a secret's environment variable; a ConfigError naming it when unset."""
    value = os.environ.get(env, "").strip()
    if not value:
        raise ConfigError([("pluto.yaml", None, f"providers.{name}.{field_name}",
                            f"the environment variable {env} that should hold {what} is not set")])
    return value
