"""State, records, errors and the test-control API of the fake Telegram Bot API.

``Controls`` is the half of ``FakeTelegram`` (telegram_server.py) that tests call directly, on the
same event loop as the server: inject what users do, script failures, read what the bot did, wait.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import math
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.changes import Changes

DEFAULT_DESCRIPTIONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    404: "Not Found",
    409: "Conflict",
    500: "Internal Server Error",
    502: "Bad Gateway",
}
# Update types NOT delivered when allowed_updates is empty/unset (the Bot API default).
NOT_DEFAULT_UPDATES = {"chat_member", "message_reaction", "message_reaction_count"}
CHAT_ACTIONS = {
    "typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
    "upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note",
}
MAX_TEXT = 4096      # code points after entity parsing (tdlib: utf8_length(text) > 4096 for bots)
MAX_CAPTION = 1024
MAX_CALLBACK_DATA = 64  # bytes
CALLBACK_WINDOW = 10.0  # seconds a client waits for answerCallbackQuery before it shows an error
QUERY_TOO_OLD = "query is too old and response timeout expired or query ID is invalid"


class ApiError(Exception):
    """A Bot API error: answered as {"ok": false, "error_code": code, "description": ...}."""

    def __init__(self, code: int, description: str | None = None, parameters: dict | None = None):
        self.code = code
        self.description = description or DEFAULT_DESCRIPTIONS.get(code, "Error")
        self.parameters = parameters
        super().__init__(f"{code} {self.description}")

    @classmethod
    def too_many(cls, retry_after: int) -> "ApiError":
        return cls(429, f"Too Many Requests: retry after {retry_after}", {"retry_after": retry_after})

    def body(self) -> dict:
        out: dict[str, Any] = {"ok": False, "error_code": self.code, "description": self.description}
        if self.parameters:
            out["parameters"] = self.parameters
        return out


def bad(description: str) -> ApiError:
    return ApiError(400, "Bad Request: " + description)


def check_markup(markup: Any) -> None:
    """An inline keyboard as the Bot API checks it: rows of buttons with a text and exactly one
    action; ``callback_data`` 1-64 bytes (else BUTTON_DATA_INVALID)."""
    if markup is None or not isinstance(markup, dict) or "inline_keyboard" not in markup:
        return
    rows = markup["inline_keyboard"]
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise bad("can't parse inline keyboard button: InlineKeyboardMarkup must be an array of "
                  "button rows")
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not str(button.get("text") or ""):
                raise bad("can't parse inline keyboard button: Text buttons are unallowed in the "
                          "inline keyboard")
            data = button.get("callback_data")
            if data is not None:
                if not isinstance(data, str) or not 1 <= len(data.encode()) <= MAX_CALLBACK_DATA:
                    raise bad("BUTTON_DATA_INVALID")
            elif not any(k in button for k in ("url", "switch_inline_query", "web_app",
                                                "login_url", "pay", "copy_text")):
                raise bad("can't parse inline keyboard button: InlineKeyboardButton must have "
                          "exactly one optional field")


@dataclass
class Callback:
    """A callback query (a button pressed) and how the bot answered it."""
    id: str
    chat_id: int
    message_id: int
    user_id: int
    data: str
    time: float = field(default_factory=time.monotonic)
    answered: float | None = None   # when (monotonic), None while unanswered
    text: str | None = None
    show_alert: bool = False


@dataclass
class Upload:
    """One file part of a multipart request."""
    field: str
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass
class StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes
    file_name: str | None = None
    mime_type: str | None = None


@dataclass
class Sent:
    """A message the bot sent, or an edit it made (kind "edit")."""
    kind: str                      # "message" | "photo" | "document" | "edit"
    chat_id: int
    message_id: int
    text: str | None               # plain text (caption for media) after entity parsing
    raw_text: str | None           # as the bot sent it (HTML/Markdown source)
    parse_mode: str | None
    entities: list[dict] = field(default_factory=list)
    time: float = field(default_factory=time.monotonic)
    reply_to_message_id: int | None = None
    message_thread_id: int | None = None
    reply_markup: dict | None = None
    file_bytes: bytes | None = None
    file_name: str | None = None
    mime_type: str | None = None


@dataclass
class Call:
    """One Bot API request as the fake received it."""
    method: str
    params: dict
    files: dict[str, Upload]
    time: float = field(default_factory=time.monotonic)
    status: int = 0
    result: Any = None
    description: str | None = None


@dataclass
class Queued:
    """An update waiting in the bot's queue until getUpdates confirms it (or the webhook takes it)."""
    update: dict
    forced: bool = False           # a redelivery: survives the offset until it was handed out once
    delivered: bool = False


@dataclass
class Failure:
    """A scripted failure for the next ``times`` calls of ``method`` ("*" = any method)."""
    method: str
    times: int
    error: ApiError | None         # None: drop the connection without an answer


class Described:
    """A result answered with a "description" next to it (setWebhook: "Webhook was set")."""

    def __init__(self, result: Any, description: str):
        self.result, self.description = result, description


# ---------------------------------------------------------------- request parameters
_JSON_PARAMS = {"reply_parameters", "reply_markup", "entities", "caption_entities", "allowed_updates",
                "commands", "link_preview_options", "scope", "media"}
_INT_PARAMS = {"offset", "limit", "timeout", "message_id", "message_thread_id", "reply_to_message_id",
               "max_connections", "cache_time", "user_id"}
_BOOL_PARAMS = {"disable_notification", "protect_content", "allow_sending_without_reply",
                "drop_pending_updates", "show_alert", "disable_web_page_preview",
                "disable_content_type_detection", "has_spoiler", "show_caption_above_media"}


def coerce_param(name: str, value: Any) -> Any:
    """Form values are strings; typed values arrive as JSON inside the form (as PTB sends them)."""
    if not isinstance(value, str):
        return value
    try:
        if name in _JSON_PARAMS:
            return json.loads(value)
        if name in _INT_PARAMS:
            return int(value)
    except ValueError:
        raise bad(f"can't parse {name} JSON object" if name in _JSON_PARAMS else f"invalid {name} specified")
    if name in ("chat_id", "from_chat_id") and value.lstrip("-").isdigit():
        return int(value)
    if name in _BOOL_PARAMS:
        return value.lower() in ("true", "1")
    return value


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, GIF, JPEG or WebP image; None if it is not one."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return (1, 1)
    if data.startswith(b"\xff\xd8"):
        i = 2
        while i + 9 < len(data) and data[i] == 0xFF:
            marker, seglen = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5:i + 9])
                return (w, h)
            i += 2 + seglen
        return (1, 1)
    return None


class Controls(Changes):
    """Platform state plus the Python API tests use (the HTTP side lives in FakeTelegram)."""

    FAKE = "Telegram"

    def __init__(self, token: str, bot_username: str, bot_name: str) -> None:
        self.token = token
        self.bot_user = {"id": int(token.split(":")[0]), "is_bot": True, "first_name": bot_name,
                         "username": bot_username}
        # what the bot did, for assertions
        self.sent: list[Sent] = []                  # every message sent and every edit, in order
        self.calls: list[Call] = []                 # every Bot API request (after token/method checks)
        self.deleted: list[tuple[int, int]] = []    # (chat_id, message_id)
        self.chat_actions: list[tuple[int, str]] = []
        self.callback_answers: list[dict] = []
        self.callback_window = CALLBACK_WINDOW
        self._callbacks: dict[str, Callback] = {}
        self.markup_edits: list[tuple[int, int, dict | None]] = []  # editMessageReplyMarkup
        self.commands: list[dict] = []
        self.webhook_deliveries: list[dict] = []    # {update_id, url, status, error, time}
        # platform state
        self._chats: dict[int, dict] = {}
        self._msgs: dict[tuple[int, int], dict] = {}
        self._last_id: dict[int, int] = {}
        self._files: dict[str, StoredFile] = {}
        self._files_by_path: dict[str, StoredFile] = {}
        self._queue: list[Queued] = []
        self._updates: dict[int, dict] = {}
        self._update_ids = itertools.count(700_000_001)
        self._file_seq = itertools.count(1)
        self._allowed_updates: list[str] = []
        self._webhook: dict | None = None
        self._webhook_error: tuple[int, str] | None = None
        self._poll_gen = 0
        self._blocked: set[int] = set()
        self._failures: list[Failure] = []
        self._latency: dict[str, float] = {}
        self._flood: dict[int, list[float]] = {}
        self._closing = False
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ change notification
    # ------------------------------------------------------------------ chats, files, updates
    def add_chat(self, chat_id: int, *, chat_type: str | None = None, title: str | None = None,
                 username: str | None = None, first_name: str | None = None, is_forum: bool = False) -> dict:
        """Make a chat known (a user who started the bot, a group it is in). Returns the Chat JSON."""
        if chat_id in self._chats:
            return self._chats[chat_id]
        kind = chat_type or ("private" if chat_id > 0 else
                             "supergroup" if str(chat_id).startswith("-100") else "group")
        chat: dict[str, Any] = {"id": chat_id, "type": kind}
        if kind == "private":
            chat["first_name"] = first_name or "Alice"
        else:
            chat["title"] = title or f"Group {chat_id}"
        if username:
            chat["username"] = username
        if is_forum:
            chat["is_forum"] = True
        self._chats[chat_id] = chat
        return chat

    def set_blocked(self, chat_id: int, blocked: bool = True) -> None:
        """Sends to this chat answer 403 (blocked by the user / kicked from the group)."""
        (self._blocked.add if blocked else self._blocked.discard)(chat_id)

    def add_file(self, data: bytes, *, file_name: str | None = None, mime_type: str | None = None,
                 folder: str = "documents") -> StoredFile:
        """Store bytes as a Telegram file (getFile + download serve them)."""
        n = next(self._file_seq)
        if file_name and "." in file_name:
            ext = file_name.rpartition(".")[2]
        else:
            ext = "jpg" if folder == "photos" else "bin"
        stored = StoredFile(f"BQACAgIAAxkBAAI{n:06d}fake", f"AgAD{n:06d}", f"{folder}/file_{n}.{ext}",
                            bytes(data), file_name, mime_type)
        self._files[stored.file_id] = stored
        self._files_by_path[stored.file_path] = stored
        return stored

    def file_bytes(self, file_id: str) -> bytes:
        return self._files[file_id].data

    def _next_message_id(self, chat_id: int) -> int:
        self._last_id[chat_id] = self._last_id.get(chat_id, 0) + 1
        return self._last_id[chat_id]

    def inject_update(self, update: dict) -> dict:
        """Queue a raw Update (``update_id`` is assigned when missing). Returns it."""
        update = copy.deepcopy(update)              # later edits must not change what was queued
        update.setdefault("update_id", next(self._update_ids))
        self._updates[update["update_id"]] = update
        kind = next(k for k in update if k != "update_id")
        allowed = set(self._allowed_updates) if self._allowed_updates else None
        if (kind in allowed) if allowed is not None else (kind not in NOT_DEFAULT_UPDATES):
            if self._reaches_bot(update.get(kind)):
                self._queue.append(Queued(update))
        self._notify()
        return update

    def _reaches_bot(self, msg: Any) -> bool:
        """Privacy mode: in groups only commands, @mentions of the bot and replies to it arrive."""
        if not getattr(self, "privacy_mode", False) or not isinstance(msg, dict) or "chat" not in msg:
            return True
        if msg["chat"]["type"] == "private":
            return True
        text = msg.get("text") or msg.get("caption") or ""
        name = self.bot_user["username"].lower()
        command = re.match(r"^/\w+(@\w+)?", text)
        if command and (command.group(1) is None or command.group(1)[1:].lower() == name):
            return True
        replied = msg.get("reply_to_message") or {}
        return f"@{name}" in text.lower() or replied.get("from", {}).get("id") == self.bot_user["id"]

    def redeliver(self, update_id: int) -> dict:
        """Telegram delivers the same update (same update_id) again, even if it was confirmed."""
        update = self._updates[update_id]
        self._queue.append(Queued(update, forced=True))
        self._notify()
        return update

    def inject_message(self, chat_id: int, text: str | None = None, *, user_id: int | None = None,
                       username: str | None = None, first_name: str = "Alice", chat_type: str | None = None,
                       chat_title: str | None = None, entities: list[dict] | None = None,
                       reply_to_message_id: int | None = None, message_thread_id: int | None = None,
                       document: bytes | None = None, file_name: str = "file.bin", mime_type: str | None = None,
                       photo: bytes | None = None, caption: str | None = None,
                       voice: bytes | None = None, duration: int = 1) -> dict:
        """A user writes to the bot. Returns the Update; ``update["message"]["message_id"]`` is its id.

        Private chats have positive ids (chat id == user id); groups negative (``-100...`` = supergroup).
        ``entities`` default to what Telegram detects (bot_command, mention, hashtag, url).
        """
        from .telegram_markup import detect_entities

        chat = self.add_chat(chat_id, chat_type=chat_type, title=chat_title, first_name=first_name)
        uid = user_id if user_id is not None else (chat_id if chat["type"] == "private" else 10_001)
        user = {"id": uid, "is_bot": False, "first_name": first_name, "username": username or f"user{uid}",
                "language_code": "en"}
        msg: dict[str, Any] = {"message_id": self._next_message_id(chat_id), "from": user, "chat": chat,
                               "date": int(time.time())}
        if message_thread_id is not None:
            msg.update(message_thread_id=message_thread_id, is_topic_message=bool(chat.get("is_forum")))
        if reply_to_message_id is not None:
            replied = self._msgs[(chat_id, reply_to_message_id)]
            msg["reply_to_message"] = {k: v for k, v in replied.items() if k != "reply_to_message"}
        media = document is not None or photo is not None or voice is not None
        body, key = (caption, "caption_entities") if media else (text, "entities")
        if body is not None:
            msg["text" if key == "entities" else "caption"] = body
            found = detect_entities(body) if entities is None else entities
            if found:
                msg[key] = found
        if document is not None:
            stored = self.add_file(document, file_name=file_name, mime_type=mime_type)
            msg["document"] = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                               "file_name": file_name, "file_size": len(document),
                               **({"mime_type": mime_type} if mime_type else {})}
        if photo is not None:
            stored = self.add_file(photo, folder="photos")
            w, h = image_size(photo) or (1, 1)
            msg["photo"] = [{"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                             "width": w, "height": h, "file_size": len(photo)}]
        if voice is not None:  # a voice note: OGG/Opus, its duration as the client measured it
            stored = self.add_file(voice, file_name="voice.oga", mime_type="audio/ogg", folder="voice")
            msg["voice"] = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                            "duration": duration, "mime_type": "audio/ogg", "file_size": len(voice)}
        self._msgs[(chat_id, msg["message_id"])] = msg
        return self.inject_update({"message": msg})

    def inject_edit(self, chat_id: int, message_id: int, text: str) -> dict:
        """The user edits an earlier message (an ``edited_message`` update)."""
        from .telegram_markup import detect_entities

        msg = {**self._msgs[(chat_id, message_id)], "text": text, "edit_date": int(time.time())}
        msg.pop("entities", None)
        if found := detect_entities(text):
            msg["entities"] = found
        self._msgs[(chat_id, message_id)] = msg
        return self.inject_update({"edited_message": msg})

    def inject_callback_query(self, chat_id: int, message_id: int, data: str, *,
                              user_id: int | None = None, first_name: str = "Alice",
                              query_id: str | None = None) -> dict:
        """The user presses an inline button under the bot's message (``data``: its
        callback_data, or anything a forged client sends). ``query_id`` repeats an earlier
        query's id (a redelivered update carries the same query)."""
        uid = user_id if user_id is not None else (chat_id if chat_id > 0 else 10_001)
        qid = query_id or str(next(self._update_ids) * 1_000_003)
        query = {"id": qid, "chat_instance": str(chat_id), "data": data,
                 "from": {"id": uid, "is_bot": False, "first_name": first_name,
                          "username": f"user{uid}"},
                 "message": self._msgs[(chat_id, message_id)]}
        self._callbacks.setdefault(qid, Callback(qid, chat_id, message_id, uid, data))
        return self.inject_update({"callback_query": query})

    def buttons(self, chat_id: int, message_id: int, *, as_sent: bool = False) -> list[tuple[str, str]]:
        """(text, callback_data) of the inline buttons under a message now (or as first sent)."""
        if as_sent:
            sent = next((s for s in self.sent if (s.chat_id, s.message_id) == (chat_id, message_id)
                         and s.kind != "edit"), None)
            markup = sent.reply_markup if sent is not None else None
        else:
            markup = (self.message(chat_id, message_id) or {}).get("reply_markup")
        rows = (markup or {}).get("inline_keyboard") or []
        return [(b["text"], b.get("callback_data", "")) for row in rows for b in row]

    async def click(self, chat_id: int, message_id: int, label: str, *, user_id: int | None = None,
                    timeout: float = 10.0) -> Callback:
        """Press the button ``label`` (on the message as it is now, or as it was sent: a client
        still showing it) and wait until the bot answered the query."""
        found = dict(self.buttons(chat_id, message_id))
        found = found if label in found else dict(self.buttons(chat_id, message_id, as_sent=True))
        if label not in found:
            raise AssertionError(f"fake Telegram: no button {label!r} under message {message_id}")
        update = self.inject_callback_query(chat_id, message_id, found[label], user_id=user_id)
        return await self.wait_answered(update["callback_query"]["id"], timeout)

    async def wait_answered(self, query_id: str, timeout: float = 10.0) -> Callback:
        query = self._callbacks[query_id]
        await self.wait_until(lambda: query.answered is not None, timeout,
                              f"callback query {query_id} to be answered")
        return query

    def callback(self, query_id: str) -> Callback:
        return self._callbacks[query_id]

    @property
    def callbacks(self) -> list[Callback]:
        return list(self._callbacks.values())

    @property
    def callback_failures(self) -> list[str]:
        """Callback queries answered late or never within the window (the user saw an error)."""
        now = time.monotonic()
        out = []
        for q in self._callbacks.values():
            waited = (q.answered if q.answered is not None else now) - q.time
            if waited > self.callback_window:
                out.append(f"callback {q.id} ({q.data!r}) "
                           f"{'answered after' if q.answered else 'unanswered for'} {waited:.1f}s")
        return out

    def notes_for(self, user_id: int) -> list[str]:
        """What the bot showed this user alone: its answers (toasts, alerts) to their presses."""
        return [q.text for q in sorted(self._callbacks.values(), key=lambda q: q.answered or 0)
                if q.user_id == user_id and q.answered is not None and q.text]

    # ------------------------------------------------------------------ scripted trouble
    def fail_next(self, method: str, times: int = 1, *, error_code: int = 500, description: str | None = None,
                  retry_after: int | None = None) -> None:
        """The next ``times`` calls of ``method`` ("*" = any) answer this error instead.

        429 carries ``parameters.retry_after`` (default 1) and "Too Many Requests: retry after N".
        """
        if error_code == 429:
            error = ApiError.too_many(retry_after or 1)
            if description:
                error.description = description
        else:
            params = {"retry_after": retry_after} if retry_after else None
            error = ApiError(error_code, description, params)
        self._failures.append(Failure(method.lower(), times, error))

    def drop_next(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` get no answer: the connection is cut."""
        self._failures.append(Failure(method.lower(), times, None))

    def _take_failure(self, method: str, call: Call) -> bool:
        """Raise the scripted error for this call; True means: drop the connection."""
        for failure in self._failures:
            if failure.times > 0 and failure.method in ("*", method.lower()):
                failure.times -= 1
                if failure.error is None:
                    call.status = 0
                    return True
                raise failure.error
        return False

    def set_latency(self, seconds: float, method: str | None = None) -> None:
        """Delay every answer (or those of one method) by ``seconds``."""
        self._latency[(method or "*").lower()] = seconds

    def set_flood_limit(self, per_second: int | None, retry_after: int = 1) -> None:
        """More than ``per_second`` sends/edits to one chat within a second answer 429."""
        self.flood_limit, self.flood_retry_after = per_second, retry_after

    # ------------------------------------------------------------------ reading what happened
    def _record(self, kind: str, msg: dict, p: dict, text: str, entities: list[dict], *, raw: str | None,
                stored: StoredFile | None = None) -> None:
        reply = p.get("reply_parameters") or {}
        self.sent.append(Sent(
            kind, msg["chat"]["id"], msg["message_id"], text, raw, p.get("parse_mode"), entities,
            reply_to_message_id=(msg.get("reply_to_message") or {}).get("message_id",
                                                                       reply.get("message_id")),
            message_thread_id=p.get("message_thread_id"), reply_markup=p.get("reply_markup"),
            file_bytes=stored.data if stored else None, file_name=stored.file_name if stored else None,
            mime_type=stored.mime_type if stored else None))

    def messages(self, chat_id: int | None = None) -> list[Sent]:
        """New messages the bot sent (text, photo, document), oldest first; edits excluded."""
        return [s for s in self.sent if s.kind != "edit" and chat_id in (None, s.chat_id)]

    def last_change(self, chat_id: int, message_id: int) -> float:
        """When the message was last sent or edited (time.monotonic(); -inf if never)."""
        return max((s.time for s in self.sent
                    if s.chat_id == chat_id and s.message_id == message_id), default=-math.inf)

    def edits(self, chat_id: int | None = None) -> list[Sent]:
        return [s for s in self.sent if s.kind == "edit" and chat_id in (None, s.chat_id)]

    def message(self, chat_id: int, message_id: int) -> dict | None:
        """The message as it is now (after edits) as Telegram JSON; None if deleted or unknown."""
        return self._msgs.get((chat_id, message_id))

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method.lower() == method.lower()]

    @property
    def pending_updates(self) -> list[dict]:
        """Updates not yet confirmed by getUpdates (or not yet accepted by the webhook)."""
        return [q.update for q in self._queue]

    @property
    def webhook_url(self) -> str | None:
        return self._webhook["url"] if self._webhook else None

    async def wait_for_messages(self, chat_id: int, n: int = 1, timeout: float = 5.0) -> list[Sent]:
        """Wait until the bot has sent at least ``n`` new messages to ``chat_id``; returns them all."""
        try:
            return await self.wait_until(lambda: len(m := self.messages(chat_id)) >= n and m, timeout)
        except TimeoutError:
            got = [s.text for s in self.messages(chat_id)]
            raise TimeoutError(f"fake Telegram: expected {n} message(s) in chat {chat_id} within "
                               f"{timeout}s, got {len(got)}: {got!r}") from None

    async def wait_for_calls(self, method: str, n: int = 1, timeout: float = 5.0, *,
                             answered: bool = True) -> list[Call]:
        """Wait until ``method`` was called at least ``n`` times (and answered, unless answered=False:
        a long poll in progress is received but not answered)."""
        def done() -> list[Call]:
            calls = [c for c in self.calls_to(method) if c.status or not answered]
            return calls if len(calls) >= n else []
        return await self.wait_until(done, timeout, f"{n} {method} call(s)")

    async def wait_until_confirmed(self, timeout: float = 5.0) -> None:
        """Wait until every queued update was confirmed (offset) or accepted by the webhook."""
        await self.wait_until(lambda: not self._queue, timeout, "all updates to be confirmed")
