"""The terminal: an interactive chat (``pluto chat``) and a one-shot turn (``pluto run``).

It is a provider like any other: lines typed become :class:`IncomingMessage`s handed to its
intake; a run's progress is printed from the run feed as it streams (text as it is written,
a note when a tool is used), and the replies — a run's final answer or error, a command's
answer, a notice — come through delivery like on every platform. Ctrl+C while a reply streams
sends ``/stop`` (the same command any chat platform uses); Ctrl+D leaves.

A tool call that waits for a person (docs/approvals.md) is printed with its arguments, then the
terminal asks ``Approve? [y/N]``: ``y`` sends ``/approve <id>``, anything else ``/deny <id>``
(typing ``/approve <id>`` or ``/deny <id> [reason]`` at the prompt works too); the run that
resumes it is shown like any other.
"""

from __future__ import annotations

import asyncio
import getpass
import itertools
import signal
import sys
import uuid
from collections import OrderedDict
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol, TextIO

from pluto.events import (ApprovalRequest, MessageDelta, MessageFinal, RunError, ToolEnd,
                          ToolStart)
from pluto.providers.cli.screen import Screen, wants_markdown
from pluto.gateway.ports import Intake, Provider, ProviderContext, RunFeed
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.types import (MARKDOWN, Accepted, Capabilities, Dropped, Duplicate, IncomingMessage,
                         OutgoingMessage, Refused)

REPLY_WAIT = 60.0  # seconds to wait for a reply delivery has recorded
KEPT_RUNS = 256  # runs remembered: their replies awaited, their files shown from the feed
MAX_TOOL_FILES = 10  # files one tool result shows (as delivery sends at most)


class CliProvider(Provider):
    name = "cli"
    capabilities = Capabilities(max_message_length=1_000_000, markup=MARKDOWN,
                                streams_deltas=True, can_send_images=True,  # by their path
                                operator=True)  # its user runs the gateway: errors in full

    def __init__(self, feed: RunFeed, *, chat_id: str = "terminal",
                 history_file: Path | None = None, once: str | None = None,
                 out: TextIO | None = None, err: TextIO | None = None,
                 markdown: bool | None = None, width: int | None = None,
                 data_dir: Path | None = None):
        self.feed = feed
        self.data_dir = data_dir  # where the files tools make are (shown by their path)
        self.chat_id = chat_id
        self.user_id = _user()
        self.history_file = history_file
        self.once = once  # ``pluto run``: this one message, then done
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        # on a terminal, replies are drawn as Markdown; elsewhere printed as written
        self.screen = Screen(self.out, width=width, markdown=wants_markdown(self.out)
                             if markdown is None else markdown)
        self._ids = itertools.count(1)
        self._process = uuid.uuid4().hex[:8]  # ids stay unique across runs (dedupe)
        # answers without a run (a command's, a notice), by the message they answer; a run's
        # reply by its run: a notice to the message meanwhile (a compaction, a dataset added)
        # is no reply, and the parts of a reply all carry the run
        self._replies: dict[str, asyncio.Future[OutgoingMessage]] = {}
        self._finals: OrderedDict[str, asyncio.Future[OutgoingMessage]] = OrderedDict()
        self._followed: OrderedDict[str, None] = OrderedDict()  # runs shown from the feed
        self._streamed: set[str] = set()  # runs whose text is being printed as it streams
        self._said: dict[str, bool] = {}  # followed runs: has their last turn printed text?
        self._muted: set[str] = set()  # runs stopped with Ctrl+C: the rest is not printed
        self._shown: dict[str, int] = {}  # runs being followed → the last seq printed
        self._progress = asyncio.Event()  # set whenever a followed run prints an event
        self.errors = 0
        self.unsent = 0  # messages the person was asked to send again (not recorded)
        self.interrupted = False
        self.handover = HandOver(self.name)
        # where the person's answers come from (``run``: the terminal or a pipe); None: no one
        # to ask (an approval then waits for a typed command)
        self.reader: _Reader | None = None
        self._waiting: dict[str, ApprovalRequest] = {}  # runs paused for a decision

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> CliProvider:
        return cls(ctx.feed, chat_id=str(ctx.option("chat_id") or "terminal"),
                   history_file=ctx.data_dir / "chat_history", once=ctx.option("message"),
                   data_dir=ctx.data_dir)

    def message(self, text: str) -> IncomingMessage:
        return IncomingMessage(provider=self.name, chat_id=self.chat_id, user_id=self.user_id,
                               user_name=self.user_id, text=text, is_direct=True,
                               message_id=f"{self.chat_id}:{self._process}:{next(self._ids)}")

    async def run(self, intake: Intake) -> None:
        if self.once is not None:
            if sys.stdin.isatty():  # (an approval is asked on the terminal)
                self.reader = _TtyReader(None)
            await self.ask(intake, self.once)
            return
        reader = _TtyReader(self.history_file) if sys.stdin.isatty() else _PipeReader()
        self.reader = reader
        while True:
            try:
                line = await reader.read("you> ")
            except EOFError:
                self.out.write("\n" if sys.stdin.isatty() else "")
                return
            if line.strip():
                await self.ask(intake, line.rstrip("\n"))

    async def ask(self, intake: Intake, text: str | IncomingMessage) -> None:
        """Send one message and wait until its reply is complete; Ctrl+C sends /stop."""
        loop = asyncio.get_running_loop()
        msg = self.message(text) if isinstance(text, str) else text
        replied = self._expect(msg)
        stopping: list[asyncio.Task[object]] = []

        def on_interrupt() -> None:
            if not stopping:
                self.interrupted = True
                for run_id in self._shown:  # the answer stops here on screen, at once
                    self._muted.add(run_id)
                    self._end_line(run_id)
                stopping.append(loop.create_task(intake.submit(self.message("/stop"))))

        try:
            loop.add_signal_handler(signal.SIGINT, on_interrupt)
            installed = True
        except (NotImplementedError, RuntimeError):
            installed = False
        try:
            try:
                ticket = await self.handover(intake.submit, msg)
            except NotRecorded:  # storage failed (logged once per outage): say so, plainly
                self._say("! not sent: your message could not be recorded just now (a problem "
                          "on our side); please send it again.")
                self.errors += 1
                self.unsent += 1
                return
            outcome = await ticket.outcome()
            match outcome:
                case Accepted(run_id=run_id):
                    await self._show(run_id)
                    if (waiting := self._waiting.pop(run_id, None)) is not None:
                        await self._decide(intake, waiting)
                case Refused(notice=None, reason=reason) | Dropped(notice=None, reason=reason):
                    self._say(f"! no answer: {reason}")
                    self.errors += 1
                case Duplicate():
                    pass
                case Refused() | Dropped():  # told why, through delivery: not an answer
                    await _wait(replied)
                    self.errors += 1
                case _:  # answered: the answer comes through delivery
                    await _wait(replied)
            if stopping:
                await asyncio.gather(*stopping, return_exceptions=True)
        finally:
            self._replies.pop(msg.message_id or "", None)
            if installed:
                loop.remove_signal_handler(signal.SIGINT)

    async def _decide(self, intake: Intake, request: ApprovalRequest) -> None:
        """Ask the person about a paused tool call (its request is printed above) and send
        their decision: ``y`` approves, anything else denies; a typed command goes as is."""
        if self.reader is None:
            return  # nobody to ask here: /approve or /deny, typed, decides it
        try:
            answer = (await self.reader.read("Approve? [y/N] ", self.err)).strip()
        except EOFError:
            answer = ""
        if answer.lower().startswith(("/approve", "/deny")):
            command = answer
        elif answer.lower() in ("y", "yes"):
            command = f"/approve {request.approval_id}"
        else:
            command = f"/deny {request.approval_id}"
        await self.ask(intake, command)

    def _expect(self, msg: IncomingMessage) -> asyncio.Future[OutgoingMessage]:
        future: asyncio.Future[OutgoingMessage] = asyncio.get_running_loop().create_future()
        self._replies[msg.message_id or ""] = future
        return future

    async def _show(self, run_id: str) -> None:
        """Print a run's progress from the feed; then wait for its reply, if it has one, and
        name the files its tools made — all before the next prompt."""
        expects_reply = False
        files: list[tuple[str, Path]] = []
        self._shown[run_id] = 0
        remember(self._followed, run_id, None, KEPT_RUNS)
        async with aclosing(self.feed.follow(run_id)) as events:
            async for event in events:
                self._shown[run_id] = event.seq
                self._progress.set()
                match event:
                    case MessageDelta(text=text) if run_id not in self._muted:
                        self._delta(run_id, text)
                    case ToolStart(name=name) if run_id not in self._muted:
                        self._end_line(run_id)
                        self._said[run_id] = False  # the next turn's text is not shown yet
                        self._say(f"  [using {name}…]")
                    case ToolEnd(details=details):
                        files += _files(details, self.data_dir)
                    case MessageFinal():
                        expects_reply = True
                    case RunError():  # (an error's reply comes without the files)
                        expects_reply, files = True, []
                    case ApprovalRequest():  # its text and commands come through delivery
                        self._end_line(run_id)
                        self._waiting[run_id] = event
                        remember_waiting(self._waiting)
                        expects_reply = True
        if expects_reply:
            await _wait(self._final(run_id))
            self._finals.pop(run_id, None)
        self._shown.pop(run_id, None)
        self._said.pop(run_id, None)
        self._muted.discard(run_id)
        self._end_line(run_id)
        for kind, path in files:  # delivery sends them after the text: shown here, in order
            self.out.write(f"[{kind}: {path}]\n")
        self.out.flush()

    def _final(self, run_id: str) -> asyncio.Future[OutgoingMessage]:
        """The future of a run's reply (made by whichever comes first: it, or the wait)."""
        future = self._finals.get(run_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            remember(self._finals, run_id, future, KEPT_RUNS)
        return future

    async def send(self, message: OutgoingMessage) -> str | None:
        run_id = message.run_id or ""
        await self._caught_up(run_id, message.seq - 1)
        if not run_id:  # an answer of its own (a command's, a notice): below the reply being
            for streaming in list(self._streamed):  # written, never inside it
                self._end_line(streaming)
        match message.kind:
            case "delta":
                pass  # progress comes from the run feed
            case "notice":
                self._end_line(run_id)
                self._say(f"  [{message.text}]")
            case "error":
                self._end_line(run_id)
                self.errors += 1
                self._say(f"! {message.text}")
            case _:
                if run_id in self._streamed:  # its text is on screen already
                    self._end_line(run_id)
                elif message.text and not self._said.get(run_id):  # (shown, then cut short
                    # by Ctrl+C or by a notice: not printed twice)
                    if not self.screen.markdown:
                        self.out.write(self._label())
                    self.screen.reply(message.text)
                if run_id not in self._followed:  # (else named from the feed, in its place)
                    for attachment in message.attachments:  # a terminal shows where it is
                        self.out.write(f"[{attachment.kind}: "
                                       f"{attachment.path or attachment.filename}]\n")
        self.out.flush()
        if message.kind != "delta":
            future = self._final(run_id) if run_id else self._replies.get(message.answers or "")
            if future is not None and not future.done():
                future.set_result(message)
        return None

    async def _caught_up(self, run_id: str, seq: int, timeout: float = 5.0) -> None:
        """A run's reply comes through delivery, its progress through the feed: print the
        reply only after everything before it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._shown.get(run_id, seq) < seq and loop.time() < deadline:
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), deadline - loop.time())
            except TimeoutError:
                return

    def _delta(self, run_id: str, text: str) -> None:
        """Print a piece of a reply as the model writes it."""
        first = run_id not in self._streamed
        self._streamed.add(run_id)
        self._said[run_id] = True
        if self.screen.stream(run_id, text):
            return
        if first:
            self.out.write(self._label())
        self.out.write(text)
        self.out.flush()

    def _say(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()

    def _label(self) -> str:
        return "pluto> " if sys.stdout.isatty() else ""

    def _end_line(self, run_id: str) -> None:
        if run_id in self._streamed:
            self._streamed.discard(run_id)
            if not self.screen.end(run_id):
                self.out.write("\n")
            self.out.flush()


def _files(details: Any, data_dir: Path | None) -> list[tuple[str, Path]]:
    """The images and files a tool made (``details["attachments"]``: [{path, kind}], else
    ``details["image"]``) that exist under the data dir — those delivery sends."""
    if not isinstance(details, dict):
        return []
    listed = details.get("attachments")
    wanted = [(a.get("path"), a.get("kind")) for a in listed if isinstance(a, dict)] \
        if isinstance(listed, list) else [(details.get("image"), "image")]
    root = data_dir.resolve() if data_dir is not None else None
    found = []
    for name, kind in wanted[:MAX_TOOL_FILES]:
        if not isinstance(name, str) or not name:
            continue
        path = Path(name)
        if not path.is_absolute():
            if root is None:
                continue
            path = root / path
        try:
            path = path.resolve()
            ok = path.is_file() and (root is None or path.is_relative_to(root))
        except OSError:
            ok = False
        if ok:
            found.append(("file" if kind == "file" else "image", path))
    return found


async def _wait(future: asyncio.Future[OutgoingMessage]) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(future), REPLY_WAIT)
    except TimeoutError:
        pass


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "local"


def remember_waiting(waiting: dict[str, ApprovalRequest]) -> None:
    """Keep the paused runs bounded (each is asked about once, then forgotten)."""
    while len(waiting) > KEPT_RUNS:
        waiting.pop(next(iter(waiting)))


class _Reader(Protocol):
    async def read(self, prompt: str, err: TextIO | None = None) -> str: ...


class _PipeReader:
    """Lines from a non-interactive stdin (scripts, tests)."""

    async def read(self, prompt: str, err: TextIO | None = None) -> str:
        if err is not None:  # (a question, not the chat prompt: said where the notes go)
            err.write(prompt + "\n")
            err.flush()
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            raise EOFError
        return line


class _TtyReader:
    """Line editing and history with prompt_toolkit (imported only for a real terminal)."""

    def __init__(self, history_file: Path | None):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, History, InMemoryHistory

        history: History = InMemoryHistory()
        if history_file is not None:
            history_file.parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(history_file))
        self.session: PromptSession[str] = PromptSession(history=history)

    async def read(self, prompt: str, err: TextIO | None = None) -> str:
        while True:
            try:
                return await self.session.prompt_async(prompt)
            except KeyboardInterrupt:
                continue  # Ctrl+C at the prompt clears the line; Ctrl+D leaves
