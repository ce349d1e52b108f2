"""A fake Discord for tests: the REST API (v10) and the gateway websocket on 127.0.0.1.

The real ``discord.Client`` talks to it over the wire once redirected (process-global!)::

    async with FakeDiscord() as fake:
        guild = fake.add_guild(name="Lab")
        general = fake.add_channel(guild["id"], name="general")
        with fake.redirect():                      # sets Route.BASE + DEFAULT_GATEWAY, restores after
            client = discord.Client(intents=intents, guild_ready_timeout=0.1)
            task = asyncio.create_task(client.start(fake.token))
            ...
            fake.inject_message(int(general["id"]), f"{fake.bot_mention} hi")
            sent = await fake.wait_for_messages(int(general["id"]))

REST: /users/@me, /users/{id}, /users/@me/channels (DM), /oauth2/applications/@me, /gateway,
/gateway/bot, /channels/{id} (GET), /channels/{id}/messages (GET history, POST JSON or multipart),
/channels/{id}/messages/{mid} (GET, PATCH, DELETE), /channels/{id}/typing; attachment downloads at
/attachments/... (signed URLs, no auth, like the CDN). Every JSON answer has exactly
``Content-Type: application/json`` and ``Via: 1.1 google``.

Gateway (``/gw/`` and the resume URL ``/gw-resume/``): HELLO, heartbeat/ACK, IDENTIFY (token,
intents, privileged intents, shards) -> READY + GUILD_CREATE per guild, dispatches with sequence
numbers, RESUME (replays what the session missed, then RESUMED), INVALID_SESSION, RECONNECT,
server-side closes with codes, REQUEST_GUILD_MEMBERS -> GUILD_MEMBERS_CHUNK. Frames are zlib-stream
compressed when the client asks for ``compress=zlib-stream`` (discord.py does), else plain text.

The test-control API is in discord_state.Controls plus the gateway controls below.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import math
import secrets
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from .discord_clicks import Clicks, check_components
from .discord_state import (INTENT_GUILD_MEMBERS, INTENT_GUILDS, INTENT_MESSAGE_CONTENT, MAX_CONTENT, MAX_FILES,
                            MESSAGEABLE_TYPES, PRIVILEGED_INTENTS, ROUTE_ALIASES, THREAD_TYPES, ApiError, Attachment,
                            Call, Controls, Edit, Identify, Resume, Sent, Typing, form_error, iso)

__all__ = ["FakeDiscord", "DEFAULT_TOKEN", "DEFAULT_BOT_ID", "ROUTE_ALIASES", "discord_redirect"]

DEFAULT_BOT_ID = 1100000000000000001
DEFAULT_TOKEN = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GfAkE1.pluto_fake_discord_token_for_tests_0123"

# op codes
DISPATCH, HEARTBEAT, IDENTIFY, PRESENCE_UPDATE, VOICE_STATE_UPDATE = 0, 1, 2, 3, 4
RESUME, RECONNECT, REQUEST_GUILD_MEMBERS, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 6, 7, 8, 9, 10, 11
# close codes after which Discord does not let the session be resumed
NON_RESUMABLE_CLOSES = {4004, 4007, 4009, 4010, 4011, 4012, 4013, 4014}

ROUTES: list[tuple[str, str, str, bool]] = [   # method, path template, handler, needs auth
    ("GET", "/users/@me", "_r_me", True),
    ("POST", "/users/@me/channels", "_r_create_dm", True),
    ("GET", "/users/{user_id}", "_r_get_user", True),
    ("GET", "/oauth2/applications/@me", "_r_application", True),
    ("GET", "/gateway", "_r_gateway", False),
    ("GET", "/gateway/bot", "_r_gateway_bot", True),
    ("GET", "/channels/{channel_id}", "_r_get_channel", True),
    ("GET", "/channels/{channel_id}/messages", "_r_history", True),
    ("POST", "/channels/{channel_id}/messages", "_r_send", True),
    ("GET", "/channels/{channel_id}/messages/{message_id}", "_r_get_message", True),
    ("PATCH", "/channels/{channel_id}/messages/{message_id}", "_r_edit", True),
    ("DELETE", "/channels/{channel_id}/messages/{message_id}", "_r_delete", True),
    ("POST", "/channels/{channel_id}/typing", "_r_typing", True),
    ("POST", "/interactions/{interaction_id}/{interaction_token}/callback", "_r_interaction_callback",
     False),
]


@contextlib.contextmanager
def discord_redirect(api_base: str, gateway_url: str) -> Iterator[None]:
    """Point discord.py at another server: ``Route.BASE`` (read when each request's Route is built)
    and ``DiscordWebSocket.DEFAULT_GATEWAY`` (read at connect and after a non-resumable
    INVALID_SESSION). Both are class attributes: process-global. Restored on exit."""
    import discord.gateway
    import discord.http
    import yarl

    old_base = discord.http.Route.BASE
    old_gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE = api_base
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)
    try:
        yield
    finally:
        discord.http.Route.BASE = old_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old_gateway


@dataclass
class Upload:
    """One file part of a multipart request."""
    field: str
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass
class Connection:
    """One gateway websocket as the fake saw it."""
    path: str                               # "/gw/" or "/gw-resume/"
    query: dict[str, str]
    opened: float = field(default_factory=time.monotonic)
    closed: float | None = None
    close_code: int | None = None           # the code the socket ended with
    closed_by: str | None = None            # "server" | "client" | "abort"
    session_id: str | None = None
    heartbeats: list[int | None] = field(default_factory=list)   # the seq each heartbeat carried
    ws: web.WebSocketResponse | None = field(default=None, repr=False)
    request: web.Request | None = field(default=None, repr=False)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)
    compressor: Any = field(default=None, repr=False)
    identified: bool = False

    @property
    def open(self) -> bool:
        return self.closed is None

    def send(self, frame: dict) -> None:
        self.queue.put_nowait(("frame", frame))

    def close(self, code: int | None) -> None:
        self.queue.put_nowait(("close", code))


@dataclass
class Session:
    """A gateway session: survives its connection so that it can be RESUMEd."""
    id: str
    intents: int
    shard: list[int] | None
    seq: int = 0
    log: list[dict] = field(default_factory=list)    # every dispatch frame sent (or due) in order
    conn: Connection | None = field(default=None, repr=False)
    valid: bool = True
    presence: dict | None = None

    def wants(self, guild_id: int | None) -> bool:
        if not self.shard:
            return True
        shard_id, count = self.shard
        return (((guild_id or 0) >> 22) % count) == shard_id


class FakeDiscord(Controls, Clicks):
    """One fake bot application on a local Discord. Use ``async with`` or ``start()`` / ``stop()``."""

    def __init__(self, token: str = DEFAULT_TOKEN, *, bot_id: int = DEFAULT_BOT_ID,
                 bot_name: str = "Pluto Test Bot", application_name: str = "Pluto",
                 heartbeat_interval: float = 5.0, privileged_intents: int = PRIVILEGED_INTENTS,
                 compress: bool = True, resend_on_resume: int = 0,
                 max_upload_bytes: int = 10 * 1024 * 1024) -> None:
        self.port = 0
        super().__init__(token, bot_id, bot_name, application_name)
        self.heartbeat_interval = heartbeat_interval      # seconds, sent in HELLO (as ms)
        self.privileged_intents = privileged_intents      # enabled "in the developer portal"; others -> 4014
        self.compress = compress                          # honour ?compress=zlib-stream
        self.resend_on_resume = resend_on_resume          # also re-send N already-delivered dispatches
        self.replay_missed = True                         # False: RESUME succeeds but missed events are lost
        self.max_upload_bytes = max_upload_bytes
        self.ack_heartbeats = True                        # False: a zombied connection (no op 11)
        self.connections: list[Connection] = []
        self.presences: list[dict] = []                   # op 3 payloads
        self.member_requests: list[dict] = []             # op 8 payloads
        self._sessions: dict[str, Session] = {}
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task] = set()
        self._route_table = [(m, self._compile(p), p, h, auth) for m, p, h, auth in ROUTES]
        self._clicks_init()

    # ------------------------------------------------------------------ lifecycle and URLs
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        """For ``discord.http.Route.BASE``."""
        return f"{self.url}/api/v10"

    @property
    def gateway_url(self) -> str:
        """For ``DiscordWebSocket.DEFAULT_GATEWAY`` (discord.py appends ``?v=10&encoding=json&compress=…``)."""
        return f"ws://127.0.0.1:{self.port}/gw/"

    @property
    def resume_gateway_url(self) -> str:
        """What READY announces as ``resume_gateway_url``: discord.py RESUMEs there."""
        return f"ws://127.0.0.1:{self.port}/gw-resume/"

    def redirect(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: point discord.py (process-global) at this fake; restores on exit."""
        return discord_redirect(self.api_base, self.gateway_url)

    async def start(self) -> "FakeDiscord":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/v{version:\\d+}{tail:/.*}", self._handle_api)
        for path in ("/gw", "/gw/", "/gw-resume", "/gw-resume/"):
            app.router.add_get(path, self._handle_gateway)
        app.router.add_get("/attachments/{channel_id}/{att_id}/{filename}", self._handle_cdn)
        app.router.add_get("/media/attachments/{channel_id}/{att_id}/{filename}", self._handle_cdn)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        for conn in self.connections:
            if conn.open and conn.ws is not None:
                conn.close(1001)
        if self._runner:
            await self._runner.cleanup()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> "FakeDiscord":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ================================================================== gateway: test controls
    @property
    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    @property
    def open_connections(self) -> list[Connection]:
        return [c for c in self.connections if c.open]

    def _live(self, session_id: str | None) -> list[Connection]:
        return [c for c in self.connections if c.open and c.ws is not None
                and (session_id is None or c.session_id == session_id)]

    def disconnect(self, code: int | None = 4000, *, session_id: str | None = None) -> int:
        """Close the open gateway connection(s) (of one session) with ``code``; ``None`` cuts the TCP
        connection without a close frame. After 4000 (and most 4xxx/1xxx) discord.py RESUMEs; after
        4004/4010-4014 it gives up (4014: PrivilegedIntentsRequired); after 4007/4009 the session is
        gone, so its RESUME gets INVALID_SESSION and it IDENTIFYs anew. Events dispatched from now
        until the client resumes are kept and replayed. Returns how many connections were closed."""
        closed = 0
        for conn in self._live(session_id):
            self._detach(conn)
            if conn.session_id and code in NON_RESUMABLE_CLOSES and conn.session_id in self._sessions:
                self._sessions[conn.session_id].valid = False
            conn.queue.put_nowait(("abort", None) if code is None else ("close", code))
            closed += 1
        return closed

    def send_reconnect(self, *, session_id: str | None = None) -> int:
        """Send op 7 RECONNECT: discord.py closes (4000) and RESUMEs on ``resume_gateway_url``."""
        return self._send_op(RECONNECT, None, session_id)

    def invalidate_session(self, resumable: bool = False, *, session_id: str | None = None) -> int:
        """Send op 9 INVALID_SESSION ``d=resumable``. False: the session is dropped; discord.py
        reconnects to DEFAULT_GATEWAY and IDENTIFYs (after ``before_identify_hook``: 5 s in
        discord.py unless overridden). True: it closes and RESUMEs."""
        targets = self._live(session_id)
        if not resumable:
            for conn in targets:
                if conn.session_id in self._sessions:
                    self._sessions[conn.session_id].valid = False
        count = self._send_op(INVALID_SESSION, resumable, session_id)
        for conn in targets:            # the client may IDENTIFY/RESUME again on this same socket
            conn.identified, conn.session_id = False, None
        return count

    def request_heartbeat(self, *, session_id: str | None = None) -> int:
        """Send op 1: the client must heartbeat at once."""
        for conn in self._live(session_id):
            conn.send({"op": HEARTBEAT, "d": None, "s": None, "t": None})
        return len(self._live(session_id))

    def _send_op(self, op: int, d: Any, session_id: str | None) -> int:
        targets = self._live(session_id)
        for conn in targets:
            conn.send({"op": op, "d": d, "s": None, "t": None})
            self._detach(conn)      # later dispatches wait in the session's log for the RESUME
        return len(targets)

    def _detach(self, conn: Connection) -> None:
        session = self._sessions.get(conn.session_id or "")
        if session is not None and session.conn is conn:
            session.conn = None

    # ================================================================== gateway: dispatching
    def _dispatch_to(self, session: Session, event: str, data: dict) -> None:
        session.seq += 1
        frame = {"op": DISPATCH, "t": event, "s": session.seq, "d": data}
        session.log.append(frame)
        if session.conn is not None:
            session.conn.send(frame)
        self._notify()

    def _broadcast(self, event: str, data: dict, *, guild_id: int | None, intent: int,
                   message: dict | None = None) -> None:
        for session in list(self._sessions.values()):
            if not session.valid or not session.intents & intent or not session.wants(guild_id):
                continue
            if event == "GUILD_CREATE":
                payload = self._guild_json(self._guilds[guild_id],  # type: ignore[index]
                                           members_intent=bool(session.intents & INTENT_GUILD_MEMBERS))
                payload.pop("unavailable")      # a join, not a lazy-loaded guild becoming available
            else:
                payload = copy.deepcopy(data)
            if message is not None and not self._may_read(session, message, guild_id):
                # without the MESSAGE_CONTENT intent these fields arrive empty
                payload.update(content="", embeds=[], attachments=[], components=[])
                payload.pop("poll", None)
            self._dispatch_to(session, event, payload)

    def _may_read(self, session: Session, message: dict, guild_id: int | None) -> bool:
        if session.intents & INTENT_MESSAGE_CONTENT or guild_id is None:
            return True
        return (message["author"]["id"] == self.bot_user["id"]
                or any(m["id"] == self.bot_user["id"] for m in message.get("mentions", [])))

    def _ready_payload(self, session: Session) -> dict:
        guilds = [{"id": str(g), "unavailable": True} for g in self._guilds if session.wants(g)]
        out = {
            "v": 10, "user_settings": {}, "user_guild_settings": {"entries": [], "version": 0, "partial": False},
            "user": {**copy.deepcopy(self.bot_user), "verified": True, "mfa_enabled": False, "email": None},
            "session_type": "normal", "session_id": session.id, "resume_gateway_url": self.resume_gateway_url,
            "relationships": [], "private_channels": [], "presences": [], "guilds": guilds,
            "guild_join_requests": [], "geo_ordered_rtc_regions": ["local"], "game_relationships": [],
            "auth": {}, "application": {"id": self.bot_user["id"], "flags": 565248},
            "_trace": ['["gateway-fake",{"micros":1}]'],
        }
        if session.shard:
            out["shard"] = session.shard
        return out

    # ================================================================== gateway: the websocket
    async def _handle_gateway(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True, max_msg_size=0, timeout=5.0)
        conn = Connection(path=request.path, query=dict(request.query), ws=ws, request=request)
        await ws.prepare(request)
        self.connections.append(conn)
        self._notify()
        if conn.query.get("compress") == "zlib-stream" and self.compress:
            conn.compressor = zlib.compressobj()
        writer = asyncio.create_task(self._writer(conn))
        self._tasks.add(writer)
        writer.add_done_callback(self._tasks.discard)
        if conn.query.get("v", "10") not in ("9", "10"):
            conn.close(4012)                                   # Invalid API version
        elif conn.query.get("encoding", "json") != "json":
            conn.close(4002)                                   # this fake speaks JSON only
        else:
            conn.send({"op": HELLO, "d": {"heartbeat_interval": int(self.heartbeat_interval * 1000),
                                          "_trace": ['["gateway-fake",{"micros":1}]']},
                       "s": None, "t": None})
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    raw = msg.data if isinstance(msg.data, str) else msg.data.decode("utf-8", "replace")
                    try:
                        payload = json.loads(raw)
                        op = payload["op"]
                    except (ValueError, KeyError, TypeError):
                        conn.close(4002)                       # Decode error
                        continue
                    self._on_frame(conn, op, payload.get("d"))
                elif msg.type == WSMsgType.ERROR:
                    break
        except ConnectionResetError:
            pass
        finally:
            self._detach(conn)
            if conn.closed_by is None:
                conn.closed_by = "client"
                conn.close_code = ws.close_code
                # a client that closes with 1000/1001 ends its session (it cannot be resumed)
                if ws.close_code in (1000, 1001) and conn.session_id in self._sessions:
                    self._sessions[conn.session_id].valid = False
            else:
                conn.close_code = conn.close_code if conn.close_code is not None else ws.close_code
            conn.closed = time.monotonic()
            conn.queue.put_nowait(("stop", None))
            self._notify()
        return ws

    async def _writer(self, conn: Connection) -> None:
        ws = conn.ws
        assert ws is not None
        try:
            while True:
                kind, value = await conn.queue.get()
                if kind == "frame":
                    if ws.closed:
                        continue
                    text = json.dumps(value, separators=(",", ":"))
                    if conn.compressor is not None:
                        data = conn.compressor.compress(text.encode()) + conn.compressor.flush(zlib.Z_SYNC_FLUSH)
                        await ws.send_bytes(data)
                    else:
                        await ws.send_str(text)
                elif kind == "close":
                    if conn.closed_by is None:
                        conn.closed_by, conn.close_code = "server", value
                    self._detach(conn)
                    await ws.close(code=value)
                    return
                elif kind == "abort":
                    if conn.closed_by is None:
                        conn.closed_by = "abort"
                    self._detach(conn)
                    if conn.request is not None and conn.request.transport is not None:
                        conn.request.transport.abort()
                    return
                else:                                         # "stop"
                    return
        except (ConnectionResetError, RuntimeError):
            return

    def _on_frame(self, conn: Connection, op: int, d: Any) -> None:
        if op == HEARTBEAT:
            conn.heartbeats.append(d)
            if self.ack_heartbeats:
                conn.send({"op": HEARTBEAT_ACK, "d": None, "s": None, "t": None})
        elif op == IDENTIFY:
            self._identify(conn, d if isinstance(d, dict) else {})
        elif op == RESUME:
            self._resume(conn, d if isinstance(d, dict) else {})
        elif not conn.identified:
            conn.close(4003)                                   # Not authenticated
        elif op == PRESENCE_UPDATE:
            self.presences.append(d)
            if session := self._sessions.get(conn.session_id or ""):
                session.presence = d
        elif op == VOICE_STATE_UPDATE:
            pass
        elif op == REQUEST_GUILD_MEMBERS:
            self._members_chunk(conn, d if isinstance(d, dict) else {})
        else:
            conn.close(4001)                                   # Unknown opcode
        self._notify()

    def _token_ok(self, token: Any) -> bool:
        return isinstance(token, str) and token.removeprefix("Bot ") == self.token

    def _identify(self, conn: Connection, d: dict) -> None:
        intents, shard = d.get("intents"), d.get("shard")
        record = Identify(None, intents if isinstance(intents, int) else None, shard,
                          d.get("properties") or {}, False)
        self.identifies.append(record)
        code = None
        if conn.identified:
            code = 4005                                        # Already authenticated
        elif not self._token_ok(d.get("token")):
            code = 4004                                        # Authentication failed
        elif not isinstance(intents, int) or intents < 0 or intents >= 1 << 53:
            code = 4013                                        # Invalid intent(s)
        elif intents & PRIVILEGED_INTENTS & ~self.privileged_intents:
            code = 4014                                        # Disallowed intent(s)
        elif shard is not None and (not isinstance(shard, list) or len(shard) != 2
                                    or not 0 <= shard[0] < shard[1]):
            code = 4010                                        # Invalid shard
        if code is not None:
            record.close_code = code
            conn.close(code)
            return
        session = Session(secrets.token_hex(16), intents, shard)
        self._sessions[session.id] = session
        record.session_id, record.accepted = session.id, True
        conn.identified, conn.session_id = True, session.id
        session.conn = conn
        self._dispatch_to(session, "READY", self._ready_payload(session))
        if intents & INTENT_GUILDS:
            for gid, guild in self._guilds.items():
                if session.wants(gid):
                    self._dispatch_to(session, "GUILD_CREATE", self._guild_json(
                        guild, members_intent=bool(intents & INTENT_GUILD_MEMBERS)))

    def _resume(self, conn: Connection, d: dict) -> None:
        sid, seq = str(d.get("session_id")), d.get("seq")
        session = self._sessions.get(sid)
        record = Resume(sid, seq, False)
        self.resumes.append(record)
        if conn.identified:
            conn.close(4005)
            return
        if not self._token_ok(d.get("token")):
            conn.close(4004)
            return
        if session is None or not session.valid:
            conn.send({"op": INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        last = seq if isinstance(seq, int) else 0
        if last > session.seq:
            session.valid = False
            conn.close(4007)                                   # Invalid seq
            return
        if session.conn is not None and session.conn is not conn:
            old = session.conn
            self._detach(old)
            old.close(4000)
        record.accepted = True
        conn.identified, conn.session_id = True, session.id
        first = max(last - self.resend_on_resume, 0)
        for frame in session.log:
            if frame["s"] > last and not self.replay_missed:
                break
            if frame["s"] > first and frame["t"] != "READY":
                conn.send(frame)
                record.replayed.append(frame["s"])
        session.conn = conn
        self._dispatch_to(session, "RESUMED", {"_trace": ['["gateway-fake",{"micros":1}]']})

    def _members_chunk(self, conn: Connection, d: dict) -> None:
        self.member_requests.append(d)
        session = self._sessions.get(conn.session_id or "")
        guild = self._guilds.get(int(d.get("guild_id") or 0))
        if session is None or guild is None:
            return
        ids = list(guild["members"])
        if d.get("user_ids"):
            wanted = {int(u) for u in (d["user_ids"] if isinstance(d["user_ids"], list) else [d["user_ids"]])}
            ids = [u for u in ids if u in wanted]
        elif d.get("query"):
            q = str(d["query"]).lower()
            ids = [u for u in ids if self._users[u]["username"].lower().startswith(q)]
        if d.get("limit"):
            ids = ids[:int(d["limit"])]
        chunk = {"guild_id": str(guild["id"]), "members": [self._member_json(guild, u) for u in ids],
                 "chunk_index": 0, "chunk_count": 1, "not_found": []}
        if d.get("nonce") is not None:
            chunk["nonce"] = d["nonce"]
        self._dispatch_to(session, "GUILD_MEMBERS_CHUNK", chunk)

    # ================================================================== REST
    @staticmethod
    def _compile(template: str) -> list[str]:
        return template.strip("/").split("/")

    def _match(self, method: str, path: str) -> tuple[str, str, dict[str, str], str, bool] | None | str:
        parts = path.strip("/").split("/")
        path_matched = False
        for m, segs, template, handler, auth in self._route_table:
            if len(segs) != len(parts):
                continue
            params: dict[str, str] = {}
            for seg, part in zip(segs, parts):
                if seg.startswith("{"):
                    if part.startswith("@") or not (part.isdigit() or seg.endswith("token}")):
                        break
                    params[seg[1:-1]] = part
                elif seg != part:
                    break
            else:
                path_matched = True
                if m == method:
                    return f"{m} {template}", template, params, handler, auth
        return "405" if path_matched else None

    def _headers(self, route: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        bucket = hashlib.sha1(route.encode()).hexdigest()[:32]
        out = {"Via": "1.1 google", "X-RateLimit-Bucket": bucket, "X-RateLimit-Limit": "50",
               "X-RateLimit-Remaining": "49", "X-RateLimit-Reset": f"{time.time() + 1:.3f}",
               "X-RateLimit-Reset-After": "1.000"}
        out.update(extra or {})
        return out

    @staticmethod
    def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(body=json.dumps(body).encode(), status=status,
                            headers={**(headers or {}), "Content-Type": "application/json"})

    def _too_many(self, route: str, retry_after: float, *, global_: bool, via: bool, scope: str,
                  bucket_headers: dict[str, str] | None = None) -> web.Response:
        if not via:                       # what a Cloudflare ban looks like: HTML, no Via
            return web.Response(status=429, text="<html><body>error code: 1015</body></html>",
                                content_type="text/html", headers={"Retry-After": str(math.ceil(retry_after))})
        headers = self._headers(route, bucket_headers)
        headers.update({"Retry-After": str(max(math.ceil(retry_after), 1)), "X-RateLimit-Scope": scope})
        if global_:
            headers["X-RateLimit-Global"] = "true"
            for h in ("X-RateLimit-Bucket", "X-RateLimit-Limit", "X-RateLimit-Remaining",
                      "X-RateLimit-Reset", "X-RateLimit-Reset-After"):
                headers.pop(h, None)
        else:
            headers.update({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": f"{retry_after:.3f}",
                            "X-RateLimit-Reset": f"{time.time() + retry_after:.3f}"})
        body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": global_}
        if not global_ and scope == "shared":
            body["code"] = 0
        return self._json(body, 429, headers)

    def _bucket(self, route: str, channel_id: int | None) -> tuple[bool, dict[str, str], float]:
        bucket = self._buckets.get(route)
        if bucket is None:
            return True, {}, 0.0
        now = time.monotonic()
        hits = bucket.hits.setdefault(str(channel_id or ""), [])
        hits[:] = [t for t in hits if now - t < bucket.per]
        reset_after = (hits[0] + bucket.per - now) if hits else bucket.per
        if len(hits) >= bucket.limit:
            return False, {"X-RateLimit-Limit": str(bucket.limit)}, max(reset_after, 0.001)
        hits.append(now)
        reset_after = hits[0] + bucket.per - now
        return True, {"X-RateLimit-Limit": str(bucket.limit),
                      "X-RateLimit-Remaining": str(bucket.limit - len(hits)),
                      "X-RateLimit-Reset-After": f"{reset_after:.3f}",
                      "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}"}, 0.0

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["version"] not in ("9", "10"):
            return self._json({"message": "Invalid API version", "code": 50041}, 400)
        found = self._match(request.method, request.match_info["tail"])
        if found is None:
            return self._json(ApiError(404).body(), 404)
        if found == "405":
            return self._json(ApiError(405).body(), 405)
        route, template, params, handler, needs_auth = found  # type: ignore[misc]
        if needs_auth and request.headers.get("Authorization") != f"Bot {self.token}":
            return self._json(ApiError(401).body(), 401)
        channel_id = int(params["channel_id"]) if "channel_id" in params else None
        call = Call(request.method, route, request.match_info["tail"], params)
        self.calls.append(call)
        try:
            delay = self._latency.get(route, self._latency.get("*", 0.0))
            if delay:
                await asyncio.sleep(delay)
            left = self._global_until - time.monotonic()
            if left > 0:
                call.status, call.rate_limited = 429, True
                return self._too_many(route, round(left, 3), global_=True, via=True, scope="global")
            left = self._windows.get((route, channel_id or 0), 0.0) - time.monotonic()
            if left > 0:
                call.status, call.rate_limited = 429, True
                return self._too_many(route, round(left, 3), global_=False, via=True,
                                      scope="user")
            failure = self._take_failure(route, channel_id)
            if failure is not None:
                if failure.kind == "drop":
                    call.status = 0
                    if request.transport is not None:
                        request.transport.abort()
                    return web.Response(status=500)
                if failure.kind == "ratelimit":
                    call.status, call.rate_limited = 429, True
                    if failure.global_:
                        self._global_until = time.monotonic() + failure.retry_after
                    return self._too_many(route, failure.retry_after, global_=failure.global_,
                                          via=failure.via, scope=failure.scope or "user")
                assert failure.error is not None
                raise failure.error
            ok, bucket_headers, retry = self._bucket(route, channel_id)
            if not ok:
                call.status, call.rate_limited = 429, True
                return self._too_many(route, round(retry, 3), global_=False, via=True, scope="user",
                                      bucket_headers=bucket_headers)
            body, files = await self._read_body(request)
            call.json = body
            status, result = await getattr(self, handler)(params, body, files, dict(request.query))
            call.status = status
            if status == 204:
                return web.Response(status=204, headers=self._headers(route, bucket_headers))
            return self._json(result, status, self._headers(route, bucket_headers))
        except ApiError as exc:
            call.status, call.code = exc.status, exc.code
            return self._json(exc.body(), exc.status, self._headers(route))
        except Exception as exc:  # a bug in the fake: answer Discord's 500, keep the cause visible
            call.status, call.code = 500, 0
            return self._json({"message": f"500: Internal Server Error (fake failed: {exc!r})", "code": 0}, 500)
        finally:
            self._notify()

    async def _read_body(self, request: web.Request) -> tuple[Any, dict[int, Upload]]:
        files: dict[int, Upload] = {}
        if not request.can_read_body:
            return None, files
        ctype = request.content_type
        if ctype == "multipart/form-data":
            body: Any = {}
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                name = part.name or ""                                 # type: ignore[union-attr]
                if name == "payload_json":
                    try:
                        body = json.loads(await part.text())           # type: ignore[union-attr]
                    except ValueError:
                        raise ApiError(400, 50109)
                elif name.startswith("files[") and name.endswith("]") and name[6:-1].isdigit():
                    data = bytes(await part.read())                    # type: ignore[union-attr]
                    files[int(name[6:-1])] = Upload(name, part.filename,  # type: ignore[union-attr]
                                                    part.headers.get("Content-Type"), data)
                else:
                    await part.read()                                  # type: ignore[union-attr]
            return body, files
        raw = await request.read()
        if not raw:
            return None, files
        try:
            return json.loads(raw), files
        except ValueError:
            raise ApiError(400, 50109)

    # ------------------------------------------------------------------ REST handlers
    def _channel_or_404(self, params: dict) -> dict:
        channel = self._channels.get(int(params["channel_id"]))
        if channel is None:
            raise ApiError(404, 10003)
        return channel

    def _message_or_404(self, channel: dict, params: dict) -> dict:
        msg = self._msgs.get(int(channel["id"]), {}).get(int(params["message_id"]))
        if msg is None:
            raise ApiError(404, 10008)
        return msg

    async def _r_me(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        return 200, {**copy.deepcopy(self.bot_user), "verified": True, "mfa_enabled": False, "locale": "en-US",
                     "email": None, "bio": ""}

    async def _r_get_user(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        user = self._users.get(int(params["user_id"]))
        if user is None:
            raise ApiError(404, 10013)
        return 200, copy.deepcopy(user)

    async def _r_create_dm(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        rid = (body or {}).get("recipient_id") if isinstance(body, dict) else None
        if rid is None:
            raise form_error("recipient_id", "BASE_TYPE_REQUIRED", "This field is required")
        if not str(rid).isdigit() or int(rid) not in self._users:
            raise ApiError(400, 50007)
        return 200, copy.deepcopy(self.add_dm(int(rid)))

    async def _r_application(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        owner = self.default_user
        return 200, {
            "id": self.bot_user["id"], "name": self.application_name, "icon": None, "description": "",
            "summary": "", "type": None, "hook": True, "bot_public": True, "bot_require_code_grant": False,
            "verify_key": hashlib.sha256(self.token.encode()).hexdigest(), "flags": 565248,
            "owner": copy.deepcopy(owner), "team": None, "bot": copy.deepcopy(self.bot_user),
            "approximate_guild_count": len(self._guilds), "approximate_user_install_count": 0,
            "redirect_uris": [], "interactions_endpoint_url": None, "tags": [], "install_params": None,
            "integration_types_config": {"0": {}}, "is_monetized": False, "explicit_content_filter": 0,
            "rpc_origins": [], "cover_image": None, "custom_install_url": None,
        }

    async def _r_gateway(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        return 200, {"url": self.gateway_url}

    async def _r_gateway_bot(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        return 200, {"url": self.gateway_url, "shards": 1,
                     "session_start_limit": {"total": 1000, "remaining": 1000 - len(self.identifies),
                                             "reset_after": 14_400_000, "max_concurrency": 1}}

    async def _r_get_channel(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        return 200, copy.deepcopy(self._channel_or_404(params))

    async def _r_get_message(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        channel = self._channel_or_404(params)
        return 200, copy.deepcopy(self._message_or_404(channel, params))

    async def _r_history(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        channel = self._channel_or_404(params)
        q = query
        limit = max(1, min(int(q.get("limit", 50)), 100))
        msgs = sorted(self._msgs.get(int(channel["id"]), {}).items())
        if "before" in q:
            msgs = [x for x in msgs if x[0] < int(q["before"])][-limit:]
        elif "after" in q:
            msgs = [x for x in msgs if x[0] > int(q["after"])][:limit]
        elif "around" in q:
            pivot = int(q["around"])
            before = [x for x in msgs if x[0] < pivot][-(limit // 2):] if limit > 1 else []
            msgs = (before + [x for x in msgs if x[0] >= pivot])[:limit]
        else:
            msgs = msgs[-limit:]
        return 200, [copy.deepcopy(m) for _, m in reversed(msgs)]

    async def _r_typing(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        channel = self._channel_or_404(params)
        if int(channel["id"]) in self._forbidden:
            raise ApiError(403, self._forbidden[int(channel["id"])])
        self.typing.append(Typing(int(channel["id"])))
        return 204, None

    def _check_sendable(self, channel: dict) -> None:
        if channel["type"] not in MESSAGEABLE_TYPES:
            raise ApiError(400, 50008)
        cid = int(channel["id"])
        if cid in self._forbidden:
            raise ApiError(403, self._forbidden[cid])
        if channel["type"] in THREAD_TYPES and channel["thread_metadata"]["archived"]:
            raise ApiError(400, 50083)

    def _content_of(self, body: dict) -> str:
        content = body.get("content")
        if content is None:
            return ""
        if not isinstance(content, str):
            content = str(content)
        if len(content) > MAX_CONTENT:
            raise form_error("content", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT} or fewer in length.")
        return content

    def _uploads(self, channel: dict, body: dict, files: dict[int, Upload]) -> dict[int, Attachment]:
        if len(files) > MAX_FILES:
            raise form_error("files", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_FILES} or fewer in length.")
        if sum(len(u.data) for u in files.values()) > self.max_upload_bytes:
            raise ApiError(413, 40005)
        meta = {}
        for item in body.get("attachments") or []:
            if isinstance(item, dict) and str(item.get("id", "")).isdigit() and int(item["id"]) in files:
                meta[int(item["id"])] = item
        out = {}
        for index, upload in sorted(files.items()):
            info = meta.get(index, {})
            name = info.get("filename") or upload.filename or f"file{index}"
            out[index] = self._store_file(int(channel["id"]), name, upload.data, upload.content_type,
                                          info.get("description"))
        return out

    def _outgoing_mentions(self, content: str, body: dict, replied: dict | None) -> list[dict]:
        allowed = body.get("allowed_mentions")
        found = self._mentions_in(content)
        if isinstance(allowed, dict):
            parse = allowed.get("parse") or []
            users = {str(u) for u in allowed.get("users") or []}
            found = [m for m in found if "users" in parse or m["id"] in users]
        replied_user = not isinstance(allowed, dict) or allowed.get("replied_user", True)
        if replied is not None and replied_user and replied["author"]["id"] not in {m["id"] for m in found}:
            found.append(copy.deepcopy(replied["author"]))
        return found

    async def _r_send(self, params: dict, body: Any, files: dict[int, Upload], query: dict) -> tuple[int, Any]:
        channel = self._channel_or_404(params)
        self._check_sendable(channel)
        body = body if isinstance(body, dict) else {}
        content = self._content_of(body)
        embeds = body.get("embeds") or []
        components = check_components(body.get("components"))
        uploads = self._uploads(channel, body, files)
        if not content and not embeds and not uploads and not body.get("sticker_ids") and not body.get("poll"):
            raise ApiError(400, 50006)
        replied = None
        ref = body.get("message_reference")
        if isinstance(ref, dict) and ref.get("message_id") is not None:
            ref_channel = int(ref.get("channel_id") or channel["id"])
            replied = self.message(ref_channel, int(ref["message_id"]))
            if replied is None and ref.get("fail_if_not_exists", True):
                raise form_error("message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")
        nonce = body.get("nonce")
        if nonce is not None and body.get("enforce_nonce"):
            seen = self._nonces.get((int(channel["id"]), str(nonce)))
            if seen is not None and time.monotonic() - seen[0] < 120:
                existing = self.message(int(channel["id"]), seen[1])
                if existing is not None:
                    return 200, copy.deepcopy(existing)
        msg = self._new_message(channel, self.bot_user, content, attachments=list(uploads.values()),
                                mentions=self._outgoing_mentions(content, body, replied), reply_to=replied,
                                nonce=nonce, embeds=embeds)
        msg["components"] = components
        mid = int(msg["id"])
        if nonce is not None and body.get("enforce_nonce"):
            self._nonces[(int(channel["id"]), str(nonce))] = (time.monotonic(), mid)
        sent = Sent(int(channel["id"]), mid, content, list(uploads.values()), time.monotonic(),
                    copy.deepcopy(body), reply_to=int(replied["id"]) if replied else None, nonce=nonce,
                    embeds=copy.deepcopy(embeds))
        self.sent.append(sent)
        self._sent_by_id[mid] = sent
        self._dispatch_message("MESSAGE_CREATE", channel, msg)
        return 200, copy.deepcopy(msg)

    async def _r_edit(self, params: dict, body: Any, files: dict[int, Upload], query: dict) -> tuple[int, Any]:
        channel = self._channel_or_404(params)
        msg = self._message_or_404(channel, params)
        if msg["author"]["id"] != self.bot_user["id"]:
            raise ApiError(403, 50005)
        body = body if isinstance(body, dict) else {}
        content = self._content_of(body) if "content" in body else msg["content"]
        uploads = self._uploads(channel, body, files)
        cid = int(channel["id"])
        old = {int(a["id"]): a for a in msg["attachments"]}
        if "attachments" in body:
            keep = [int(a["id"]) for a in body["attachments"] or []
                    if isinstance(a, dict) and str(a.get("id", "")).isdigit() and int(a["id"]) in old]
        else:
            keep = list(old)
        new_atts = [old[k] for k in keep] + [self._attachment_json(a, cid) for a in uploads.values()]
        embeds = body["embeds"] or [] if "embeds" in body else msg["embeds"]
        if not content and not new_atts and not embeds:
            raise ApiError(400, 50006)
        components = (check_components(body.get("components")) if "components" in body
                      else msg.get("components") or [])
        msg.update(content=content, attachments=new_atts, embeds=embeds, edited_timestamp=iso(),
                   mentions=self._outgoing_mentions(content, body, None), components=components)
        if (sent := self._sent_by_id.get(int(msg["id"]))) is not None:
            files_now = [self._files[int(a["id"])] for a in new_atts if int(a["id"]) in self._files]
            sent.edits.append(Edit(content if "content" in body else None, files_now, time.monotonic(),
                                   copy.deepcopy(body)))
        self._dispatch_message("MESSAGE_UPDATE", channel, msg)
        return 200, copy.deepcopy(msg)

    async def _r_delete(self, params: dict, body: Any, files: dict, query: dict) -> tuple[int, Any]:
        channel = self._channel_or_404(params)
        msg = self._message_or_404(channel, params)
        mid = int(msg["id"])
        del self._msgs[int(channel["id"])][mid]
        self.deleted.append((int(channel["id"]), mid))
        if (sent := self._sent_by_id.get(mid)) is not None:
            sent.deleted, sent.deleted_time = True, time.monotonic()
        self._dispatch_delete(channel, mid)
        return 204, None

    # ------------------------------------------------------------------ the CDN
    async def _handle_cdn(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        path = f"/attachments/{info['channel_id']}/{info['att_id']}/{info['filename']}"
        att = self._files.get(int(info["att_id"])) if info["att_id"].isdigit() else None
        if (att is None or att.filename != info["filename"]
                or not self._check_cdn(path, request.query.get("ex", ""), request.query.get("hm", ""))):
            return web.Response(status=404, text="This content is no longer available.")
        return web.Response(body=att.data, headers={
            "Content-Type": (att.content_type or "application/octet-stream"), "Via": "1.1 google"})
