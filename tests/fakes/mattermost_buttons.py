"""The fake Mattermost's interactive message buttons (``props.attachments[].actions``).

As the Mattermost server does:

- a post's ``props.attachments`` are checked when it is created: an action needs a ``name``,
  ``type`` button or select, and a button an ``integration.url`` (http/https); an action
  without an ``id`` gets one (ids are alphanumeric: another id is refused);
- ``click(post_id, action_id, user)`` on an action the post no longer has (an update took
  it off; a client still showing it) is answered 404 by the server: nothing is posted;
- ``click(post_id, action_id, user)`` is what the server does when a person clicks: it POSTs
  ``{user_id, user_name, channel_id, channel_name, team_id, team_domain, post_id,
  trigger_id, type, data_source, context}`` to the action's integration URL, then applies the
  answer — ``ephemeral_text`` shown to that user alone (``ephemerals``), ``update`` replacing
  the post's message and props (its buttons gone when the new props have none). An answer
  that is not 200 JSON (or none in ``action_timeout``) is recorded in ``click_failures``: the
  person sees "Unable to complete the action".
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.fakes.mattermost_state import ApiFailure, new_id

_ACTION_ID = re.compile(r"[A-Za-z0-9]+")


@dataclass
class Click:
    post_id: str
    action_id: str
    user_id: str
    request: dict[str, Any]
    status: int = 0
    answer: Any = None
    time: float = field(default_factory=time.monotonic)


def check_attachments(props: Any) -> dict[str, Any]:
    """A post's props with its attachments checked (ids given to actions without one)."""
    if props is None:
        return {}
    if not isinstance(props, dict):
        raise ApiFailure(400, "model.post.is_valid.props.app_error", "Invalid props.")
    attachments = props.get("attachments")
    if attachments is None:
        return dict(props)
    if not isinstance(attachments, list):
        raise ApiFailure(400, "model.post.is_valid.props.app_error", "Invalid attachments.")
    for attachment in attachments:
        if not isinstance(attachment, dict):
            raise ApiFailure(400, "model.post.is_valid.props.app_error", "Invalid attachment.")
        for action in attachment.get("actions") or []:
            if not isinstance(action, dict) or not action.get("name"):
                raise ApiFailure(400, "model.post.is_valid.action.app_error",
                                 "An action needs a name.")
            if action.get("type", "button") not in ("button", "select"):
                raise ApiFailure(400, "model.post.is_valid.action.app_error",
                                 "An action's type must be button or select.")
            action_id = action.setdefault("id", new_id())
            if not isinstance(action_id, str) or not _ACTION_ID.fullmatch(action_id):
                raise ApiFailure(400, "model.post.is_valid.action_id.app_error",
                                 "An action id must be alphanumeric.")
            url = (action.get("integration") or {}).get("url")
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ApiFailure(400, "model.post.is_valid.action_url.app_error",
                                 "An action needs an integration URL.")
    return dict(props)


def actions_of(post: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for att in (post.get("props") or {}).get("attachments") or []
            for a in att.get("actions") or []]


class Buttons:
    """Mixed into FakeMattermost (which holds the posts, users and channels)."""

    action_timeout = 30.0  # Mattermost's OutgoingIntegrationRequestsTimeout default

    def _init_buttons(self) -> None:
        self.clicks: list[Click] = []
        self.click_failures: list[str] = []
        self.ephemerals: dict[str, list[str]] = {}  # user id → what they alone were shown
        self.created_actions: dict[str, list[dict[str, Any]]] = {}  # post → its actions then

    async def click(self, post_id: str, action_id: str, user: dict[str, Any]) -> Click:
        """``user`` clicks the action ``action_id`` of post ``post_id``; returns once the
        integration answered and its answer was applied."""
        post = self.posts[post_id]  # type: ignore[attr-defined]
        action = next((a for a in actions_of(post) if a.get("id") == action_id), None)
        if action is None:  # gone (the post was updated): the server answers the client 404
            click = Click(post_id, action_id, user["id"], {}, 404, "action not found")
            self.clicks.append(click)
            return click
        channel = self.channels[post["channel_id"]]  # type: ignore[attr-defined]
        request = {"user_id": user["id"], "user_name": user["username"],
                   "channel_id": channel.id, "channel_name": channel.name,
                   "team_id": channel.team_id, "team_domain": "team", "post_id": post_id,
                   "trigger_id": secrets.token_urlsafe(24), "type": "", "data_source": "",
                   "context": (action.get("integration") or {}).get("context") or {}}
        click = Click(post_id, action_id, user["id"], request)
        self.clicks.append(click)
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    action["integration"]["url"], json=request,
                    timeout=aiohttp.ClientTimeout(total=self.action_timeout)) as r:
                click.status = r.status
                raw = await r.read()
            click.answer = json.loads(raw) if raw else {}
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            click.answer = repr(e)
        if click.status != 200 or not isinstance(click.answer, dict):
            self.click_failures.append(f"{post_id}/{action_id} by {user['username']}: "
                                       f"{click.status} {click.answer!r}")
        else:
            await self._apply(post, user, click.answer)
        self.notify()  # type: ignore[attr-defined]
        return click

    async def _apply(self, post: dict[str, Any], user: dict[str, Any],
                     answer: dict[str, Any]) -> None:
        text = answer.get("ephemeral_text")
        if isinstance(text, str) and text:
            self.ephemerals.setdefault(user["id"], []).append(text)
        update = answer.get("update")
        if isinstance(update, dict):
            post["message"] = str(update.get("message") or "")
            props = update.get("props") if isinstance(update.get("props"), dict) else {}
            post["props"] = {**props, "from_bot": post["props"].get("from_bot", "true")}
            post["edit_at"] = post["update_at"] = self.now_ms()  # type: ignore[attr-defined]
            channel = self.channels[post["channel_id"]]  # type: ignore[attr-defined]
            await self._broadcast("post_edited", {"post": json.dumps(post)},  # type: ignore[attr-defined]
                                  channel)
