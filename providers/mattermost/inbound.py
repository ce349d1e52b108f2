"""From a Mattermost post to an :class:`IncomingMessage`.

A ``posted`` event carries the post as a JSON string (``data.post``) beside the channel's type
(``data.channel_type``: ``D`` a direct message, ``G`` a group message, ``O``/``P`` a public or
private channel) and, for the users it mentions, ``data.mentions`` (a JSON list of user ids).
A direct message is always for the bot; elsewhere a post is addressed to it when it mentions
``@<bot username>`` or continues a thread the bot takes part in. A thread is named by its root
post (``root_id``); a top-level channel post is answered in a thread under it
(``reply_in_thread``), so ``thread_id`` is the thread's root — the post's own id for a new one.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pluto.errors import PlutoError
from pluto.providers.kit.files import safe_filename
from pluto.types import Attachment, IncomingMessage

PROVIDER = "mattermost"
MAX_POST_JSON = 1024 * 1024
CHANNEL_TYPES = ("D", "G", "O", "P")


class BadPayload(PlutoError, ValueError):
    """An event or post that is not what Mattermost sends."""


@dataclass(frozen=True, slots=True)
class Post:
    """The parts of a post the provider reads."""

    raw: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.raw.get("id") or "")

    @property
    def channel_id(self) -> str:
        return str(self.raw.get("channel_id") or "")

    @property
    def user_id(self) -> str:
        return str(self.raw.get("user_id") or "")

    @property
    def root_id(self) -> str | None:
        return str(self.raw.get("root_id") or "") or None

    @property
    def message(self) -> str:
        return str(self.raw.get("message") or "")

    @property
    def create_at(self) -> int:
        value = self.raw.get("create_at")
        return value if isinstance(value, int) else 0

    @property
    def file_ids(self) -> list[str]:
        ids = self.raw.get("file_ids")
        return [str(i) for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []

    @property
    def from_user(self) -> bool:
        """A person's ordinary post: no system message (joins, headers), not deleted."""
        return not self.raw.get("type") and not self.raw.get("delete_at")

    @property
    def from_bot(self) -> bool:
        props = self.raw.get("props")
        return isinstance(props, dict) and str(props.get("from_bot")).lower() == "true"


def post_of(value: Any) -> Post:
    """A post from its JSON text (a ``posted`` event) or its object (a REST answer)."""
    if isinstance(value, str):
        if len(value) > MAX_POST_JSON:
            raise BadPayload("the post is too large")
        try:
            value = json.loads(value)
        except ValueError:
            raise BadPayload("the post is not JSON") from None
    if not isinstance(value, dict):
        raise BadPayload("the post is not an object")
    post = Post(value)
    if not post.id or not post.channel_id or not post.user_id:
        raise BadPayload("the post has no id, channel or author")
    return post


def mentioned_ids(data: dict[str, Any]) -> list[str]:
    raw = data.get("mentions")
    try:
        ids = json.loads(raw) if isinstance(raw, str) and len(raw) < 65536 else raw
    except ValueError:
        return []
    return [str(i) for i in ids] if isinstance(ids, list) else []


def _mention(username: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.-])@{re.escape(username)}(?![\w-]|\.\w)", re.IGNORECASE)


def mentions(post: Post, username: str) -> bool:
    return bool(username) and bool(_mention(username).search(post.message))


def without_mention(text: str, username: str) -> str:
    """``"@pluto what now?"`` → ``"what now?"``."""
    if not username:
        return text.strip()
    cleaned = _mention(username).sub("", text)
    cleaned = re.sub(r"^[\s,:]+", "", cleaned)
    return re.sub(r"[ \t]{2,}", " ", cleaned).strip()


def to_incoming(post: Post, *, username: str, user_name: str | None, direct: bool,
                addressed: bool, thread_id: str | None, team_id: str | None,
                attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    return IncomingMessage(
        provider=PROVIDER, chat_id=post.channel_id, user_id=post.user_id,
        user_name=user_name or post.user_id, message_id=post.id,
        text=without_mention(post.message, username), attachments=attachments,
        thread_id=thread_id, reply_to_id=post.root_id, is_direct=direct,
        mentions_bot=addressed, guild_id=team_id or None,
        timestamp=post.create_at / 1000 if post.create_at else time.time())


def file_meta(post: Post) -> dict[str, dict[str, Any]]:
    """The file infos a post carries in its ``metadata`` (Mattermost 5.11+), by id."""
    meta = post.raw.get("metadata")
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, list):
        return {}
    return {str(f.get("id")): f for f in files if isinstance(f, dict) and f.get("id")}


def upload_path(root: Path, post: Post, file_id: str, filename: str) -> Path:
    folder = re.sub(r"[^0-9A-Za-z_-]", "_", post.channel_id)[:60] or "channel"
    short = re.sub(r"[^0-9A-Za-z]", "", file_id)[:16] or "file"
    return root / folder / f"{short}-{safe_filename(filename)}"

