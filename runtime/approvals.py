"""A person approves risky tool calls (docs/approvals.md).

An agent's ``approval:`` rules (agent.yaml) say which of its tools wait for a person: ``always``,
``first_time`` (once per session) or ``never``. A run that reaches such a call stores it as a
request (storage: a row that expires), shows it in the chat with Approve / Deny, and ends with the
outcome ``awaiting_approval``. The decision — a click, ``/approve``, ``/deny``, or nobody in time —
resumes it in a new run on whichever instance holds the chat, also after a restart; that run
first records the decision (``approval.decision``), then runs the call or tells the model it was
refused, and goes on. This module holds what the runner and the gateway share about it.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Literal

from pluto.events import ApprovalRequest

ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no look-alikes: people may type it
SHOWN_ARGUMENTS = 700  # characters of a call's arguments a chat shows
STORED_ARGUMENTS = 64_000  # a call's arguments kept with its request (the model sees them all)
_COMMAND = re.compile(r"^/(approve|deny)(?:@\S+)?(?:\s+([a-z2-9]{6,16}))?(?:\s+(.*))?$",
                      re.S | re.I)


def new_approval_id() -> str:
    """An id a person can type, unguessable enough (48 bits) for a button's payload."""
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(10))


@dataclass(frozen=True, slots=True)
class Asking:
    """Where a run's tool call may wait for a person: the chat it answers and who decides."""

    provider: str
    chat_id: str
    thread_id: str | None
    asker: str  # the user id whose message the run answers
    approvers: tuple[str, ...]  # user ids, and "asker"


@dataclass(frozen=True, slots=True)
class Decision:
    """``/approve [id]`` or ``/deny [id] [reason]`` as written in a chat (or sent by a button)."""

    verdict: Literal["approved", "denied"]
    approval_id: str | None
    reason: str


def parse_decision(text: str) -> Decision | None:
    m = _COMMAND.match(text.strip())
    if m is None:
        return None
    verdict: Literal["approved", "denied"] = "approved" if m.group(1).lower() == "approve" \
        else "denied"
    return Decision(verdict, m.group(2).lower() if m.group(2) else None,
                    (m.group(3) or "").strip()[:300])


def shown_arguments(arguments: str) -> str:
    """A call's arguments as a chat shows them: JSON, indented when it parses, cut short."""
    try:
        text = json.dumps(json.loads(arguments or "{}"), indent=1, ensure_ascii=False)
    except (json.JSONDecodeError, RecursionError):
        text = arguments
    return text if len(text) <= SHOWN_ARGUMENTS else text[:SHOWN_ARGUMENTS - 1] + "…"


def who_decides(approvers: tuple[str, ...]) -> str:
    names = ["the person who asked" if a == "asker" else a for a in approvers]
    if not names:
        return "nobody (no approvers are configured)"
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def request_text(event: ApprovalRequest) -> str:
    """The chat's view of a request (Markdown; the arguments in a code block, so whatever a
    model wrote in them shows as text, never as a link or a mention)."""
    fence = "```"
    shown = event.arguments.replace(fence, "'''")
    return (f"The agent wants to run **{event.name}** with:\n{fence}\n{shown}\n{fence}\n"
            f"Approve or deny it — {event.approvers} may decide.")


def refusal_text(verdict: str, tool: str, by: str, reason: str) -> str:
    """What the model reads when a call was not approved."""
    match verdict:
        case "expired":
            return (f"The call to {tool} was not run: nobody approved it in time. Tell the user "
                    "it was not done, and do not call it again unless they ask.")
        case "cancelled":
            return f"The call to {tool} was not run: the request was cancelled ({reason})."
        case _:
            extra = f" Their reason: {reason}" if reason else ""
            return (f"The user denied the call to {tool}; it was not run.{extra} Do not call it "
                    "again unless they ask.")


def decision_line(verdict: str, tool: str, by: str) -> str:
    """The one line a chat sees when a request ends without a click (or with one)."""
    match verdict:
        case "approved":
            return f"✅ {tool} approved{f' by {by}' if by else ''}."
        case "denied":
            return f"🚫 {tool} denied{f' by {by}' if by else ''}."
        case "expired":
            return f"⏱ Nobody approved {tool} in time, so it was not run."
        case _:
            return f"{tool} was not run (the request was cancelled)."
