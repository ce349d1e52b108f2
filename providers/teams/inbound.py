"""From a Bot Framework activity to an :class:`IncomingMessage`.

A message activity names its conversation (``personal``, ``groupChat`` or ``channel``; a
channel thread's id ends in ``;messageid=<root>``), who wrote (``from``), the bot
(``recipient``) and the ``serviceUrl`` replies go to. In groups and channels the bot is
addressed by a mention: an entity ``{"type": "mention", "mentioned": {"id": <bot>}}`` and
``<at>Name</at>`` in the text (removed here); a quoted reply to one of the bot's messages comes
with an HTML attachment whose ``<blockquote itemtype="http://schema.skype.com/Reply">`` names
the quoted message (``itemid``) and its author (``itemprop="mri"``).
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pluto.errors import PlutoError
from pluto.providers.kit.payload import dict_at, list_at
from pluto.types import Attachment, IncomingMessage

PROVIDER = "teams"
FILE_INFO = "application/vnd.microsoft.teams.file.download.info"
MAX_ATTACHMENTS = 10
MAX_TEXT = 100_000
_AT = re.compile(r"<at[^>]*>(.*?)</at>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_QUOTE = re.compile(r'<blockquote[^>]*itemtype="http://schema\.skype\.com/Reply"[^>]*'
                    r'itemid="([^"]{1,64})"[^>]*>(.*?)</blockquote>', re.S | re.I)
_MRI = re.compile(r'itemprop="mri"[^>]*itemid="([^"]{1,128})"', re.I)


class BadActivity(PlutoError, ValueError):
    """An activity that cannot be read (400)."""


@dataclass(frozen=True, slots=True)
class Activity:
    raw: dict[str, Any]
    type: str
    id: str
    service_url: str
    channel_id: str
    conversation: str  # the full id (a channel thread's ends in ;messageid=…)
    kind: str  # personal | groupChat | channel
    sender: dict[str, Any]
    bot_id: str

    @property
    def chat_and_thread(self) -> tuple[str, str | None]:
        """The chat (a channel without its thread) and the thread (a channel's root)."""
        base, sep, root = self.conversation.partition(";messageid=")
        return (base, root) if sep and root else (self.conversation, None)


def _dicts(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The objects in the array at ``key`` (anything else in it, or no array: none)."""
    return [item for item in list_at(data, key) if isinstance(item, dict)]


def _str(value: Any, limit: int = 512) -> str:
    return value[:limit] if isinstance(value, str) else ""


def parse(payload: Any) -> Activity:
    """The fields every activity must have; :class:`BadActivity` when one is missing."""
    if not isinstance(payload, dict):
        raise BadActivity("not a JSON object")
    conversation = dict_at(payload, "conversation")
    found = Activity(payload, _str(payload.get("type"), 64), _str(payload.get("id"), 256),
                     _str(payload.get("serviceUrl"), 2048), _str(payload.get("channelId"), 64),
                     _str(conversation.get("id"), 1024),
                     _str(conversation.get("conversationType"), 32) or "personal",
                     dict_at(payload, "from"), _str(dict_at(payload, "recipient").get("id")))
    if not found.type or not found.service_url.startswith(("https://", "http://")):
        raise BadActivity("the activity has no type or no serviceUrl")
    if found.type == "message" and not (found.id and found.conversation and found.bot_id
                                        and _str(found.sender.get("id"))):
        raise BadActivity("the message has no id, conversation, sender or recipient")
    return found


def mentions(activity: Activity) -> bool:
    return any(e.get("type") == "mention" and _str(dict_at(e, "mentioned").get("id"))
               == activity.bot_id for e in _dicts(activity.raw, "entities"))


def quoted(activity: Activity) -> tuple[str, str] | None:
    """(the quoted message's id, its author) of a quoted reply."""
    for item in _dicts(activity.raw, "attachments"):
        content = item.get("content")
        if item.get("contentType") == "text/html" and isinstance(content, str):
            match = _QUOTE.search(content[:MAX_TEXT])
            if match:
                author = _MRI.search(match.group(2))
                return match.group(1), author.group(1) if author else ""
    return None


def text_of(activity: Activity) -> str:
    """The text, the bot's ``<at>`` mention removed, others kept as ``@Name``."""
    text = _str(activity.raw.get("text"), MAX_TEXT)
    bot_names = {_str(e.get("text")) for e in _dicts(activity.raw, "entities")
                 if e.get("type") == "mention"
                 and _str(dict_at(e, "mentioned").get("id")) == activity.bot_id}
    text = _AT.sub(lambda m: "" if m.group(0) in bot_names else "@" + m.group(1), text)
    if activity.raw.get("textFormat") not in (None, "plain", "markdown"):
        text = html.unescape(_TAG.sub("", text))
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _timestamp(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def to_incoming(activity: Activity, attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    chat, thread = activity.chat_and_thread
    reply = quoted(activity)
    to_bot = reply is not None and reply[1] == activity.bot_id
    channel_data = dict_at(activity.raw, "channelData")
    sender = activity.sender
    return IncomingMessage(
        provider=PROVIDER, chat_id=chat, thread_id=thread,
        user_id=user_of(activity),
        user_name=_str(sender.get("name"), 256) or None, text=text_of(activity),
        message_id=message_id(activity), attachments=attachments,
        reply_to_id=reply[0] if reply else None, is_direct=activity.kind == "personal",
        mentions_bot=activity.kind == "personal" or mentions(activity) or to_bot,
        guild_id=_str(dict_at(channel_data, "team").get("id"), 256) or None,
        timestamp=_timestamp(activity.raw.get("timestamp")))


def user_of(activity: Activity) -> str:
    """Who acted: the person's Entra object id, else their Teams id."""
    sender = activity.sender
    return _str(sender.get("aadObjectId"), 128) or _str(sender.get("id"), 256)


def message_id(activity: Activity) -> str:
    """The dedupe key: activity ids are unique within a conversation only."""
    return f"{activity.conversation}|{activity.id}"


def activity_part(platform_id: str) -> str:
    return platform_id.rsplit("|", 1)[-1]


@dataclass(frozen=True, slots=True)
class FileIn:
    name: str
    url: str
    mime: str
    kind: str  # file | image
    with_token: bool  # the Connector's own URL: fetched with the bot's token


def files_of(activity: Activity) -> list[FileIn]:
    found: list[FileIn] = []
    for item in _dicts(activity.raw, "attachments")[:MAX_ATTACHMENTS]:
        kind, content = _str(item.get("contentType"), 256), dict_at(item, "content")
        name = _str(item.get("name"), 256)
        if kind == FILE_INFO and _str(content.get("downloadUrl"), 4096):
            found.append(FileIn(name or "file", content["downloadUrl"], _mime(name), "file",
                                False))
        elif kind.startswith("image/") and _str(item.get("contentUrl"), 4096):
            url = item["contentUrl"]
            found.append(FileIn(name or f"image-{len(found) + 1}.{kind[6:][:8]}", url, kind,
                                "image", _same_host(url, activity.service_url)))
    return found


def _same_host(url: str, service_url: str) -> bool:
    def host(u: str) -> str:
        return u.split("://", 1)[-1].split("/", 1)[0].lower()
    return host(url) == host(service_url)


def _mime(name: str) -> str:
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return {"csv": "text/csv", "pdf": "application/pdf", "txt": "text/plain",
            "json": "application/json", "xlsx": "application/vnd.openxmlformats-"
            "officedocument.spreadsheetml.sheet", "png": "image/png",
            "jpg": "image/jpeg"}.get(ext, "application/octet-stream")

