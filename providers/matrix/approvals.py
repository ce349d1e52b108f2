"""Approvals on Matrix: a reply or a reaction on the bot's request message as a decision.

Matrix has no buttons (``has_buttons`` stays False): an approval request's text ends with
"Reply `/approve <id>` or `/deny <id>`", and writing that works as in any chat. Two more
gestures, on the request message itself, decide it:

- a reply (``m.relates_to`` → ``m.in_reply_to``) whose text is ``approve`` or ``deny``,
  optionally followed by a reason (``deny too risky``);
- a reaction (``m.reaction``, ``rel_type: m.annotation``) whose key is ✅ or 👍 (approve), ❌ or
  👎 (deny); skin tones and the emoji variation selector are ignored.

Which approval a message carries is read from the message the bot sent: its text holds
``/approve <id>``. The provider keeps a bounded map event id → (approval id, thread) of what it
sent, and reads the event from the homeserver when the map does not know it (after a restart).
Before a gesture is handed over, the gateway is asked whether this person may decide
(``ProviderContext.approvals``); Matrix has nothing private to show a refused person in a room,
so a refusal is only logged (info) and the room sees nothing. An accepted gesture is handed over
as the command from that person, under the gesture's own event id (a redelivered event is one
decision).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

APPROVE_KEYS = frozenset({"✅", "👍", "✔", "☑"})
DENY_KEYS = frozenset({"❌", "👎", "✖", "🚫"})
_MODIFIERS = re.compile("[\ufe0f\ufe0e\U0001f3fb-\U0001f3ff]")
_REQUEST = re.compile(r"/approve ([a-z2-9]{6,16})\b")
_REPLY = re.compile(r"(approve|deny)\b[\s.,:;!-]*(.*)", re.I | re.S)
MAX_REASON = 500


@dataclass(frozen=True, slots=True)
class Request:
    """An approval request the bot showed: its approval id, and the thread it is in."""

    approval_id: str
    thread_id: str | None


def approval_in(text: str) -> str | None:
    """The approval id a request message's text carries (``/approve <id>``)."""
    found = _REQUEST.search(text or "")
    return found.group(1) if found else None


def verdict_of_key(key: object) -> str | None:
    """``approve`` / ``deny`` for a reaction's key, None for any other."""
    if not isinstance(key, str) or len(key) > 32:
        return None
    plain = _MODIFIERS.sub("", key).strip()
    if plain in APPROVE_KEYS:
        return "approve"
    if plain in DENY_KEYS:
        return "deny"
    return None


def verdict_of_reply(text: str) -> tuple[str, str] | None:
    """(``approve`` | ``deny``, the reason) for a reply's text that is a decision."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return None
    found = _REPLY.fullmatch(" ".join(lines).strip())
    if found is None:
        return None
    reason = " ".join(found.group(2).split())[:MAX_REASON]
    return found.group(1).lower(), reason


def command(verdict: str, approval_id: str, reason: str = "") -> str:
    text = f"/{verdict} {approval_id}"
    return f"{text} {reason}" if reason and verdict == "deny" else text
