"""The data, errors and test controls of the fake Mattermost server (mattermost_server.py).

Users, one team, channels (``D`` direct, ``G`` group, ``O`` open, ``P`` private) with their
members, posts with Mattermost's fields (``create_at``/``update_at``/``edit_at``/``delete_at``
in milliseconds, strictly growing), files, and the records a test reads: ``calls``,
``typing``, ``edits``, ``refused``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.changes import Changes


MAX_MESSAGE = 16383  # runes in one post's message
MAX_FILE = 100 * 1024 * 1024  # the default MaxFileSize
FILES_PER_POST = 10


def new_id() -> str:
    """A Mattermost id: 26 lowercase letters and digits."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=26))


class ApiFailure(Exception):
    """An error the fake answers with: ``{"id", "message", "status_code"}``."""

    def __init__(self, status: int, error_id: str, message: str = "",
                 headers: dict[str, str] | None = None, text: str | None = None) -> None:
        super().__init__(error_id)
        self.status, self.error_id = status, error_id
        self.message = message or error_id
        self.headers = headers or {}
        self.text = text  # a plain-text body (the rate limiter's "limit exceeded")

    def response(self) -> web.Response:
        if self.text is not None:
            return web.Response(status=self.status, text=self.text, headers=self.headers)
        return web.json_response({"id": self.error_id, "message": self.message,
                                  "detailed_error": "", "request_id": new_id(),
                                  "status_code": self.status}, status=self.status,
                                 headers=self.headers)

    @classmethod
    def too_many(cls, seconds: float) -> ApiFailure:
        """What the server's rate limiter answers: plain text, the wait in headers."""
        reset = str(max(1, math.ceil(seconds)))
        return cls(429, "limit", headers={"X-Ratelimit-Limit": "10", "X-Ratelimit-Remaining": "0",
                                          "X-Ratelimit-Reset": reset, "Retry-After": reset},
                   text="limit exceeded\n")


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    time: float = field(default_factory=time.monotonic)


@dataclass
class Channel:
    id: str
    type: str  # D, G, O, P
    name: str
    display_name: str
    members: list[str]
    team_id: str = ""
    last_post_at: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "name": self.name,
                "display_name": self.display_name, "team_id": self.team_id,
                "last_post_at": self.last_post_at, "create_at": 0, "update_at": 0,
                "delete_at": 0, "header": "", "purpose": "", "creator_id": ""}


@dataclass
class Throttle:
    """Requests matching ``when`` are refused with 429 until ``until`` (monotonic)."""

    until: float
    when: Callable[[Call], bool]


class State(Changes):
    """Everything the fake holds, and the controls a test uses."""

    FAKE = "Mattermost"

    def __init__(self, token: str, bot_username: str) -> None:
        self.token = token
        self.team = {"id": new_id(), "name": "team", "display_name": "Team"}
        self.bot = self._user(bot_username, is_bot=True)
        self.alice = self._user("alice")
        self.bob = self._user("bob")
        self.carol = self._user("carol")
        self.users = {u["id"]: u for u in (self.bot, self.alice, self.bob, self.carol)}
        self.channels: dict[str, Channel] = {}
        self.posts: dict[str, dict[str, Any]] = {}  # id → the post now
        self.order: list[str] = []  # post ids, oldest first
        self.files: dict[str, tuple[bytes, dict[str, Any]]] = {}
        self.edits: dict[str, list[str]] = {}  # post → the messages it was patched to
        self.calls: list[Call] = []
        self.typing: list[tuple[str, str]] = []  # (channel, parent)
        self.throttles: list[Throttle] = []
        self.refused: list[float] = []  # when requests were refused with 429 (monotonic)
        self.sent_at: dict[str, float] = {}  # the bot's posts: when accepted (monotonic)
        self._failures: list[tuple[Callable[[Call], bool], ApiFailure]] = []
        self._clock = 0
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()

    @staticmethod
    def _user(username: str, is_bot: bool = False) -> dict[str, Any]:
        return {"id": new_id(), "username": username, "is_bot": is_bot,
                "first_name": username.title(), "last_name": "", "roles": "system_user"}

    def now_ms(self) -> int:
        """The server's clock in ms, strictly growing (each post has its own time)."""
        self._clock = max(self._clock + 1, int(time.time() * 1000))
        return self._clock

    # changes ------------------------------------------------------------------------------

    def notify(self) -> None:
        self._notify()

    # test controls --------------------------------------------------------------------------

    def add_direct(self, user: dict[str, Any]) -> str:
        """The direct channel between ``user`` and the bot."""
        a, b = sorted([user["id"], self.bot["id"]])
        channel = Channel(new_id(), "D", f"{a}__{b}", user["username"], [user["id"],
                                                                          self.bot["id"]])
        self.channels[channel.id] = channel
        return channel.id

    def add_channel(self, name: str, members: list[dict[str, Any]], kind: str = "O") -> str:
        team = "" if kind == "G" else self.team["id"]
        channel = Channel(new_id(), kind, name, name.title(), [m["id"] for m in members], team)
        self.channels[channel.id] = channel
        return channel.id

    def throttle(self, seconds: float, when: Callable[[Call], bool] = lambda c: True) -> None:
        """A rate-limit window: matching requests get 429 (``X-Ratelimit-Reset``: the seconds
        left) for ``seconds``."""
        self.throttles.append(Throttle(time.monotonic() + seconds, when))

    def fail_next(self, failure: ApiFailure, when: Callable[[Call], bool] = lambda c: True
                  ) -> None:
        self._failures.append((when, failure))

    def touch(self, post_id: str) -> None:
        """Someone reacts to a post: it changes (``update_at``), so a ``since`` query that
        covers the change returns it again."""
        self.posts[post_id]["update_at"] = self.now_ms()
        self.posts[post_id]["has_reactions"] = True
        self.notify()

    def check_failures(self, call: Call) -> None:
        for i, (when, failure) in enumerate(self._failures):
            if when(call):
                del self._failures[i]
                raise failure
        now = time.monotonic()
        self.throttles = [t for t in self.throttles if t.until > now]
        for t in self.throttles:
            if t.when(call):
                self.refused.append(now)
                raise ApiFailure.too_many(t.until - now)

    # what the bot shows -----------------------------------------------------------------------

    def bot_posts(self, channel_id: str) -> list[dict[str, Any]]:
        """The bot's posts in a channel (threads included, deleted ones not), oldest first."""
        return [p for i in self.order if (p := self.posts[i])["channel_id"] == channel_id
                and p["user_id"] == self.bot["id"] and not p["delete_at"]]

    def file_bytes(self, file_id: str) -> bytes | None:
        found = self.files.get(file_id)
        return found[0] if found else None

    # posts ----------------------------------------------------------------------------------

    def make_post(self, channel: Channel, user_id: str, message: str, root_id: str = "",
                  file_ids: list[str] | None = None) -> dict[str, Any]:
        now = self.now_ms()
        infos = [self.files[f][1] for f in file_ids or []]
        for info in infos:
            info["post_id"] = "pending"
        post: dict[str, Any] = {
            "id": new_id(), "create_at": now, "update_at": now, "edit_at": 0, "delete_at": 0,
            "is_pinned": False, "user_id": user_id, "channel_id": channel.id,
            "root_id": root_id, "original_id": "", "message": message, "type": "",
            "props": {"from_bot": "true"} if self.users[user_id]["is_bot"] else {},
            "hashtags": "", "pending_post_id": "", "reply_count": 0,
            "file_ids": list(file_ids or []), "metadata": {"files": infos} if infos else {}}
        for info in infos:
            info["post_id"] = post["id"]
        self.posts[post["id"]] = post
        self.order.append(post["id"])
        channel.last_post_at = now
        if root_id:
            self.posts[root_id]["reply_count"] += 1
        return post

    def store_file(self, data: bytes, name: str, mime: str, channel_id: str,
                   user_id: str) -> dict[str, Any]:
        info = {"id": new_id(), "user_id": user_id, "channel_id": channel_id, "post_id": "",
                "create_at": self.now_ms(), "name": name, "size": len(data),
                "mime_type": mime, "extension": name.rpartition(".")[2] if "." in name else ""}
        self.files[info["id"]] = (data, info)
        return info
