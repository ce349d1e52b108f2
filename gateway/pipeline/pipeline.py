"""Where a message goes once a provider has handed it over (see :mod:`.intake`).

:meth:`Pipeline.handle` takes one message through the steps, one concern each, and says what
became of it (a typed :data:`~pluto.types.Outcome`):

    access (routing, mention, pairing, rate limits) → commands → overload → the session's lane

(a redelivered message was already stopped by intake, which records every message first).

A message for an agent gets its run id at once (the run is recorded as queued), then waits in
its session's lane: one run at a time per session, in arrival order; different sessions run
concurrently, up to the gateway's run slots (:mod:`.overload`; when those are all taken and
too many runs wait for one, or the event loop runs late, a new message gets a one-line busy
notice instead). :meth:`Pipeline.process` runs it: the agent, any files sent with it, the runner,
and delivery of the reply. Every answer — a command's, a notice, a run's — leaves through
:class:`~pluto.gateway.delivery.delivery.Delivery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal
from dataclasses import dataclass, replace

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError, ProviderError, RunTakenOver, StorageError
from pluto.events import RunEnd, RunError, RunEvent
from pluto.gateway.delivery.delivery import Delivery, reply_to
from pluto.gateway.metrics import Metrics
from pluto.gateway.pipeline.access import Access
from pluto.gateway.pipeline.approvals import ApprovalDesk
from pluto.gateway.pipeline.commands import Commands, Failed
from pluto.gateway.pipeline.data_commands import DataCommands
from pluto.gateway.pipeline.lanes import SessionLanes
from pluto.gateway.pipeline.overload import Load
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.gateway.ports import Provider
from pluto.ids import ordered_id
from pluto.runtime.approvals import Asking
from pluto.runtime.delegation import Delegation
from pluto.runtime.memory import Speaker
from pluto.runtime.runner import INTERNAL_ERROR, STORAGE_FAILED, Runner, RunRequest
from pluto.runtime.usage import Attribution
from pluto.runtime.voice import SpokenAnswer
from pluto.storage.ports import ConversationStore, InboundStore
from pluto.storage.rows import SessionRow, ToolApproval
from pluto.types import (Accepted, Answered, Dropped, IncomingMessage, Outcome, Refused, Route,
                         outcome_to_dict)

log = logging.getLogger(__name__)

BUSY = "I'm still working through your earlier messages; please wait a moment and try again."
BUSY_GATEWAY = ("I'm very busy right now and can't take this message; please send it again in "
                "a minute.")
STOPPED = "stopped by the user"


@dataclass(frozen=True, slots=True)
class Job:
    """A message waiting in its session's lane, with the run that will answer it."""

    msg: IncomingMessage
    route: Route
    run_id: str
    received: float
    session_id: str  # the session when it was accepted (a /new meanwhile starts a fresh one)
    # the session row itself when the run starts at once: not looked up again (with several
    # instances each lookup is a database round trip)
    session: SessionRow | None = None
    # what the run's events pass through before delivery (a scheduled firing: an answer of
    # "nothing to report" is not sent)
    wrap: Callable[[AsyncIterator[RunEvent]], AsyncIterator[RunEvent]] | None = None
    origin: str = "message"  # message | schedule: what started it (kept in the usage ledger)
    resume: ToolApproval | None = None  # a decided approval request this run resumes

    @property
    def source(self) -> tuple[str, str] | None:
        """The inbox's message this job answers, marked handled when its run is recorded."""
        return (self.msg.provider, self.msg.message_id) if self.msg.message_id else None


class Pipeline:
    def __init__(self, *, conversations: ConversationStore, inbox: InboundStore,
                 access: Access, registry: AgentRegistry, routes: Callable[[], RoutingTable],
                 data: DataCommands, runner: Runner, delivery: Delivery,
                 providers: Mapping[str, Provider], metrics: Metrics, load: Load,
                 publish: Callable[[RunEvent], None], max_queued: int = 50,
                 session_guard: Callable[[str], AbstractAsyncContextManager[Any]] | None = None,
                 track_runs: bool = False,
                 fence: Callable[[IncomingMessage], Callable[[], bool]] | None = None):
        self.conversations = conversations
        self.inbox = inbox
        self.access = access
        self.registry = registry
        self.routes = routes  # the table in force (live reload swaps it)
        self.data = data
        self.runner = runner
        self.delivery = delivery
        self.providers = providers
        self.metrics = metrics
        self.publish = publish  # to the run feed
        self.session_guard = session_guard
        self.load = load  # the run slots, and whether to take new work at all
        self.lanes: SessionLanes[Job] = SessionLanes(
            self.process, max_queued=max_queued,
            guard=self._guard if session_guard is not None else None, slots=load)
        # sessions whose next lane needs the session's lease: a chat's intake already runs
        # its messages one at a time on one instance, so only a session that spans chats
        # (``session: shared``) or a message outside the shared inbox (no platform id) needs it
        self._spanning: dict[str, bool] = {}
        # Several instances: a chat's intake waits for each run to end before it takes the
        # chat's next message (see intake), so the runs it started are followed here.
        self.track_runs = track_runs
        # several instances: whether a message's run may still act (its chat still ours)
        self.fence = fence
        # several instances: tell the others to stop a session (True: one of them was running)
        self.stop_elsewhere: Callable[[str], Awaitable[bool]] | None = None
        self._unfinished: dict[str, asyncio.Future[None]] = {}
        # run id -> message id of every run accepted here and not yet over (the recovery
        # sweep leaves these alone); told when a run could not even be ended (storage failed)
        self.live: dict[str, str | None] = {}
        self.on_stranded: Callable[[str, str, IncomingMessage], None] = lambda *a: None
        # a schedule's firing, its chat's turn come (the scheduler starts it): None, no
        # scheduler here — such a message is dropped, the firing recorded by whoever has one
        self.scheduled: Callable[[IncomingMessage], Awaitable[Outcome]] | None = None
        # agents asking agents, and handoffs: which agent a session was handed to
        self.delegation: Delegation = runner.services.setdefault("delegation",
                                                                 Delegation(registry.load))
        self.delegation.live = self.live  # a child run is this process's while it runs
        # approvals of tool calls: /approve, /deny and buttons (None: no store for them)
        self.approvals = ApprovalDesk(
            runner.approvals, lambda p, m, text, kind: self.delivery.reply(
                p, m, text, kind=kind),  # type: ignore[arg-type]
            self._resume) if runner.approvals is not None else None
        self.commands = Commands(registry, conversations, self.stop, self._answering)
        data.register(self.commands)
        access.is_command = self.commands.knows

    # intake → lane ------------------------------------------------------------------------

    async def handle(self, msg: IncomingMessage) -> Outcome:
        """One message through access and commands into its session's lane; the inbox learns
        it was handled (with the run it starts, in the same commit)."""
        outcome = await self._handle(msg)
        if msg.message_id and not isinstance(outcome, Accepted):
            await self.inbox.handled(msg.provider, msg.message_id, outcome_to_dict(outcome))
        return outcome

    def _guard(self, key: str) -> AbstractAsyncContextManager[Any]:
        assert self.session_guard is not None
        if self._spanning.pop(key, True):
            return self.session_guard(key)
        return contextlib.nullcontext()

    async def finished(self, run_id: str) -> None:
        """Wait until the run (accepted by :meth:`handle`, with ``track_runs``) has ended and
        its reply is in the outbox."""
        fut = self._unfinished.get(run_id)
        if fut is not None:
            await asyncio.shield(fut)

    def _settled(self, run_id: str) -> None:
        fut = self._unfinished.pop(run_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _handle(self, msg: IncomingMessage) -> Outcome:
        if msg.firing is not None:  # made by the gateway (checked when the schedule was made)
            if self.scheduled is None:
                return Dropped("no scheduler runs here")
            return await self.scheduled(msg)
        if msg.approval is not None:  # made by the gateway: a request decided without a click
            return await self._resume_decided(msg)
        provider = self.providers.get(msg.provider)
        self.metrics.message_in(msg.provider)
        if provider is None:
            log.error("message from unknown provider %r dropped", msg.provider)
            return Dropped(f"no provider named {msg.provider!r} is running")
        own = provider.own_route(msg)  # (the console's test chat names its agent itself)
        admitted = own if own is not None else await self.access.admit(msg, self.routes())
        if isinstance(admitted, Refused):
            if admitted.notice:
                await self.delivery.reply(provider, msg, admitted.notice, kind="notice")
            return admitted
        route = admitted
        if self.approvals is not None and (decision := self.approvals.parse(msg)) is not None:
            return await self.approvals.decide(msg, route, provider, decision)
        answer = await self.commands.handle(msg, route)
        if answer is not None:
            failed = isinstance(answer, Failed)
            self.metrics.message_out(provider.name, "command")
            await self.delivery.reply(provider, msg, answer, kind="error" if failed else "reply")
            return Answered(str(answer), failed=failed)
        if (overloaded := self.load.refusal()) is not None:
            self.load.refused(overloaded)
            self.metrics.busy_refusal(overloaded)
            await self.delivery.reply(provider, msg, BUSY_GATEWAY, kind="notice")
            return Dropped("the gateway is overloaded", notice=BUSY_GATEWAY)
        if self.lanes.full(route.session_key):
            await self.delivery.reply(provider, msg, BUSY, kind="notice")
            return Dropped("the session's queue is full", notice=BUSY)
        return await self._queue(msg, route)

    async def submit(self, msg: IncomingMessage, route: Route, *,
                     wrap: Callable[[AsyncIterator[RunEvent]], AsyncIterator[RunEvent]]
                     | None = None) -> Outcome:
        """A message the gateway makes itself (a scheduled firing), routed already: into its
        session's lane like any other (access and commands were checked when it was made)."""
        return await self._queue(msg, route, wrap, origin="schedule")

    async def _resume_decided(self, msg: IncomingMessage) -> Outcome:
        """A gateway-made message for a request decided without one (it expired, or the
        instance that took its decision died first): the run that resumes it."""
        assert msg.approval is not None
        row = None if self.approvals is None else await self.approvals.store.get(msg.approval)
        if row is None or row.status == "pending" or row.provider != msg.provider:
            return Dropped("no decided approval request to resume")
        return await self._resume(msg, None, row)

    async def _resume(self, msg: IncomingMessage, route: Route | None,
                      row: ToolApproval) -> Outcome:
        """Queue the run that resumes a decided request, in the request's session (not the
        decider's: an admin's click in a group resumes the asker's conversation) — claimed
        first, so one run resumes it, whoever handles a decision twice."""
        assert self.approvals is not None
        tools = row.turn.get("tools")
        resumed = Route(agent=row.agent, session_key=row.session_key,
                        tools=tuple(tools) if tools is not None else None, rule="approval",
                        approvers=row.approvers,
                        memory_in_groups=route.memory_in_groups if route is not None else None)
        run_id = ordered_id()
        if not await self.approvals.store.claim_resume(row.id, run_id, msg.message_id):
            log.info("approval %s: resumed already (or its run was taken over)", row.id)
            return Dropped("the request was resumed already")
        return await self._queue(msg, resumed, origin="approval", resume=row, run_id=run_id)

    async def _queue(self, msg: IncomingMessage, route: Route,
                     wrap: Callable[[AsyncIterator[RunEvent]], AsyncIterator[RunEvent]]
                     | None = None, *, origin: str = "message",
                     resume: ToolApproval | None = None, run_id: str | None = None) -> Outcome:
        """Into the session's lane. A message that will wait is recorded as a queued run now;
        one that starts at once is recorded by its start (one commit fewer on the way)."""
        session = await self.conversations.session(route.session_key, route.agent)
        waiting = self.lanes.busy(route.session_key)
        job = Job(msg, route, run_id or ordered_id(), time.time(), session.id,
                  None if waiting else session, wrap, origin, resume)
        self.live[job.run_id] = msg.message_id
        if self.track_runs:
            self._unfinished[job.run_id] = asyncio.get_running_loop().create_future()
        if self.session_guard is not None:
            chat = f"{route.agent}/{msg.provider}/{msg.chat_id}"
            within = route.session_key == chat or route.session_key.startswith(chat + "/")
            self._spanning[route.session_key] = (self._spanning.get(route.session_key, False)
                                                 or not within or not msg.message_id)
        if waiting:
            await self.conversations.queue_run(job.run_id, session.id, route.agent, msg.text,
                                               source=job.source)
        if not self.lanes.submit(route.session_key, job):
            await self._drop(job, "the gateway is stopping")  # closed meanwhile
            return Dropped("the gateway is stopping")
        if msg.firing is not None or msg.approval is not None:  # nobody there asked for it
            if (provider := self.providers.get(msg.provider)) is not None:
                try:
                    provider.run_started(msg, job.run_id)
                except Exception:  # noqa: BLE001 - its reply is recorded all the same
                    log.exception("%s: run_started failed for run %s", msg.provider,
                                  job.run_id)
        return Accepted(job.run_id, queued=waiting)

    async def stop(self, session_key: str, *, everywhere: bool = True) -> tuple[bool, int]:
        """``/stop``: cancel the session's run and drop what waits behind it — on every
        instance (``stop_elsewhere``, several instances: the run may be on another)."""
        running, dropped = self.lanes.cancel(session_key)
        for job in dropped:
            await self._drop(job, "dropped by /stop before it ran")
        if self.approvals is not None:  # a run waiting for a person stops too
            with contextlib.suppress(StorageError):
                waiting = await self.approvals.store.cancel_pending(session_key,
                                                                    "stopped with /stop")
                running = running or bool(waiting)
        if everywhere and self.stop_elsewhere is not None:
            running = await self.stop_elsewhere(session_key) or running
        return running, len(dropped)

    async def _answering(self, route: Route) -> str:
        """The agent answering the route's session: the route's, or the one it was handed to
        (its session is looked up only when the route's agent may hand over)."""
        if not (await self.registry.load(route.agent)).handoff:
            return route.agent
        session = await self.conversations.session(route.session_key, route.agent)
        return (await self.delegation.agent_for(session.id, route.agent,
                                                self.conversations)).name

    def urgent(self, msg: IncomingMessage) -> bool:
        """A message to handle at once, ahead of the chat's queue (``/stop``)."""
        return self.commands.is_urgent(msg.text)

    async def close(self, grace: float) -> None:
        """Stop taking messages; let runs finish for ``grace`` seconds, then cancel them."""
        for job in await self.lanes.close(grace):
            await self._drop(job, "the gateway stopped before it ran")

    async def _drop(self, job: Job, why: str) -> None:
        """A run that will never start (or was stopped before it did): record it cancelled,
        so its watchers are not left waiting."""
        self._settled(job.run_id)
        self.live.pop(job.run_id, None)
        try:
            end = await self.conversations.cancel_run(
                job.run_id, job.session_id, job.route.agent, job.msg.text,
                RunEnd(run_id=job.run_id, outcome="cancelled"), error=why, source=job.source)
        except Exception:
            log.exception("recording the end of run %s failed", job.run_id)
            return
        if end is not None:
            self.publish(end)

    # a job's turn ---------------------------------------------------------------------------

    async def process(self, job: Job) -> None:
        try:
            await self._process(job)
        except asyncio.CancelledError:  # /stop or shutdown; a run that had started is ended
            await asyncio.shield(self._drop(job, STOPPED))  # by the runner: this is a no-op
            raise
        finally:
            self._settled(job.run_id)
            self.live.pop(job.run_id, None)

    async def _process(self, job: Job) -> None:
        msg, route = job.msg, job.route
        provider = self.providers.get(msg.provider)
        if provider is None:
            await self._drop(job, f"the provider {msg.provider} is gone")
            return
        observe = self._observer(provider.name)
        try:  # the route's agent, or the one the session was handed to (until /new)
            agent = await self.registry.load(route.agent) if job.resume is not None else \
                await self.delegation.agent_for(job.session_id, route.agent, self.conversations)
        except (PlutoError, LookupError) as e:
            log.error("agent %s unavailable: %s", route.agent, e)
            await self._deliver(provider, msg, job, self._without_run(
                job, "error", f"The agent '{route.agent}' is not available right now.",
                observe))
            return
        session = job.session if job.session is not None and job.session.agent == agent.name \
            else await self.conversations.session(route.session_key, agent.name)
        if job.resume is not None:
            await self._process_resumed(provider, job, agent, session, observe)
            return

        def notify(line: str, kind: Literal["notice", "error"]) -> Awaitable[object]:
            return self.delivery.reply(provider, msg, line, kind=kind)

        text = await self.data.take_uploads(msg, route, session.id, notify)  # data: datasets
        if text is not None:  # images: kept with the run, a note each in the message
            text = await self.data.take_images(msg, text, job.run_id, session.id,
                                               self.runner.settings_for(agent), notify)
        if text is not None:  # voice notes: their words become the message (runtime/voice.py)
            text = await self.data.take_voice(msg, text, notify)
        if text is None:  # only files were sent, or one could not be read: the user was told
            await self._deliver(provider, msg, job, self._without_run(job, "ok", None, observe))
            return
        req = RunRequest(job.run_id, session, agent, text, route.tools, source=job.source,
                         who=Attribution(msg.provider, msg.user_id, msg.chat_id, route.rule,
                                         job.received, job.origin),
                         speaker=Speaker(msg.provider, msg.chat_id, msg.user_id, msg.is_direct,
                                         route.memory_in_groups),
                         notify=lambda line: self.delivery.reply(provider, msg, line,
                                                                 kind="notice"),
                         asking=Asking(msg.provider, msg.chat_id, msg.thread_id, msg.user_id,
                                       route.approvers))
        events = self.runner.run(req, observe)
        spoken = self.data.spoken(agent.name, job.run_id)  # voice.speak_agents
        if spoken is not None and provider.capabilities.can_send_files:
            events = spoken.listen(events)
        await self._deliver(provider, msg, job, job.wrap(events) if job.wrap else events)
        if spoken is not None and spoken.text:
            await self._speak(provider, msg, job, spoken)

    async def _process_resumed(self, provider: Provider, job: Job, agent: Any,
                               session: SessionRow,
                               observe: Callable[[RunEvent], None]) -> None:
        """The run that resumes a decided approval request: in the asker's name, in the
        request's chat (its reply quotes nothing: a click is no message to quote)."""
        row, route = job.resume, job.route
        assert row is not None
        msg = replace(job.msg, is_direct=True, thread_id=row.thread_id)
        req = RunRequest(job.run_id, session, agent, "", route.tools, source=job.source,
                         who=Attribution(row.provider, row.asker, row.chat_id, route.rule,
                                         job.received, job.origin),
                         speaker=Speaker(row.provider, row.chat_id, row.asker,
                                         bool(row.turn.get("direct")), route.memory_in_groups),
                         notify=lambda line: self.delivery.reply(provider, msg, line,
                                                                 kind="notice"),
                         asking=Asking(row.provider, row.chat_id, row.thread_id, row.asker,
                                       row.approvers),
                         resume=row)
        await self._deliver(provider, msg, job, self.runner.run(req, observe))

    async def _speak(self, provider: Provider, msg: IncomingMessage, job: Job,
                     spoken: SpokenAnswer) -> None:
        """The answer, spoken, as a voice note after its text (docs/voice.md)."""
        note = await spoken.note()
        if note is not None:
            await self.delivery.outbox.deliver(provider, f"voice:{job.run_id}", [replace(
                reply_to(msg, ""), attachments=(note,))])

    async def _deliver(self, provider: Provider, msg: IncomingMessage, job: Job,
                       events: AsyncIterator[RunEvent]) -> None:
        run_id = job.run_id
        try:
            last = await self.delivery.run(
                provider, msg, events, fence=self.fence(msg) if self.fence else None)
        except RunTakenOver as e:  # another instance answers it: say nothing more here
            log.warning("%s", e)
            if e.end is not None:  # (recorded here as it found out: its watchers here end)
                self.publish(e.end)
            if self.runner.hand_back:  # several instances: unless its row says it was taken
                # over, nobody will answer it (our claim ran out and was taken again as the
                # database came back: the chat found free, its message counted handled) — it
                # is handed back as a run storage cut short (a no-op for one taken over)
                self.on_stranded(run_id, provider.name, msg)
            return
        except ProviderError:
            self.metrics.error("delivery")  # already logged by delivery; the run is recorded
            return
        except StorageError as e:  # (retried by storage first): logged once, no traceback
            self.metrics.error("run")
            log.error("run %s in %s chat %s: %s", run_id, provider.name, msg.chat_id, e)
            if self.runner.hand_back:  # several instances: answered again once storage works
                self.on_stranded(run_id, provider.name, msg)
                return
            await self._end_failed(provider, msg, job, STORAGE_FAILED)
            return
        except Exception:
            self.metrics.error("run")
            log.exception("run %s in %s chat %s failed", run_id, provider.name, msg.chat_id)
            last = None
        if isinstance(last, RunEnd):
            return
        await self._end_failed(provider, msg, job, INTERNAL_ERROR)

    async def _end_failed(self, provider: Provider, msg: IncomingMessage, job: Job,
                          message: str) -> None:
        """A run that failed before it could end (or whose reply could not be recorded):
        end it, say so, and release its watchers. When storage cannot record even that, the
        run is left to the recovery sweep, which answers its message again once storage
        works (or, if the answer itself was saved, its reply is sent then)."""
        run_id = job.run_id
        if message == STORAGE_FAILED:
            with contextlib.suppress(Exception):  # (reads work on a full disk)
                row = await self.conversations.run(run_id)
                if row is not None and row.status == "ok":  # saved; only its reply was not
                    log.warning("run %s: its answer is saved, its reply could not be; it is "
                                "sent once storage works", run_id)
                    self.on_stranded(run_id, provider.name, msg)
                    return
        try:
            await self.delivery.run(provider, msg, self._without_run(
                job, "error", message, self._observer(provider.name)))
        except StorageError as e:
            log.warning("run %s could not be ended either (%s); its message is answered again "
                        "once storage works", run_id, e)
            self.on_stranded(run_id, provider.name, msg)
        except Exception:
            log.exception("recording the failure of run %s failed too", run_id)

    async def _without_run(self, job: Job, outcome: str, message: str | None,
                           observe: Callable[[RunEvent], None]) -> AsyncIterator[RunEvent]:
        """End a run that needs no model: with an error sentence, or quietly."""
        run_id = job.run_id
        await self.conversations.queue_run(run_id, job.session_id, job.route.agent,
                                           job.msg.text, source=job.source)
        if message is not None:
            error = await self.conversations.append_event(RunError(run_id=run_id,
                                                                   message=message))
            observe(error)
            yield error
        end = await self.conversations.end_run(run_id, outcome, error=message,
                                               event=RunEnd(run_id=run_id,
                                                            outcome=outcome))  # type: ignore
        if end is not None:
            observe(end)
            yield end

    def _observer(self, provider: str) -> Callable[[RunEvent], None]:
        def observe(event: RunEvent) -> None:
            self.publish(event)
            self.metrics.observe(event, provider)
        return observe
