"""State, payloads, records, errors and the test-control API of the fake Discord.

``Controls`` is the half of ``FakeDiscord`` (discord_server.py) that tests call directly, on the
same event loop as the server: make guilds/channels/users known, inject what users do, script
failures, read what the bot did, wait. The gateway half (sessions, connections, RESUME) lives in
discord_server.py and plugs in through ``_broadcast``.

Payloads follow the Discord API v10 shapes (ids are strings, timestamps ISO 8601 with offset),
close enough that discord.py 2.x builds real ``Guild``/``TextChannel``/``Thread``/``Message``
objects from them.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import hashlib
import hmac
import itertools
import mimetypes
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.changes import Changes

DISCORD_EPOCH_MS = 1_420_070_400_000
MAX_CONTENT = 2000
MAX_FILES = 10

# Gateway intents (bits), https://discord.com/developers/docs/events/gateway#gateway-intents
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1            # privileged
INTENT_GUILD_PRESENCES = 1 << 8          # privileged
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15         # privileged
PRIVILEGED_INTENTS = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT

# Channel types
GUILD_TEXT, DM, GUILD_CATEGORY, GUILD_ANNOUNCEMENT = 0, 1, 4, 5
ANNOUNCEMENT_THREAD, PUBLIC_THREAD, PRIVATE_THREAD = 10, 11, 12
THREAD_TYPES = {ANNOUNCEMENT_THREAD, PUBLIC_THREAD, PRIVATE_THREAD}
MESSAGEABLE_TYPES = {GUILD_TEXT, DM, GUILD_ANNOUNCEMENT} | THREAD_TYPES

# Message types
DEFAULT_MESSAGE, REPLY_MESSAGE = 0, 19

# Permission bits used for the bot's managed role and @everyone
_P = {"add_reactions": 6, "view_channel": 10, "send_messages": 11, "embed_links": 14, "attach_files": 15,
      "read_message_history": 16, "use_external_emojis": 18, "send_messages_in_threads": 38,
      "create_public_threads": 35}
BOT_PERMISSIONS = sum(1 << b for b in _P.values())
EVERYONE_PERMISSIONS = (1 << 6) | (1 << 10) | (1 << 11) | (1 << 16)

# Short names for routes, accepted by rate_limit_next / fail_next / drop_next / set_bucket / set_latency.
ROUTE_ALIASES = {
    "me": "GET /users/@me",
    "get_user": "GET /users/{user_id}",
    "create_dm": "POST /users/@me/channels",
    "application": "GET /oauth2/applications/@me",
    "gateway": "GET /gateway",
    "gateway_bot": "GET /gateway/bot",
    "get_channel": "GET /channels/{channel_id}",
    "history": "GET /channels/{channel_id}/messages",
    "send_message": "POST /channels/{channel_id}/messages",
    "get_message": "GET /channels/{channel_id}/messages/{message_id}",
    "edit_message": "PATCH /channels/{channel_id}/messages/{message_id}",
    "delete_message": "DELETE /channels/{channel_id}/messages/{message_id}",
    "typing": "POST /channels/{channel_id}/typing",
    "interaction_callback": "POST /interactions/{interaction_id}/{interaction_token}/callback",
}

# JSON error codes, https://discord.com/developers/docs/topics/opcodes-and-status-codes#json
ERROR_MESSAGES = {
    0: None,
    10003: "Unknown Channel",
    10008: "Unknown Message",
    10013: "Unknown User",
    40005: "Request entity too large",
    50001: "Missing Access",
    50005: "Cannot edit a message authored by another user",
    50006: "Cannot send an empty message",
    50007: "Cannot send messages to this user",
    50008: "Cannot send messages in a non-text channel",
    50013: "Missing Permissions",
    50035: "Invalid Form Body",
    50083: "Thread is archived",
    50109: "The request body contains invalid JSON.",
}
STATUS_TEXT = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
               405: "Method Not Allowed", 413: "Payload Too Large", 429: "Too Many Requests",
               500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
               504: "Gateway Timeout"}


def normalize_route(route: str) -> str:
    """ "send_message" / "post /channels/{channel_id}/messages" -> "POST /channels/{channel_id}/messages"."""
    if route == "*":
        return route
    if route in ROUTE_ALIASES:
        return ROUTE_ALIASES[route]
    method, _, path = route.strip().partition(" ")
    if not path:
        raise ValueError(f"route must be '*', an alias {sorted(ROUTE_ALIASES)} or 'METHOD /path', got {route!r}")
    return f"{method.upper()} {path.strip()}"


class ApiError(Exception):
    """A Discord REST error: answered as {"message": ..., "code": ..., ["errors": ...]}."""

    def __init__(self, status: int, code: int = 0, message: str | None = None, errors: dict | None = None):
        self.status, self.code, self.errors = status, code, errors
        self.message = message or ERROR_MESSAGES.get(code) or f"{status}: {STATUS_TEXT.get(status, 'Error')}"
        super().__init__(f"{status} {self.message} (code {code})")

    def body(self) -> dict:
        out: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.errors:
            out["errors"] = self.errors
        return out


def form_error(path: str, code: str, message: str) -> ApiError:
    """400 code 50035 "Invalid Form Body" with one field error, nested the way Discord nests them:
    "content" -> {"content": {"_errors": [...]}}, "files.0" -> {"files": {"0": {"_errors": [...]}}}."""
    errors: dict[str, Any] = {"_errors": [{"code": code, "message": message}]}
    for part in reversed(path.split(".")):
        errors = {part: errors}
    return ApiError(400, 50035, "Invalid Form Body", errors)


# ---------------------------------------------------------------- records
@dataclass
class Attachment:
    """A file attached to a message the bot sent (or a user "sent", see ``inject_message``)."""
    id: int
    filename: str
    data: bytes
    content_type: str | None          # as Discord reports it (detected from the name / bytes)
    uploaded_content_type: str | None  # the multipart part's Content-Type as the client sent it
    description: str | None = None
    url: str = ""

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class Edit:
    """One PATCH of a message the bot sent."""
    content: str | None
    attachments: list[Attachment]
    time: float
    payload: dict


@dataclass
class Sent:
    """A message the bot created (POST /channels/{id}/messages), with its later edits."""
    channel_id: int
    message_id: int
    content: str
    attachments: list[Attachment]
    time: float
    payload: dict                      # the JSON the client sent (payload_json for multipart)
    reply_to: int | None = None        # message_reference.message_id
    nonce: str | int | None = None
    embeds: list[dict] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    deleted: bool = False
    deleted_time: float | None = None

    @property
    def current_content(self) -> str | None:
        """The content after the last edit (the original content if never edited)."""
        for edit in reversed(self.edits):
            if edit.content is not None:
                return edit.content
        return self.content

    @property
    def current_attachments(self) -> list[Attachment]:
        return self.edits[-1].attachments if self.edits else self.attachments


@dataclass
class Call:
    """One REST request as the fake received it (after route matching)."""
    method: str
    route: str                         # "POST /channels/{channel_id}/messages"
    path: str                          # "/channels/123/messages"
    params: dict[str, str]
    time: float = field(default_factory=time.monotonic)
    status: int = 0                    # 0: connection dropped (drop_next)
    code: int | None = None            # Discord JSON error code when status >= 400
    json: Any = None
    rate_limited: bool = False


@dataclass
class Typing:
    channel_id: int
    time: float = field(default_factory=time.monotonic)


@dataclass
class Identify:
    session_id: str | None             # None: rejected
    intents: int | None
    shard: list[int] | None
    properties: dict
    accepted: bool
    close_code: int | None = None      # why it was rejected
    time: float = field(default_factory=time.monotonic)


@dataclass
class Resume:
    session_id: str
    seq: int | None
    accepted: bool
    replayed: list[int] = field(default_factory=list)   # seqs re-sent before RESUMED
    time: float = field(default_factory=time.monotonic)


@dataclass
class Failure:
    """A scripted answer for the next ``times`` matching requests."""
    route: str                         # normalized route or "*"
    times: int
    channel_id: int | None
    kind: str                          # "error" | "ratelimit" | "drop"
    error: ApiError | None = None
    retry_after: float = 0.0
    global_: bool = False
    via: bool = True
    scope: str | None = None

    def matches(self, route: str, channel_id: int | None) -> bool:
        return (self.times > 0 and self.route in ("*", route)
                and (self.channel_id is None or self.channel_id == channel_id))


@dataclass
class Bucket:
    """A real per-route rate limit bucket (per channel, like Discord's major parameters)."""
    route: str
    limit: int
    per: float
    hits: dict[str, list[float]] = field(default_factory=dict)


# ---------------------------------------------------------------- helpers
def iso(ts: float | None = None) -> str:
    return dt.datetime.fromtimestamp(time.time() if ts is None else ts, dt.timezone.utc).isoformat()


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, GIF or JPEG; None if it is not one of those."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data.startswith(b"\xff\xd8"):
        i = 2
        while i + 9 < len(data) and data[i] == 0xFF:
            marker, seglen = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5:i + 9])
                return (w, h)
            i += 2 + seglen
    return None


def detect_content_type(filename: str, data: bytes) -> str | None:
    """What Discord reports as an attachment's content_type: sniffed images, else from the name."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    guessed = mimetypes.guess_type(filename)[0]
    if guessed and (guessed.startswith("text/") or guessed in ("application/json", "application/xml")):
        guessed += "; charset=utf-8"
    return guessed


_MENTION = re.compile(r"<@!?(\d{15,21})>")


class Controls(Changes):
    """Platform state plus the Python API tests use (HTTP and the gateway live in FakeDiscord)."""

    FAKE = "Discord"

    def __init__(self, token: str, bot_id: int, bot_name: str, application_name: str) -> None:
        self.token = token
        self.application_name = application_name
        # what the bot did, for assertions
        self.sent: list[Sent] = []                  # every message the bot created, in order
        self.calls: list[Call] = []                 # every REST request that matched a route
        self.typing: list[Typing] = []              # POST /channels/{id}/typing
        self.deleted: list[tuple[int, int]] = []    # (channel_id, message_id) the bot deleted
        self.identifies: list[Identify] = []        # gateway op 2, accepted or not
        self.resumes: list[Resume] = []             # gateway op 6, accepted or not
        # platform state
        self._users: dict[int, dict] = {}
        self._guilds: dict[int, dict] = {}          # {"id", "name", "owner_id", "members": {uid: joined}, ...}
        self._channels: dict[int, dict] = {}        # channel JSON (guild text, thread, DM)
        self._msgs: dict[int, dict[int, dict]] = {}  # channel_id -> message_id -> message JSON (REST shape)
        self._sent_by_id: dict[int, Sent] = {}
        self._files: dict[int, Attachment] = {}     # attachment id -> file, for the fake CDN
        self._nonces: dict[tuple[int, str], tuple[float, int]] = {}
        self._failures: list[Failure] = []
        self._buckets: dict[str, Bucket] = {}
        self._forbidden: dict[int, int] = {}        # channel_id -> JSON error code for sends
        self._latency: dict[str, float] = {}
        self._global_until = 0.0
        self._windows: dict[tuple[str, int], float] = {}  # (route, channel) → 429s until
        self._last_snowflake = 0
        self._seq = itertools.count(1)
        self._cdn_key = hashlib.sha256(token.encode()).digest()
        self._changed = asyncio.Event()
        self.bot_user = self.add_user(bot_id, username=bot_name.lower().replace(" ", "_"),
                                      global_name=None, bot=True)
        self.default_user = self.add_user(username="alice", global_name="Alice")

    # ------------------------------------------------------------------ base URL (set by the server)
    @property
    def url(self) -> str:                           # pragma: no cover - overridden by FakeDiscord
        return "http://127.0.0.1:0"

    # ------------------------------------------------------------------ change notification
    # ------------------------------------------------------------------ hooks for the gateway half
    def _broadcast(self, event: str, data: dict, *, guild_id: int | None, intent: int,
                   message: dict | None = None) -> None:
        """Dispatch an event to every live gateway session (FakeDiscord implements it)."""

    # ------------------------------------------------------------------ ids and payloads
    def snowflake(self, ts: float | None = None) -> int:
        """A new Discord snowflake for ``ts`` (now by default), strictly increasing."""
        ms = int((time.time() if ts is None else ts) * 1000)
        value = ((ms - DISCORD_EPOCH_MS) << 22) | (1 << 17) | (1 << 12)
        value = max(value, self._last_snowflake + 1)
        self._last_snowflake = value
        return value

    @property
    def bot_id(self) -> int:
        return int(self.bot_user["id"])

    @property
    def bot_mention(self) -> str:
        """``<@bot_id>``: put it in ``inject_message`` content to mention the bot as a user would."""
        return f"<@{self.bot_id}>"

    def user(self, user_id: int) -> dict:
        return self._users[int(user_id)]

    def _user_ref(self, who: Any) -> dict:
        """A user id, user dict, or "bot" -> the stored user JSON (unknown ids are created)."""
        if who == "bot":
            return self.bot_user
        if isinstance(who, dict):
            who = who["id"]
        uid = int(who)
        return self._users.get(uid) or self.add_user(uid)

    def _member_json(self, guild: dict, user_id: int, *, with_user: bool = True) -> dict:
        joined = guild["members"].get(user_id, guild["created"])
        roles = [str(guild["bot_role_id"])] if user_id == self.bot_id else []
        member: dict[str, Any] = {
            "nick": None, "avatar": None, "banner": None, "roles": roles, "joined_at": iso(joined),
            "premium_since": None, "deaf": False, "mute": False, "flags": 0, "pending": False,
            "communication_disabled_until": None, "unusual_dm_activity_until": None,
        }
        if with_user:
            member["user"] = copy.deepcopy(self._users[user_id])
        return member

    def _roles_json(self, guild: dict) -> list[dict]:
        def role(rid: int, name: str, perms: int, position: int, managed: bool, tags: dict | None) -> dict:
            out = {"id": str(rid), "name": name, "description": None, "color": 0,
                   "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
                   "hoist": False, "icon": None, "unicode_emoji": None, "position": position,
                   "permissions": str(perms), "managed": managed, "mentionable": False, "flags": 0}
            if tags is not None:
                out["tags"] = tags
            return out
        return [role(guild["id"], "@everyone", EVERYONE_PERMISSIONS, 0, False, None),
                role(guild["bot_role_id"], self.bot_user["username"], BOT_PERMISSIONS, 1, True,
                     {"bot_id": str(self.bot_id)})]

    def _guild_json(self, guild: dict, *, members_intent: bool) -> dict:
        """The GUILD_CREATE payload (lazy-loaded available guild)."""
        gid = guild["id"]
        member_ids = list(guild["members"]) if members_intent else [self.bot_id]
        channels = [copy.deepcopy(c) for c in self._channels.values()
                    if c.get("guild_id") == str(gid) and c["type"] not in THREAD_TYPES]
        threads = [copy.deepcopy(c) for c in self._channels.values()
                   if c.get("guild_id") == str(gid) and c["type"] in THREAD_TYPES
                   and not c["thread_metadata"]["archived"]]
        for ch in channels + threads:
            ch.pop("guild_id", None)                # GUILD_CREATE channels omit guild_id
        return {
            "id": str(gid), "name": guild["name"], "icon": None, "description": None, "home_header": None,
            "splash": None, "discovery_splash": None, "features": [], "banner": None,
            "owner_id": str(guild["owner_id"]), "application_id": None, "region": "deprecated",
            "afk_channel_id": None, "afk_timeout": 300, "system_channel_id": None, "widget_enabled": False,
            "verification_level": 0, "roles": self._roles_json(guild), "default_message_notifications": 0,
            "mfa_level": 0, "explicit_content_filter": 0, "max_presences": None, "max_members": 500000,
            "max_stage_video_channel_users": 50, "max_video_channel_users": 25, "vanity_url_code": None,
            "premium_tier": 0, "premium_subscription_count": 0, "system_channel_flags": 0,
            "preferred_locale": "en-US", "rules_channel_id": None, "public_updates_channel_id": None,
            "safety_alerts_channel_id": None, "nsfw_level": 0, "nsfw": False,
            "premium_progress_bar_enabled": False, "emojis": [], "stickers": [], "incidents_data": None,
            "latest_onboarding_question_id": None, "hub_type": None, "version": int(guild["created"] * 1000),
            "joined_at": iso(guild["members"].get(self.bot_id, guild["created"])), "large": False,
            "unavailable": False, "lazy": True, "member_count": len(guild["members"]),
            "voice_states": [], "members": [self._member_json(guild, uid) for uid in member_ids],
            "channels": channels, "threads": threads, "presences": [], "stage_instances": [],
            "guild_scheduled_events": [], "soundboard_sounds": [], "embedded_activities": [],
            "activity_instances": [], "application_command_counts": {},
        }

    def _guild_of(self, channel: dict) -> dict | None:
        gid = channel.get("guild_id")
        return self._guilds.get(int(gid)) if gid else None

    # ------------------------------------------------------------------ world building
    def add_user(self, user_id: int | None = None, *, username: str | None = None,
                 global_name: str | None = None, bot: bool = False) -> dict:
        """Make a user known. Returns the User JSON (the stored dict; ``user["id"]`` is a string)."""
        uid = int(user_id) if user_id is not None else self.snowflake()
        if uid in self._users:
            return self._users[uid]
        name = username or f"user{uid % 100000}"
        user: dict[str, Any] = {
            "id": str(uid), "username": name, "discriminator": "0",
            "global_name": global_name if global_name is not None else (None if bot else name.title()),
            "avatar": None, "avatar_decoration_data": None, "collectibles": None, "display_name_styles": None,
            "banner": None, "accent_color": None, "banner_color": None, "clan": None, "primary_guild": None,
            "public_flags": 0, "flags": 0,
        }
        if bot:
            user["bot"] = True
        self._users[uid] = user
        return user

    def add_guild(self, guild_id: int | None = None, *, name: str = "Pluto Test Guild",
                  owner_id: int | None = None, members: Iterable[Any] = ()) -> dict:
        """Put the bot in a guild (server). Connected clients get GUILD_CREATE (as when it joins).
        ``members``: user ids/dicts that are members besides the bot and the owner. Returns the state
        dict ({"id", "name", "owner_id", "members": {user_id: joined_time}, ...})."""
        gid = int(guild_id) if guild_id is not None else self.snowflake()
        if gid in self._guilds:
            return self._guilds[gid]
        owner = self._user_ref(owner_id) if owner_id is not None else self.default_user
        now = time.time()
        guild = {"id": gid, "name": name, "owner_id": int(owner["id"]), "created": now - 86400,
                 "bot_role_id": self.snowflake(), "members": {}}
        self._guilds[gid] = guild
        for who in [self.bot_id, owner["id"], *members]:
            guild["members"][int(self._user_ref(who)["id"])] = now
        self._broadcast("GUILD_CREATE", {}, guild_id=gid, intent=INTENT_GUILDS)
        self._notify()
        return guild

    def add_member(self, guild_id: int, user: Any) -> dict:
        """A user joins a guild. Returns the user JSON."""
        u = self._user_ref(user)
        self._guilds[int(guild_id)]["members"].setdefault(int(u["id"]), time.time())
        return u

    def add_channel(self, guild_id: int, channel_id: int | None = None, *, name: str = "general",
                    type: int = GUILD_TEXT, topic: str | None = None, parent_id: int | None = None,
                    position: int | None = None) -> dict:
        """A guild channel (text by default; ``type=4`` a category). Connected clients get
        CHANNEL_CREATE. Returns the channel JSON."""
        guild = self._guilds[int(guild_id)]
        cid = int(channel_id) if channel_id is not None else self.snowflake()
        if cid in self._channels:
            return self._channels[cid]
        count = sum(1 for c in self._channels.values() if c.get("guild_id") == str(guild["id"]))
        channel: dict[str, Any] = {
            "id": str(cid), "type": type, "guild_id": str(guild["id"]), "name": name,
            "position": count if position is None else position, "permission_overwrites": [],
            "parent_id": str(parent_id) if parent_id else None, "nsfw": False, "flags": 0,
        }
        if type != GUILD_CATEGORY:
            channel.update(topic=topic, last_message_id=None, rate_limit_per_user=0,
                           icon_emoji=None, theme_color=None)
        self._channels[cid] = channel
        self._msgs.setdefault(cid, {})
        self._broadcast("CHANNEL_CREATE", copy.deepcopy(channel), guild_id=guild["id"], intent=INTENT_GUILDS)
        self._notify()
        return channel

    def add_thread(self, parent_id: int, thread_id: int | None = None, *, name: str = "thread",
                   private: bool = False, owner_id: int | None = None, archived: bool = False) -> dict:
        """A thread under a text channel (type 11 public, 12 private), active unless ``archived``.
        Connected clients get THREAD_CREATE. Returns the channel JSON (with ``parent_id``)."""
        parent = self._channels[int(parent_id)]
        tid = int(thread_id) if thread_id is not None else self.snowflake()
        if tid in self._channels:
            return self._channels[tid]
        owner = self._user_ref(owner_id) if owner_id is not None else self.default_user
        now = iso()
        thread: dict[str, Any] = {
            "id": str(tid), "type": PRIVATE_THREAD if private else PUBLIC_THREAD,
            "guild_id": parent["guild_id"], "parent_id": parent["id"], "owner_id": owner["id"],
            "name": name, "last_message_id": None, "message_count": 0, "member_count": 1,
            "rate_limit_per_user": 0, "flags": 0, "total_message_sent": 0, "applied_tags": [],
            "thread_metadata": {"archived": archived, "auto_archive_duration": 1440, "archive_timestamp": now,
                                "locked": False, "create_timestamp": now,
                                **({"invitable": True} if private else {})},
        }
        self._channels[tid] = thread
        self._msgs.setdefault(tid, {})
        self._broadcast("THREAD_CREATE", {**copy.deepcopy(thread), "newly_created": True},
                        guild_id=int(parent["guild_id"]), intent=INTENT_GUILDS)
        self._notify()
        return thread

    def add_dm(self, user: Any = None, channel_id: int | None = None) -> dict:
        """The DM channel between the bot and ``user`` (default: the default user). Returns its JSON."""
        u = self._user_ref(user if user is not None else self.default_user)
        for ch in self._channels.values():
            if ch["type"] == DM and ch["recipients"][0]["id"] == u["id"]:
                return ch
        cid = int(channel_id) if channel_id is not None else self.snowflake()
        channel = {"id": str(cid), "type": DM, "last_message_id": None, "flags": 0,
                   "recipients": [copy.deepcopy(u)]}
        self._channels[cid] = channel
        self._msgs.setdefault(cid, {})
        return channel

    def channel(self, channel_id: int) -> dict | None:
        return self._channels.get(int(channel_id))

    def message(self, channel_id: int, message_id: int) -> dict | None:
        """The message as it is now (after edits) as REST JSON; None if deleted or unknown."""
        return self._msgs.get(int(channel_id), {}).get(int(message_id))

    # ------------------------------------------------------------------ messages
    def _cdn_url(self, att_id: int, channel_id: int, filename: str) -> str:
        ex = int(time.time()) + 86400
        path = f"/attachments/{channel_id}/{att_id}/{filename}"
        sig = hmac.new(self._cdn_key, f"{path}:{ex:x}".encode(), hashlib.sha256).hexdigest()
        return f"{self.url}{path}?ex={ex:x}&is={ex - 86400:x}&hm={sig}&"

    def _check_cdn(self, path: str, ex: str, hm: str) -> bool:
        good = hmac.new(self._cdn_key, f"{path}:{ex}".encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(good, hm or "")

    def _store_file(self, channel_id: int, filename: str, data: bytes, uploaded_type: str | None,
                    description: str | None = None) -> Attachment:
        att = Attachment(self.snowflake(), filename, bytes(data), detect_content_type(filename, data),
                         uploaded_type, description)
        att.url = self._cdn_url(att.id, channel_id, filename)
        self._files[att.id] = att
        return att

    def _attachment_json(self, att: Attachment, channel_id: int) -> dict:
        out: dict[str, Any] = {"id": str(att.id), "filename": att.filename, "size": att.size, "url": att.url,
                               "proxy_url": att.url.replace("/attachments/", "/media/attachments/", 1)}
        if att.content_type:
            out["content_type"] = att.content_type
        if att.description:
            out["description"] = att.description
        if (wh := image_size(att.data)) is not None:
            out["width"], out["height"] = wh
            out["placeholder_version"] = 1
        return out

    def _mentions_in(self, content: str) -> list[dict]:
        seen, out = set(), []
        for m in _MENTION.finditer(content or ""):
            uid = int(m.group(1))
            if uid in self._users and uid not in seen:
                seen.add(uid)
                out.append(copy.deepcopy(self._users[uid]))
        return out

    def _new_message(self, channel: dict, author: dict, content: str, *, attachments: list[Attachment],
                     mentions: list[dict], reply_to: dict | None, nonce: Any = None,
                     embeds: list[dict] | None = None, mention_everyone: bool = False,
                     ts: float | None = None) -> dict:
        cid = int(channel["id"])
        mid = self.snowflake(ts)
        msg: dict[str, Any] = {
            "type": REPLY_MESSAGE if reply_to else DEFAULT_MESSAGE, "content": content,
            "mentions": mentions, "mention_roles": [], "attachments": [self._attachment_json(a, cid)
                                                                       for a in attachments],
            "embeds": embeds or [], "timestamp": iso(ts), "edited_timestamp": None, "flags": 0,
            "components": [], "id": str(mid), "channel_id": str(cid), "author": copy.deepcopy(author),
            "pinned": False, "mention_everyone": mention_everyone, "tts": False,
        }
        if nonce is not None:
            msg["nonce"] = nonce
        if channel["type"] in THREAD_TYPES:
            msg["position"] = channel["total_message_sent"]
            channel["message_count"] += 1
            channel["total_message_sent"] += 1
        if reply_to is not None:
            msg["message_reference"] = {"type": 0, "channel_id": reply_to["channel_id"],
                                        "message_id": reply_to["id"],
                                        **({"guild_id": channel["guild_id"]} if channel.get("guild_id") else {})}
            msg["referenced_message"] = {k: v for k, v in reply_to.items() if k != "referenced_message"}
        channel["last_message_id"] = str(mid)
        self._msgs.setdefault(cid, {})[mid] = msg
        return msg

    def inject_message(self, channel_id: int, content: str = "", *, author: Any = None,
                       mentions: Iterable[Any] | None = None, attachments: Iterable[tuple] = (),
                       reply_to: int | None = None, reply_mention: bool = True,
                       mention_everyone: bool = False, embeds: list[dict] | None = None) -> dict:
        """A user writes in a channel (guild text, thread or DM): MESSAGE_CREATE goes to connected
        clients (filtered by their intents) and is kept for RESUME replay. Returns the message JSON
        (REST shape; ``int(msg["id"])`` is its id).

        ``author``: user id / user dict (default: ``default_user``; in a DM, the DM's recipient).
        ``mentions``: users (ids, dicts or "bot") mentioned; ``<@id>`` in ``content`` are found as
        well, as Discord does. ``attachments``: ``(filename, bytes)`` or ``(filename, bytes,
        content_type)``; served by the fake CDN. ``reply_to``: id of a message in this channel;
        with ``reply_mention`` its author is mentioned (Discord's default for replies).
        """
        channel = self._channels.get(int(channel_id))
        if channel is None:
            raise KeyError(f"fake Discord: unknown channel {channel_id}; add_channel/add_thread/add_dm first")
        if author is None:
            author = channel["recipients"][0] if channel["type"] == DM else self.default_user
        user = self._user_ref(author)
        if guild := self._guild_of(channel):
            guild["members"].setdefault(int(user["id"]), time.time())
        found = self._mentions_in(content)
        ids = {m["id"] for m in found}
        replied = None
        if reply_to is not None:
            replied = self.message(channel["id"], reply_to)
            if replied is None:
                raise KeyError(f"fake Discord: no message {reply_to} in channel {channel_id}")
            if reply_mention and replied["author"]["id"] not in ids:
                found.append(copy.deepcopy(replied["author"]))
                ids.add(replied["author"]["id"])
        for who in mentions or ():
            u = self._user_ref(who)
            if u["id"] not in ids:
                found.append(copy.deepcopy(u))
                ids.add(u["id"])
        files = []
        for item in attachments:
            filename, data, *rest = item
            stored = self._store_file(int(channel["id"]), filename, data, rest[0] if rest else None)
            if rest:
                stored.content_type = rest[0]
            files.append(stored)
        msg = self._new_message(channel, user, content, attachments=files, mentions=found, reply_to=replied,
                                embeds=embeds, mention_everyone=mention_everyone)
        self._dispatch_message("MESSAGE_CREATE", channel, msg)
        self._notify()
        return copy.deepcopy(msg)

    def inject_edit(self, channel_id: int, message_id: int, content: str) -> dict:
        """A user edits their message: MESSAGE_UPDATE. Returns the updated message JSON."""
        msg = self._msgs[int(channel_id)][int(message_id)]
        msg.update(content=content, edited_timestamp=iso(), mentions=self._mentions_in(content))
        self._dispatch_message("MESSAGE_UPDATE", self._channels[int(channel_id)], msg)
        self._notify()
        return copy.deepcopy(msg)

    def inject_delete(self, channel_id: int, message_id: int) -> None:
        """A user deletes a message: MESSAGE_DELETE."""
        channel = self._channels[int(channel_id)]
        self._msgs[int(channel_id)].pop(int(message_id))
        self._dispatch_delete(channel, int(message_id))
        self._notify()

    def redeliver(self, channel_id: int, message_id: int) -> dict:
        """Dispatch MESSAGE_CREATE for an existing message again (same id), as Discord sometimes does."""
        msg = self._msgs[int(channel_id)][int(message_id)]
        self._dispatch_message("MESSAGE_CREATE", self._channels[int(channel_id)], msg)
        self._notify()
        return copy.deepcopy(msg)

    def _dispatch_message(self, event: str, channel: dict, msg: dict) -> None:
        guild = self._guild_of(channel)
        data = copy.deepcopy(msg)
        if guild is not None:
            data["guild_id"] = str(guild["id"])
            data["member"] = self._member_json(guild, int(msg["author"]["id"]), with_user=False)
            for m in data["mentions"]:
                if int(m["id"]) in guild["members"]:
                    m["member"] = self._member_json(guild, int(m["id"]), with_user=False)
            intent = INTENT_GUILD_MESSAGES
        else:
            intent = INTENT_DIRECT_MESSAGES
        self._broadcast(event, data, guild_id=guild["id"] if guild else None, intent=intent, message=msg)

    def _dispatch_delete(self, channel: dict, message_id: int) -> None:
        guild = self._guild_of(channel)
        data = {"id": str(message_id), "channel_id": channel["id"]}
        if guild is not None:
            data["guild_id"] = str(guild["id"])
        self._broadcast("MESSAGE_DELETE", data, guild_id=guild["id"] if guild else None,
                        intent=INTENT_GUILD_MESSAGES if guild else INTENT_DIRECT_MESSAGES)

    # ------------------------------------------------------------------ scripted trouble
    def rate_limit_next(self, route: str = "*", retry_after: float = 0.5, *, global_: bool = False,
                        times: int = 1, channel_id: int | None = None, via: bool = True,
                        scope: str | None = None) -> None:
        """The next ``times`` requests to ``route`` answer 429 with Discord's body
        ``{"message": "You are being rate limited.", "retry_after": ..., "global": ...}``, the
        ``X-RateLimit-*`` and ``Retry-After`` headers, and ``Via: 1.1 google``. ``via=False`` leaves
        ``Via`` out and answers text/html, like a Cloudflare ban (discord.py raises at once).
        ``route``: "*", an alias (``ROUTE_ALIASES``) or "METHOD /path/{template}"."""
        self._failures.append(Failure(normalize_route(route), times, channel_id, "ratelimit",
                                      retry_after=retry_after, global_=global_, via=via,
                                      scope=scope or ("global" if global_ else "user")))

    def rate_limit_window(self, channel_id: int, seconds: float,
                          routes: tuple[str, ...] = ("send_message", "edit_message", "typing")
                          ) -> None:
        """For the next ``seconds``, every request to these routes in this channel answers a
        per-route 429 whose ``retry_after`` is the time left (like a channel's exhausted
        bucket); other channels are not affected."""
        until = time.monotonic() + seconds
        for route in routes:
            self._windows[(normalize_route(route), int(channel_id))] = until

    def global_rate_limit(self, seconds: float) -> None:
        """Every request for the next ``seconds`` answers a global 429 (retry_after = time left)."""
        self._global_until = time.monotonic() + seconds

    def fail_next(self, route: str = "*", status: int = 500, code: int = 0, message: str | None = None, *,
                  times: int = 1, channel_id: int | None = None, errors: dict | None = None) -> None:
        """The next ``times`` requests to ``route`` answer ``status`` with ``{"message", "code"}``.
        E.g. ``fail_next("send_message", 403, 50013)`` (Missing Permissions), ``(…, 403, 50007)``
        (Cannot send messages to this user). discord.py retries 500/502/504 by itself (after 1 s, 3 s…)."""
        self._failures.append(Failure(normalize_route(route), times, channel_id, "error",
                                      error=ApiError(status, code, message, errors)))

    def drop_next(self, route: str = "*", *, times: int = 1, channel_id: int | None = None) -> None:
        """The next ``times`` requests to ``route`` get no answer: the connection is cut."""
        self._failures.append(Failure(normalize_route(route), times, channel_id, "drop"))

    def set_bucket(self, route: str, limit: int, per: float = 1.0) -> None:
        """A real rate limit: ``limit`` requests per ``per`` seconds per channel on ``route``, announced
        in ``X-RateLimit-*`` headers (discord.py then waits by itself) and enforced with 429s."""
        key = normalize_route(route)
        self._buckets[key] = Bucket(key, limit, per)

    def forbid(self, channel_id: int, code: int = 50013) -> None:
        """Until ``allow``: sending to this channel answers 403 (50013 Missing Permissions; 50007 for a
        DM whose user blocked the bot / closed DMs; 50001 Missing Access)."""
        self._forbidden[int(channel_id)] = code

    def allow(self, channel_id: int) -> None:
        self._forbidden.pop(int(channel_id), None)

    def set_latency(self, seconds: float, route: str = "*") -> None:
        """Delay every answer to ``route`` (all routes by default) by ``seconds``."""
        self._latency[normalize_route(route)] = seconds

    def _take_failure(self, route: str, channel_id: int | None) -> Failure | None:
        for failure in self._failures:
            if failure.matches(route, channel_id):
                failure.times -= 1
                return failure
        return None

    # ------------------------------------------------------------------ reading what happened
    def messages(self, channel_id: int | None = None, *, include_deleted: bool = True) -> list[Sent]:
        """Messages the bot created (oldest first), optionally in one channel."""
        return [s for s in self.sent if (channel_id is None or s.channel_id == int(channel_id))
                and (include_deleted or not s.deleted)]

    def sent_message(self, message_id: int) -> Sent:
        return self._sent_by_id[int(message_id)]

    def calls_to(self, route: str) -> list[Call]:
        key = normalize_route(route)
        return [c for c in self.calls if key in ("*", c.route)]

    def typing_in(self, channel_id: int) -> list[Typing]:
        return [t for t in self.typing if t.channel_id == int(channel_id)]

    def history(self, channel_id: int) -> list[dict]:
        """Every message in the channel now (users' and the bot's), oldest first, REST JSON."""
        return [copy.deepcopy(m) for _, m in sorted(self._msgs.get(int(channel_id), {}).items())]

    async def wait_for_messages(self, channel_id: int, n: int = 1, timeout: float = 5.0) -> list[Sent]:
        """Wait until the bot has created at least ``n`` messages in ``channel_id``; returns them all."""
        try:
            return await self.wait_until(lambda: len(m := self.messages(channel_id)) >= n and m, timeout)
        except TimeoutError:
            got = [s.content for s in self.messages(channel_id)]
            raise TimeoutError(f"fake Discord: expected {n} message(s) in channel {channel_id} within "
                               f"{timeout}s, got {len(got)}: {got!r}") from None

    async def wait_for_identifies(self, n: int = 1, timeout: float = 5.0) -> list[Identify]:
        """Wait until ``n`` IDENTIFYs were accepted."""
        return await self.wait_until(lambda: len(i := [x for x in self.identifies if x.accepted]) >= n and i,
                                     timeout, f"{n} accepted IDENTIFY(s)")

    async def wait_for_resumes(self, n: int = 1, timeout: float = 5.0) -> list[Resume]:
        """Wait until ``n`` RESUMEs were accepted (missed events replayed, RESUMED sent)."""
        return await self.wait_until(lambda: len(r := [x for x in self.resumes if x.accepted]) >= n and r,
                                     timeout, f"{n} accepted RESUME(s)")
