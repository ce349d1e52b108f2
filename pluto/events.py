"""The typed events a run yields: a tagged union dispatched with ``match``.

Names are an API once a client uses them (the web widget, the SSE stream), so they follow the
seed design: run.start, message.delta, tool.start, tool.end, message.final, run.end, run.error;
tool.progress (a long tool call's progress, as its tool reports it) was added with MCP tools;
approval.request (a tool call waits for a person's decision: the run ends ``awaiting_approval``)
and approval.decision (the decision, first in the run that resumes it) with approvals.

Every event carries ``seq``: its number within its run (1, 2, 3, …), given by storage when the
event is committed. It travels with the event everywhere (the run feed, SSE, the WebSocket, the
terminal), so a watcher resumes "after seq N" and never sees an event twice. An event not yet
committed has ``seq`` 0.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "cancelled", "budget", "error", "interrupted", "awaiting_approval"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart:
    type: Literal["run.start"] = "run.start"
    run_id: str
    seq: int = 0
    session_id: str
    agent: str
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageDelta:
    type: Literal["message.delta"] = "message.delta"
    run_id: str
    seq: int = 0
    text: str
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStart:
    type: Literal["tool.start"] = "tool.start"
    run_id: str
    seq: int = 0
    call_id: str
    name: str
    arguments: dict[str, Any]
    # an agent asked by this call (``ask_<name>``): the run that answers it, whose events are
    # in the run feed under that id (a watcher may nest them under this call)
    child_run_id: str | None = None
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolProgress:
    """How far a tool call has got (``total`` None: unknown); between its start and end."""

    type: Literal["tool.progress"] = "tool.progress"
    run_id: str
    seq: int = 0
    call_id: str
    name: str
    progress: float
    total: float | None = None
    message: str | None = None
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolEnd:
    type: Literal["tool.end"] = "tool.end"
    run_id: str
    seq: int = 0
    call_id: str
    name: str
    content: str
    details: Any = None
    is_error: bool = False
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageFinal:
    type: Literal["message.final"] = "message.final"
    run_id: str
    seq: int = 0
    text: str
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd:
    type: Literal["run.end"] = "run.end"
    run_id: str
    seq: int = 0
    outcome: Outcome
    usage: dict[str, int] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunError:
    """A run that could not finish. ``message`` is one plain sentence fit for a chat user;
    ``detail``, when there is more to say, is for the gateway's operators only (the terminal,
    the admin API): it may name an internal endpoint or a variable."""

    type: Literal["run.error"] = "run.error"
    run_id: str
    seq: int = 0
    message: str
    kind: str = "error"
    detail: str | None = None
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """A tool call waits for a person's decision (docs/approvals.md): the run ends after this
    with the outcome ``awaiting_approval``; a decision resumes it in a new run. ``arguments``
    is the call's arguments as the chat shows them (JSON, truncated); ``approvers`` who may
    decide, in words; ``expires_at`` when nobody deciding means denied (epoch seconds)."""

    type: Literal["approval.request"] = "approval.request"
    run_id: str
    seq: int = 0
    approval_id: str
    call_id: str
    name: str
    arguments: str
    approvers: str = ""
    expires_at: float = 0.0
    ts: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecision:
    """What became of an approval request: the first event of the run that resumes it.
    ``verdict``: approved, denied, expired (nobody decided in time) or cancelled."""

    type: Literal["approval.decision"] = "approval.decision"
    run_id: str
    seq: int = 0
    approval_id: str
    call_id: str
    name: str
    verdict: Literal["approved", "denied", "expired", "cancelled"]
    by: str = ""
    reason: str = ""
    ts: float = field(default_factory=time.time)


RunEvent = (RunStart | MessageDelta | ToolStart | ToolProgress | ToolEnd | MessageFinal | RunEnd
            | RunError | ApprovalRequest | ApprovalDecision)

_EVENTS: tuple[type[RunEvent], ...] = (RunStart, MessageDelta, ToolStart, ToolProgress, ToolEnd,
                                       MessageFinal, RunEnd, RunError, ApprovalRequest,
                                       ApprovalDecision)
_BY_TYPE: dict[str, type[RunEvent]] = {
    str(cls.__dataclass_fields__["type"].default): cls for cls in _EVENTS}


_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _BY_TYPE.values()}


def event_to_dict(event: RunEvent) -> dict[str, Any]:
    """The event as a plain dict (shallow: the events are flat and frozen; this is on the hot
    path of every run, where ``dataclasses.asdict``'s deep copy costs several times more)."""
    return {name: getattr(event, name) for name in _FIELDS[type(event)]}


def event_from_dict(data: dict[str, Any]) -> RunEvent:
    """Rebuild an event stored or sent as a dict; unknown keys are ignored."""
    cls = _BY_TYPE[data["type"]]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
