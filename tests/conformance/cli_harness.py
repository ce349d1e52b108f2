"""The terminal harness: the real CLI provider, its "platform" being what it prints.

Lines are fed to the provider as if typed; what the user sees is what it writes to its output
(a streamed reply is its deltas, printed as they come).
"""

from __future__ import annotations

import asyncio
import io
import re
from dataclasses import dataclass, field
from typing import Any

from pluto.gateway.ports import Inbox, Provider
from pluto.types import IncomingMessage, OutgoingMessage
from pluto.providers.cli import CliProvider
from tests.conformance.harness import Harness, Shown, UserMessage

_FENCE = re.compile(r"^```[^\n]*\n(.*?)\n```", re.S | re.M)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


class TerminalUnderTest(CliProvider):
    """The terminal provider with the keyboard replaced by ``inbox`` calls from the test."""

    def __init__(self) -> None:
        super().__init__(chat_id="terminal", out=io.StringIO(), err=io.StringIO())
        self.inbox: Inbox | None = None
        self.ready = asyncio.Event()
        self.outgoing: list[OutgoingMessage] = []
        self.changed = asyncio.Event()

    async def run(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.ready.set()
        await asyncio.Event().wait()

    async def send(self, message: OutgoingMessage) -> str | None:
        result = await super().send(message)
        self.outgoing.append(message)
        self.changed.set()
        return result


@dataclass
class CliHarness(Harness):
    name: str = "cli"
    caps: Any = CliProvider.capabilities
    features: frozenset[str] = frozenset({"redelivery"})
    direct_chat: str = "terminal"
    terminal: TerminalUnderTest = field(default_factory=TerminalUnderTest)

    async def open(self) -> None:
        pass

    async def make_provider(self) -> Provider:
        return self.terminal

    async def connected(self, timeout: float = 10) -> None:
        await self.terminal.ready.wait()

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        message = self.terminal.message(text)
        await self._deliver(message)
        return UserMessage(self.direct_chat, message)

    async def redeliver(self, message: UserMessage) -> None:
        await self._deliver(message.ref)

    async def _deliver(self, message: IncomingMessage) -> None:
        assert self.terminal.inbox is not None
        await self.terminal.inbox(message)

    def shown(self, chat: str | None = None) -> list[Shown]:
        texts: list[list[str]] = []
        streamed: dict[str | None, int] = {}
        for m in self.terminal.outgoing:
            if m.kind == "delta":
                if m.run_id not in streamed:
                    streamed[m.run_id] = len(texts)
                    texts.append([])
                texts[streamed[m.run_id]].append(m.text)
            elif m.kind in ("reply", "error") and m.run_id not in streamed:
                texts.append([m.text])  # a streamed reply's final adds nothing on screen
        printed = self.terminal.out.getvalue()  # type: ignore[attr-defined]
        out = []
        for i, parts in enumerate(texts):
            text = "".join(parts)
            assert text in printed, f"not on the terminal: {text!r}"
            code = tuple(_FENCE.findall(text) + _INLINE.findall(text))
            out.append(Shown(id=str(i), text=text, raw=text, code=code))
        return out

    async def changed(self) -> None:
        self.terminal.changed.clear()
        try:
            await asyncio.wait_for(self.terminal.changed.wait(), 0.5)
        except TimeoutError:
            pass
