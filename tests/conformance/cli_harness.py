"""The terminal harness: the real CLI provider, its "platform" being what it prints.

Lines are fed to the provider as if typed (each asked in the background, as the terminal does
while the user types); what the user sees is what it writes to its output: a streamed reply is
its pieces, printed from the run feed as they come, then the answers delivery hands it.
"""

from __future__ import annotations

import asyncio
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pluto.gateway.ports import Intake, Provider, RunFeed
from pluto.providers.cli import CliProvider
from pluto.types import IncomingMessage, OutgoingMessage
from tests.conformance.harness import Harness, Shown, UserMessage

_FENCE = re.compile(r"^```[^\n]*\n(.*?)\n```", re.S | re.M)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


RETYPE_SECONDS = 0.2  # a person told "not sent" types the message again


@dataclass
class Typed:
    """A line the person typed (``message``: its first sending); ``taken`` once recorded."""

    message: IncomingMessage
    taken: bool = False


class TerminalUnderTest(CliProvider):
    """The terminal provider with the keyboard replaced by the test."""

    def __init__(self, feed: RunFeed) -> None:
        super().__init__(feed, chat_id="terminal", out=io.StringIO(), err=io.StringIO())
        self.intake: Intake | None = None
        self.ready = asyncio.Event()
        # what the terminal shows: (the run it streams, or None; its text; a file it names)
        self.display: list[tuple[str | None, str, Path | None]] = []
        self.changed = asyncio.Event()
        self.asking: set[asyncio.Task[None]] = set()
        self.problems: list[str] = []  # what the person was shown wrongly

    async def run(self, intake: Intake) -> None:
        self.intake = intake
        self.ready.set()
        await asyncio.Event().wait()

    def type(self, message: IncomingMessage, typed: Typed | None = None) -> None:
        assert self.intake is not None
        task = asyncio.create_task(self._typing(message, typed))
        self.asking.add(task)
        task.add_done_callback(self.asking.discard)

    async def _typing(self, message: IncomingMessage, typed: Typed | None) -> None:
        """Ask; a person told the message was not sent types it again, a moment later."""
        assert self.intake is not None
        while True:
            unsent = self.unsent
            await self.ask(self.intake, message)
            if self.unsent == unsent:
                if typed is not None:
                    typed.taken = True
                return
            told = self.err.getvalue()  # type: ignore[attr-defined]
            if "please send it again" not in told or "Traceback" in told:
                self.problems.append(f"not told plainly to send it again: {told!r}")
            await asyncio.sleep(RETYPE_SECONDS)
            message = self.message(message.text)

    def _delta(self, run_id: str, text: str) -> None:
        super()._delta(run_id, text)
        for i, (run, shown, _) in enumerate(self.display):
            if run == run_id:
                self.display[i] = (run, shown + text, None)
                break
        else:
            self.display.append((run_id, text, None))
        self.changed.set()

    async def send(self, message: OutgoingMessage) -> str | None:
        streamed = message.run_id is not None and any(r == message.run_id
                                                      for r, _, _ in self.display)
        result = await super().send(message)
        if message.kind in ("reply", "error") and not streamed and message.text:
            self.display.append((None, message.text, None))  # a streamed one adds nothing more
        for attachment in message.attachments:  # printed as its path
            self.display.append((None, "", attachment.path))
        self.changed.set()
        return result


@dataclass
class CliHarness(Harness):
    name: str = "cli"
    caps: Any = CliProvider.capabilities
    features: frozenset[str] = frozenset({"redelivery"})
    direct_chat: str = "terminal"
    terminal: TerminalUnderTest | None = field(default=None)

    async def open(self) -> None:
        pass

    async def make_provider(self) -> Provider:
        assert self.gateway is not None
        self.terminal = TerminalUnderTest(self.gateway.feed)
        return self.terminal

    async def connected(self, timeout: float = 10) -> None:
        assert self.terminal is not None
        await self.terminal.ready.wait()

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        assert self.terminal is not None
        typed = Typed(self.terminal.message(text))
        self.terminal.type(typed.message, typed)
        return UserMessage(self.direct_chat, typed)

    async def redeliver(self, message: UserMessage) -> None:
        assert self.terminal is not None
        self.terminal.type(message.ref.message)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Taken: the terminal did not tell the person to send it again."""
        return message.ref.taken

    def shown(self, chat: str | None = None) -> list[Shown]:
        assert self.terminal is not None
        assert not self.terminal.problems, self.terminal.problems
        printed = self.terminal.out.getvalue()  # type: ignore[attr-defined]
        out = []
        for i, (_, text, path) in enumerate(self.terminal.display):
            if path is not None:
                assert str(path) in printed, f"not on the terminal: {path}"
                out.append(Shown(id=str(i), text="", kind="image", data=path.read_bytes()))
                continue
            assert text in printed, f"not on the terminal: {text!r}"
            code = tuple(_FENCE.findall(text) + _INLINE.findall(text))
            out.append(Shown(id=str(i), text=text, raw=text, code=code))
        return out

    async def changed(self) -> None:
        assert self.terminal is not None
        self.terminal.changed.clear()
        try:
            await asyncio.wait_for(self.terminal.changed.wait(), 0.5)
        except TimeoutError:
            pass
