"""Agents as tools, and handoffs: ``agents:`` and ``handoff:`` in an agent's ``agent.yaml``.

``agents: [analyst]`` gives the model a tool ``ask_analyst(question)``. Calling it starts a
*child run*: the analyst answers the question with its own instructions, model and tools,
through the same :class:`~pluto.runtime.runner.Runner`, with a run id of its own, in a session
of its own (one per asked agent and parent session, so its answers do not enter the parent's
history). The child works inside the parent's budgets:

- its time is at most three quarters of what the parent has left (the rest is the parent's, to
  answer), its tokens at most what the parent has left; what it used is added to the parent's;
- its ledger rows are the parent's: the root run's id and agent, ``purpose`` ``ask_<name>``
  (so the usage budgets of the parent's agent, route, user and chat cover it);
- a child that runs out of them ends with its budget error, which the parent reads as the
  tool's error, and answers.

Its events are committed under its own run id (readable like any run's) and published to the
same observer as the parent's; the parent's ``tool.progress`` for the call names the child run
and its tools as they start, and its ``tool.end`` carries ``details.run_id``. Depth (a child's
child ...) and fan-out (children per run) are limited (``delegation:`` in agent.yaml: the root
agent's depth, each parent's fan-out); a refused ask is a tool error the model reads. Cancelling
the parent's tool call (``/stop``) cancels the child run, which is recorded cancelled.

``handoff: [writer]`` gives ``handoff_to(name)``: from the next message on, the session is
answered by that agent (until ``/new``, which starts a new session); the chat is told
"Handing over to writer.". A handoff is the session's ``handoff_to`` tool message: for a
message to a session whose route's agent may hand over, its newest such message is read from
storage (one indexed query) — so it holds across a restart and on every instance alike.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from pluto.agents.spec import AgentSpec, Budget
from pluto.errors import PlutoError
from pluto.events import MessageFinal, RunEnd, RunError, RunEvent, RunStart, ToolStart
from pluto.ids import ordered_id
from pluto.runtime.tools import Progress, Tool, ToolContext, ToolResult
from pluto.storage.ports import ConversationStore

if TYPE_CHECKING:
    from pluto.runtime.runner import Runner, RunRequest

log = logging.getLogger(__name__)

ASK = "ask_"
HANDOFF = "handoff_to"
CHILD_TIME_SHARE = 0.75  # of the parent's time left; the rest is for the parent's answer
HANDED = "Handing over to"
_HANDED_RE = re.compile(rf"{HANDED} ([a-z0-9][a-z0-9_-]{{0,63}})\.")


class ParentRun(Protocol):
    """What a child run needs of its parent's state (the runner's ``_RunState``)."""

    req: RunRequest
    deadline: float
    usage: dict[str, int]
    observe: Callable[[RunEvent], None]

    @property
    def total_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a child run sits: its parent, the root run (whose ledger and budgets it uses)."""

    parent_run_id: str
    root_run_id: str
    root_agent: str
    depth: int  # 1: asked by a run that nobody asked
    max_depth: int  # the root agent's limit


@dataclass(slots=True)
class _Asks:
    """One parent run's asks so far (its fan-out)."""

    parent: ParentRun
    lineage: Lineage | None
    started: int = 0


@dataclass(slots=True)
class _Followed:
    answer: str | None = None
    error: str | None = None
    outcome: str = "cancelled"
    usage: dict[str, int] = field(default_factory=dict)


class Delegation:
    """Builds a run's ``ask_<name>`` and ``handoff_to`` tools (``services["delegation"]``)."""

    def __init__(self, load: Callable[[str], Awaitable[AgentSpec]]):
        self.load = load  # an agent by name (the registry's load)
        self.lineage: dict[str, Lineage] = {}  # child runs going on
        # the runs this process holds (run id -> message id; the gateway's, which its recovery
        # sweep leaves alone): a child run is held while it runs, with its parent's message
        self.live: dict[str, str | None] = {}

    def charged(self, run_id: str) -> Lineage | None:
        """A child run's place (its usage is its root run's), None for a run nobody asked."""
        return self.lineage.get(run_id)

    async def agent_for(self, session_id: str, default: str,
                        store: ConversationStore) -> AgentSpec:
        """The agent that answers the session: the one it was handed to (while that one is
        available), else ``default`` (the route's). Raises as the loader does for ``default``."""
        spec = await self.load(default)
        if not spec.handoff:  # (a session handed on by a later agent began with one)
            return spec
        name = await _handed_to(store, session_id)
        if name is not None and name != default:
            try:
                return await self.load(name)
            except (PlutoError, LookupError) as e:
                log.warning("session %s was handed to agent %s, which is not available (%s); "
                            "%s answers", session_id, name, e, default)
        return spec

    async def tools_for(self, runner: Runner, parent: ParentRun) -> dict[str, Tool]:
        """The parent run's tools to ask its agents and hand over (those the route allows)."""
        agent, narrowed = parent.req.agent, parent.req.tools
        asks = _Asks(parent, self.lineage.get(parent.req.run_id))
        tools: dict[str, Tool] = {}
        for name in agent.agents:
            if narrowed is not None and ASK + name not in narrowed:
                continue
            try:
                child = await self.load(name)
            except (PlutoError, LookupError) as e:
                log.warning("agent %s lists agent %s, which is not available: %s",
                            agent.name, name, e)
                continue
            tools[ASK + name] = self._ask_tool(runner, asks, child)
        if agent.handoff and (narrowed is None or HANDOFF in narrowed):
            tools[HANDOFF] = self._handoff_tool(parent)
        return tools

    # asking an agent -------------------------------------------------------------------------

    def _ask_tool(self, runner: Runner, asks: _Asks, child: AgentSpec) -> Tool:
        async def ask(ctx: ToolContext, question: str) -> ToolResult:
            return await self._ask(runner, asks, child.name, question, ctx.progress,
                                   ctx.child_run_id)

        about = f": {child.description}" if child.description else ""
        return Tool(ASK + child.name, (
            f"Ask the agent '{child.name}'{about}. It answers one question with its own "
            "instructions and tools and returns its answer; give it everything it needs "
            "in the question (it does not see this conversation)."),
            {"type": "object", "properties": {"question": {
                "type": "string", "description": "The question or task, self-contained."}},
             "required": ["question"], "additionalProperties": False}, ask)

    def _refusal(self, asks: _Asks, name: str) -> str | None:
        parent = asks.parent
        agent = parent.req.agent
        depth = asks.lineage.depth + 1 if asks.lineage else 1
        limit = asks.lineage.max_depth if asks.lineage else agent.delegation.max_depth
        if depth > limit:
            return (f"Error: {name} cannot be asked from here: agents may ask other agents "
                    f"only {limit} level(s) deep. Answer with what you have.")
        if asks.started >= agent.delegation.max_children:
            return (f"Error: this answer already asked {asks.started} agent(s), the most "
                    f"allowed ({agent.delegation.max_children}). Answer with what you have.")
        return None

    async def _ask(self, runner: Runner, asks: _Asks, name: str, question: str,
                   progress: Progress | None, run_id: str | None = None) -> ToolResult:
        if (refused := self._refusal(asks, name)) is not None:
            return ToolResult(refused, is_error=True)
        try:
            spec = await self.load(name)
        except (PlutoError, LookupError):
            return ToolResult(f"Error: the agent '{name}' is not available right now.",
                              is_error=True)
        parent = asks.parent
        budget = _child_budget(parent, spec, time.monotonic())
        if isinstance(budget, str):
            return ToolResult(f"Error: {name} was not asked: {budget}", is_error=True)
        req = await self._child_request(runner, parent, replace(spec, budget=budget), question,
                                        run_id)
        asks.started += 1
        self.lineage[req.run_id] = self._child_lineage(asks, parent)
        self.live[req.run_id] = self.live.get(parent.req.run_id)
        try:
            followed = await _follow(runner.run(req, parent.observe), name, req.run_id, progress)
        finally:
            self.lineage.pop(req.run_id, None)
            self.live.pop(req.run_id, None)
        for key in ("prompt_tokens", "completion_tokens"):  # the child's tokens are the parent's
            parent.usage[key] = parent.usage.get(key, 0) + int(followed.usage.get(key, 0))
        return _result(name, req.run_id, followed)

    @staticmethod
    def _child_lineage(asks: _Asks, parent: ParentRun) -> Lineage:
        up = asks.lineage
        if up is None:
            return Lineage(parent.req.run_id, parent.req.run_id, parent.req.agent.name, 1,
                           parent.req.agent.delegation.max_depth)
        return Lineage(parent.req.run_id, up.root_run_id, up.root_agent, up.depth + 1,
                       up.max_depth)

    @staticmethod
    async def _child_request(runner: Runner, parent: ParentRun, spec: AgentSpec,
                             question: str, run_id: str | None = None) -> RunRequest:
        """The child's run: its own id and session (per asked agent and parent session), the
        parent's person and chat (budgets, memory); no inbox message, no chat notices, nobody
        to ask for an approval."""
        session = await runner.store.session(f"ask/{spec.name}/{parent.req.session.id}",
                                             spec.name)
        # (a child cannot wait for a person: a call of its that needs approval is refused,
        # and the parent reads why — docs/approvals.md)
        return replace(parent.req, run_id=run_id or ordered_id(), session=session, agent=spec,
                       text=question, tools=None, source=None, notify=None, asking=None,
                       resume=None)

    # handing over -----------------------------------------------------------------------------

    def _handoff_tool(self, parent: ParentRun) -> Tool:
        names = list(parent.req.agent.handoff)

        async def handoff_to(ctx: ToolContext, name: str) -> ToolResult:
            return await self._hand_over(parent, names, name)

        return Tool(HANDOFF, (
            "Hand this conversation over to another agent: from the user's next message on, "
            f"it answers them (one of: {', '.join(names)}). Then tell the user so in one "
            "short sentence."),
            {"type": "object", "properties": {"name": {"enum": names, "description":
                                                       "The agent to hand over to."}},
             "required": ["name"], "additionalProperties": False}, handoff_to)

    async def _hand_over(self, parent: ParentRun, names: list[str], name: str) -> ToolResult:
        if name not in names:  # (the schema's enum says so too)
            return ToolResult(f"Error: you can hand over only to: {', '.join(names)}.",
                              is_error=True)
        try:
            await self.load(name)
        except (PlutoError, LookupError):
            return ToolResult(f"Error: the agent '{name}' is not available right now.",
                              is_error=True)
        line = f"{HANDED} {name}."  # (kept by the tool message the run records)
        if parent.req.notify is not None:
            with contextlib.suppress(Exception):  # the chat's notice never stops the answer
                await parent.req.notify(line)
        return ToolResult(f"{line} From the user's next message on, {name} answers this "
                          "conversation (until /new). Tell the user so in one short sentence.",
                          details={"text": line, "handoff": name})


async def _handed_to(store: ConversationStore, session_id: str) -> str | None:
    """The agent the session's newest handoff named, if any."""
    said = await store.newest_tool_result(session_id, HANDOFF)
    m = _HANDED_RE.match(said) if said else None
    return m.group(1) if m is not None else None


def _child_budget(parent: ParentRun, spec: AgentSpec, now: float) -> Budget | str:
    """The child's own budget, cut to what the parent has left; a sentence when nothing is."""
    seconds = (parent.deadline - now) * CHILD_TIME_SHARE
    tokens = parent.req.agent.budget.max_tokens - parent.total_tokens
    if seconds <= 0.05:
        return "this answer has no time left for it"
    if tokens <= 0:
        return "this answer has no tokens left for it"
    own = spec.budget
    return own.model_copy(update={"max_seconds": min(own.max_seconds, seconds),
                                  "max_tokens": min(own.max_tokens, tokens)})


async def _follow(events: AsyncIterator[RunEvent], name: str, run_id: str,
                  progress: Progress | None) -> _Followed:
    """Read the child run to its end; its start and its tools are the parent call's progress."""
    out = _Followed()
    step = 0
    async with aclosing(events) as running:  # type: ignore[type-var]
        async for event in running:
            note = None
            match event:
                case RunStart():
                    note = f"asking {name} (run {run_id})"
                case ToolStart(name=tool):
                    note = f"{name}: {tool}"
                case MessageFinal(text=text):
                    out.answer = text
                case RunError(message=message):
                    out.error = message
                case RunEnd(outcome=outcome, usage=usage):
                    out.outcome, out.usage = outcome, dict(usage)
            if note is not None and progress is not None:
                step += 1
                await progress(step, None, note)
    return out


def _result(name: str, run_id: str, followed: _Followed) -> ToolResult:
    details = {"run_id": run_id, "agent": name, "outcome": followed.outcome}
    if followed.outcome == "ok" and followed.answer is not None:
        return ToolResult(followed.answer, details=details)
    why = followed.error or f"its run ended ({followed.outcome})"
    return ToolResult(f"Error: {name} could not answer: {why}", details=details, is_error=True)
