"""From a Slack event to an :class:`IncomingMessage`.

Slack sends a message in a channel that mentions the bot twice: as ``app_mention`` and (with the
``message.channels`` subscription) as ``message``; it retries an event it thinks was not
acknowledged, with the same ``event_id`` (over HTTP with ``X-Slack-Retry-Num``; in Socket Mode
in a new envelope). Both are the same message, identified by its channel and ``ts``: that is the
message id the gateway's persistent dedupe keys on, and :class:`RecentKeys` drops the copies
that arrive while the first is still being handled, before any work (a file download) is done.

In a direct message every message is for the bot. In a channel a message is addressed to it when
it mentions the bot (``<@BOT_USER_ID>``), or is a reply in a thread the bot takes part in
(:class:`Threads`). A top-level channel message is answered in a thread under it
(``reply_in_thread``), so ``thread_id`` is the thread's ``ts`` — the message's own ``ts`` for a
new one — and ``session: thread`` in routes.yaml makes each thread its own conversation.
"""

from __future__ import annotations

import html
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pluto.providers.kit.bounded import remember
from pluto.types import Attachment, IncomingMessage

PROVIDER = "slack"

# message subtypes that are people writing; the rest (edits, deletions, joins, bots) are not
USER_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})

_USER_REF = re.compile(r"<@([UW][A-Z0-9]+)(?:\|([^>]*))?>")
_CHANNEL_REF = re.compile(r"<#(C[A-Z0-9]+)(?:\|([^>]*))?>")
_SPECIAL = re.compile(r"<!(here|channel|everyone)(?:\|[^>]*)?>")
_SUBTEAM = re.compile(r"<!subteam\^[A-Z0-9]+(?:\|([^>]*))?>")
_LINK = re.compile(r"<((?:https?|mailto|tel):[^|>]+)(?:\|([^>]*))?>")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the bot is in its workspace (from ``auth.test``)."""

    user_id: str
    bot_id: str
    team_id: str


def message_key(channel: str, ts: str) -> str:
    """The id of a message: ``ts`` is unique within its channel."""
    return f"{channel}:{ts}"


def mentions(text: str, bot_user_id: str) -> bool:
    return any(m.group(1) == bot_user_id for m in _USER_REF.finditer(text or ""))


def plain_text(text: str, bot_user_id: str) -> str:
    """Slack's wire format as a person reads it: the bot's mention removed, other mentions,
    channels and links spelled out, ``&lt;``/``&gt;``/``&amp;`` decoded."""
    def user(m: re.Match[str]) -> str:
        return "" if m.group(1) == bot_user_id else f"@{m.group(2) or m.group(1)}"

    def link(m: re.Match[str]) -> str:
        url, label = m.group(1), m.group(2)
        target = url.removeprefix("mailto:").removeprefix("tel:")
        return f"{label} ({url})" if label and label not in (url, target) else target

    text = _USER_REF.sub(user, text or "")
    text = _CHANNEL_REF.sub(lambda m: f"#{m.group(2) or m.group(1)}", text)
    text = _SPECIAL.sub(lambda m: f"@{m.group(1)}", text)
    text = _SUBTEAM.sub(lambda m: m.group(1) or "@team", text)
    text = _LINK.sub(link, text)
    text = html.unescape(text)
    text = re.sub(r"^[ \t]*[,:][ \t]*", "", text.strip())  # "<@BOT>: hi" → "hi"
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def is_from_people(event: dict[str, Any]) -> bool:
    """A message a person wrote (not a bot, not an edit, deletion or channel notice)."""
    return (event.get("type") in ("message", "app_mention") and bool(event.get("user"))
            and not event.get("bot_id") and event.get("subtype") in USER_SUBTYPES
            and bool(event.get("channel")) and bool(event.get("ts")))


def is_direct(event: dict[str, Any]) -> bool:
    """A direct message (``channel_type`` im; DM channel ids start with ``D``)."""
    kind = event.get("channel_type")
    return kind == "im" if kind else str(event.get("channel", "")).startswith("D")


@dataclass(frozen=True, slots=True)
class Addressed:
    """What the provider decided about an event before building the message."""

    direct: bool
    mentioned: bool  # the bot is mentioned, or the message continues a thread it is in
    thread_ts: str | None  # where the answer goes (None: the conversation itself)


def to_incoming(event: dict[str, Any], who: Identity, addressed: Addressed, *,
                team_id: str | None, attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    channel, ts = str(event["channel"]), str(event["ts"])
    parent = event.get("thread_ts")
    return IncomingMessage(
        provider=PROVIDER, chat_id=channel, user_id=str(event["user"]),
        text=plain_text(str(event.get("text") or ""), who.user_id),
        message_id=message_key(channel, ts), attachments=attachments,
        thread_id=addressed.thread_ts,
        reply_to_id=message_key(channel, str(parent)) if parent and parent != ts else None,
        is_direct=addressed.direct, mentions_bot=addressed.direct or addressed.mentioned,
        guild_id=team_id or event.get("team") or who.team_id, timestamp=_seconds(ts))


def _seconds(ts: str) -> float:
    try:
        return float(ts)
    except ValueError:
        return time.time()


class RecentKeys:
    """Message keys being handled or handled lately (bounded): the in-process first line of
    dedupe, for copies that arrive together. The gateway's dedupe is the persistent one."""

    def __init__(self, size: int = 10_000):
        self.size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def claim(self, key: str) -> bool:
        """True the first time ``key`` is seen (and remembers it)."""
        if key in self._keys:
            self._keys.move_to_end(key)
            return False
        remember(self._keys, key, None, self.size)
        return True

    def release(self, key: str) -> None:
        """Forget ``key`` (its handling failed: let a redelivery try again)."""
        self._keys.pop(key, None)


class Threads:
    """Which threads (channel, thread ts) the bot takes part in: those it posted in or was
    mentioned in, remembered (bounded); others are looked up once (``conversations.replies``)."""

    def __init__(self, size: int = 10_000):
        self.size = size
        self._known: OrderedDict[tuple[str, str], bool] = OrderedDict()

    def join(self, channel: str, thread_ts: str) -> None:
        self._remember((channel, thread_ts), True)

    def known(self, channel: str, thread_ts: str) -> bool | None:
        return self._known.get((channel, thread_ts))

    def learn(self, channel: str, thread_ts: str, messages: list[dict[str, Any]],
              who: Identity) -> bool:
        """Whether the bot wrote in (or was mentioned in) a thread's ``messages``; remembered."""
        inside = any(m.get("user") == who.user_id or m.get("bot_id") == who.bot_id
                     or mentions(str(m.get("text") or ""), who.user_id) for m in messages)
        self._remember((channel, thread_ts), inside)
        return inside

    def _remember(self, key: tuple[str, str], inside: bool) -> None:
        remember(self._known, key, self._known.get(key, False) or inside, self.size)
