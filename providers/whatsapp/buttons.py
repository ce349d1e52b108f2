"""Approval buttons on WhatsApp: an ``interactive`` reply-button message, and a tap on one
(an ``interactive.button_reply`` in the signed webhook) handed over as the command it carries.

The Cloud API takes at most 3 reply buttons, each title at most 20 characters and id at most
256, and a body of at most 1,024 characters: a longer text goes first as a text message, then
the buttons under a short body. A button's id is its command (``/approve a1b2c3``). Chats are
1:1 and WhatsApp has no private channel: a tap the gateway refuses gets a text reply in that
person's own chat, and nothing is handed over. The tap's ``wamid`` is the click's id (a
redelivered webhook is one decision).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pluto.providers.kit.buttons import command_of, payload_of
from pluto.types import Button

log = logging.getLogger(__name__)

# ProviderContext.approvals: (provider, chat, user, approval id) -> None when the person may
# decide, else the sentence to show them (kit.buttons.ApprovalCheck, as the context types it)
Check = Callable[[str, str, str, str], Awaitable[str | None]]

MAX_BUTTONS = 3
MAX_TITLE = 20
MAX_ID = 256
MAX_BODY = 1024


def interactive_messages(text: str, buttons: tuple[Button, ...]
                         ) -> list[tuple[str, dict[str, Any]]]:
    """The (type, content) of the messages that show ``text`` with ``buttons`` under it."""
    if len(buttons) > MAX_BUTTONS:
        log.warning("whatsapp: %d buttons asked, WhatsApp shows %d", len(buttons), MAX_BUTTONS)
    shown = buttons[:MAX_BUTTONS]
    out: list[tuple[str, dict[str, Any]]] = []
    body = text.strip()
    if len(body) > MAX_BODY or not body:
        if body:
            out.append(("text", {"body": text, "preview_url": False}))
        body = " / ".join(b.label for b in shown) + "?"
    replies = []
    for button in shown:
        button_id = payload_of(button)
        assert len(button_id) <= MAX_ID
        replies.append({"type": "reply", "reply": {"id": button_id,
                                                   "title": _title(button.label)}})
    out.append(("interactive", {"type": "button", "body": {"text": body[:MAX_BODY]},
                                "action": {"buttons": replies}}))
    return out


def with_commands(text: str, buttons: tuple[Button, ...]) -> str:
    """The text with the buttons' commands written out (a template message has no buttons)."""
    if not buttons:
        return text
    return "Reply " + " or ".join(b.command for b in buttons) + f": {text}"  # (kept when cut)


def _title(label: str) -> str:
    label = " ".join(label.split()) or "?"
    return label if len(label) <= MAX_TITLE else label[:MAX_TITLE - 1] + "…"


def tapped(raw: dict[str, Any]) -> tuple[str, str] | None:
    """(command, approval id) of a button_reply message, None when it is not one of ours."""
    interactive = raw.get("interactive")
    if not isinstance(interactive, dict) or interactive.get("type") != "button_reply":
        return None
    reply = interactive.get("button_reply")
    return command_of(reply.get("id")) if isinstance(reply, dict) else None
