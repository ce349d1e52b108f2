"""A recording provider and helpers to drive a Gateway in-process."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from pluto.errors import ProviderError

from pluto.gateway.ports import Intake, Provider, ProviderContext, Ticket
from pluto.types import MARKDOWN, Capabilities, IncomingMessage, OutgoingMessage, Outcome

_ids = itertools.count(1)


class RecordingProvider(Provider):
    """A provider whose platform is a list: what the gateway sends is recorded.

    Its dialect is Markdown, so recorded texts read as the agent wrote them. ``edits`` and
    ``typing_calls`` record edits and typing indicators; ``fail_next`` scripts send errors.
    """

    name = "test"
    capabilities = Capabilities(max_message_length=200, streams_deltas=False, markup=MARKDOWN)

    def __init__(self, name: str = "test", *, streams: bool = False,
                 capabilities: Capabilities | None = None):
        self.name = name  # type: ignore[misc]
        if streams:
            self.capabilities = Capabilities(streams_deltas=True)  # type: ignore[misc]
        if capabilities is not None:
            self.capabilities = capabilities  # type: ignore[misc]
        self.sent: list[OutgoingMessage] = []
        self.edits: list[OutgoingMessage] = []
        self.typing_calls: list[str] = []
        self.deleted: list[str] = []  # platform ids of messages deleted
        self.failures: list[ProviderError] = []
        self.intake: Intake | None = None
        self._changed = asyncio.Event()
        self.running = asyncio.Event()

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> RecordingProvider:
        return cls(ctx.name)

    async def run(self, intake: Intake) -> None:
        self.intake = intake
        self.running.set()
        await asyncio.Event().wait()

    async def send(self, message: OutgoingMessage) -> str | None:
        if self.failures:
            raise self.failures.pop(0)
        self.sent.append(message)
        self._changed.set()
        return str(len(self.sent))

    async def edit(self, message: OutgoingMessage) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.edits.append(message)
        self._changed.set()

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        self.typing_calls.append(chat_id)

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        if self.failures:
            raise self.failures.pop(0)
        self.deleted.append(platform_id)
        self._changed.set()
        return True

    def fail_next(self, error: ProviderError, times: int = 1) -> None:
        """The next ``times`` sends or edits raise ``error``."""
        self.failures += [error] * times

    def msg(self, text: str, *, chat: str = "c1", user: str = "u1", **kw: object) -> IncomingMessage:
        return IncomingMessage(provider=self.name, chat_id=chat, user_id=user, text=text,
                               message_id=str(next(_ids)), **kw)  # type: ignore[arg-type]

    async def say(self, text: str, **kw: object) -> Outcome:
        """Hand a message to the gateway like the platform would; what became of it."""
        await self.running.wait()
        assert self.intake is not None
        return await (await self.intake.submit(self.msg(text, **kw))).outcome()

    def finals(self, chat: str | None = None) -> list[str]:
        return [m.text for m in self.sent if m.kind in ("reply", "error")
                and (chat is None or m.chat_id == chat)]

    async def wait_finals(self, n: int, chat: str | None = None, timeout: float = 10) -> list[str]:
        async def until() -> list[str]:
            while len(self.finals(chat)) < n:
                self._changed.clear()
                await self._changed.wait()
            return self.finals(chat)
        return await asyncio.wait_for(until(), timeout)


def write_agent(config_dir: Path, name: str, yaml_text: str, instructions: str = "Be brief.") -> Path:
    d = config_dir / "agents" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "agent.yaml").write_text(yaml_text)
    (d / "instructions.md").write_text(instructions)
    return d


def permanent(error: BaseException) -> bool:
    """Whether a provider error is one that no retry can fix."""
    from pluto.errors import DeliveryRefused, ProviderUnusable

    return isinstance(error, (DeliveryRefused, ProviderUnusable))


class RecordingIntake:
    """An intake for a provider under test without a gateway: it keeps what it is handed."""

    def __init__(self, *, full: bool = False) -> None:
        self.got: list[IncomingMessage] = []
        self.full = full  # ``offer`` says there is no room (a webhook must answer 503)

    async def submit(self, msg: IncomingMessage) -> Ticket:
        self.got.append(msg)
        return _settled(msg)

    async def offer(self, msg: IncomingMessage) -> Ticket | None:
        if self.full:
            return None
        return await self.submit(msg)


def _settled(msg: IncomingMessage) -> Ticket:
    from pluto.gateway.pipeline.intake import Ticket as QueueTicket
    from pluto.types import Accepted

    ticket = QueueTicket(msg)
    ticket.settle(Accepted("run"))
    return ticket


class _NoFeed:
    """A run feed for providers built without a gateway (settings tests)."""

    async def follow(self, run_id: str, after: int = 0):  # type: ignore[no-untyped-def]
        raise AssertionError("this provider was built without a run feed")
        yield  # pragma: no cover

    def listen(self, run_id: str, listener: object) -> None:
        raise AssertionError("this provider was built without a run feed")


def provider_context(config: object, data_dir: Path, http: object = None, *,
                     name: str = "test", feed: object = None) -> ProviderContext:
    """A ProviderContext as the gateway builds it; ``http`` may be an aiohttp Application, an
    HttpServer or an HttpMount."""
    from aiohttp import web

    from pluto.gateway.ports import HttpMount

    app = getattr(http, "app", http)
    mount = HttpMount(app.router, app.on_shutdown) if isinstance(app, web.Application) else http
    return ProviderContext(name=name, config=config, data_dir=data_dir,  # type: ignore[arg-type]
                           feed=feed or _NoFeed(), http=mount)  # type: ignore[arg-type]
