"""Buttons under a message, and a click as the message it stands for (docs/approvals.md).

The core asks a provider that declares ``Capabilities.has_buttons`` to show
``OutgoingMessage.buttons`` (an approval's Approve / Deny). Each :class:`~pluto.types.Button`
carries the chat command a click means (``/approve a1b2c3d4e5``). When someone clicks, the
provider:

1. reads the command back from the platform's payload (:func:`command_of`: only commands a
   button of ours can carry get through — a forged payload is refused, never run);
2. asks the gateway, within the platform's deadline, whether this person may decide
   (``ProviderContext.approvals``: None = yes, else the sentence to show them privately —
   Telegram's callback answer, Slack's or Discord's ephemeral reply);
3. answers the platform's callback, then hands the click over as a message from the clicker
   (:func:`click_message`), under the click's own id, so a redelivered click is one decision.

The gateway checks again when the message's turn comes (the request may have been decided
meanwhile): the check in step 2 is for the person's sake, not the only guard.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from pluto.types import Button, IncomingMessage

# what a button of ours may carry: /approve or /deny and an approval id (runtime/approvals.py)
_COMMAND = re.compile(r"/(approve|deny) ([a-z2-9]{6,16})")
MAX_PAYLOAD = 64  # bytes: Telegram's callback_data limit, the smallest of the platforms'


# ``ProviderContext.approvals``: (provider, chat id, user id, approval id) -> whether that
# person may decide the request in this chat: None when they may (hand the click over), else
# what to tell them
ApprovalCheck = Callable[[str, str, str, str], Awaitable[str | None]]


def payload_of(button: Button) -> str:
    """What the platform carries back on a click (at most :data:`MAX_PAYLOAD` bytes)."""
    data = button.command.strip()
    if len(data.encode()) > MAX_PAYLOAD:
        raise ValueError(f"a button's command is longer than {MAX_PAYLOAD} bytes: {data[:20]}…")
    return data


def command_of(payload: object) -> tuple[str, str] | None:
    """(the command, the approval id) a click's payload carries, or None when it is not one
    of ours (a forged or stale payload: ignore it, tell the clicker nothing runs)."""
    if not isinstance(payload, str):
        return None
    m = _COMMAND.fullmatch(payload.strip())
    return (m.group(0), m.group(2)) if m is not None else None


def click_message(provider: str, *, chat_id: str, user_id: str, command: str, click_id: str,
                  user_name: str | None = None, thread_id: str | None = None,
                  guild_id: str | None = None, is_direct: bool = False) -> IncomingMessage:
    """A click as the message it stands for: the command, from the clicker, under the click's
    id (``click:<platform id>``: a redelivery is recognised), addressed to the bot (a group's
    mention rule does not apply to a button the bot showed)."""
    return IncomingMessage(provider=provider, chat_id=chat_id, user_id=user_id, text=command,
                           message_id=f"click:{click_id}", user_name=user_name,
                           thread_id=thread_id, guild_id=guild_id, is_direct=is_direct,
                           mentions_bot=True)
