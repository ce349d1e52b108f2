"""Approval buttons on Mattermost: interactive message buttons (a post's
``props.attachments[].actions``), whose clicks Mattermost POSTs to an integration URL that the
provider mounts on the gateway's HTTP server (``actions_url``).

A button is ``{"type": "button", "name": <label>, "style": …, "integration": {"url":
actions_url, "context": {"command": …, "token": …}}}``. On a click, the Mattermost server
POSTs ``{user_id, user_name, channel_id, post_id, trigger_id, context, …}`` to the URL and
applies the answer: ``{"ephemeral_text": …}`` is shown to the clicker alone (a refusal),
``{"update": {…}}`` replaces the post (the buttons taken off). The server keeps a button's
context to itself (clients never see it); still, anyone who can reach the URL could post, so
the context carries a token — HMAC-SHA256 of the command under a key derived from the bot's
access token — compared in constant time: a post without the right token is refused (401) and
nothing is handed over. The click's ``trigger_id`` is its id (one decision).

Without the HTTP server (``pluto serve``) or ``actions_url``, Mattermost has nowhere to post a
click: the buttons are written as the commands to reply with instead, and those work as ever.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pluto import jsonlimits
from pluto.providers.handover import NotRecorded
from pluto.providers.kit.buttons import click_message, command_of, payload_of
from pluto.providers.kit.http import read_limited
from pluto.providers.mattermost.api import MattermostApi
from pluto.providers.mattermost.errors import FAILURES, provider_error
from pluto.providers.mattermost.known import Known
from pluto.types import Button, IncomingMessage

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # a click's post is a few hundred bytes
CHECK_BUDGET = 5.0  # seconds: Mattermost waits up to its integration timeout (30 s default)
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
HandOver = Callable[[IncomingMessage], Awaitable[object]]
# ProviderContext.approvals: (provider, chat, user, approval id) -> None when the person may
# decide, else the sentence to show them (kit.buttons.ApprovalCheck, as the context types it)
Check = Callable[[str, str, str, str], Awaitable[str | None]]
NOT_TAKEN = "Your click could not be taken just now; please click again in a minute."


def key_of(token: str) -> bytes:
    """The key of the buttons' tokens, derived from the bot's access token (never shown)."""
    return hashlib.sha256(b"pluto mattermost buttons\0" + token.encode()).digest()


def token_for(key: bytes, command: str) -> str:
    return hmac.new(key, command.encode(), hashlib.sha256).hexdigest()


def attachments_for(buttons: tuple[Button, ...], url: str, key: bytes) -> list[dict[str, Any]]:
    """``props.attachments`` with the buttons (one attachment, no text of its own)."""
    actions = []
    for i, button in enumerate(buttons):
        command = payload_of(button)
        actions.append({"id": f"pluto{i}", "type": "button", "name": button.label,
                        "style": button.style,
                        "integration": {"url": url, "context": {
                            "command": command, "token": token_for(key, command)}}})
    return [{"text": "", "actions": actions}]


def written(buttons: tuple[Button, ...]) -> str:
    """The buttons as the commands to reply with (no place for Mattermost to post clicks)."""
    return "Reply " + " or ".join(f"`{b.command}`" for b in buttons) + "."


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Actions:
    """The integration endpoint: ``POST <path of actions_url>``."""

    def __init__(self, name: str, key: bytes, api: MattermostApi, known: Known,
                 check: Check | None, hand_over: Callable[[], HandOver | None]):
        self.name = name
        self.key = key
        self.api = api
        self.known = known
        self.check = check
        self.hand_over = hand_over  # None until the provider receives

    async def handle(self, request: web.Request) -> web.Response:
        raw = await read_limited(request, MAX_BODY)
        if raw is None:
            return web.json_response({"error": "too large"}, status=413)
        try:
            body = jsonlimits.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return web.json_response({"error": "not a Mattermost action"}, status=400)
        context = _dict(body.get("context"))
        command, token = _str(context.get("command")), _str(context.get("token"))
        if not token or not hmac.compare_digest(token.encode(),
                                                token_for(self.key, command).encode()):
            log.warning("mattermost: refused a button click without our token")
            return web.json_response({"error": "invalid request"}, status=401)
        found = command_of(command)
        ids = [_str(body.get(k)) for k in ("user_id", "channel_id", "post_id")]
        if found is None or not all(_ID.fullmatch(i) for i in ids):
            return web.json_response({"error": "not a click of ours"}, status=400)
        user_id, channel_id, post_id = ids
        return web.json_response(await self._click(body, found, user_id, channel_id, post_id))

    async def _click(self, body: dict[str, Any], found: tuple[str, str], user_id: str,
                     channel_id: str, post_id: str) -> dict[str, Any]:
        """What Mattermost is to do: show the clicker a sentence, or update the post."""
        hand_over = self.hand_over()
        if hand_over is None:
            return {"ephemeral_text": NOT_TAKEN}
        command, approval_id = found
        refusal = await self._refusal(channel_id, user_id, approval_id)
        if refusal is not None:
            return {"ephemeral_text": refusal}
        post = await self._post(post_id, channel_id)
        kind, team = await self.known.channel(channel_id)
        click_id = _str(body.get("trigger_id"))[:200] or f"{post_id}:{user_id}"
        try:
            await hand_over(click_message(
                self.name, chat_id=channel_id, user_id=user_id, command=command,
                click_id=click_id, user_name=_str(body.get("user_name")) or None,
                thread_id=_str(post.get("root_id")) or None if post else None,
                guild_id=team or None, is_direct=kind == "D"))
        except NotRecorded:
            return {"ephemeral_text": NOT_TAKEN}
        if not post:
            return {}
        props = {k: v for k, v in (post.get("props") or {}).items() if k != "attachments"}
        return {"update": {"message": _str(post.get("message")), "props": props}}

    async def _refusal(self, channel_id: str, user_id: str, approval_id: str) -> str | None:
        if self.check is None:
            return None
        try:
            return await asyncio.wait_for(
                self.check(self.name, channel_id, user_id, approval_id), CHECK_BUDGET)
        except asyncio.TimeoutError:
            return "That took too long to check; please click again."

    async def _post(self, post_id: str, channel_id: str) -> dict[str, Any]:
        """The clicked post (its thread, its text to keep), when it is the bot's own in that
        channel; {} when it cannot be read."""
        try:
            post = await asyncio.wait_for(self.api.post(post_id), CHECK_BUDGET)
        except (*FAILURES, asyncio.TimeoutError) as e:
            log.info("mattermost: the clicked post %s could not be read: %s", post_id,
                     provider_error(e) if not isinstance(e, asyncio.TimeoutError) else "timeout")
            return {}
        if post.get("channel_id") != channel_id or post.get("user_id") != self.known.bot_id:
            return {}
        return post
