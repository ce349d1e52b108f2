"""From a Matrix room event to an :class:`IncomingMessage`.

A room with the bot and one person is a direct chat; in a larger room a message is addressed to
the bot when it mentions the bot's user id (``m.mentions``, the id in the text, or a pill
linking to it), replies to one of the bot's events, or is in a thread the bot takes part in.
A thread (``rel_type: m.thread``) is its own session: its root event id is the thread id.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pluto.providers.kit.files import safe_filename
from pluto.providers.kit.payload import dict_at, text_at
from pluto.types import Attachment, IncomingMessage

PROVIDER = "matrix"
FILE_TYPES = {"m.file": "file", "m.image": "image", "m.audio": "file"}  # m.audio: voice notes
TEXT_TYPES = ("m.text", "m.emote")  # m.notice is what bots send: never answered (no loops)


@dataclass(frozen=True, slots=True)
class Event:
    """The parts of an ``m.room.message`` event the provider reads."""

    room_id: str
    raw: dict[str, Any]

    @property
    def id(self) -> str:
        return text_at(self.raw, "event_id")

    @property
    def sender(self) -> str:
        return text_at(self.raw, "sender")

    @property
    def content(self) -> dict[str, Any]:
        return dict_at(self.raw, "content")

    @property
    def msgtype(self) -> str:
        return text_at(self.content, "msgtype")

    @property
    def relates_to(self) -> dict[str, Any]:
        return dict_at(self.content, "m.relates_to")

    @property
    def is_edit(self) -> bool:
        return self.relates_to.get("rel_type") == "m.replace"

    @property
    def thread_root(self) -> str | None:
        r = self.relates_to
        return str(r["event_id"]) if r.get("rel_type") == "m.thread" and r.get("event_id") else None

    @property
    def reply_to(self) -> str | None:
        reply = self.relates_to.get("m.in_reply_to")
        if not isinstance(reply, dict) or not reply.get("event_id"):
            return None
        if self.relates_to.get("is_falling_back"):  # a thread message, not a reply
            return None
        return str(reply["event_id"])

    @property
    def timestamp(self) -> float:
        ts = self.raw.get("origin_server_ts")
        return ts / 1000 if isinstance(ts, (int, float)) else 0.0

    def file(self) -> tuple[str, str, str, int, Literal["file", "image"]] | None:
        """(mxc url, file name, MIME type, size, kind) of an ``m.file``, ``m.image`` or
        ``m.audio`` (a voice message too: docs/voice.md)."""
        kind = FILE_TYPES.get(self.msgtype)
        url = self.content.get("url")
        if kind is None or not isinstance(url, str) or not url.startswith("mxc://"):
            return None
        info = dict_at(self.content, "info")
        name = str(self.content.get("filename") or self.content.get("body") or "file")
        size = info.get("size") if isinstance(info.get("size"), int) else 0
        return (url, name, str(info.get("mimetype") or "application/octet-stream"), size,
                "image" if kind == "image" else "file")  # type: ignore[return-value]

    def text(self) -> str:
        """What the person wrote: the body, or a file's caption (Matrix 1.10: ``filename``
        beside a ``body`` that differs from it)."""
        body = text_at(self.content, "body")
        if self.msgtype in FILE_TYPES:
            name = self.content.get("filename")
            return body if name and name != body else ""
        if self.reply_to and body.startswith("> "):  # an older client's reply fallback
            lines = body.split("\n")
            while lines and lines[0].startswith(">"):
                lines.pop(0)
            body = "\n".join(lines)
        return body


def mentions(event: Event, bot_id: str, bot_name: str | None) -> bool:
    listed = event.content.get("m.mentions")
    if isinstance(listed, dict) and bot_id in (listed.get("user_ids") or []):
        return True
    if bot_id in str(event.content.get("body") or ""):
        return True
    formatted = str(event.content.get("formatted_body") or "")
    return f"matrix.to/#/{bot_id}" in formatted


def without_mention(text: str, bot_id: str, bot_name: str | None) -> str:
    """``"Pluto: what now?"`` or ``"@pluto:example.org what now?"`` → ``"what now?"``."""
    names = [re.escape(bot_id)] + ([re.escape(bot_name)] if bot_name else [])
    cleaned = re.sub(rf"(^|\s)(?:{'|'.join(names)})\b[,:]?", r"\1", text)
    return re.sub(r"[ \t]{2,}", " ", cleaned).strip()


def to_incoming(event: Event, *, bot_id: str, bot_name: str | None, direct: bool,
                addressed: bool, sender_name: str | None = None,
                attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    return IncomingMessage(
        provider=PROVIDER, chat_id=event.room_id, user_id=event.sender,
        user_name=sender_name or event.sender, message_id=event.id,
        text=without_mention(event.text(), bot_id, bot_name), attachments=attachments,
        thread_id=event.thread_root, reply_to_id=event.reply_to, is_direct=direct,
        mentions_bot=addressed, timestamp=event.timestamp or time.time())


def upload_path(root: Path, event: Event, filename: str) -> Path:
    folder = re.sub(r"[^0-9A-Za-z_-]", "_", event.room_id)[:60] or "room"
    short = re.sub(r"[^0-9A-Za-z]", "", event.id)[-16:] or "event"
    return root / folder / f"{short}-{safe_filename(filename)}"
