"""A fake Slack for tests: Web API, signed Events API posts and a Socket Mode websocket.

    async with FakeSlack() as fake:
        dm = fake.add_dm()                                   # the default user's DM with the bot
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        fake.events_url = "http://127.0.0.1:8080/slack/events"   # HTTP mode (else: Socket Mode)
        await fake.user_message(dm["id"], "hello")           # signed event_callback POSTed there
        posts = await fake.wait_for_posts(dm["id"], 1)       # what the app answered
        assert posts[0].text == "hi"

It behaves like Slack where an app can tell:

- Web API ``POST /api/<method>`` (form, JSON or query parameters; token in ``Authorization: Bearer``
  or a ``token`` form/query field). Errors are HTTP 200 ``{"ok": false, "error": ...}``, including
  ``unknown_method`` (with ``req_method``), ``not_authed``, ``invalid_auth``, ``not_allowed_token_type``
  (the app-level ``xapp-`` token works only for ``apps.connections.open``, and only it does there);
  scripted 429 ``ratelimited`` carries ``Retry-After``.
- ``files.getUploadURLExternal`` → raw bytes (or multipart) POSTed without auth to ``/upload/v1/<id>``
  (answered ``text/plain`` "OK - <n>") → ``files.completeUploadExternal`` shares the file.
- ``url_private(_download)`` of files serves bytes to ``Authorization: Bearer <bot token>`` only;
  without it Slack redirects to its sign-in page (HTTP 200 HTML), and so does the fake.
- Events API: ``event_callback`` POSTs signed ``v0=HMAC-SHA256(secret, "v0:<ts>:<body>")``; an
  answer that is not 2xx within ``event_ack_timeout`` (3 s) is retried ``len(event_retry_delays)``
  times (Slack: at once, ~1 min, ~5 min; the fake: short), same ``event_id``, with
  ``X-Slack-Retry-Num`` / ``X-Slack-Retry-Reason``; ``X-Slack-No-Retry: 1`` on an error stops it.
- Socket Mode: ``apps.connections.open`` → ``ws://…/socket?ticket=…`` (single use); ``hello`` on
  connect; ``events_api`` envelopes must be acked (``{"envelope_id": …}``) within
  ``event_ack_timeout`` or are redelivered in a new envelope with ``retry_attempt`` + 1 and
  ``retry_reason: "timeout"``; ``socket_disconnect()`` sends ``{"type": "disconnect", …}``.
- The app's own messages come back as ``message`` events (``bot_id`` set) where it is subscribed
  (``message.im`` by default), as on Slack; ``echo_bot_messages=False`` turns that off.

Test controls, records and waits are in slack_state.py (``Controls``); button clicks
(``block_actions``), ephemeral messages and the 3 s ack deadline in slack_clicks.py.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from .slack_clicks import Interactivity, check_actions
from .slack_state import (DEFAULT_SUBSCRIPTIONS, MAX_TEXT, Ack, Attempt, Call, Controls, Delivery, Edit,
                          PendingFile, Posted, SlackError, Uploaded, UserMessage, check_blocks, mimetype_for,
                          slack_escape)

__all__ = ["FakeSlack", "SocketConnection", "sign", "BOT_TOKEN", "APP_TOKEN", "SIGNING_SECRET",
           "UserMessage", "Delivery", "slack_escape"]

BOT_TOKEN = "xoxb-1111111111-2222222222-FakePlutoBotToken0123"
APP_TOKEN = "xapp-1-A0PLUTOAPP-3333333333-fakeplutoapptoken0123456789abcdef"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
USER_AGENT = "Slackbot 1.0 (+https://api.slack.com/robots)"


def sign(secret: str, timestamp: int | str, body: str | bytes) -> str:
    """Slack's request signature: ``v0=`` + hex HMAC-SHA256(secret, "v0:<timestamp>:<body>")."""
    raw = body.decode() if isinstance(body, bytes) else body
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:{raw}".encode(), hashlib.sha256).hexdigest()
    return f"v0={digest}"


def _bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).lower() in ("1", "true", "yes")


def _json_param(p: dict, name: str, error: str) -> Any:
    """Structured arguments arrive as JSON in forms/queries and as JSON values in JSON bodies."""
    value = p.get(name)
    if isinstance(value, str):
        if value == "":
            return None
        try:
            return json.loads(value)
        except ValueError:
            raise SlackError(error)
    return value


@dataclass
class SocketConnection:
    """One Socket Mode websocket the app opened."""
    ticket: str
    ws: web.WebSocketResponse = field(repr=False)
    opened: float = field(default_factory=time.monotonic)
    closed: float | None = None
    sent: list[dict] = field(default_factory=list)       # every JSON message the fake sent on it

    @property
    def is_open(self) -> bool:
        return self.closed is None and not self.ws.closed


class FakeSlack(Interactivity, Controls):
    """One Slack workspace with one installed app. Use ``async with`` or ``start()`` / ``stop()``.

    ``event_ack_timeout``: seconds Slack waits for a 2xx / an ack (3 on Slack).
    ``event_retry_delays``: pause before each retry; its length is the number of retries (3 on Slack:
    at once, 1 min, 5 min).
    """

    def __init__(self, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN,
                 signing_secret: str = SIGNING_SECRET, team_id: str = "T0PLUTOTEAM", team_name: str = "Pluto Test",
                 team_domain: str = "pluto-test", bot_user_id: str = "U0PLUTOBOT", bot_id: str = "B0PLUTOBOT",
                 app_id: str = "A0PLUTOAPP", bot_name: str = "Pluto",
                 subscriptions: set[str] | frozenset[str] = DEFAULT_SUBSCRIPTIONS, echo_bot_messages: bool = True,
                 chat_write_public: bool = False, events_url: str | None = None, event_ack_timeout: float = 3.0,
                 event_retry_delays: tuple[float, ...] = (0.0, 0.2, 0.5)) -> None:
        super().__init__(bot_token=bot_token, app_token=app_token, signing_secret=signing_secret, team_id=team_id,
                         team_name=team_name, bot_user_id=bot_user_id, bot_id=bot_id, app_id=app_id,
                         bot_name=bot_name, subscriptions=subscriptions, echo_bot_messages=echo_bot_messages,
                         chat_write_public=chat_write_public)
        self.team_domain = team_domain
        self.events_url = events_url
        self.event_ack_timeout = event_ack_timeout
        self.event_retry_delays = tuple(event_retry_delays)
        self.socket_connections: list[SocketConnection] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self._tickets: dict[str, bool] = {}                 # ticket -> used
        self._envelopes: dict[str, tuple[Delivery, Attempt, asyncio.Future]] = {}
        self._rr = itertools.count()
        self._init_clicks()
        self._methods = {
            "api.test": self._m_api_test, "auth.test": self._m_auth_test,
            "chat.postMessage": self._m_chat_post_message, "chat.update": self._m_chat_update,
            "chat.delete": self._m_chat_delete, "conversations.info": self._m_conversations_info,
            "conversations.open": self._m_conversations_open, "conversations.history": self._m_conversations_history,
            "conversations.replies": self._m_conversations_replies, "users.info": self._m_users_info,
            "files.getUploadURLExternal": self._m_files_get_upload_url_external,
            "files.completeUploadExternal": self._m_files_complete_upload_external, "files.info": self._m_files_info,
            "apps.connections.open": self._m_apps_connections_open, "reactions.add": self._m_reactions_add,
            "chat.postEphemeral": self._m_chat_post_ephemeral,
        }

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:  # type: ignore[override]
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """For ``AsyncWebClient(base_url=...)`` (trailing slash included, as slack_sdk needs)."""
        return f"{self.url}/api/"

    async def start(self) -> "FakeSlack":
        app = web.Application(client_max_size=1024 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._handle_api)
        app.router.add_get("/api/{method}", self._handle_api)
        app.router.add_post("/upload/v1/{upload_id}", self._handle_upload)
        app.router.add_get("/files-pri/{team_file}/download/{name}", self._handle_file)
        app.router.add_get("/files-pri/{team_file}/{name}", self._handle_file)
        app.router.add_get("/socket", self._handle_socket)
        app.router.add_post("/actions/{key}", self._handle_response_url)
        app.router.add_get("/", self._handle_signin)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        self._closing = True
        self._notify()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self.socket_connections:
            if not conn.ws.closed:
                try:
                    await asyncio.wait_for(conn.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY), 1.0)
                except (asyncio.TimeoutError, ConnectionError, RuntimeError):
                    pass
        if self._session:
            await self._session.close()
        if self._runner:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeSlack":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ Web API
    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["method"]
        try:
            params = await self._read_params(request)
        except SlackError as exc:
            return web.json_response(exc.body(), status=exc.status)
        handler = self._methods.get(name)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method", "req_method": name})
        token = self._token(request, params)
        call = Call(name, params, token)
        self.calls.append(call)
        headers: dict[str, str] = {}
        try:
            if name != "api.test":
                self._check_token(name, token)
            delay = self._latency.get(name, self._latency.get("*", 0.0))
            if delay:
                await asyncio.sleep(delay)
            failure = self._take_failure(name)
            if failure is not None:
                if failure.error is None:
                    call.status = 0
                    assert request.transport is not None
                    request.transport.abort()
                    return web.Response(status=500)
                raise failure.error
            body = {"ok": True, **await handler(params)}
            status = 200
        except SlackError as exc:
            body, status, headers = exc.body(), exc.status, exc.headers
        except Exception as exc:  # a bug in the fake: answer, and keep the cause visible
            body, status = {"ok": False, "error": "fatal_error", "detail": f"fake failed: {exc!r}"}, 200
        call.status, call.response = status, body
        self._notify()
        return web.json_response(body, status=status, headers=headers)

    async def _read_params(self, request: web.Request) -> dict:
        params: dict[str, Any] = dict(request.query)
        if request.method != "POST" or not request.can_read_body:
            return params
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError:
                raise SlackError("invalid_json")
            if not isinstance(body, dict):
                raise SlackError("invalid_json")
            body.pop("token", None)           # Slack takes no token inside a JSON body
            params.update(body)
        else:
            form = await request.post()
            for key, value in form.items():
                params[key] = value if isinstance(value, str) else value.file.read()  # type: ignore[union-attr]
        return params

    @staticmethod
    def _token(request: web.Request, params: dict) -> str | None:
        auth = request.headers.get("Authorization", "")
        if auth:
            return auth[7:].strip() if auth.lower().startswith("bearer ") else auth
        token = params.pop("token", None)
        return token if isinstance(token, str) and token else None

    def _check_token(self, method: str, token: str | None) -> None:
        if not token:
            raise SlackError("not_authed")
        if token not in (self.bot_token, self.app_token):
            raise SlackError("invalid_auth")
        if (method == "apps.connections.open") != (token == self.app_token):
            raise SlackError("not_allowed_token_type")

    # ------------------------------------------------------------------ shared checks
    def _conversation(self, p: dict, key: str = "channel", *, posting: bool = False) -> str:
        ref = p.get(key)
        if not ref:
            raise SlackError("channel_not_found")
        channel_id = self._find_channel(ref)
        if channel_id is None:
            raise SlackError("channel_not_found")
        ch = self._channels[channel_id]
        member = self.bot_user_id in ch["members"]
        if not member and ch["kind"] != "channel":
            raise SlackError("channel_not_found")        # private conversations are invisible to outsiders
        if posting:
            if ch["archived"]:
                raise SlackError("is_archived")
            if not member and not self.chat_write_public:
                raise SlackError("not_in_channel")
        return channel_id

    def _text_and_blocks(self, p: dict, *, required: bool) -> tuple[str | None, list | None]:
        text = p.get("text")
        text = None if text is None else str(text)
        blocks = _json_param(p, "blocks", "invalid_blocks_format")
        attachments = _json_param(p, "attachments", "invalid_attachments")
        if blocks is not None:
            check_blocks(blocks)
            for i, block in enumerate(blocks):
                if block.get("type") == "actions":
                    check_actions(i, block)
        if required and not text and not blocks and not attachments:
            raise SlackError("no_text")
        if text is not None and len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        return text, blocks

    def _own_message(self, channel_id: str, ts: Any, cant: str) -> dict:
        msg = self._history.get(channel_id, {}).get(str(ts or ""))
        if msg is None:
            raise SlackError("message_not_found")
        if msg.get("bot_id") != self.bot_id:
            raise SlackError(cant)
        return msg

    def _echo(self, events: list[dict]) -> None:
        """Slack sends the app events for its own messages too, where it is subscribed."""
        if not self.echo_bot_messages or self._closing:
            return
        if not self.events_url and not any(c.is_open for c in self.socket_connections):
            return
        for event in events:
            self._spawn(self.send_event(event))

    # ------------------------------------------------------------------ methods
    async def _m_api_test(self, p: dict) -> dict:
        return {"args": {k: v for k, v in p.items() if isinstance(v, str)}}

    async def _m_auth_test(self, p: dict) -> dict:
        return {"url": f"https://{self.team_domain}.slack.com/", "team": self.team_name,
                "user": self._users[self.bot_user_id]["name"], "team_id": self.team_id,
                "user_id": self.bot_user_id, "bot_id": self.bot_id, "is_enterprise_install": False}

    async def _m_chat_post_message(self, p: dict) -> dict:
        channel_id = self._conversation(p, posting=True)
        text, blocks = self._text_and_blocks(p, required=True)
        thread_ts = str(p["thread_ts"]) if p.get("thread_ts") else None
        ts = self.next_ts()
        msg = self._store(channel_id, self._bot_message(text, blocks, ts, thread_ts))
        broadcast = _bool(p.get("reply_broadcast"), False)
        if broadcast and thread_ts:
            msg["subtype"] = "thread_broadcast"
        self.posted.append(Posted(channel_id, ts, msg.get("thread_ts"), text, blocks, _bool(p.get("mrkdwn"), True),
                                  broadcast, dict(p)))
        self._echo(self._message_events(channel_id, copy.deepcopy(msg), from_bot=True))
        return {"channel": channel_id, "ts": ts, "message": copy.deepcopy(msg)}

    async def _m_chat_update(self, p: dict) -> dict:
        channel_id = self._conversation(p)
        msg = self._own_message(channel_id, p.get("ts"), "cant_update_message")
        text, blocks = self._text_and_blocks(p, required=True)
        previous = copy.deepcopy(msg)
        if text is not None:
            msg["text"] = text
        if blocks is not None:           # absent: the blocks stay; [] removes them
            if blocks:
                msg["blocks"] = [dict(b, block_id=b.get("block_id") or uuid.uuid4().hex[:5]) for b in blocks]
            else:
                msg.pop("blocks", None)
        msg["edited"] = {"user": self.bot_user_id, "ts": self.next_ts()}
        self.updates.append(Edit(channel_id, msg["ts"], msg.get("text"), msg.get("blocks"), previous.get("text"),
                                 dict(p)))
        self._echo(self._change_events(channel_id, "message_changed", copy.deepcopy(msg), previous))
        out = {k: v for k, v in msg.items() if k not in ("reply_count", "reply_users", "reply_users_count",
                                                         "latest_reply", "ts", "type")}
        return {"channel": channel_id, "ts": msg["ts"], "text": msg.get("text", ""), "message": out}

    async def _m_chat_delete(self, p: dict) -> dict:
        channel_id = self._conversation(p)
        msg = self._own_message(channel_id, p.get("ts"), "cant_delete_message")
        del self._history[channel_id][msg["ts"]]
        self.deletes.append((channel_id, msg["ts"]))
        self._echo(self._change_events(channel_id, "message_deleted", {}, msg))
        return {"channel": channel_id, "ts": msg["ts"]}

    async def _m_conversations_info(self, p: dict) -> dict:
        return {"channel": self.channel_json(self._conversation(p))}

    async def _m_conversations_open(self, p: dict) -> dict:
        users = [u for u in str(p.get("users") or "").split(",") if u]
        if p.get("channel"):
            return {"channel": {"id": self._conversation(p)}}
        if len(users) != 1:
            raise SlackError("users_list_not_supplied" if not users else "not_enough_users")
        if users[0] not in self._users:
            raise SlackError("user_not_found")
        dm = self.add_dm(users[0])
        return {"no_op": True, "already_open": True, "channel": {"id": dm["id"]}}

    async def _m_conversations_history(self, p: dict) -> dict:
        channel_id = self._conversation(p)
        limit = int(p.get("limit") or 100)
        msgs = list(reversed(self.history(channel_id)))[:limit]
        return {"messages": msgs, "has_more": False, "pin_count": 0, "response_metadata": {"next_cursor": ""}}

    async def _m_conversations_replies(self, p: dict) -> dict:
        channel_id = self._conversation(p)
        ts = str(p.get("ts") or "")
        if ts not in self._history.get(channel_id, {}):
            raise SlackError("thread_not_found")
        parent = self._history[channel_id][ts]
        root = parent.get("thread_ts") or ts
        return {"messages": self.history(channel_id, root), "has_more": False,
                "response_metadata": {"next_cursor": ""}}

    async def _m_users_info(self, p: dict) -> dict:
        user = self._users.get(str(p.get("user") or ""))
        if user is None:
            raise SlackError("user_not_found")
        return {"user": copy.deepcopy(user)}

    async def _m_reactions_add(self, p: dict) -> dict:
        channel_id = self._conversation(p)
        ts, name = str(p.get("timestamp") or ""), str(p.get("name") or "").strip(":")
        msg = self._history.get(channel_id, {}).get(ts)
        if msg is None:
            raise SlackError("message_not_found")
        if not name:
            raise SlackError("invalid_name")
        for reaction in msg.setdefault("reactions", []):
            if reaction["name"] == name:
                if self.bot_user_id in reaction["users"]:
                    raise SlackError("already_reacted")
                reaction["users"].append(self.bot_user_id)
                reaction["count"] += 1
                break
        else:
            msg["reactions"].append({"name": name, "users": [self.bot_user_id], "count": 1})
        self.reactions.append((channel_id, ts, name))
        return {}

    async def _m_files_get_upload_url_external(self, p: dict) -> dict:
        filename = p.get("filename")
        try:
            length = int(p.get("length"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SlackError("invalid_arguments", extra={"response_metadata": {
                "messages": ["[ERROR] missing required field: length"]}})
        if not filename:
            raise SlackError("invalid_arguments", extra={"response_metadata": {
                "messages": ["[ERROR] missing required field: filename"]}})
        alt_txt = p.get("alt_txt") or None
        if alt_txt and len(alt_txt) > 1000:
            raise SlackError("alt_txt_too_large")
        file_id, upload_id = self._id("F"), uuid.uuid4().hex
        self._pending_files[upload_id] = PendingFile(file_id, upload_id, str(filename), length, alt_txt,
                                                     p.get("snippet_type") or None)
        return {"upload_url": f"{self.url}/upload/v1/{upload_id}", "file_id": file_id}

    async def _handle_upload(self, request: web.Request) -> web.StreamResponse:
        pending = self._pending_files.get(request.match_info["upload_id"])
        if pending is None or pending.completed:
            return web.Response(status=404, text="Not Found", content_type="text/plain")
        failure = self._take_failure("upload")
        if failure is not None:
            if failure.error is None:
                assert request.transport is not None
                request.transport.abort()
                return web.Response(status=500)
            return web.Response(status=failure.error.status if failure.error.status != 200 else 500,
                                text=failure.error.error, content_type="text/plain")
        if request.content_type == "multipart/form-data":
            data = b""
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if getattr(part, "filename", None) is not None or part.name in ("file", "filename"):
                    data = bytes(await part.read())  # type: ignore[union-attr]
        else:
            data = await request.read()
        pending.data = data
        self._notify()
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    async def _m_files_complete_upload_external(self, p: dict) -> dict:
        files = _json_param(p, "files", "invalid_arguments")
        if not isinstance(files, list) or not files or not all(isinstance(f, dict) and f.get("id") for f in files):
            raise SlackError("invalid_arguments")
        by_id = {pf.file_id: pf for pf in self._pending_files.values()}
        pendings = []
        for f in files:
            pf = by_id.get(str(f["id"]))
            if pf is None or pf.completed or pf.data is None:
                raise SlackError("file_not_found")
            pendings.append((pf, f))
        targets: list[str] = []
        refs = [p["channel_id"]] if p.get("channel_id") else [c for c in str(p.get("channels") or "").split(",") if c]
        for ref in refs:
            targets.append(self._conversation({"channel": ref}, posting=True))
        thread_ts = str(p["thread_ts"]) if p.get("thread_ts") else None
        if thread_ts and len(targets) != 1:
            raise SlackError("invalid_arguments")
        comment = p.get("initial_comment") or None
        out = []
        for pf, f in pendings:
            pf.completed = True
            mime, filetype, pretty = mimetype_for(pf.filename)
            title = f.get("title") or pf.filename
            obj = self._file_json(pf.file_id, pf.filename, title, mime, filetype, pretty, len(pf.data or b""),
                                  self.bot_user_id)
            obj.update(editable=True, display_as_bot=False)
            if pf.alt_txt:
                obj["alt_txt"] = pf.alt_txt
            self._files[pf.file_id] = obj
            self._file_bytes[pf.file_id] = pf.data or b""
            out.append(obj)
        for channel_id in targets:
            ts = self.next_ts()
            msg = self._bot_message(comment, None, ts, thread_ts)
            msg.update(files=[copy.deepcopy(o) for o in out], upload=True, display_as_bot=False)
            self._store(channel_id, msg)
            for pf, f in pendings:
                self._share_file(pf.file_id, channel_id, ts, msg.get("thread_ts"))
            self._echo(self._message_events(channel_id, copy.deepcopy(msg), from_bot=True))
        for pf, f in pendings:
            obj = self._files[pf.file_id]
            for channel_id in targets or [None]:  # type: ignore[list-item]
                self.uploads.append(Uploaded(pf.file_id, pf.data or b"", pf.filename, obj["title"], channel_id,
                                             thread_ts, comment, pf.alt_txt, pf.snippet_type))
        return {"files": [copy.deepcopy(self._files[pf.file_id]) for pf, _ in pendings]}

    async def _m_files_info(self, p: dict) -> dict:
        obj = self._files.get(str(p.get("file") or ""))
        if obj is None:
            raise SlackError("file_not_found")
        return {"file": copy.deepcopy(obj), "comments": [], "response_metadata": {"next_cursor": ""}}

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        team_file = request.match_info["team_file"]
        file_id = team_file.partition("-")[2]
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {self.bot_token}":
            # Slack: no/other token -> redirect to the sign-in page, which answers 200 HTML
            raise web.HTTPFound(f"/?redir={quote(request.path_qs)}")
        if file_id not in self._file_bytes:
            return web.Response(status=404, text="File not found", content_type="text/plain")
        obj = self._files[file_id]
        headers = {"Content-Disposition": f"attachment; filename=\"{obj['name']}\""}
        return web.Response(body=self._file_bytes[file_id], content_type=obj["mimetype"], headers=headers)

    async def _handle_signin(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="<!DOCTYPE html><html><head><title>Slack</title></head>"
                                 "<body>Sign in to your workspace</body></html>", content_type="text/html")

    async def _m_apps_connections_open(self, p: dict) -> dict:
        ticket = str(uuid.uuid4())
        self._tickets[ticket] = False
        return {"url": f"ws://127.0.0.1:{self.port}/socket?ticket={ticket}&app_id={self.app_id}"}

    # ------------------------------------------------------------------ Socket Mode
    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if self._tickets.get(ticket) is not False:
            return web.Response(status=401, text="invalid or used ticket")
        self._tickets[ticket] = True
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = SocketConnection(ticket, ws)
        self.socket_connections.append(conn)
        open_count = sum(1 for c in self.socket_connections if c.is_open)
        await self._ws_send(conn, {"type": "hello", "num_connections": open_count,
                                   "debug_info": {"host": "applink-fake-1", "build_number": 1,
                                                  "approximate_connection_time": 18060},
                                   "connection_info": {"app_id": self.app_id}})
        self._notify()
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self._on_socket_text(msg.data)
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    break
        finally:
            conn.closed = time.monotonic()
            self._notify()
        return ws

    async def _ws_send(self, conn: SocketConnection, message: dict) -> None:
        conn.sent.append(message)
        await conn.ws.send_str(json.dumps(message))

    def _on_socket_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            return
        if not isinstance(message, dict) or "envelope_id" not in message:
            return
        env_id = str(message["envelope_id"])
        entry = self._envelopes.pop(env_id, None)
        if entry is None:
            self.acks.append(Ack(env_id, None, message.get("payload"), late=False))
        else:
            delivery, attempt, waiter = entry
            late = waiter.done()
            self.acks.append(Ack(env_id, delivery.event_id, message.get("payload"), late=late))
            if not late:
                waiter.set_result(True)
        self._notify()

    def _open_connection(self) -> SocketConnection | None:
        live = [c for c in self.socket_connections if c.is_open]
        return live[next(self._rr) % len(live)] if live else None

    async def socket_disconnect(self, reason: str = "refresh_requested", *, close_after: float | None = None) -> int:
        """Send ``{"type": "disconnect", "reason": reason}`` on every open connection; close them
        ``close_after`` seconds later (default: 10 s for "warning", as Slack, else 1 s; the client
        usually closes first when it reconnects). Returns how many connections got it."""
        if close_after is None:
            close_after = 10.0 if reason == "warning" else 1.0
        conns = [c for c in self.socket_connections if c.is_open]
        for conn in conns:
            await self._ws_send(conn, {"type": "disconnect", "reason": reason,
                                       "debug_info": {"host": "applink-fake-1"}})
            self._spawn(self._close_later(conn, close_after))
        return len(conns)

    async def socket_close(self, code: int = aiohttp.WSCloseCode.GOING_AWAY) -> int:
        """Close every open Socket Mode connection abruptly (no disconnect message first)."""
        conns = [c for c in self.socket_connections if c.is_open]
        for conn in conns:
            await conn.ws.close(code=code)
        return len(conns)

    async def _close_later(self, conn: SocketConnection, delay: float) -> None:
        await asyncio.sleep(delay)
        if not conn.ws.closed:
            await conn.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)

    @property
    def open_sockets(self) -> list[SocketConnection]:
        return [c for c in self.socket_connections if c.is_open]

    async def wait_for_socket(self, n: int = 1, timeout: float = 5.0) -> SocketConnection:
        """Wait until at least ``n`` connections were opened in all (the ``n``-th got its hello) and
        one is open now; returns the newest open one."""
        def ready() -> SocketConnection | None:
            live = self.open_sockets
            return live[-1] if len(self.socket_connections) >= n and live else None
        return await self.wait_until(ready, timeout, f"{n} Socket Mode connection(s)")

    # ------------------------------------------------------------------ Events API delivery
    async def send_event(self, event: dict, *, via: str | None = None, url: str | None = None,  # type: ignore[override]
                         retries: bool = True, wait: bool = False, ack_timeout: float | None = None) -> Delivery:
        """Deliver an event as Slack does. ``event`` is an inner event (``{"type": "message", ...}``)
        or a whole payload (``event_callback``). ``via``: "http" (to ``url`` or ``events_url``) or
        "socket"; default: HTTP when ``events_url`` is set, else Socket Mode (an envelope waits for a
        connection). Retries follow ``event_retry_delays`` unless ``retries=False``. Returns the
        Delivery at once (``wait=True``: once Slack stopped trying; see ``Delivery.wait``)."""
        payload = event if event.get("type") in ("event_callback", "app_rate_limited") else self.event_callback(event)
        transport = via or ("http" if (url or self.events_url) else "socket")
        target = url or self.events_url
        if transport == "http" and not target:
            raise ValueError("fake Slack: no events_url for an HTTP delivery")
        delivery = Delivery(payload.get("event_id", ""), payload, transport, target if transport == "http" else None)
        self.deliveries.append(delivery)
        timeout = self.event_ack_timeout if ack_timeout is None else ack_timeout
        delays = self.event_retry_delays if retries else ()
        runner = self._deliver_http(delivery, timeout, delays) if transport == "http" else \
            self._deliver_socket(delivery, timeout, delays)
        task = self._spawn(runner)
        if wait:
            await asyncio.shield(task)
        return delivery

    def _finish(self, delivery: Delivery, acked: bool) -> None:
        delivery.acked, delivery.done, delivery.gave_up = acked, True, not acked
        delivery._finished.set()
        self._notify()

    def signed_headers(self, body: str | bytes, *, timestamp: int | None = None, secret: str | None = None) -> dict:
        """The headers Slack sends with an Events API POST of ``body``."""
        ts = int(time.time()) if timestamp is None else timestamp
        return {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                "X-Slack-Request-Timestamp": str(ts),
                "X-Slack-Signature": sign(secret or self.signing_secret, ts, body)}

    async def _deliver_http(self, delivery: Delivery, timeout: float, delays: tuple[float, ...]) -> None:
        assert self._session is not None and delivery.url is not None
        body = json.dumps(delivery.payload)
        reason = ""
        for num in range(len(delays) + 1):
            if num:
                await asyncio.sleep(delays[num - 1])
            headers = self.signed_headers(body)
            if num:
                headers.update({"X-Slack-Retry-Num": str(num), "X-Slack-Retry-Reason": reason})
            attempt = Attempt(num, time.monotonic(), headers)
            delivery.attempts.append(attempt)
            self._notify()
            no_retry = False
            try:
                async with self._session.post(delivery.url, data=body.encode(), headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    attempt.status, attempt.body = resp.status, await resp.text()
                    if 200 <= resp.status < 300:
                        attempt.acked = True
                    else:
                        attempt.reason = "http_error"
                        no_retry = resp.headers.get("X-Slack-No-Retry") == "1"
            except asyncio.TimeoutError:
                attempt.reason = "http_timeout"
            except aiohttp.ClientConnectorError:
                attempt.reason = "connection_failed"
            except aiohttp.TooManyRedirects:
                attempt.reason = "too_many_redirects"
            except (aiohttp.ClientError, OSError):
                attempt.reason = "unknown_error"
            attempt.elapsed = time.monotonic() - attempt.started
            if attempt.acked:
                return self._finish(delivery, True)
            reason = attempt.reason or "unknown_error"
            if no_retry:
                break
        self._finish(delivery, False)

    async def _deliver_socket(self, delivery: Delivery, timeout: float, delays: tuple[float, ...]) -> None:
        loop = asyncio.get_running_loop()
        for num in range(len(delays) + 1):
            if num:
                await asyncio.sleep(delays[num - 1])
            conn = await self.wait_until(self._open_connection, timeout=1e9, what="a Socket Mode connection")
            env_id = str(uuid.uuid4())
            attempt = Attempt(num, time.monotonic(), envelope_id=env_id)
            delivery.attempts.append(attempt)
            waiter: asyncio.Future = loop.create_future()
            self._envelopes[env_id] = (delivery, attempt, waiter)
            envelope = {"envelope_id": env_id, "payload": delivery.payload, "type": "events_api",
                        "accepts_response_payload": False, "retry_attempt": num,
                        "retry_reason": "" if num == 0 else "timeout"}
            try:
                await self._ws_send(conn, envelope)
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
                attempt.acked = True
            except asyncio.TimeoutError:
                attempt.reason = "timeout"
                waiter.cancel()                       # a later ack is recorded as late
                self._envelopes[env_id] = (delivery, attempt, waiter)
            except (ConnectionError, RuntimeError):
                attempt.reason = "connection_failed"
                waiter.cancel()
            attempt.elapsed = time.monotonic() - attempt.started
            self._notify()
            if attempt.acked:
                return self._finish(delivery, True)
        self._finish(delivery, False)

    # ------------------------------------------------------------------ raw signed posts (for auth tests)
    async def post_signed(self, url: str, payload: dict | str | bytes, *, timestamp: int | None = None,
                          signature: str | None = None, secret: str | None = None,
                          headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, dict, str]:
        """POST ``payload`` once, signed like Slack (override ``timestamp``/``signature``/``secret`` to
        forge it). Returns (status, response headers, response text). No retries, no records."""
        assert self._session is not None
        body = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
        sent = self.signed_headers(body, timestamp=timestamp, secret=secret)
        if signature is not None:
            sent["X-Slack-Signature"] = signature
        sent.update(headers or {})
        async with self._session.post(url, data=body.encode() if isinstance(body, str) else body, headers=sent,
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, dict(resp.headers), await resp.text()

    async def send_bad_signature(self, url: str, event: dict | None = None) -> int:
        """POST an event whose signature is wrong; returns the HTTP status (an app must answer 401)."""
        payload = self.event_callback(event or {"type": "app_mention", "text": "forged", "ts": self.next_ts()})
        status, _, _ = await self.post_signed(url, payload, signature="v0=" + "0" * 64)
        return status

    async def send_stale(self, url: str, event: dict | None = None, *, age: int = 6 * 60) -> int:
        """POST a correctly signed event whose timestamp is ``age`` seconds old (> 5 min: a replay)."""
        payload = self.event_callback(event or {"type": "app_mention", "text": "replayed", "ts": self.next_ts()})
        status, _, _ = await self.post_signed(url, payload, timestamp=int(time.time()) - age)
        return status

    async def verify_url(self, url: str | None = None) -> bool:
        """Slack's ``url_verification``: True if the app echoed the challenge (JSON ``{"challenge"}``,
        form ``challenge=`` or plain text) with HTTP 200."""
        target = url or self.events_url
        assert target, "fake Slack: verify_url needs a url or events_url"
        challenge = uuid.uuid4().hex
        status, headers, text = await self.post_signed(
            target, {"token": self.verification_token, "challenge": challenge, "type": "url_verification"})
        if status != 200:
            return False
        answer = text.strip()
        try:
            parsed = json.loads(answer)
            if isinstance(parsed, dict):
                answer = str(parsed.get("challenge", ""))
        except ValueError:
            if answer.startswith("challenge="):
                answer = answer[len("challenge="):]
        return answer == challenge
