"""What storage hands back (frozen rows) and the engine-independent helpers every engine uses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pluto.errors import PlutoError


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    key: str
    agent: str
    created_at: float


@dataclass(frozen=True, slots=True)
class MessageRow:
    role: str
    content: str | None
    tool_calls: list[dict] | None
    tool_call_id: str | None
    name: str | None
    tokens: int
    run_id: str | None
    created_at: float

    def as_model_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            msg["tool_call_id"] = self.tool_call_id
        if self.name and self.role == "tool":
            msg["name"] = self.name
        return msg


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    session_id: str
    agent: str
    status: str
    input: str | None
    error: str | None
    usage: dict[str, int]
    started_at: float
    ended_at: float | None
    source_id: str | None = None  # the message it answers (its provider's id), if any


def estimate_tokens(text: str) -> int:
    """A cheap, offline token estimate (about four characters a token)."""
    return math.ceil(len(text) / 4) if text else 0


def sanitize_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Make a message list acceptable to any chat-completions API.

    A window or a crash can cut a tool exchange in half: an assistant message whose tool calls
    have no results, or results whose call fell out of the window. Those are dropped, and the
    list never starts with a tool result.
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg["role"] == "tool":
            i += 1  # an orphan result: its call is not in the window
            continue
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            wanted = {c.get("id") for c in msg["tool_calls"]}
            j = i + 1
            results = []
            while j < len(messages) and messages[j]["role"] == "tool":
                results.append(messages[j])
                j += 1
            if wanted == {r.get("tool_call_id") for r in results}:
                out.append(msg)
                out.extend(results)
            i = j
            continue
        out.append(msg)
        i += 1
    return out


# the outbox -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow:
    """One chunk of a reply. ``attachments`` are plain dicts (filename, mime_type, size, path,
    url, kind). Keyed by ``(reply_id, chunk)``: recording the same reply twice changes nothing."""

    reply_id: str
    chunk: int
    provider: str
    chat_id: str
    text: str
    kind: str = "reply"
    markup: str = "plain"
    run_id: str | None = None  # the run the reply answers (None: a gateway answer)
    seq: int = 0  # the run event the reply shows (its message.final or run.error), if any
    thread_id: str | None = None
    reply_to: str | None = None
    answers: str | None = None
    edit_of: str | None = None
    buttons: list[dict[str, str]] = field(default_factory=list)  # label, command, style
    attachments: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None
    status: str = "pending"  # pending → sent | failed
    attempts: int = 0
    platform_id: str | None = None
    error: str | None = None


# the HTTP API's tasks ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    agent: str | None  # the agent routes.yaml chose
    input: str
    additional_input: dict[str, Any]
    created_at: float
    requested_agent: str | None = None  # the agent the client asked for (a routing hint)
    owner: str | None = None  # the name of the API key that made it (None: from before names)


@dataclass(frozen=True, slots=True)
class StepRow:
    id: str
    task_id: str
    seq: int
    input: str
    run_id: str | None
    status: str  # created | running | completed | failed (the last two only without a run)
    output: str | None
    error: str | None
    created_at: float
    ended_at: float | None
    additional_input: dict[str, Any] = field(default_factory=dict)


# pairing ----------------------------------------------------------------------------------------

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: easy to read out and type
CODE_LENGTH = 8


class PairingError(PlutoError, LookupError):
    """No pending request has this code (never issued, already used, or expired)."""


@dataclass(frozen=True, slots=True)
class PairingRequest:
    code: str
    provider: str
    user_id: str
    chat_id: str
    user_name: str | None
    created_at: float
    expires_at: float
    new: bool = False  # issued by this call (not an earlier, still valid code)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("new")
        return d


@dataclass(frozen=True, slots=True)
class Approval:
    provider: str
    user_id: str
    user_name: str | None
    approved_at: float
    approved_by: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalize_code(code: str) -> str:
    """What an admin types: any case, with dashes or spaces (``abcd-2345``)."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def format_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}" if len(code) == CODE_LENGTH else code


# approvals of tool calls (runtime/approvals.py) ------------------------------------------------

@dataclass(frozen=True, slots=True)
class ToolApproval:
    """A tool call waiting for a person's decision, and what became of it (a durable wait: a
    row, decided once, resumed once). ``turn``: the paused model turn — its assistant message,
    the results of the calls before this one, and the calls still to make (this one first)."""

    id: str
    run_id: str
    session_id: str
    session_key: str
    agent: str
    provider: str
    chat_id: str
    thread_id: str | None
    asker: str
    approvers: tuple[str, ...]  # user ids ("123" or "telegram:123"); "asker" for the asker
    tool: str
    call_id: str
    arguments: str
    turn: dict[str, Any]
    status: str  # pending | approved | denied | expired | cancelled
    reason: str | None
    decided_by: str | None
    decided_at: float | None
    decided_message: str | None
    resumed_run: str | None
    created_at: float
    expires_at: float

    def may_decide(self, provider: str, user_id: str) -> bool:
        """Whether this user (of this provider) may approve or deny it."""
        for who in self.approvers:
            if who == "asker":
                if provider == self.provider and user_id == self.asker:
                    return True
            elif who in (user_id, f"{provider}:{user_id}"):
                return True
        return False
