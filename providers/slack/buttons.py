"""Approval buttons on Slack: a Block Kit ``actions`` block under the text, and a click
(a ``block_actions`` interactivity payload) handed over as the command it stands for.

A message with buttons is sent as ``section`` blocks holding the mrkdwn text (3,000 characters
each, Slack's limit) and one ``actions`` block of buttons (``action_id`` ``pluto_approval_<n>``,
``value`` = the command, ``style`` primary / danger); ``text`` stays as the notification's
fallback. A click reaches the bolt app like an event — over HTTP (the signed, form-encoded
``payload=`` post; interactivity may share the events URL, and the signature is checked before
anything is read) or as a Socket Mode ``interactive`` envelope — and must be acknowledged
within 3 s (Slack shows the clicker an error otherwise). Within that time the clicker is
checked (``ProviderContext.approvals``) and, when they may decide, the click is handed over as
their command under its ``trigger_id`` (a redelivered envelope carries the same one: one
decision). A refusal is shown to the clicker alone (``chat.postEphemeral``; before the ack
when the 3 s allow, else just after it), and an accepted click's buttons are taken off the
request after the ack (``chat.update``, best effort).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from pluto.providers.kit.buttons import click_message, command_of, payload_of
from pluto.providers.slack.errors import provider_error
from pluto.types import Button, IncomingMessage

log = logging.getLogger(__name__)

ACTION_ID = "pluto_approval_{}"
ACTION_PATTERN = re.compile(r"pluto_approval_\d{1,2}")
MAX_SECTION_TEXT = 3000  # Slack: a section's text
MAX_BUTTON_TEXT = 75  # Slack: a button's label
MAX_BLOCKS = 50
CHECK_BUDGET = 2.0  # seconds for the approval check: Slack wants the ack within 3
ACK_BUDGET = 2.5  # seconds from the click until the ack, whatever remains to do
TOO_SLOW = "That took too long to check; please click again."
NOT_READY = "I am just starting; please click again in a moment."
HandOver = Callable[[IncomingMessage], Awaitable[object]]
# ProviderContext.approvals: (provider, chat, user, approval id) -> None when the person may
# decide, else the sentence to show them (kit.buttons.ApprovalCheck, as the context types it)
Check = Callable[[str, str, str, str], Awaitable[str | None]]


def blocks_for(text: str, buttons: tuple[Button, ...]) -> list[dict[str, Any]]:
    """The text as mrkdwn sections, then the buttons as one actions block."""
    sections = [{"type": "section", "text": {"type": "mrkdwn", "text": part}}
                for part in _parts(text, MAX_SECTION_TEXT)][:MAX_BLOCKS - 1]
    elements = []
    for i, button in enumerate(buttons[:25]):
        element: dict[str, Any] = {
            "type": "button", "action_id": ACTION_ID.format(i), "value": payload_of(button),
            "text": {"type": "plain_text", "text": button.label[:MAX_BUTTON_TEXT] or "?",
                     "emoji": True}}
        if button.style != "default":
            element["style"] = button.style
        elements.append(element)
    return [*sections, {"type": "actions", "block_id": "pluto_approval", "elements": elements}]


def _parts(text: str, size: int) -> list[str]:
    """``text`` in pieces of at most ``size`` characters, cut at a line break where possible."""
    parts: list[str] = []
    rest = text
    while len(rest) > size:
        cut = rest.rfind("\n", size // 2, size)
        cut = cut if cut > 0 else size
        parts.append(rest[:cut])
        rest = rest[cut:].lstrip("\n")
    if rest.strip():
        parts.append(rest)
    return parts


def without_buttons(blocks: Any) -> list[dict[str, Any]]:
    """A message's blocks with our actions block taken off."""
    if not isinstance(blocks, list):
        return []
    return [b for b in blocks if isinstance(b, dict) and not (
        b.get("type") == "actions" and b.get("block_id") == "pluto_approval")]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Clicks:
    """Block actions of our buttons: checked, handed over, answered."""

    def __init__(self, name: str, client: AsyncWebClient, check: Check | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]):
        self.name = name
        self.client = client
        self.check = check
        self.spawn = spawn  # work after the ack (ephemeral notes, taking the buttons off)

    async def on_click(self, body: dict[str, Any], hand_over: HandOver | None) -> None:
        """Before the ack: returns within Slack's 3 s (the check is bounded)."""
        actions = body.get("actions")
        action = _dict(actions[0] if isinstance(actions, list) and actions else None)
        found = command_of(action.get("value"))
        user = _dict(body.get("user"))
        user_id = _str(user.get("id"))
        container = _dict(body.get("container"))
        channel = _dict(body.get("channel"))
        chat_id = _str(channel.get("id")) or _str(container.get("channel_id"))
        if found is None or not user_id or not chat_id:
            log.warning("slack: ignored a click that is not one of our buttons")
            return
        if hand_over is None:  # (HTTP: refused 503 before this; Socket Mode: connecting)
            self.spawn(self._tell(chat_id, user_id, NOT_READY, None))
            return
        command, approval_id = found
        message = _dict(body.get("message"))
        ts = _str(container.get("message_ts"))
        thread_ts = _str(message.get("thread_ts")) or _str(container.get("thread_ts")) or None
        if thread_ts == ts:  # the request is a thread's parent: it answered at the top level
            thread_ts = None
        started = time.monotonic()
        refusal = await self._refusal(chat_id, user_id, approval_id)
        if refusal is not None:  # shown before the ack when Slack's 3 s allow, else after it
            told = self.spawn(self._tell(chat_id, user_id, refusal, thread_ts))
            await asyncio.wait([told], timeout=max(0.0, ACK_BUDGET - (time.monotonic() - started)))
            return
        click_id = _str(body.get("trigger_id")) or f"{_str(action.get('action_ts'))}:{user_id}"
        team = _dict(body.get("team"))
        await hand_over(click_message(
            self.name, chat_id=chat_id, user_id=user_id, command=command, click_id=click_id,
            user_name=_str(user.get("name")) or _str(user.get("username")) or None,
            thread_id=thread_ts, guild_id=_str(team.get("id")) or None,
            is_direct=chat_id.startswith("D")))
        if ts:
            self.spawn(self._take_off(chat_id, ts, message))

    async def _refusal(self, chat_id: str, user_id: str, approval_id: str) -> str | None:
        if self.check is None:
            return None
        try:
            return await asyncio.wait_for(self.check(self.name, chat_id, user_id, approval_id),
                                          CHECK_BUDGET)
        except asyncio.TimeoutError:
            return TOO_SLOW

    async def _tell(self, chat_id: str, user_id: str, text: str, thread_ts: str | None) -> None:
        try:
            await self.client.chat_postEphemeral(channel=chat_id, user=user_id, text=text,
                                                 thread_ts=thread_ts)
        except (SlackClientError, OSError, asyncio.TimeoutError) as e:
            log.warning("slack: could not show a click's refusal in %s: %s", chat_id,
                        provider_error(e))

    async def _take_off(self, chat_id: str, ts: str, message: dict[str, Any]) -> None:
        blocks = without_buttons(message.get("blocks"))
        try:
            await self.client.chat_update(channel=chat_id, ts=ts, blocks=blocks,
                                          text=_str(message.get("text")) or " ")
        except (SlackClientError, OSError, asyncio.TimeoutError) as e:
            log.info("slack: could not take the buttons off %s in %s: %s", ts, chat_id,
                     provider_error(e))
