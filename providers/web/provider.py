"""The web provider: a chat widget any page embeds, talking to the gateway over a WebSocket.

It mounts on the gateway's HTTP server: ``/ws`` (the chat socket), ``/widget.js`` and
``/widget.css`` (the widget), ``/`` (a demo page) and ``/web/file/…`` (signed links to charts).
A visitor's chat id comes from their verified session token only.

What a chat's tabs are shown, in order, each frame to every tab:

- a run, whole, from the run feed: its start, its text as it is written, its tools with their
  tables and charts, its reply (``message.final`` or ``error``) and its ``run.end``, each frame
  carrying the event's ``seq``. The run's committed events are its durable record: delivery
  records no outbox row for its reply (``answers_from_feed``). A tab that joins mid-answer gets
  the run's frames from its start, then the rest live (a run going on in another instance is
  followed from storage for it: :meth:`WebProvider.resume`); one that joins after the end finds
  the answer in the history (storage) — each answer once;
- the gateway's answers without a run (a command's reply, a notice) through delivery and the
  outbox, like on any platform (:meth:`WebProvider.send`).

A run that waits for the visitor's decision on a tool call (docs/approvals.md) shows its
``approval.request`` (the widget draws a card with Approve / Deny, each sending its command as
the visitor's message). A decision sent from a tab here starts the run that resumes it, shown
like any run. One taken without a message from here (nobody decided in time) starts a run the
gateway tells this provider of on the instance running it (:meth:`WebProvider.run_started`, as
for a schedule's firing): it is shown live from the feed like a run a tab started. A run on
another instance (a decision taken there, an expiry swept there) is not told of here: while a
request shown here is open and a tab of its chat is, the chat's conversation is looked at now
and then (:data:`WAIT_LOOK`; each second once it has expired) and the run that answered after
it is followed from storage, its frames reaching the tabs like any run's (a run already shown
is never shown twice).

A tab that joins while messages of its chat wait for their turn — recorded by an instance that
died since, or by this one before the tab's socket dropped, or queued behind the chat's run —
sees them after the history (:meth:`WebProvider.waiting`), and the run answering each is
followed as it begins, wherever it runs: what became of each is looked up now and then
(:data:`ANSWER_LOOK`) while a tab of the chat is here. A message the tab sends again that was
recorded already (its acknowledgement was lost) is looked after the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

from pluto.errors import ConfigError, StorageError
from pluto.events import (ApprovalDecision, ApprovalRequest, RunEnd, RunEvent, RunStart,
                          ToolStart)
from pluto.gateway.ports import (ChatDirectory, Intake, Provider, ProviderContext, RunFeed,
                                 SharedFileReader, Ticket, TranscriptItem)
from pluto.providers.handover import HandOver
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.loops import follow
from pluto.providers.web import pages, protocol
from pluto.providers.web.rooms import Rooms
from pluto.providers.web.settings import WebSettings, load_settings
from pluto.providers.web.socket import serve_socket
from pluto.providers.web.tokens import FileLinks, SessionSigner, load_key
from pluto.storage.ports import RunReader
from pluto.types import (MARKDOWN, Accepted, Capabilities, Dropped, Duplicate,
                         IncomingMessage, OutgoingMessage, Outcome, Refused, Route)

log = logging.getLogger(__name__)

FINISHED_RUNS_KEPT = 2000
FOLLOW_RETRY = 0.5  # seconds before a run's following that storage cut short reads on
FOLLOW_RETRY_MAX = 5.0  # (doubling up to this)
SILENT_CHECK = 2.0  # a run listened to and silent this long is followed from storage instead
WAIT_LOOK = 5.0  # seconds between looks for the run resuming a request shown here (open)
EXPIRED_LOOK = 1.0  # … once it has expired (the gateway resumes it itself)
EXPIRED_LOOKING = 300.0  # seconds after its expiry a request is looked after at most
WAITING_KEPT = 1000  # requests looked after at most
ANSWER_LOOK = 1.0  # seconds between looks for the runs answering messages waiting elsewhere
ANSWERS_KEPT = 5000  # such messages looked after at most
KEPT_PROBES = 2000
MAX_CHILDREN = 50  # child runs (asked agents) of one run shown nested at most  # chats whose route (agent) is remembered from their last message


@dataclass(slots=True)
class _Waiting:
    """A request shown here, waiting: whose chat, since when, until when."""

    chat_id: str
    run_id: str
    asked_at: float
    expires_at: float
    next_look: float = 0.0


class _Shown:
    """Where the showing of one run stands: the last seq shown; for a child run (an agent
    asked by a tool call of the run shown), the parent run and its call, and the run whose
    buffer its frames join (the root: a tab that joins mid-answer gets them in order)."""

    def __init__(self, chat_id: str, message_id: str | None, *,
                 parent: tuple[str, str] | None = None, root: str | None = None):
        self.chat_id = chat_id
        self.message_id = message_id
        self.parent = parent
        self.root = root
        self.children: list[str] = []
        self.seq = 0
        # listened to (no task): how to stop, and the timer of a run still silent
        self.unlisten: Callable[[], None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class WebProvider(Provider):
    name = "web"
    # charts and tables reach the tabs with their tool's progress (the run feed): a reply's
    # images need no message of their own
    capabilities = Capabilities(max_message_length=100_000, markup=MARKDOWN,
                                streams_deltas=True, answers_from_feed=True,
                                can_send_images=True, can_send_files=True,
                                has_buttons=True)  # an approval's card (widget.js)
    runs: RunReader | None = None  # (from the context) a run going on elsewhere, looked up

    def __init__(self, settings: WebSettings, *, key: bytes, data_dir: Path, feed: RunFeed,
                 chats: ChatDirectory, files: SharedFileReader | None = None):
        self.settings = settings
        self.signer = SessionSigner(key, max_age=settings.session_days * 86400)
        self.links = FileLinks(key, data_dir, files)
        self.feed = feed
        self.chats = chats
        self.rooms = Rooms()
        self.sockets: set[web.WebSocketResponse] = set()
        self.handover = HandOver(self.name)
        self._intake: Intake | None = None
        self._ready = asyncio.Event()
        self._follows: dict[str, asyncio.Task[None] | None] = {}  # None: listened to
        self._shown: dict[str, _Shown] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()  # approval id → request
        self._probes: OrderedDict[str, IncomingMessage] = OrderedDict()  # chat → its route
        self._looking: asyncio.Task[None] | None = None
        # messages recorded whose run is looked for: message id → chat (:meth:`await_answer`)
        self._answers: OrderedDict[str, str] = OrderedDict()
        self._answering: asyncio.Task[None] | None = None
        self._look_failed = False

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> WebProvider:
        settings = load_settings(ctx.config.model_dump())
        if ctx.http is None or ctx.chats is None:
            raise ConfigError([("pluto.yaml", None, "providers.web",
                                "the web chat needs the HTTP server: run 'pluto serve'")])
        provider = cls(settings, key=load_key(ctx.data_dir, settings.session_secret_env),
                       data_dir=ctx.data_dir, feed=ctx.feed, chats=ctx.chats, files=ctx.files)
        provider.runs = ctx.runs
        ctx.http.router.add_get("/ws", provider._socket)
        pages.mount(ctx.http.router, provider)
        ctx.http.on_shutdown.append(provider._on_shutdown)
        return provider

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        return await serve_socket(self, request)

    # the gateway side ---------------------------------------------------------------------

    async def run(self, intake: Intake) -> None:
        self._intake = intake
        self._ready.set()
        try:
            await asyncio.Event().wait()  # messages arrive through the sockets
        finally:
            self._ready.clear()

    async def deliver(self, msg: IncomingMessage) -> Ticket:
        """Hand a visitor's message to intake (waiting while the provider (re)starts); the run
        it starts is shown to every tab of the chat. :class:`NotRecorded` when intake could
        not record it (the tab is told, and sends it again)."""
        await self._ready.wait()
        assert self._intake is not None
        remember(self._probes, msg.chat_id, IncomingMessage(
            provider=msg.provider, chat_id=msg.chat_id, user_id=msg.user_id, text="",
            guild_id=msg.guild_id, is_direct=msg.is_direct), KEPT_PROBES)
        ticket = await self.handover(self._intake.submit, msg)
        ticket.when_decided(lambda outcome: self._show_outcome(msg, outcome))
        return ticket

    def _show_outcome(self, msg: IncomingMessage, outcome: Outcome) -> None:
        client_id = (msg.message_id or "").removeprefix(f"{msg.chat_id}:")
        if isinstance(outcome, Accepted):
            self._answers.pop(msg.message_id or "", None)
            self._follow(msg.chat_id, outcome.run_id, client_id, fresh=True)
        elif isinstance(outcome, Refused | Dropped):  # (over a rate limit, a full queue…): the
            # tabs show it as not sent, to send again (the chat is told why by a notice)
            self.rooms.broadcast(msg.chat_id, protocol.frame("refused", reply_to=client_id))
        elif isinstance(outcome, Duplicate) and msg.message_id:  # recorded before (its ack
            self.await_answer(msg.chat_id, msg.message_id)  # was lost): its run is shown

    # messages waiting, wherever they were received ---------------------------------------

    async def conversation(self, probe: IncomingMessage
                           ) -> tuple[list[TranscriptItem], list[IncomingMessage]]:
        """A tab joins the chat ``probe`` comes from: its transcript, and its messages waiting
        for their turn (in no transcript yet), oldest first — the run answering each is shown
        to the chat's tabs when it begins (:meth:`_look_for_answers`). Empty when storage
        cannot say (logged)."""
        chat_id = probe.chat_id
        try:
            items, found = await self.chats.conversation(probe)
        except Exception:  # noqa: BLE001 - the tab is shown an empty history
            log.exception("web: reading the history of chat %s failed", chat_id)
            return [], []
        for msg in found:
            if msg.message_id:
                self.await_answer(chat_id, msg.message_id)
        return items, found

    def await_answer(self, chat_id: str, message_id: str) -> None:
        """Show chat ``chat_id``'s tabs the run that answers ``message_id`` when it begins
        (looked for now and then, while a tab of the chat is here). A message received here
        may be told by its ticket first (which ends the looking); looking too means one whose
        ticket is decided late — its chat's holder changed meanwhile — is not shown late."""
        log.debug("web: looking for the run answering %s", message_id)
        remember(self._answers, message_id, chat_id, ANSWERS_KEPT)
        if self._answering is None or self._answering.done():
            self._answering = asyncio.create_task(self._look_for_answers(), name="web:answers")

    async def _look_for_answers(self) -> None:
        """While messages of chats with a tab here wait: now and then, what became of each
        (one lookup a message); the run that took one up is followed (from storage, from its
        start: it may have begun, or ended, on another instance since the last look)."""
        while self._answers:
            await asyncio.sleep(ANSWER_LOOK)
            for message_id, chat_id in list(self._answers.items()):
                if not self.rooms.count(chat_id):
                    self._answers.pop(message_id, None)  # nobody here to show it to (the
                    continue  # history has it on the next visit)
                try:
                    outcome = await self.chats.outcome(self.name, message_id)
                except Exception as e:  # noqa: BLE001 - storage away: the next look
                    if not self._look_failed:
                        log.warning("web: looking up what became of waiting messages failed "
                                    "(looking again every %g s): %s", ANSWER_LOOK, e)
                    self._look_failed = True
                    break
                self._look_failed = False
                log.debug("web: %s became %s", message_id, outcome)
                if outcome is None or self._answers.pop(message_id, None) is None:
                    continue
                client_id = message_id.removeprefix(f"{chat_id}:")
                if isinstance(outcome, Accepted):  # (its run.start names the message: a tab
                    self._follow(chat_id, outcome.run_id, client_id)  # draws it in its place)
                elif isinstance(outcome, Refused | Dropped):
                    self.rooms.broadcast(chat_id, protocol.frame("refused", reply_to=client_id))

    def run_started(self, msg: IncomingMessage, run_id: str) -> None:
        """A run the gateway started here in a chat of ours for a message it made itself (a
        schedule's firing, a request nobody decided in time): shown live to the chat's tabs
        from the feed, as a run a tab started; a request it resumes is no longer looked after
        (:meth:`_look_for_resumed` is the fallback for a run on another instance)."""
        if msg.approval is not None:
            self._waiting.pop(msg.approval, None)
        self._follow(msg.chat_id, run_id, fresh=True)

    def route(self, probe: IncomingMessage) -> Route | None:
        return self.chats.route(probe)

    async def resume(self, chat_id: str, run_id: str | None, *,
                     answered: bool = False) -> set[str]:
        """A tab joins a chat whose last run (``run_id``) is still going and nothing here
        shows it (it runs on another instance): it is followed from storage, from its first
        event, its frames reaching the tabs after the history — and so is one that ended
        answered since the history was read, without its answer (``answered``: the history
        has it). The runs the history must leave out (they come as frames)."""
        if run_id is None or self.runs is None or run_id in self._follows or \
                run_id in self._finished:
            return set()  # shown here: its frames are held for the tab, or it is over
        try:
            run = await self.runs.run(run_id)
        except Exception as e:  # noqa: BLE001 - the history is shown without it
            log.warning("web: could not look up run %s of chat %s: %s", run_id, chat_id, e)
            return set()
        if run is None or (run.status not in ("queued", "running") and (
                answered or run.status != "ok")):
            return set()  # ended: its answer (or its end) is in the history
        # (the message it answers: should the run be cut off, its message's next run is found)
        source, prefix = run.source_id or "", f"{chat_id}:"
        self._follow(chat_id, run_id, source[len(prefix):] if source.startswith(prefix) else None)
        return {run_id}

    def following(self) -> dict[str, bool]:
        """The runs being shown to tabs now: run id -> whether a task follows it from storage
        (False: heard from the feed's own call)."""
        return {run_id: task is not None for run_id, task in self._follows.items()}

    def _follow(self, chat_id: str, run_id: str, client_id: str | None = None, *,
                fresh: bool = False) -> None:
        if run_id in self._follows or run_id in self._finished:
            return
        shown = self._shown[run_id] = _Shown(chat_id, client_id)
        self.rooms.run_started(chat_id, run_id)
        # A run just accepted here is shown from the feed's own call, each event as it is
        # published (no task of its own, no wake-up per batch of text); any other is followed.
        stop = self.feed.listen(run_id, lambda e: self._heard(run_id, e)) if fresh else None
        if stop is None:
            self._show_in_task(run_id, fresh=fresh)
            return
        shown.unlisten = stop
        shown.timer = asyncio.get_running_loop().call_later(SILENT_CHECK, self._silent, run_id)
        self._follows[run_id] = None

    def _show_in_task(self, run_id: str, *, fresh: bool) -> None:
        self._follows[run_id] = asyncio.create_task(self._show_run(run_id, fresh),
                                                    name=f"web:run:{run_id}")

    def _heard(self, run_id: str, event: RunEvent) -> None:
        """An event of a run listened to, in the call that published it."""
        shown = self._shown.get(run_id)
        if shown is None or shown.unlisten is None:
            return
        shown.cancel_timer()
        if event.seq != shown.seq + 1:  # (a start it missed): storage has it all, in order
            self._read_instead(run_id, shown)
            return
        try:
            self._show(run_id, shown, event)
        except Exception:
            log.exception("web: showing run %s failed; reading it from storage", run_id)
            self._read_instead(run_id, shown)
            return
        if isinstance(event, RunEnd):
            self._done(run_id)

    def _silent(self, run_id: str) -> None:
        """Nothing heard of a run for a while: follow it from storage (it may have ended
        before it was listened to — a flood of other runs made the feed forget it)."""
        shown = self._shown.get(run_id)
        if shown is not None and shown.unlisten is not None and shown.seq == 0:
            self._read_instead(run_id, shown)

    def _read_instead(self, run_id: str, shown: _Shown) -> None:
        """Stop listening to a run: follow it from storage, from where its showing stands."""
        self._stop_listening(shown)
        self._show_in_task(run_id, fresh=False)

    @staticmethod
    def _stop_listening(shown: _Shown) -> None:
        if shown.unlisten is not None:
            shown.unlisten()
            shown.unlisten = None
        shown.cancel_timer()

    def _show(self, run_id: str, shown: _Shown, event: RunEvent) -> None:
        """One event of a run (its reply too) to the chat's tabs."""
        frame = protocol.run_frame(event.seq, event, self.links.link)
        if frame is not None:
            if shown.parent is not None:  # a child run's: drawn inside its parent's call
                frame["parent_run_id"], frame["parent_call_id"] = shown.parent
            elif isinstance(event, RunStart):
                frame["message_id"] = shown.message_id
            self.rooms.run_frame(shown.root or run_id, frame)
        shown.seq = event.seq
        if isinstance(event, ToolStart) and event.child_run_id is not None:
            self._follow_child(run_id, shown, event.call_id, event.child_run_id)
        if isinstance(event, RunEnd) and event.outcome == "interrupted" and \
                shown.parent is None and shown.message_id:  # cut off (its instance stopped):
            # its message is answered again, by a run of its own, maybe elsewhere
            self.await_answer(shown.chat_id, f"{shown.chat_id}:{shown.message_id}")
        if isinstance(event, ApprovalRequest):
            self._await(shown.chat_id, event)
        elif isinstance(event, ApprovalDecision):
            self._waiting.pop(event.approval_id, None)

    def _follow_child(self, run_id: str, shown: _Shown, call_id: str, child_id: str) -> None:
        """The run answering an ``ask_<agent>`` call of a run shown: its frames, marked with
        the parent run and call, reach the same tabs — heard from the feed as the parent is,
        else followed from storage."""
        if child_id in self._follows or child_id in self._finished or \
                child_id == run_id or len(shown.children) >= MAX_CHILDREN:
            return
        shown.children.append(child_id)
        child = self._shown[child_id] = _Shown(shown.chat_id, None, parent=(run_id, call_id),
                                               root=shown.root or run_id)
        stop = self.feed.listen(child_id, lambda e: self._heard(child_id, e)) \
            if shown.unlisten is not None else None
        if stop is None:
            self._show_in_task(child_id, fresh=False)
            return
        child.unlisten = stop
        child.timer = asyncio.get_running_loop().call_later(SILENT_CHECK, self._silent,
                                                            child_id)
        self._follows[child_id] = None

    # a decision taken without a message from here ---------------------------------------

    def _await(self, chat_id: str, event: ApprovalRequest) -> None:
        remember(self._waiting, event.approval_id, _Waiting(
            chat_id, event.run_id, event.ts, event.expires_at,
            next_look=min(time.time() + WAIT_LOOK, event.expires_at)), WAITING_KEPT)
        if self._looking is None or self._looking.done():
            self._looking = asyncio.create_task(self._look_for_resumed(), name="web:approvals")

    async def _look_for_resumed(self) -> None:
        """While requests shown here wait: now and then, the run that resumed one (found in
        its chat's conversation, answered after it), followed from storage."""
        while self._waiting:
            await asyncio.sleep(min(EXPIRED_LOOK, WAIT_LOOK))
            now = time.time()
            for approval_id, waiting in list(self._waiting.items()):
                if now > waiting.expires_at + EXPIRED_LOOKING or \
                        not self.rooms.count(waiting.chat_id):
                    self._waiting.pop(approval_id, None)  # nobody here to show it to (the
                    continue  # history has it on the next visit)
                if now < waiting.next_look:
                    continue
                waiting.next_look = now + EXPIRED_LOOK if now >= waiting.expires_at \
                    else min(now + WAIT_LOOK, waiting.expires_at)
                try:
                    found = await self._resumed(waiting)
                except Exception as e:  # noqa: BLE001 - storage away: the next look
                    log.warning("web: looking for the run resuming approval %s failed: %s",
                                approval_id, e)
                    continue
                if found is not None and approval_id in self._waiting:
                    self._waiting.pop(approval_id, None)
                    self._follow(waiting.chat_id, found)

    async def _resumed(self, waiting: _Waiting) -> str | None:
        probe = self._probes.get(waiting.chat_id) or IncomingMessage(
            provider=self.name, chat_id=waiting.chat_id, user_id=waiting.chat_id, text="",
            is_direct=True)
        for item in reversed(await self.chats.transcript(probe, limit=20)):
            run = item.run_id
            if item.role == "assistant" and run and run != waiting.run_id and \
                    item.ts >= waiting.asked_at:
                return None if run in self._follows or run in self._finished else run
        return None

    async def _show_run(self, run_id: str, fresh: bool = False) -> None:
        """Follow a run to its end for the chat's tabs. Storage failing meanwhile (a cut, an
        outage) does not end the showing — ended, the run counted as shown here, its tabs
        never got the rest of it: it is read on from where it stood, while a tab of the chat
        is here to see it."""
        shown = self._shown[run_id]
        delay, told = FOLLOW_RETRY, False
        try:
            while True:
                try:
                    await follow(self.feed.follow(run_id, after=shown.seq, fresh=fresh),
                                 lambda event: self._show(run_id, shown, event),
                                 what=f"web: showing run {run_id}", log=log,
                                 passing=(StorageError,))
                    return
                except StorageError as e:
                    if not self.rooms.count(shown.chat_id):
                        return  # nobody here to show it to (the history has it next time)
                    if not told:
                        log.warning("web: following run %s failed (%s); reading it again",
                                    run_id, e)
                        told = True
                    await asyncio.sleep(delay)
                    delay, fresh = min(FOLLOW_RETRY_MAX, delay * 2), False
        finally:
            self._done(run_id)

    def _done(self, run_id: str) -> None:
        shown = self._shown.pop(run_id, None)
        if shown is not None:
            self._stop_listening(shown)
            for child in shown.children:  # (a child heard from the feed ends before its
                kept = self._shown.get(child)  # parent: one still listened to never will)
                if kept is not None and kept.unlisten is not None:
                    self._done(child)
        self.rooms.run_ended(run_id)
        self._follows.pop(run_id, None)
        remember(self._finished, run_id, None, FINISHED_RUNS_KEPT)

    async def send(self, message: OutgoingMessage) -> str | None:
        """The gateway's answers without a run (a command's reply, a notice). A run's reply
        comes from the run feed; one handed over here all the same (an outbox row recorded
        before replies were taken from the feed) is shown to the chat as it was then."""
        if message.kind == "delta":
            return None  # progress comes from the run feed
        if message.attachments:  # a spoken answer (docs/voice.md): played in the widget
            return self._send_voice(message)
        run: dict[str, Any] = {"id": f"{message.run_id}:{message.seq}",
                               "run_id": message.run_id,
                               "seq": message.seq} if message.run_id is not None else {}
        match message.kind:
            case "reply":
                frame = protocol.frame("message.final", text=message.text,
                                       **(run or {"run_id": None,
                                                  "reply_to": _client_id(message)}))
            case "notice":
                frame = protocol.frame("notice", text=message.text)
            case _ if run:
                frame = protocol.error("run_error", message.text, **run)
            case _:
                frame = protocol.error("gateway", message.text, reply_to=_client_id(message))
        self.rooms.broadcast(message.chat_id, frame)
        return str(frame["id"])

    def _send_voice(self, message: OutgoingMessage) -> str | None:
        """Each OGG voice note of ``message`` as a ``voice`` frame: a signed link the tab plays
        (other files: the widget has no place for them, they are left out)."""
        sent = None
        for attachment in message.attachments:
            link = self.links.link(str(attachment.path)) if attachment.path else None
            if link is None or attachment.mime_type != "audio/ogg":
                continue
            frame = protocol.frame("voice", url=link, name=attachment.filename,
                                   reply_to=_client_id(message))
            self.rooms.broadcast(message.chat_id, frame)
            sent = sent or str(frame["id"])
        return sent

    # shutting down ------------------------------------------------------------------------

    async def _on_shutdown(self, app: web.Application) -> None:
        for ws in list(self.sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def close(self) -> None:
        tasks = [task for task in self._follows.values() if task is not None]
        tasks += [t for t in (self._looking, self._answering) if t is not None]
        for task in tasks:
            task.cancel()
        for shown in list(self._shown.values()):
            self._stop_listening(shown)
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in self.rooms.all():
            await client.close()


def _client_id(message: OutgoingMessage) -> str | None:
    """The id the visitor's tab gave the message this answers (``<chat>:<client id>``)."""
    if not message.answers:
        return None
    return message.answers.removeprefix(f"{message.chat_id}:")

