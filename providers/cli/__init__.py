"""The terminal: an interactive chat (``pluto chat``) and a one-shot turn (``pluto run``).

It is a provider like any other: lines typed become :class:`IncomingMessage`s for the gateway,
and the gateway's replies are printed as they stream. Ctrl+C while a reply streams sends
``/stop`` (the same command any chat platform uses); Ctrl+D leaves.
"""

from __future__ import annotations

import asyncio
import getpass
import itertools
import signal
import sys
import uuid
from pathlib import Path
from typing import TextIO

from pluto.gateway.ports import Inbox, Provider
from pluto.types import Capabilities, IncomingMessage, OutgoingMessage

TERMINAL_KINDS = ("reply", "error")


class CliProvider(Provider):
    name = "cli"
    capabilities = Capabilities(max_message_length=1_000_000, markup="markdown",
                                streams_deltas=True)

    def __init__(self, *, chat_id: str = "terminal", history_file: Path | None = None,
                 out: TextIO | None = None, err: TextIO | None = None):
        self.chat_id = chat_id
        self.user_id = _user()
        self.history_file = history_file
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._ids = itertools.count(1)
        self._process = uuid.uuid4().hex[:8]  # ids stay unique across runs (dedupe)
        self._replied = asyncio.Event()
        self._streamed: set[str] = set()
        self.errors = 0
        self.interrupted = False

    def message(self, text: str) -> IncomingMessage:
        return IncomingMessage(provider=self.name, chat_id=self.chat_id, user_id=self.user_id,
                               user_name=self.user_id, text=text, is_direct=True,
                               message_id=f"{self.chat_id}:{self._process}:"
                                          f"{next(self._ids)}")

    async def run(self, inbox: Inbox) -> None:
        reader = _TtyReader(self.history_file) if sys.stdin.isatty() else _PipeReader()
        while True:
            try:
                line = await reader.read("you> ")
            except EOFError:
                self.out.write("\n" if sys.stdin.isatty() else "")
                return
            if not line.strip():
                continue
            await self.ask(inbox, line.rstrip("\n"))

    async def ask(self, inbox: Inbox, text: str) -> None:
        """Send one message and wait until its reply is complete; Ctrl+C sends /stop."""
        self._replied.clear()
        await inbox(self.message(text))
        loop = asyncio.get_running_loop()
        stop_sent = False

        def on_interrupt() -> None:
            nonlocal stop_sent
            if not stop_sent:
                stop_sent = self.interrupted = True
                loop.create_task(inbox(self.message("/stop")))

        try:
            loop.add_signal_handler(signal.SIGINT, on_interrupt)
            installed = True
        except (NotImplementedError, RuntimeError):
            installed = False
        try:
            await self._replied.wait()
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)

    async def send(self, message: OutgoingMessage) -> str | None:
        run_id = message.run_id or ""
        match message.kind:
            case "delta":
                if run_id not in self._streamed:
                    self._streamed.add(run_id)
                    self.out.write(self._label())
                self.out.write(message.text)
            case "notice":
                self._end_line(run_id)
                self.err.write(f"  [{message.text}]\n")
            case "error":
                self._end_line(run_id)
                self.errors += 1
                self.err.write(f"! {message.text}\n")
            case _:
                if run_id in self._streamed:
                    self._streamed.discard(run_id)
                    self.out.write("\n")
                else:
                    if self._streamed:  # an answer (e.g. to /stop) ends a stopped stream's line
                        self._streamed.clear()
                        self.out.write("\n")
                    self.out.write(self._label() + message.text + "\n")
                for attachment in message.attachments:  # a terminal shows where the file is
                    self.out.write(f"[{attachment.kind}: {attachment.path or attachment.filename}]\n")
        self.out.flush()
        self.err.flush()
        if message.kind in TERMINAL_KINDS:
            self._replied.set()
        return None

    def _label(self) -> str:
        return "pluto> " if sys.stdout.isatty() else ""

    def _end_line(self, run_id: str) -> None:
        if run_id in self._streamed:
            self._streamed.discard(run_id)
            self.out.write("\n")


class OneShotCliProvider(CliProvider):
    """``pluto run``: one message in, the reply out, then done."""

    def __init__(self, text: str, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.text = text

    async def run(self, inbox: Inbox) -> None:
        await self.ask(inbox, self.text)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "local"


class _PipeReader:
    """Lines from a non-interactive stdin (scripts, tests)."""

    async def read(self, prompt: str) -> str:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            raise EOFError
        return line


class _TtyReader:
    """Line editing and history with prompt_toolkit (imported only for a real terminal)."""

    def __init__(self, history_file: Path | None):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        history = InMemoryHistory()
        if history_file is not None:
            history_file.parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(history_file))
        self.session: PromptSession[str] = PromptSession(history=history)

    async def read(self, prompt: str) -> str:
        while True:
            try:
                return await self.session.prompt_async(prompt)
            except KeyboardInterrupt:
                continue  # Ctrl+C at the prompt clears the line; Ctrl+D leaves
