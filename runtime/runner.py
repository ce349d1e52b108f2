"""The Runner: one run is one turn of an agent for one session.

It loads the session's history, builds the prompt, streams the model, executes the tool calls
the model makes, feeds the results back and repeats until a final answer, within the agent's
budgets. Every event is numbered by storage (``seq``) before it is handed to the run's
observer (the run feed, metrics) and then yielded. The answer, tool events, errors and the
run's end are committed first, so nobody is shown one that is not on disk; the model's text
comes as previews, in batches (at most one per ``delta_interval``, the first at once:
:mod:`.batching`), committed behind the run and at the latest with its next event — a crash
loses at most the last previews, never an answer. The observer sees every event,
including those recorded when a run is cancelled (which are not yielded: the consumer is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pluto.agents.spec import AgentSpec
from pluto.events import (ApprovalDecision, ApprovalRequest, MessageDelta, MessageFinal, RunEnd,
                          RunError, RunEvent, RunStart, ToolEnd, ToolProgress, ToolStart)
from pluto.ids import ordered_id
from pluto.runtime.approvals import (STORED_ARGUMENTS, Asking, new_approval_id, refusal_text,
                                     shown_arguments, who_decides)
from pluto.runtime.batching import batched
from pluto.runtime.memory import MemoryBook, Speaker
from pluto.runtime.memory.compaction import Summarizer, model_summarizer
from pluto.runtime.memory.context import NO_MEMORY, RunMemory, prepare
from pluto.errors import RunTakenOver, StorageError
from pluto.runtime.errors import BudgetExceeded, ModelError
from pluto.runtime.images import with_images
from pluto.runtime.model import Model, ModelSettings, ModelTurn, ToolCall
from pluto.runtime.openai_compat import model_for
from pluto.runtime.skills import skill_tools
from pluto.runtime.tools import Progress, Tool, ToolContext, ToolError, ToolResult
from pluto.runtime.tracing import Tracing
from pluto.runtime.usage import Attribution, Reservation, UsageCall, UsageMeter
from pluto.storage.ports import ApprovalStore, ConversationStore
from pluto.storage.rows import SessionRow, ToolApproval, estimate_tokens

log = logging.getLogger(__name__)

INTERNAL_ERROR = "Something went wrong on our side while answering; the error has been logged."
# storage could not save the answer (or an event of the run) even after retrying
STORAGE_FAILED = ("I couldn't save this answer, so I can't send it; please try again in a "
                  "moment.")

# previews at full rate (a batch every delta_interval) while this many turns stream at once;
# beyond, the gap widens in proportion, up to MAX_DELTA_INTERVAL seconds (Runner._batch_gap)
STREAMS_AT_FULL_RATE = 50
MAX_DELTA_INTERVAL = 0.5

Observer = Callable[[RunEvent], None]


def _ignore(event: RunEvent) -> None:
    return None


@dataclass(frozen=True, slots=True)
class RunRequest:
    run_id: str
    session: SessionRow
    agent: AgentSpec
    text: str
    tools: tuple[str, ...] | None = None  # the route's narrowing of the agent's tools
    source: tuple[str, str] | None = None  # (provider, message id): the inbox's message
    who: Attribution = Attribution()  # whom it answers, for the usage ledger and budgets
    speaker: Speaker | None = None  # who wrote it, where: whose long-term memory it may use
    notify: Callable[[str], Awaitable[Any]] | None = None  # a one-line notice to the chat
    # where a tool call may wait for a person's approval (None: nobody can be asked here, so a
    # call that needs one is refused) — runtime/approvals.py
    asking: Asking | None = None
    resume: ToolApproval | None = None  # the decided request this run resumes


@dataclass(slots=True)
class _RunState:
    req: RunRequest
    observe: Observer
    deadline: float
    messages: list[dict[str, Any]]
    tools: dict[str, Tool]
    settings: ModelSettings
    starting: asyncio.Future[RunEvent]  # the run's start, being committed
    start_observed: bool = False
    start_shown: bool = False
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0,
                                                           "completion_tokens": 0})
    tool_calls: int = 0
    partial: str = ""
    ended: bool = False
    ledger: list[asyncio.Future[Any]] = field(default_factory=list)  # rows riding a commit
    reservation: Reservation | None = None  # the budgets' share the model call in flight holds
    approved: set[str] = field(default_factory=set)  # tools approved in the session (first_time)

    @property
    def total_tokens(self) -> int:
        return self.usage["prompt_tokens"] + self.usage["completion_tokens"]


class Runner:
    def __init__(self, conversations: ConversationStore, *,
                 models: Mapping[str, ModelSettings],
                 tools: Mapping[str, Tool], data_dir: Path,
                 services: dict[str, Any] | None = None,
                 model_factory: Callable[[ModelSettings], Model] = model_for,
                 retry_base_delay: float = 0.5, delta_interval: float = 0.04,
                 usage: UsageMeter | None = None, tracing: Tracing | None = None,
                 approvals: ApprovalStore | None = None):
        self.store = conversations
        self.models = models
        self.tools = tools
        self.data_dir = data_dir
        self.services = services or {}
        self.model_factory = model_factory
        self.retry_base_delay = retry_base_delay
        self.delta_interval = delta_interval  # text deltas are committed and shown in batches
        self.streaming = 0  # model turns being read now (their batches widen when many are)
        self.usage = usage  # the ledger (a row per model call) and budgets
        self.tracing = tracing  # spans of runs, model and tool calls (off unless configured)
        self.approvals = approvals  # tool calls waiting for a person (runtime/approvals.py)
        self.on_approval: Callable[[ToolApproval], None] | None = None  # a request was made
        # several instances: a run storage cut short is not ended with an error here but
        # handed back (its message answered again once storage works: gateway/app.py)
        self.hand_back = False

    def settings_for(self, agent: AgentSpec) -> ModelSettings:
        """An agent names a model from pluto.yaml, or gives a litellm model string itself."""
        base = self.models.get(agent.model) or ModelSettings(model=agent.model)
        changes: dict[str, Any] = {}
        if agent.api_base:
            changes["api_base"] = agent.api_base
            if agent.api_base != base.api_base:  # pluto.yaml's key never goes to another host
                changes["api_key_env"] = None
        if agent.api_key_env:  # (the loader allows only agents.api_key_envs from pluto.yaml)
            changes["api_key_env"] = agent.api_key_env
        if agent.temperature is not None:
            changes["temperature"] = agent.temperature
        if not changes:
            return base
        return replace(base, **changes)

    def tools_for(self, agent: AgentSpec, narrowed: tuple[str, ...] | None) -> dict[str, Tool]:
        names = [n for n in agent.tools if narrowed is None or n in narrowed]
        missing = [n for n in names if n not in self.tools]
        if missing:
            log.warning("agent %s lists unknown tools: %s", agent.name, ", ".join(missing))
        return {n: self.tools[n] for n in names if n in self.tools}

    async def agent_tools(self, agent: AgentSpec,
                          narrowed: tuple[str, ...] | None) -> dict[str, Tool]:
        """The agent's own tools: its skills' loader, and its MCP servers' tools (the servers
        are started now if they are not running: ``services["mcp"]``, a runtime.mcp.McpHub)."""
        tools = skill_tools(agent)
        hub = self.services.get("mcp")
        if hub is not None and agent.mcp:
            tools.update(await hub.tools_for(agent, narrowed))
        return tools

    async def run(self, req: RunRequest, observe: Observer = _ignore) -> AsyncIterator[RunEvent]:
        """Run one turn; yields events, each already committed to storage and observed."""
        agent = req.agent
        if self.tracing is not None:
            observe = self.tracing.follow(req, observe)
        state = await self._prepare(req, observe)
        starting = state.starting
        try:
            async for event in self._loop(state):
                yield event
        except (ModelError, BudgetExceeded) as e:
            if start := await self._shown_start(state):
                yield start
            if isinstance(e, BudgetExceeded):
                log.warning("run %s (agent %s) stopped at its %s budget", req.run_id,
                            agent.name, e.budget)
            public = e.public if isinstance(e, ModelError) else str(e)
            yield await self._fail(state, public, "budget" if isinstance(e, BudgetExceeded)
                                   else "error", detail=str(e) if str(e) != public else None)
            yield await self._end(state, "budget" if isinstance(e, BudgetExceeded) else "error",
                                  error=public)
        except RunTakenOver:
            state.ended = True  # another instance answers it: nothing more is said here
            raise
        except StorageError as e:  # a commit failed for good (retried by the engine first)
            # it never started, or (several instances) it is handed back: the caller sees to it
            if _failed(starting) or self.hand_back:
                state.ended = True
                raise
            log.error("run %s (agent %s): its answer or an event could not be saved (%s); "
                      "ending it with an error", req.run_id, agent.name, e)
            async for event in self._end_with(state, STORAGE_FAILED):
                yield event
        except Exception:
            if _failed(starting):  # it never started: the caller ends it (as it always did)
                state.ended = True
                raise
            log.exception("run %s failed", req.run_id)
            if start := await self._shown_start(state):
                yield start
            yield await self._fail(state, INTERNAL_ERROR, "error")
            yield await self._end(state, "error", error=INTERNAL_ERROR)
        finally:
            if not state.ended:  # cancelled (/stop, shutdown) or the consumer went away
                await asyncio.shield(self._finish_cancelled(state))
            await self._ledger_written(state)

    async def _prepare(self, req: RunRequest, observe: Observer) -> _RunState:
        """The run's state: its memory and history read, its prompt made, its start being
        committed (while the model is called: one database trip off the first token's way;
        nothing is shown before it is on disk)."""
        agent = req.agent
        memory = await self._memory(req)  # notes, summary and tools (runtime/memory)
        history = memory.history if memory.history is not None else await self.store.history(
            req.session.id, agent.history.max_messages, agent.history.max_tokens)
        starting = asyncio.ensure_future(self.store.start_run(
            req.run_id, req.session.id, agent.name, req.text,
            RunStart(run_id=req.run_id, session_id=req.session.id, agent=agent.name),
            source=req.source, message=req.resume is None))
        prompt = "\n\n".join(p for p in (agent.instructions, memory.system) if p)
        system = [{"role": "system", "content": prompt}] if prompt else []
        settings = self.settings_for(agent)
        said = [{"role": "user", "content": req.text}] if req.resume is None else []
        messages = await with_images(  # pictures' notes: image parts, or descriptions
            system + history + said, settings, self.data_dir, self.services.get("data"))
        state = _RunState(req, observe, time.monotonic() + agent.budget.max_seconds,
                          messages, self.tools_for(agent, req.tools) | memory.tools,
                          settings, starting)
        for key, tokens in (memory.usage or {}).items():  # a compaction's tokens are the run's
            state.usage[key] = state.usage.get(key, 0) + tokens
        return state

    async def _end_with(self, state: _RunState, message: str) -> AsyncIterator[RunEvent]:
        """The run's start if not shown yet, then ``message`` as its error and its end (a
        failure to record these too goes to the caller, which ends the run again or leaves it
        to the recovery sweep)."""
        state.ended = True
        if start := await self._shown_start(state):
            yield start
        yield await self._fail(state, message, "error")
        yield await self._end(state, "error", error=message)

    async def _shown_start(self, state: _RunState) -> RunEvent | None:
        """The run's start, committed and observed, the first time it is asked for (then
        None): it comes before anything else the run shows."""
        if state.start_shown:
            return None
        start = await self._observed_start(state)
        state.start_shown = True
        return start

    @staticmethod
    async def _observed_start(state: _RunState) -> RunEvent:
        """The run's start once committed, observed once (before anything else of the run:
        the usage ledger's observers too)."""
        starting = state.starting
        start = (starting.result() if starting.done()  # (no shield to make: it is committed)
                 else await asyncio.shield(starting))  # a stop never cuts a commit short
        if not state.start_observed:
            state.start_observed = True
            state.observe(start)
        return start

    # memory (runtime/memory): long-term notes, compaction, search_history ----------------

    async def _memory(self, req: RunRequest) -> RunMemory:
        """What the agent's ``memory:`` block adds to this run; a failure here is logged and
        the run goes on with the plain history window (memory never stops an answer)."""
        if req.agent.memory.long_term is None and req.agent.memory.short_term is None:
            return NO_MEMORY
        book = self.services.setdefault("memory", MemoryBook(self.data_dir / "memory"))
        started = time.monotonic()
        try:
            memory = await prepare(req.agent, session_id=req.session.id,
                                   session_key=req.session.key, run_id=req.run_id,
                                   speaker=req.speaker, book=book,
                                   history=self.services.get("history"),
                                   summarizer=lambda: self._summarizer(req.agent),
                                   narrowed=req.tools, notify=req.notify)
        except Exception:
            log.exception("memory for run %s (agent %s) failed; answering without it",
                          req.run_id, req.agent.name)
            return NO_MEMORY
        if memory.usage and self.usage is not None:  # the summarizer's call, in the ledger
            try:
                await self.usage.record(UsageCall(
                    run_id=req.run_id, session_id=req.session.id, agent=req.agent.name,
                    model=self._summary_settings(req.agent).model,
                    input_tokens=memory.usage.get("prompt_tokens", 0),
                    output_tokens=memory.usage.get("completion_tokens", 0),
                    latency=time.monotonic() - started, outcome="ok", route=req.who.route,
                    provider=req.who.provider, user_id=req.who.user_id,
                    chat_id=req.who.chat_id, purpose="compaction", origin=req.who.origin))
            except Exception:
                log.exception("usage of the compaction of run %s not recorded", req.run_id)
        return memory

    def _summary_settings(self, agent: AgentSpec) -> ModelSettings:
        """The model that writes compaction summaries: ``short_term.model``, else the agent's."""
        short = agent.memory.short_term
        if short is not None and short.model:
            return self.models.get(short.model) or ModelSettings(model=short.model)
        return self.settings_for(agent)

    def _summarizer(self, agent: AgentSpec) -> Summarizer | None:
        """None with the offline model: truncation then."""
        settings = self._summary_settings(agent)
        if settings.model == "offline":
            return None
        return model_summarizer(self.model_factory(settings), settings)

    async def _loop(self, state: _RunState) -> AsyncIterator[RunEvent]:
        state.tools.update(await self.agent_tools(state.req.agent, state.req.tools))
        if (delegation := self.services.get("delegation")) is not None:  # ask_<agent>, handoff
            state.tools.update(await delegation.tools_for(self, state))
        schemas = [t.schema() for t in state.tools.values()]
        if state.req.resume is not None:  # a decided approval: its call first
            async for event in self._resumed(state, state.req.resume):
                yield event
            if state.ended:  # it waits for another approval
                return
        while True:
            turn = None
            items = batched(self._model_turn(state, schemas), interval=self._batch_gap,
                            after=None if state.start_shown else state.starting,
                            covers=_final_answer)
            self.streaming += 1
            try:
                async with aclosing(items):  # type: ignore[type-var]
                    async for item in items:
                        if not state.start_shown:
                            yield await self._shown_start(state)  # type: ignore[misc]
                        if isinstance(item, ModelTurn):
                            turn = item
                        else:
                            state.partial += item
                            yield await self._commit(state, MessageDelta(
                                run_id=state.req.run_id, text=item))
            finally:
                self.streaming -= 1
            assert turn is not None
            self._account(state, turn)
            if not turn.tool_calls:  # the answer and the run's end, in one commit
                state.ended = True
                usage = self._usage(state)
                final, end = await self.store.complete_run(
                    state.req.run_id, state.req.session.id,
                    MessageFinal(run_id=state.req.run_id, text=turn.text),
                    RunEnd(run_id=state.req.run_id, outcome="ok", usage=usage), usage=usage)
                await self._ledger_written(state)  # (the same commit, with SQLite)
                state.partial = ""
                state.observe(final)
                state.observe(end)
                yield final
                yield end
                return
            if state.total_tokens >= state.req.agent.budget.max_tokens:
                raise BudgetExceeded(_budget_msg("tokens", state), "tokens")
            async for event in self._run_tools(state, turn):
                yield event
            if state.ended:  # a call waits for a person's approval
                return

    def _batch_gap(self) -> float:
        """The gap between a turn's preview batches: ``delta_interval``, widened in proportion
        once more than :data:`STREAMS_AT_FULL_RATE` turns stream at once (up to
        :data:`MAX_DELTA_INTERVAL`). A batch costs a commit, an observer call and a frame per
        watcher, so the same previews at a thousand answers at once would keep the loop from
        the questions still arriving; each preview then shows more text at a time."""
        if self.streaming <= STREAMS_AT_FULL_RATE:
            return self.delta_interval
        return min(MAX_DELTA_INTERVAL,
                   self.delta_interval * self.streaming / STREAMS_AT_FULL_RATE)

    async def _model_turn(self, state: _RunState,
                          schemas: list[dict[str, Any]]) -> AsyncIterator[str | ModelTurn]:
        """One model call, its budgets' share reserved first (settled by its ledger row; given
        back here if no row took it)."""
        await self._reserve_usage(state)
        try:
            async for item in self._model_call(state, schemas):
                yield item
        finally:
            if state.reservation is not None and self.usage is not None:
                held, state.reservation = state.reservation, None
                await asyncio.shield(self.usage.release(held))

    async def _model_call(self, state: _RunState,
                          schemas: list[dict[str, Any]]) -> AsyncIterator[str | ModelTurn]:
        """One model call, retried with backoff while nothing has been shown yet."""
        model = self.model_factory(state.settings)
        attempt = 0
        while True:
            shown = False
            remaining = state.deadline - time.monotonic()
            if remaining <= 0:
                raise BudgetExceeded(_budget_msg("seconds", state), "seconds")
            started, unmetered = time.monotonic(), "cancelled"  # how an unanswered call ended
            stream = model.stream(state.messages, schemas, state.settings)
            try:
                # One time limit for the whole call. This generator is read only by the turn's
                # own task (:func:`batched`), which awaits nothing else while it is suspended
                # here, so the limit can only fire while the model is awaited — never in the
                # consumer storing or showing text, where it would look like a user's stop.
                async with asyncio.timeout(remaining):
                    async for item in stream:
                        shown = shown or isinstance(item, str)
                        if isinstance(item, ModelTurn):
                            unmetered = ""
                            item = await self._metered(state, item, attempt, started)
                        yield item
                return
            except TimeoutError:
                unmetered = "error"
                raise BudgetExceeded(_budget_msg("seconds", state), "seconds") from None
            except ModelError as e:
                unmetered = "error"
                if not e.retryable or shown or attempt >= state.settings.retries:
                    raise
                delay = e.retry_after or self.retry_base_delay * 2 ** attempt
                if time.monotonic() + delay >= state.deadline:
                    raise
                unmetered = ""
                await self._meter_unanswered(state, attempt, started, "retried")
                attempt += 1
                log.warning("model %s: %s; retry %d in %.1fs", state.settings.model, e,
                            attempt, delay)
                await asyncio.sleep(delay)
            finally:
                if (close := getattr(stream, "aclose", None)) is not None:
                    await close()
                if unmetered:  # failed, or cancelled (/stop): a row too, with what we know
                    await self._meter_unanswered(state, attempt, started, unmetered,
                                                 settle=True)

    # the usage ledger and budgets (runtime/usage.py) ----------------------------------------

    async def _reserve_usage(self, state: _RunState) -> None:
        """Before a model call: reserve its estimated maximum from every usage budget that
        applies, or refuse it when one has no room (runtime/usage.py)."""
        if self.usage is None or not self.usage.budgets():
            return
        req = state.req
        prompt = sum(estimate_tokens(json.dumps(m)) for m in state.messages)
        state.reservation = await self.usage.reserve(
            self._charged(state)[1], req.who, prompt_tokens=prompt,
            max_output=state.settings.max_output_tokens,
            models=(state.settings.model, req.agent.model))

    def _usage_call(self, state: _RunState, attempt: int, started: float, outcome: str,
                    usage: Mapping[str, int], estimated: bool = False) -> UsageCall:
        req = state.req
        run_id, agent, purpose = self._charged(state)
        return UsageCall(
            run_id=run_id, session_id=req.session.id, agent=agent,
            model=state.settings.model, route=req.who.route, provider=req.who.provider,
            user_id=req.who.user_id, chat_id=req.who.chat_id,
            purpose=purpose or ("tool_loop" if state.tool_calls else "answer"), attempt=attempt,
            input_tokens=int(usage.get("prompt_tokens", 0)),
            output_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(usage.get("cached_tokens", 0)), estimated=estimated,
            latency=time.monotonic() - started, outcome=outcome, origin=req.who.origin)

    def _charged(self, state: _RunState) -> tuple[str, str, str | None]:
        """Whose ledger rows and budgets a run's calls are: its own (run id, agent), or, for
        an agent asked by another (runtime/delegation.py), its root run's, with the purpose
        ``ask_<agent>``."""
        delegation = self.services.get("delegation")
        line = delegation.charged(state.req.run_id) if delegation is not None else None
        if line is None:
            return state.req.run_id, state.req.agent.name, None
        return line.root_run_id, line.root_agent, f"ask_{state.req.agent.name}"

    async def _metered(self, state: _RunState, turn: ModelTurn, attempt: int,
                       started: float) -> ModelTurn:
        """A finished call: its ledger row, with what the model reported (a turn that reported
        nothing gets the runner's estimate, marked so in the ledger)."""
        estimated = not turn.usage
        if estimated:
            turn = replace(turn, usage={
                "prompt_tokens": sum(estimate_tokens(json.dumps(m)) for m in state.messages),
                "completion_tokens": estimate_tokens(turn.text)})
        if self.usage is not None:
            await self._record_soon(state, self._usage_call(state, attempt, started, "ok",
                                                            turn.usage, estimated))
        return turn

    async def _meter_unanswered(self, state: _RunState, attempt: int, started: float,
                                outcome: str, *, settle: bool = False) -> None:
        """A call that gave no answer (its row gives its reservation back when ``settle``: it
        failed or was stopped for good; a retried attempt keeps it for the next)."""
        if self.usage is not None:
            await asyncio.shield(self._record(state, self._usage_call(
                state, attempt, started, outcome, {}), settle=settle))

    async def _record(self, state: _RunState, call: UsageCall, *, settle: bool = False) -> None:
        with contextlib.suppress(Exception):  # (one that never started: recorded all the same)
            await self._observed_start(state)  # a call is recorded after its run's start
        held, state.reservation = (state.reservation, None) if settle else (None,
                                                                          state.reservation)
        try:
            await self.usage.record(call, models=(state.req.agent.model,),  # type: ignore[union-attr]
                                    release=held)
        except Exception:  # the ledger never stops an answer
            log.exception("usage of run %s not recorded", state.req.run_id)

    async def _record_soon(self, state: _RunState, call: UsageCall) -> None:
        """The ledger row of a finished call, handed over to ride with the run's next commit
        (the answer, or the tool call's message): it costs no commit of its own. The run
        waits for it before it shows its answer (:meth:`_ledger_written`)."""
        assert self.usage is not None
        with contextlib.suppress(Exception):
            await self._observed_start(state)  # a call is recorded after its run's start
        try:
            call = await self.usage.priced(call, models=(state.req.agent.model,))
            held, state.reservation = state.reservation, None  # settled by this row
            state.ledger.append(self.usage.record_soon(call, release=held))
        except Exception:  # the ledger never stops an answer
            log.exception("usage of run %s not recorded", state.req.run_id)

    async def _ledger_written(self, state: _RunState) -> None:
        """Every ledger row of the run handed over so far, committed (or its failure logged)."""
        while state.ledger:
            written = state.ledger.pop(0)
            try:
                await asyncio.shield(written)
            except StorageError as e:  # (storage said why: no traceback)
                log.error("usage of run %s not recorded: %s", state.req.run_id, e)
            except Exception:
                log.exception("usage of run %s not recorded", state.req.run_id)

    def _account(self, state: _RunState, turn: ModelTurn) -> None:
        usage = turn.usage or {
            "prompt_tokens": sum(estimate_tokens(json.dumps(m)) for m in state.messages),
            "completion_tokens": estimate_tokens(turn.text)}
        for key in ("prompt_tokens", "completion_tokens"):
            state.usage[key] += int(usage.get(key, 0))

    async def _run_tools(self, state: _RunState, turn: ModelTurn) -> AsyncIterator[RunEvent]:
        req = state.req
        calls = [c.as_message() for c in turn.tool_calls]
        await self.store.add_message(req.session.id, "assistant", turn.text or None,
                                     run_id=req.run_id, tool_calls=calls)
        assistant = {"role": "assistant", "content": turn.text or None, "tool_calls": calls}
        state.messages.append(assistant)
        state.partial = ""
        async for event in self._calls(state, assistant, [], list(turn.tool_calls)):
            yield event

    async def _calls(self, state: _RunState, assistant: dict[str, Any],
                     results: list[dict[str, Any]],
                     calls: list[ToolCall]) -> AsyncIterator[RunEvent]:
        """The turn's calls in order; one a person must approve first ends the run there
        (``awaiting_approval``), the rest of the turn kept with its request."""
        for i, call in enumerate(calls):
            if state.tool_calls >= state.req.agent.budget.max_tool_calls:
                raise BudgetExceeded(_budget_msg("tool_calls", state), "tool_calls")
            if await self._needs_approval(state, call):
                if state.req.asking is not None and self.approvals is not None:
                    async for event in self._pause(state, assistant, results, calls[i:]):
                        yield event
                    return
                async for event in self._not_run(state, call, (
                        f"The call to {call.name} needs a person's approval, and nobody can be "
                        "asked here; it was not run."), results):
                    yield event
                continue
            async for event in self._one_call(state, call, results):
                yield event

    async def _one_call(self, state: _RunState, call: ToolCall,
                        results: list[dict[str, Any]]) -> AsyncIterator[RunEvent]:
        req = state.req
        state.tool_calls += 1
        args, problem = _parse_arguments(call)
        child = ordered_id() if problem is None and call.name.startswith("ask_") and \
            self.services.get("delegation") is not None and call.name in state.tools else None
        yield await self._commit(state, ToolStart(run_id=req.run_id, call_id=call.id,
                                                  name=call.name, arguments=args or {},
                                                  child_run_id=child))
        result = problem or await self._call_tool(state, call, args or {}, child)
        async for event in self._tool_result(state, call, result, results):
            yield event

    async def _tool_result(self, state: _RunState, call: ToolCall, result: ToolResult,
                           results: list[dict[str, Any]]) -> AsyncIterator[RunEvent]:
        req = state.req
        await self.store.add_message(req.session.id, "tool", result.content,
                                     run_id=req.run_id, tool_call_id=call.id, name=call.name)
        message = {"role": "tool", "tool_call_id": call.id, "name": call.name,
                   "content": result.content}
        state.messages.append(message)
        results.append(message)
        yield await self._commit(state, ToolEnd(
            run_id=req.run_id, call_id=call.id, name=call.name, content=result.content,
            details=result.details, is_error=result.is_error))

    async def _not_run(self, state: _RunState, call: ToolCall, why: str,
                       results: list[dict[str, Any]]) -> AsyncIterator[RunEvent]:
        """A call refused (denied, expired, nobody to ask): the model reads why."""
        args, _ = _parse_arguments(call)
        yield await self._commit(state, ToolStart(run_id=state.req.run_id, call_id=call.id,
                                                  name=call.name, arguments=args or {}))
        async for event in self._tool_result(state, call, ToolResult(why, is_error=True),
                                             results):
            yield event

    # approvals (runtime/approvals.py) -------------------------------------------------------

    async def _needs_approval(self, state: _RunState, call: ToolCall) -> bool:
        rule = state.req.agent.approval_rule(call.name)
        if rule == "never" or call.name not in state.tools:
            return False  # (an unknown tool is refused as ever: nothing runs)
        if rule == "always":
            return True
        if call.name in state.approved:
            return False
        if self.approvals is not None and await self.approvals.approved_before(
                state.req.session.id, call.name):
            state.approved.add(call.name)
            return False
        return True

    async def _pause(self, state: _RunState, assistant: dict[str, Any],
                     results: list[dict[str, Any]],
                     pending: list[ToolCall]) -> AsyncIterator[RunEvent]:
        """Store the call as a request, show it, and end the run ``awaiting_approval``."""
        req, call = state.req, pending[0]
        asking = req.asking
        assert asking is not None and self.approvals is not None
        row = await self.approvals.create(
            id=new_approval_id(), run_id=req.run_id, session_id=req.session.id,
            session_key=req.session.key, agent=req.agent.name, provider=asking.provider,
            chat_id=asking.chat_id, thread_id=asking.thread_id, asker=asking.asker,
            approvers=asking.approvers, tool=call.name, call_id=call.id,
            arguments=call.arguments[:STORED_ARGUMENTS],
            turn={"assistant": assistant, "results": results,
                  "pending": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                              for c in pending],
                  # what the resuming run needs of this one: the route's narrowing of the
                  # tools, and whether the chat is a direct one (memory)
                  "tools": list(req.tools) if req.tools is not None else None,
                  "direct": req.speaker.is_direct if req.speaker is not None else False},
            timeout=req.agent.approval_timeout)
        log.info("run %s (agent %s): %s waits for approval %s", req.run_id, req.agent.name,
                 call.name, row.id)
        if self.on_approval is not None:
            self.on_approval(row)  # (the sweep looks again just after its deadline)
        yield await self._commit(state, ApprovalRequest(
            run_id=req.run_id, approval_id=row.id, call_id=call.id, name=call.name,
            arguments=shown_arguments(call.arguments), approvers=who_decides(asking.approvers),
            expires_at=row.expires_at))
        yield await self._end(state, "awaiting_approval")

    async def _resumed(self, state: _RunState, row: ToolApproval) -> AsyncIterator[RunEvent]:
        """A decided request: the decision recorded, the paused turn again (the history keeps
        only whole tool exchanges), its call run or refused, then the rest of the turn."""
        req = state.req
        if (start := await self._shown_start(state)) is not None:
            yield start
        yield await self._commit(state, ApprovalDecision(
            run_id=req.run_id, approval_id=row.id, call_id=row.call_id, name=row.tool,
            verdict=row.status,  # type: ignore[arg-type]
            by=row.decided_by or "", reason=row.reason or ""))
        turn = row.turn
        assistant = dict(turn["assistant"])
        await self.store.add_message(req.session.id, "assistant", assistant.get("content"),
                                     run_id=req.run_id, tool_calls=assistant["tool_calls"])
        state.messages.append(assistant)
        results: list[dict[str, Any]] = []
        for done in turn.get("results") or []:
            await self.store.add_message(req.session.id, "tool", done["content"],
                                         run_id=req.run_id, tool_call_id=done["tool_call_id"],
                                         name=done.get("name"))
            state.messages.append(done)
            results.append(done)
        pending = [ToolCall(c["id"], c["name"], c["arguments"]) for c in turn["pending"]]
        first, rest = pending[0], pending[1:]
        if row.status == "approved":
            state.approved.add(first.name)
            async for event in self._one_call(state, first, results):
                yield event
        else:
            async for event in self._not_run(state, first, refusal_text(
                    row.status, first.name, row.decided_by or "", row.reason or ""), results):
                yield event
        async for event in self._calls(state, assistant, results, rest):
            yield event

    async def _call_tool(self, state: _RunState, call: ToolCall, args: dict[str, Any],
                         child_run_id: str | None = None) -> ToolResult:
        tool = state.tools.get(call.name)
        if tool is None:
            known = ", ".join(state.tools) or "none"
            return ToolResult(f"There is no tool named '{call.name}'. Available tools: {known}.",
                              is_error=True)
        req = state.req
        ctx = ToolContext(req.run_id, req.session.id, req.session.key, req.agent.name,
                          self.data_dir, self.services, req.agent.datasets,
                          progress=self._progress_of(state, call), speaker=req.speaker,
                          call_id=call.id, child_run_id=child_run_id)
        try:
            async with asyncio.timeout(max(0.0, state.deadline - time.monotonic())):
                return await tool(ctx, args)
        except TimeoutError:
            raise BudgetExceeded(_budget_msg("seconds", state), "seconds") from None
        except ToolError as e:
            return ToolResult(f"Error: {e}", is_error=True)
        except Exception as e:
            log.exception("tool %s failed in run %s", call.name, req.run_id)
            return ToolResult(f"The tool failed: {type(e).__name__}: {e}", is_error=True)

    def _progress_of(self, state: _RunState, call: ToolCall) -> Progress:
        """A call's progress, committed and observed as tool.progress events (at most two a
        second, and the last); not yielded: the watchers of the run feed show it."""
        last = [0.0]

        async def report(progress: float, total: float | None = None,
                         message: str | None = None) -> None:
            now = time.monotonic()
            if now - last[0] < 0.5 and (total is None or progress < total):
                return
            last[0] = now
            await self._commit(state, ToolProgress(
                run_id=state.req.run_id, call_id=call.id, name=call.name, progress=progress,
                total=total, message=message[:200] if message else None))

        return report

    async def _commit(self, state: _RunState, event: RunEvent) -> RunEvent:
        # a batch of streamed text is a preview: committed behind us (the answer never is)
        event = await self.store.append_event(event, durable=not isinstance(event, MessageDelta))
        state.observe(event)
        return event

    async def _fail(self, state: _RunState, message: str, kind: str,
                    detail: str | None = None) -> RunEvent:
        await self._keep_partial(state)
        return await self._commit(state, RunError(run_id=state.req.run_id, message=message,
                                                  kind=kind, detail=detail))

    @staticmethod
    def _usage(state: _RunState) -> dict[str, int]:
        return dict(state.usage, total_tokens=state.total_tokens, tool_calls=state.tool_calls)

    async def _end(self, state: _RunState, outcome: Any, error: str | None = None) -> RunEvent:
        state.ended = True
        usage = self._usage(state)
        event = await self.store.end_run(state.req.run_id, outcome, error=error, usage=usage,
                                         event=RunEnd(run_id=state.req.run_id, outcome=outcome,
                                                      usage=usage))
        if event is None:  # it had ended already: another instance took it over
            raise RunTakenOver(f"run {state.req.run_id} was taken over by another instance")
        state.observe(event)
        return event

    async def _keep_partial(self, state: _RunState) -> None:
        """What a person already saw of an answer stays in the history."""
        if state.partial:
            await self.store.add_message(state.req.session.id, "assistant", state.partial,
                                         run_id=state.req.run_id)
            state.partial = ""

    async def _finish_cancelled(self, state: _RunState) -> None:
        try:
            await self._shown_start(state)  # (observed, not yielded: the consumer is gone)
        except BaseException:  # noqa: BLE001 - it never started: nothing to end
            return
        await self._keep_partial(state)
        try:
            await self._end(state, "cancelled", error="stopped by the user")
        except RunTakenOver:
            pass  # another instance took it over: it ends there


def _final_answer(item: Any) -> bool:
    """A model turn that ends the run: its text is the answer, shown whole (not as a delta)."""
    return isinstance(item, ModelTurn) and not item.tool_calls


def _failed(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


def _parse_arguments(call: ToolCall) -> tuple[dict[str, Any] | None, ToolResult | None]:
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as e:
        return None, ToolResult(f"Your arguments for {call.name} were not valid JSON ({e.msg} at "
                                f"position {e.pos}). Call the tool again with a JSON object.",
                                is_error=True)
    if not isinstance(args, dict):
        return None, ToolResult(f"The arguments for {call.name} must be a JSON object.",
                                is_error=True)
    return args, None


def _budget_msg(budget: str, state: _RunState) -> str:
    b = state.req.agent.budget
    match budget:
        case "seconds":
            return f"I stopped: this answer took longer than the {b.max_seconds:g}-second limit."
        case "tokens":
            return (f"I stopped: this answer used more than the {b.max_tokens:,}-token limit "
                    f"({state.total_tokens:,} used).")
        case _:
            return (f"I stopped: this answer needed more than the {b.max_tool_calls} tool calls "
                    f"allowed.")
