"""Rows and engine-independent helpers shared by every storage engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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
