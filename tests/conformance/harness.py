"""The harness contract: what a conformance scenario needs from one provider and its platform.

A harness starts a :class:`Gateway` in-process with the provider under test, pointed at the
provider's fake platform server; scenarios then act as users of the platform (``user_says``)
and read what the platform shows them (``shown``). Applicability is declared, never skipped:
a scenario parametrizes over the harnesses whose provider ``caps`` or platform ``features``
it needs (see ``conftest.harnesses``).

Platform features (beyond the provider's :class:`Capabilities`):

- ``groups``: group chats, where the bot answers when mentioned or replied to
- ``redelivery``: the platform can deliver the same message twice
- ``flood_control``: the platform answers "too many requests" with a retry-after
- ``files_in``: users can send files
- ``serve``: the provider runs under ``pluto serve`` (``serve_config``), for the kill test
- ``strangers``: a second person can act in the direct chat's conversation (a group, a
  channel): a click by someone who may not decide is refused privately (``private_notes``)

Approvals (docs/approvals.md): a provider with ``caps.has_buttons`` shows an approval request's
buttons (``Shown.buttons``) and the harness clicks them as the platform delivers a click
(``click``); the others show the commands in the text, and the user writes one.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.gateway.ports import Provider
from pluto.types import Capabilities, IncomingMessage, Outcome
from pluto.runtime.testing import ScriptedModel
from pluto.runtime.tools import Tool


@dataclass(frozen=True, slots=True)
class Shown:
    """One message of the bot as the user sees it now (after edits)."""

    id: str
    text: str  # what the user reads (markup applied, entities decoded)
    raw: str = ""  # what the provider sent (in its markup)
    code: tuple[str, ...] = ()  # the contents of code blocks and inline code
    kind: str = "text"  # text | image | file
    data: bytes | None = None  # the file of an image or document
    edits: int = 0
    buttons: tuple[str, ...] = ()  # the labels of the buttons under it, if it has any now


@dataclass(frozen=True, slots=True)
class UserMessage:
    """A handle on something a user sent, to have the platform deliver it again."""

    chat: str
    ref: Any = None


@dataclass
class Harness(abc.ABC):
    """Base class: owns the gateway; subclasses own the platform and the provider."""

    config_dir: Path
    data_dir: Path
    name: str = "?"
    caps: Capabilities = Capabilities()
    features: frozenset[str] = frozenset()
    direct_chat: str = ""
    group_chat: str = ""
    gateway: Gateway | None = None
    model: ScriptedModel = field(default_factory=ScriptedModel)
    tools: dict[str, Tool] = field(default_factory=dict)
    received: list[IncomingMessage] = field(default_factory=list)  # what the gateway got

    # the gateway ------------------------------------------------------------------------

    async def open(self) -> None:
        """Start the fake platform."""
        return None

    async def start(self, model: ScriptedModel | None = None, *,
                    tools: dict[str, Tool] | None = None) -> Gateway:
        self.model = model or self.model
        self.tools = tools if tools is not None else self.tools
        cfg = PlutoConfig(data_dir=self.data_dir, gateway={
            "stream_edit_interval_seconds": 0.05, "shutdown_grace_seconds": 0.2})
        gw = Gateway(self.config_dir, config=cfg, model_factory=self.model, tools=self.tools)
        await gw.start()
        handle = gw.pipeline.handle

        async def recording(msg: IncomingMessage) -> Outcome:
            self.received.append(msg)
            return await handle(msg)

        gw.pipeline.handle = recording  # type: ignore[method-assign]
        self.gateway = gw
        gw.add_provider(await self.make_provider())
        await self.connected()
        return gw

    async def restart(self) -> Gateway:
        """Stop the gateway (what is still being delivered is cancelled) and start a new one
        on the same data dir and platform."""
        await self.stop_gateway()
        return await self.start()

    async def stop_gateway(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None

    async def close(self) -> None:
        await self.stop_gateway()

    # what each platform implements ---------------------------------------------------------

    @abc.abstractmethod
    async def make_provider(self) -> Provider:
        """A new provider instance talking to the platform."""

    def expect_connection(self) -> None:
        """Note the platform's state before a provider (re)connects (see ``connected``)."""
        return None

    async def connected(self, timeout: float = 10) -> None:
        """Wait until a provider connected since ``expect_connection`` receives messages."""
        return None

    @abc.abstractmethod
    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        """A user writes in ``chat`` (the direct chat by default); in a group, ``mention``
        addresses the bot and ``reply_to`` replies to one of its messages."""

    async def redeliver(self, message: UserMessage) -> None:
        raise NotImplementedError(f"{self.name} has no redelivery")

    @abc.abstractmethod
    def shown(self, chat: str | None = None) -> list[Shown]:
        """The bot's messages in ``chat`` as they are now, oldest first."""

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A person clicks the button ``label`` under ``message`` (in ``chat``, the direct chat
        by default), as the platform delivers a click — the usual user, or ``user`` (a
        stranger's id, feature ``strangers``). Returns once the platform has the click's
        answer (a callback answered, an interaction acknowledged)."""
        raise NotImplementedError(f"{self.name} has no buttons")

    stranger: str = ""  # a user id that may not decide the usual user's requests

    def private_notes(self, user: str) -> list[str]:
        """What the platform showed ``user`` alone (a callback's alert, an ephemeral
        message), oldest first."""
        raise NotImplementedError(f"{self.name} shows nothing privately")

    def confirmed(self, message: UserMessage) -> bool | None:
        """Whether the platform counts ``message`` as taken by the bot (an offset past it, a
        2xx, an ack); None where the platform has no such thing (it never delivers again)."""
        raise NotImplementedError(f"{self.name} cannot tell what it confirmed")

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        """Once the bot has ``after`` messages in ``chat``, its next send there is refused
        with a retry-after (once)."""
        raise NotImplementedError(f"{self.name} has no flood control")

    def refused_sends(self) -> list[float]:
        """When sends were refused for flood control (monotonic times), oldest first."""
        raise NotImplementedError(f"{self.name} has no flood control")

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        """For ``pluto serve``: the ``providers:`` entries of pluto.yaml and the environment
        (credentials) that point the provider at this platform."""
        raise NotImplementedError(f"{self.name} does not run under pluto serve")

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        """When the platform accepted new messages in ``chat`` (monotonic times)."""
        raise NotImplementedError(f"{self.name} does not record send times")

    @abc.abstractmethod
    async def changed(self) -> None:
        """Return once anything new happened on the platform (a send, an edit, an update)."""

    # waiting ------------------------------------------------------------------------------

    async def settled(self, timeout: float = 15) -> None:
        """Nothing more is on its way: the gateway has handled every message handed over,
        its runs have ended and every reply was sent; then the client has caught up with what
        was sent. What :meth:`shown` says after this is all a scenario's messages brought (a
        positive barrier for "nothing more arrives", instead of a pause)."""
        assert self.gateway is not None, "not started"
        try:
            await asyncio.wait_for(self.gateway.settled(), timeout)
            await asyncio.wait_for(self.caught_up(), timeout)
        except TimeoutError:
            raise AssertionError(f"{self.name}: the gateway did not settle in {timeout} s; "
                                 f"shown: {[s.text[:80] for s in self.shown()]}") from None

    async def caught_up(self) -> None:
        """Return once the client shows what the gateway has sent so far. A fake platform
        records a message before it answers the provider's call: nothing to wait for; a
        client that reads the gateway (a socket, a poll) waits for its reading to come in."""
        return None

    async def wait_shown(self, predicate: Callable[[list[Shown]], bool], *,
                         chat: str | None = None, timeout: float = 15,
                         what: str = "the expected messages") -> list[Shown]:
        async def until() -> list[Shown]:
            while not predicate(shown := self.shown(chat)):
                await self.changed()
            return shown
        try:
            return await asyncio.wait_for(until(), timeout)
        except TimeoutError:
            raise AssertionError(f"{self.name}: {what} did not appear; shown: "
                                 f"{[s.text[:80] for s in self.shown(chat)]}") from None

    async def wait_messages(self, n: int, *, chat: str | None = None,
                            timeout: float = 15) -> list[Shown]:
        return await self.wait_shown(lambda s: len(s) >= n, chat=chat, timeout=timeout,
                                     what=f"{n} message(s)")

    async def wait_texts(self, expected: list[str], *, chat: str | None = None,
                         raw: bool = False, timeout: float = 15) -> list[Shown]:
        """Wait until the bot's messages read ``expected`` (their ``raw`` form if asked)."""
        return await self.wait_shown(
            lambda shown: [s.raw if raw else s.text for s in shown] == expected, chat=chat,
            timeout=timeout, what=f"the messages {[e[:60] for e in expected]}")
