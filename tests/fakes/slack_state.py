"""State, records, errors and the test-control API of the fake Slack.

``Controls`` is the half of ``FakeSlack`` (slack_server.py) that tests call directly, on the same
event loop as the server: set up the workspace (channels, users, DMs, files), make users talk,
script failures, read what the app did, wait. The HTTP / websocket side and event delivery live in
slack_server.py.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.changes import Changes

MAX_TEXT = 40_000          # chat.postMessage / chat.update: longer text -> msg_too_long
MAX_BLOCKS = 50            # more blocks -> invalid_blocks
MAX_SECTION_TEXT = 3_000   # a section's text over this -> invalid_blocks
MAX_HEADER_TEXT = 150
# Which Events API subscription delivers a `message` event for a conversation kind.
MESSAGE_SUBSCRIPTION = {"im": "message.im", "channel": "message.channels", "group": "message.groups",
                        "mpim": "message.mpim"}
DEFAULT_SUBSCRIPTIONS = frozenset({"app_mention", "message.im"})


class SlackError(Exception):
    """A Web API refusal: answered as ``{"ok": false, "error": ...}`` (HTTP 200 unless ``status``)."""

    def __init__(self, error: str, status: int = 200, headers: dict[str, str] | None = None,
                 extra: dict | None = None) -> None:
        self.error, self.status, self.headers, self.extra = error, status, headers or {}, extra or {}
        super().__init__(error)

    def body(self) -> dict:
        return {"ok": False, "error": self.error, **self.extra}


def slack_escape(text: str) -> str:
    """Escape text the way Slack does for what users type: & < > become entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------- records
@dataclass
class Call:
    """One Web API request as the fake received it (after the method name was recognised)."""
    method: str
    params: dict
    token: str | None
    time: float = field(default_factory=time.monotonic)
    status: int = 0                   # HTTP status answered; 0 = dropped / still running
    response: dict | None = None


@dataclass
class Posted:
    """A message the app posted with chat.postMessage."""
    channel: str
    ts: str
    thread_ts: str | None
    text: str | None
    blocks: list | None
    mrkdwn: bool = True
    reply_broadcast: bool = False
    params: dict = field(default_factory=dict)
    time: float = field(default_factory=time.monotonic)


@dataclass
class Edit:
    """One chat.update: the message's text/blocks after it, and the text before it."""
    channel: str
    ts: str
    text: str | None
    blocks: list | None
    previous_text: str | None
    params: dict = field(default_factory=dict)
    time: float = field(default_factory=time.monotonic)


@dataclass
class Uploaded:
    """A file the app uploaded (getUploadURLExternal + bytes + completeUploadExternal)."""
    file_id: str
    data: bytes
    filename: str
    title: str
    channel: str | None               # None: completed without a channel (the file stays private)
    thread_ts: str | None
    initial_comment: str | None
    alt_txt: str | None = None
    snippet_type: str | None = None
    time: float = field(default_factory=time.monotonic)


@dataclass
class Attempt:
    """One delivery attempt of an event: an HTTP POST or a Socket Mode envelope."""
    retry_num: int                    # 0 = first delivery
    started: float
    headers: dict[str, str] = field(default_factory=dict)   # HTTP: the request headers sent
    envelope_id: str | None = None    # Socket Mode
    status: int | None = None         # HTTP status; None = no answer in time / no connection
    reason: str | None = None         # why it failed: http_timeout, http_error, connection_failed, timeout
    body: str | None = None           # HTTP response body
    elapsed: float | None = None
    acked: bool = False


@dataclass
class Delivery:
    """An event callback Slack tries to deliver (same ``event_id`` on every retry)."""
    event_id: str
    payload: dict
    transport: str                    # "http" | "socket"
    url: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    acked: bool = False
    done: bool = False
    gave_up: bool = False             # all retries failed (or X-Slack-No-Retry)
    _finished: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def event(self) -> dict:
        return self.payload.get("event", {})

    async def wait(self, timeout: float = 5.0) -> "Delivery":
        """Wait until Slack stops trying: acknowledged, or every retry failed."""
        try:
            await asyncio.wait_for(self._finished.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"fake Slack: delivery of {self.event_id} not finished after {timeout}s "
                               f"({len(self.attempts)} attempt(s))") from None
        return self


@dataclass
class Ack:
    """A Socket Mode acknowledgement as received on the websocket."""
    envelope_id: str
    event_id: str | None              # None: an envelope id the fake never sent (or already acked)
    payload: dict | None              # the optional "payload" of the ack
    late: bool                        # arrived after the ack deadline (Slack had already retried)
    time: float = field(default_factory=time.monotonic)


@dataclass
class UserMessage:
    """What ``user_message`` did: the message as stored, the events it produced, their deliveries."""
    channel: str
    ts: str
    message: dict
    events: list[dict]
    deliveries: list[Delivery]


@dataclass
class Failure:
    method: str                       # "*" = any Web API method; "upload" = the upload URL
    times: int
    error: SlackError | None          # None: drop the connection without an answer


@dataclass
class PendingFile:
    file_id: str
    upload_id: str
    filename: str
    length: int
    alt_txt: str | None
    snippet_type: str | None
    data: bytes | None = None
    completed: bool = False


# ---------------------------------------------------------------- helpers
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")


def rich_text_blocks(text: str) -> list[dict]:
    """The rich_text block Slack attaches to a message a user typed (mentions as user elements)."""
    elements: list[dict] = []
    pos = 0
    for m in _MENTION.finditer(text):
        if m.start() > pos:
            elements.append({"type": "text", "text": text[pos:m.start()]})
        elements.append({"type": "user", "user_id": m.group(1)})
        pos = m.end()
    if pos < len(text):
        elements.append({"type": "text", "text": text[pos:]})
    return [{"type": "rich_text", "block_id": uuid.uuid4().hex[:5],
             "elements": [{"type": "rich_text_section", "elements": elements}]}]


def mimetype_for(filename: str) -> tuple[str, str, str]:
    """(mimetype, filetype, pretty_type) from a file name, as Slack guesses them."""
    ext = filename.rpartition(".")[2].lower() if "." in filename else ""
    known = {"csv": ("text/csv", "csv", "CSV"), "txt": ("text/plain", "text", "Plain Text"),
             "png": ("image/png", "png", "PNG"), "jpg": ("image/jpeg", "jpg", "JPEG"),
             "jpeg": ("image/jpeg", "jpg", "JPEG"), "gif": ("image/gif", "gif", "GIF"),
             "json": ("application/json", "json", "JSON"), "pdf": ("application/pdf", "pdf", "PDF"),
             "md": ("text/plain", "markdown", "Markdown (raw)"), "svg": ("image/svg+xml", "svg", "SVG"),
             "py": ("text/plain", "python", "Python"), "parquet": ("application/octet-stream", "binary", "Binary"),
             "xlsx": ("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "xlsx", "Excel Spreadsheet")}
    return known.get(ext, ("application/octet-stream", "binary", "Binary"))


def check_blocks(blocks: Any) -> None:
    """Enough of Slack's Block Kit validation to catch what a renderer gets wrong: invalid_blocks."""
    if not isinstance(blocks, list):
        raise SlackError("invalid_blocks_format")
    if len(blocks) > MAX_BLOCKS:
        raise SlackError("invalid_blocks", extra={
            "errors": [f"must be less than {MAX_BLOCKS + 1} items [json-pointer:]"]})
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise SlackError("invalid_blocks", extra={
                "errors": [f"missing required field: type [json-pointer:/blocks/{i}]"]})
        kind = block["type"]
        text = block.get("text")
        if kind == "section":
            if text is None and not block.get("fields"):
                raise SlackError("invalid_blocks", extra={
                    "errors": [f"must provide either text or fields [json-pointer:/blocks/{i}]"]})
            if isinstance(text, dict):
                if text.get("type") not in ("mrkdwn", "plain_text"):
                    raise SlackError("invalid_blocks", extra={"errors": [
                        f"must be one of mrkdwn, plain_text [json-pointer:/blocks/{i}/text/type]"]})
                if not 1 <= len(text.get("text") or "") <= MAX_SECTION_TEXT:
                    raise SlackError("invalid_blocks", extra={"errors": [
                        f"must be between 1 and {MAX_SECTION_TEXT} characters [json-pointer:/blocks/{i}/text/text]"]})
        elif kind == "header":
            if not isinstance(text, dict) or text.get("type") != "plain_text":
                raise SlackError("invalid_blocks", extra={"errors": [
                    f"must be plain_text [json-pointer:/blocks/{i}/text/type]"]})
            if not 1 <= len(text.get("text") or "") <= MAX_HEADER_TEXT:
                raise SlackError("invalid_blocks", extra={"errors": [
                    f"must be between 1 and {MAX_HEADER_TEXT} characters [json-pointer:/blocks/{i}/text/text]"]})


class Controls(Changes):
    """Workspace state plus the Python API tests use (the HTTP side lives in FakeSlack)."""

    FAKE = "Slack"

    def __init__(self, *, bot_token: str, app_token: str, signing_secret: str, team_id: str, team_name: str,
                 bot_user_id: str, bot_id: str, app_id: str, bot_name: str,
                 subscriptions: set[str] | frozenset[str], echo_bot_messages: bool, chat_write_public: bool) -> None:
        self.bot_token, self.app_token, self.signing_secret = bot_token, app_token, signing_secret
        self.verification_token = "FakeVerificationToken0123"
        self.team_id, self.team_name = team_id, team_name
        self.bot_user_id, self.bot_id, self.app_id, self.bot_name = bot_user_id, bot_id, app_id, bot_name
        self.subscriptions = set(subscriptions)
        self.echo_bot_messages = echo_bot_messages      # the app's own messages come back as events
        self.chat_write_public = chat_write_public      # chat:write.public: post to public channels unjoined
        self.events_url: str | None = None              # HTTP Events API target; None = Socket Mode
        # what the app did, for assertions
        self.calls: list[Call] = []
        self.posted: list[Posted] = []
        self.updates: list[Edit] = []
        self.deletes: list[tuple[str, str]] = []        # (channel, ts)
        self.uploads: list[Uploaded] = []
        self.reactions: list[tuple[str, str, str]] = []  # (channel, ts, name)
        self.deliveries: list[Delivery] = []
        self.acks: list[Ack] = []
        # workspace state
        self._users: dict[str, dict] = {}
        self._channels: dict[str, dict] = {}
        self._history: dict[str, dict[str, dict]] = {}  # channel -> ts -> message (insertion = time order)
        self._files: dict[str, dict] = {}                # file id -> Slack file object
        self._file_bytes: dict[str, bytes] = {}
        self._pending_files: dict[str, PendingFile] = {}  # upload id -> pending external upload
        self._failures: list[Failure] = []
        self._latency: dict[str, float] = {}
        self._seq = itertools.count(1)
        self._last_ts_us = 0
        self._closing = False
        self._changed = asyncio.Event()
        self._users[bot_user_id] = self._user_json(bot_user_id, bot_name.lower(), bot_name, is_bot=True)
        self.default_user = self.add_user(name="alice", real_name="Alice Example")["id"]

    # ------------------------------------------------------------------ change notification
    # ------------------------------------------------------------------ ids
    def _id(self, prefix: str) -> str:
        return f"{prefix}0FAKE{next(self._seq):05d}"

    def next_ts(self) -> str:
        """A message ts: "<unix seconds>.<6 digits>", unique and increasing (Slack's format)."""
        now_us = int(time.time() * 1_000_000)
        self._last_ts_us = max(now_us, self._last_ts_us + 1)
        return f"{self._last_ts_us // 1_000_000}.{self._last_ts_us % 1_000_000:06d}"

    @property
    def bot_mention(self) -> str:
        """How a mention of the bot appears in message text: ``<@U...>``."""
        return f"<@{self.bot_user_id}>"

    # ------------------------------------------------------------------ users and conversations
    def _user_json(self, user_id: str, name: str, real_name: str, *, is_bot: bool = False) -> dict:
        profile = {"real_name": real_name, "display_name": name, "real_name_normalized": real_name,
                   "display_name_normalized": name, "team": self.team_id,
                   "image_72": f"https://avatars.example/{user_id}_72.png"}
        if is_bot:
            profile.update(bot_id=self.bot_id, api_app_id=self.app_id, always_active=True)
        else:
            profile["email"] = f"{name}@example.com"
        return {"id": user_id, "team_id": self.team_id, "name": name, "deleted": False, "color": "9f69e7",
                "real_name": real_name, "tz": "Europe/Berlin", "tz_label": "Central European Time",
                "tz_offset": 3600, "profile": profile, "is_admin": False, "is_owner": False,
                "is_primary_owner": False, "is_restricted": False, "is_ultra_restricted": False,
                "is_bot": is_bot, "is_app_user": False, "updated": int(time.time())}

    def add_user(self, user_id: str | None = None, *, name: str = "user", real_name: str | None = None,
                 is_bot: bool = False) -> dict:
        """Make a workspace member known (users.info answers it). Returns the user JSON."""
        user_id = user_id or self._id("U")
        if user_id not in self._users:
            self._users[user_id] = self._user_json(user_id, name, real_name or name.title(), is_bot=is_bot)
        return self._users[user_id]

    def add_channel(self, name: str, *, channel_id: str | None = None, private: bool = False, mpim: bool = False,
                    bot_member: bool = True, members: list[str] | tuple[str, ...] = (),
                    archived: bool = False) -> dict:
        """A public (``C…``) or private channel, or a group DM (``mpim``). Returns the stored channel."""
        if channel_id is None:
            channel_id = self._id("G" if private and not mpim else "C")
        kind = "mpim" if mpim else "group" if private else "channel"
        member_set = set(members) | ({self.default_user} if not members else set())
        if bot_member:
            member_set.add(self.bot_user_id)
        channel = {"id": channel_id, "name": name, "kind": kind, "members": member_set,
                   "archived": archived, "created": int(time.time()), "topic": "", "purpose": ""}
        self._channels[channel_id] = channel
        self._history.setdefault(channel_id, {})
        return channel

    def add_dm(self, user_id: str | None = None, *, channel_id: str | None = None) -> dict:
        """The direct-message conversation between a user and the bot (``D…``)."""
        user_id = user_id or self.default_user
        self.add_user(user_id)
        for ch in self._channels.values():
            if ch["kind"] == "im" and ch["user"] == user_id:
                return ch
        channel_id = channel_id or self._id("D")
        channel = {"id": channel_id, "name": None, "kind": "im", "user": user_id,
                   "members": {user_id, self.bot_user_id}, "archived": False, "created": int(time.time())}
        self._channels[channel_id] = channel
        self._history.setdefault(channel_id, {})
        return channel

    def set_member(self, channel_id: str, member: bool = True, user_id: str | None = None) -> None:
        """Add/remove the bot (or ``user_id``) to/from a channel."""
        who = user_id or self.bot_user_id
        (self._channels[channel_id]["members"].add if member else self._channels[channel_id]["members"].discard)(who)

    def set_archived(self, channel_id: str, archived: bool = True) -> None:
        self._channels[channel_id]["archived"] = archived

    def channel(self, channel_id: str) -> dict:
        return self._channels[channel_id]

    def channel_json(self, channel_id: str) -> dict:
        """conversations.info's view of a conversation."""
        ch = self._channels[channel_id]
        if ch["kind"] == "im":
            return {"id": ch["id"], "created": ch["created"], "is_im": True, "is_org_shared": False,
                    "user": ch["user"], "is_user_deleted": False, "priority": 0}
        in_it = self.bot_user_id in ch["members"]
        return {"id": ch["id"], "name": ch["name"], "name_normalized": ch["name"],
                "is_channel": ch["kind"] != "mpim", "is_group": False, "is_im": False,
                "is_mpim": ch["kind"] == "mpim", "is_private": ch["kind"] in ("group", "mpim"),
                "created": ch["created"], "is_archived": ch["archived"], "is_general": False,
                "creator": self.default_user, "is_shared": False, "is_org_shared": False,
                "is_ext_shared": False, "is_member": in_it, "num_members": len(ch["members"]),
                "topic": {"value": ch["topic"], "creator": "", "last_set": 0},
                "purpose": {"value": ch["purpose"], "creator": "", "last_set": 0}}

    def channel_type(self, channel_id: str) -> str:
        """The ``channel_type`` of message events: im, channel, group or mpim."""
        return self._channels[channel_id]["kind"]

    # ------------------------------------------------------------------ files users send
    def add_file(self, data: bytes, filename: str, *, title: str | None = None, mimetype: str | None = None,
                 user: str | None = None) -> dict:
        """Store a file as if a user uploaded it; returns the Slack file object (``url_private_download``
        serves the bytes to the bot token). Pass it to ``user_message(files=[...])``."""
        file_id = self._id("F")
        mime, filetype, pretty = mimetype_for(filename)
        if mimetype:
            mime = mimetype
        obj = self._file_json(file_id, filename, title or filename, mime, filetype, pretty, len(data),
                              user or self.default_user)
        self._files[file_id] = obj
        self._file_bytes[file_id] = bytes(data)
        return copy.deepcopy(obj)

    def _file_json(self, file_id: str, filename: str, title: str, mime: str, filetype: str, pretty: str,
                   size: int, user: str) -> dict:
        now = int(time.time())
        base = f"{self.url}/files-pri/{self.team_id}-{file_id}"
        return {"id": file_id, "created": now, "timestamp": now, "name": filename, "title": title,
                "mimetype": mime, "filetype": filetype, "pretty_type": pretty, "user": user,
                "user_team": self.team_id, "editable": False, "size": size, "mode": "hosted",
                "is_external": False, "external_type": "", "is_public": False, "public_url_shared": False,
                "display_as_bot": False, "username": "", "url_private": f"{base}/{filename}",
                "url_private_download": f"{base}/download/{filename}",
                "permalink": f"{self.url}/files/{user}/{file_id}/{filename}",
                "permalink_public": f"{self.url}/{self.team_id}-{file_id}-public", "has_rich_preview": False,
                "file_access": "visible", "shares": {}, "channels": [], "groups": [], "ims": [],
                "comments_count": 0}

    def file_bytes(self, file_id: str) -> bytes:
        return self._file_bytes[file_id]

    def file(self, file_id: str) -> dict | None:
        return copy.deepcopy(self._files.get(file_id))

    def _share_file(self, file_id: str, channel_id: str, ts: str, thread_ts: str | None) -> None:
        obj = self._files[file_id]
        ch = self._channels[channel_id]
        scope = "private" if ch["kind"] != "channel" else "public"
        share: dict[str, Any] = {"reply_users": [], "reply_users_count": 0, "reply_count": 0, "ts": ts,
                                 "channel_name": ch.get("name") or "", "team_id": self.team_id,
                                 "share_user_id": self.bot_user_id, "source": "UNKNOWN"}
        if thread_ts:
            share["thread_ts"] = thread_ts
        obj["shares"].setdefault(scope, {}).setdefault(channel_id, []).append(share)
        bucket = {"im": "ims", "channel": "channels"}.get(ch["kind"], "groups")
        if channel_id not in obj[bucket]:
            obj[bucket].append(channel_id)

    # ------------------------------------------------------------------ messages
    def _store(self, channel_id: str, msg: dict) -> dict:
        """Put a message into the channel's history; link thread replies to their parent."""
        history = self._history.setdefault(channel_id, {})
        parent_ts = msg.get("thread_ts")
        if parent_ts and parent_ts != msg["ts"]:
            parent = history.get(parent_ts)
            if parent is not None and parent.get("thread_ts") not in (None, parent_ts):
                parent = history.get(parent["thread_ts"])   # a reply's ts: Slack threads under its parent
                if parent is not None:
                    msg["thread_ts"] = parent["ts"]
            if parent is not None:
                parent["thread_ts"] = parent["ts"]
                parent["reply_count"] = parent.get("reply_count", 0) + 1
                users = parent.setdefault("reply_users", [])
                sender = msg.get("user") or msg.get("bot_id")
                if sender not in users:
                    users.append(sender)
                parent["reply_users_count"] = len(users)
                parent["latest_reply"] = msg["ts"]
                msg["parent_user_id"] = parent.get("user")
        history[msg["ts"]] = msg
        return msg

    def message(self, channel_id: str, ts: str) -> dict | None:
        """A message as it is now (after edits); None if deleted or unknown."""
        return copy.deepcopy(self._history.get(channel_id, {}).get(ts))

    def history(self, channel_id: str, thread_ts: str | None = None) -> list[dict]:
        """Messages of a channel oldest first (top level only), or of one thread (parent first)."""
        msgs = list(self._history.get(channel_id, {}).values())
        if thread_ts is None:
            return [copy.deepcopy(m) for m in msgs if m.get("thread_ts") in (None, m["ts"])]
        return [copy.deepcopy(m) for m in msgs if m["ts"] == thread_ts or m.get("thread_ts") == thread_ts]

    def _bot_message(self, text: str | None, blocks: list | None, ts: str, thread_ts: str | None) -> dict:
        msg: dict[str, Any] = {"user": self.bot_user_id, "type": "message", "ts": ts, "bot_id": self.bot_id,
                               "app_id": self.app_id, "text": text or "", "team": self.team_id,
                               "bot_profile": {"id": self.bot_id, "app_id": self.app_id, "name": self.bot_name,
                                               "icons": {}, "deleted": False, "updated": int(time.time()),
                                               "team_id": self.team_id}}
        if blocks is not None:
            msg["blocks"] = [dict(b, block_id=b.get("block_id") or uuid.uuid4().hex[:5]) for b in blocks]
        if thread_ts:
            msg["thread_ts"] = thread_ts
        return msg

    # ------------------------------------------------------------------ events
    def event_callback(self, event: dict, *, event_id: str | None = None) -> dict:
        """Wrap an inner event into the Events API ``event_callback`` envelope Slack posts."""
        return {"token": self.verification_token, "team_id": self.team_id, "context_team_id": self.team_id,
                "context_enterprise_id": None, "api_app_id": self.app_id, "event": event,
                "type": "event_callback", "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
                "event_time": int(float(event.get("event_ts") or time.time())),
                "authorizations": [{"enterprise_id": None, "team_id": self.team_id, "user_id": self.bot_user_id,
                                    "is_bot": True, "is_enterprise_install": False}],
                "is_ext_shared_channel": False,
                "event_context": f"4-{event.get('type', 'event')}-{self.team_id}-{event.get('channel', '')}"}

    def _message_events(self, channel_id: str, msg: dict, *, from_bot: bool = False) -> list[dict]:
        """The inner events the app is sent for a new message, per its subscriptions."""
        ch = self._channels[channel_id]
        kind = ch["kind"]
        if self.bot_user_id not in ch["members"]:
            return []
        events: list[dict] = []
        base = {k: v for k, v in msg.items() if k not in ("reply_count", "reply_users", "reply_users_count",
                                                          "latest_reply")}
        text = msg.get("text") or ""
        if (kind != "im" and not from_bot and "app_mention" in self.subscriptions
                and re.search(rf"<@{self.bot_user_id}(\|[^>]*)?>", text)):
            mention = {k: v for k, v in base.items() if k not in ("subtype", "upload", "display_as_bot")}
            mention.update(type="app_mention", channel=channel_id, event_ts=msg["ts"])
            events.append(mention)
        if MESSAGE_SUBSCRIPTION[kind] in self.subscriptions:
            events.append({**base, "type": "message", "channel": channel_id, "event_ts": msg["ts"],
                           "channel_type": kind})
        return events

    def _change_events(self, channel_id: str, subtype: str, msg: dict, previous: dict) -> list[dict]:
        ch = self._channels[channel_id]
        if MESSAGE_SUBSCRIPTION[ch["kind"]] not in self.subscriptions or self.bot_user_id not in ch["members"]:
            return []
        event: dict[str, Any] = {"type": "message", "subtype": subtype, "channel": channel_id,
                                 "hidden": True, "ts": self.next_ts(), "event_ts": None,
                                 "channel_type": ch["kind"], "previous_message": previous}
        event["event_ts"] = event["ts"]
        if subtype == "message_changed":
            event["message"] = msg
        else:
            event["deleted_ts"] = previous["ts"]
        return [event]

    # ------------------------------------------------------------------ users talk
    async def user_message(self, channel: str, text: str = "", *, user: str | None = None,
                           thread_ts: str | None = None, files: list[dict] | None = None,
                           deliver: bool = True) -> UserMessage:
        """A user posts ``text`` (Slack wire format: ``<@U…>`` mentions, ``&lt;`` escapes) in a channel
        or DM (``channel`` is a conversation id, a user id for that user's DM, or a channel name).
        Stores it, builds the events Slack sends for it (``message`` with ``channel_type``, and
        ``app_mention`` when the bot is mentioned in a channel; ``file_share`` subtype with ``files``)
        and, unless ``deliver=False``, delivers each (HTTP to ``events_url``, else Socket Mode)."""
        channel_id = self._find_channel(channel)
        if channel_id is None:
            raise KeyError(f"fake Slack: no conversation {channel!r}")
        ch = self._channels[channel_id]
        user = user or (ch["user"] if ch["kind"] == "im" else self.default_user)
        self.add_user(user)
        ts = self.next_ts()
        msg: dict[str, Any] = {"user": user, "type": "message", "ts": ts, "client_msg_id": str(uuid.uuid4()),
                               "text": text, "team": self.team_id, "blocks": rich_text_blocks(text) if text else []}
        if thread_ts:
            msg["thread_ts"] = thread_ts
        if files:
            msg.update(subtype="file_share", files=[copy.deepcopy(f) for f in files], upload=False,
                       display_as_bot=False)
            for f in files:
                if f["id"] in self._files:
                    self._share_file(f["id"], channel_id, ts, thread_ts)
        self._store(channel_id, msg)
        events = self._message_events(channel_id, copy.deepcopy(msg))
        deliveries = [await self.send_event(e) for e in events] if deliver else []
        self._notify()
        return UserMessage(channel_id, ts, copy.deepcopy(msg), events, deliveries)

    async def send_event(self, event: dict, **kwargs: Any) -> Delivery:  # implemented by FakeSlack
        raise NotImplementedError

    def _find_channel(self, ref: Any) -> str | None:
        """A channel id, a user id (that user's DM with the bot, opened if needed) or a channel name."""
        if not isinstance(ref, str) or not ref:
            return None
        if ref in self._channels:
            return ref
        if ref[0] in "UW" and ref in self._users and ref != self.bot_user_id:
            return self.add_dm(ref)["id"]
        name = ref.lstrip("#")
        for ch in self._channels.values():
            if ch.get("name") == name:
                return ch["id"]
        return None

    # ------------------------------------------------------------------ scripted trouble
    def fail_next(self, method: str, error: str = "internal_error", times: int = 1, *, status: int = 200,
                  headers: dict[str, str] | None = None) -> None:
        """The next ``times`` calls of ``method`` ("*" = any Web API method, "upload" = the upload URL)
        answer ``{"ok": false, "error": error}`` with HTTP ``status`` (Slack uses 200 for API errors)."""
        self._failures.append(Failure(method, times, SlackError(error, status, headers)))

    def rate_limit_next(self, method: str, retry_after: int = 1, times: int = 1) -> None:
        """The next ``times`` calls answer HTTP 429, ``Retry-After: <retry_after>``, error ``ratelimited``."""
        self.fail_next(method, "ratelimited", times, status=429, headers={"Retry-After": str(retry_after)})

    def drop_next(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` get no answer: the connection is cut."""
        self._failures.append(Failure(method, times, None))

    def set_latency(self, seconds: float, method: str = "*") -> None:
        """Delay every Web API answer (or one method's) by ``seconds``."""
        self._latency[method] = seconds

    def _take_failure(self, method: str) -> Failure | None:
        for failure in self._failures:
            if failure.times > 0 and failure.method in (method, "*" if method != "upload" else "upload"):
                failure.times -= 1
                return failure
        return None

    # ------------------------------------------------------------------ reading what happened
    def posts(self, channel: str | None = None, *, thread_ts: str | None = None) -> list[Posted]:
        """chat.postMessage calls that succeeded, oldest first (optionally one channel / thread)."""
        return [p for p in self.posted if channel in (None, p.channel) and thread_ts in (None, p.thread_ts)]

    def edits(self, channel: str | None = None, ts: str | None = None) -> list[Edit]:
        return [e for e in self.updates if channel in (None, e.channel) and ts in (None, e.ts)]

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    async def wait_for_posts(self, channel: str, n: int = 1, timeout: float = 5.0) -> list[Posted]:
        """Wait until the app posted at least ``n`` messages to ``channel``; returns them all."""
        try:
            return await self.wait_until(lambda: len(p := self.posts(channel)) >= n and p, timeout)
        except TimeoutError:
            got = [p.text for p in self.posts(channel)]
            raise TimeoutError(f"fake Slack: expected {n} post(s) in {channel} within {timeout}s, "
                               f"got {len(got)}: {got!r}") from None

    async def wait_for_updates(self, channel: str | None = None, n: int = 1, timeout: float = 5.0) -> list[Edit]:
        return await self.wait_until(lambda: len(e := self.edits(channel)) >= n and e, timeout,
                                     f"{n} chat.update(s)")

    async def wait_for_uploads(self, channel: str | None = None, n: int = 1, timeout: float = 5.0) -> list[Uploaded]:
        def done() -> list[Uploaded]:
            got = [u for u in self.uploads if channel in (None, u.channel)]
            return got if len(got) >= n else []
        return await self.wait_until(done, timeout, f"{n} upload(s)")

    async def wait_for_calls(self, method: str, n: int = 1, timeout: float = 5.0) -> list[Call]:
        return await self.wait_until(lambda: len(c := [x for x in self.calls_to(method) if x.status]) >= n and c,
                                     timeout, f"{n} {method} call(s)")

    async def wait_for_acks(self, n: int = 1, timeout: float = 5.0) -> list[Ack]:
        return await self.wait_until(lambda: len(self.acks) >= n and list(self.acks), timeout, f"{n} ack(s)")

    # provided by FakeSlack
    url: str
