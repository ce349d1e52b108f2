"""A fake Matrix homeserver for tests: mautrix's client API talks to it over HTTP.

    async with FakeMatrix() as fake:
        dm = fake.add_room(members=[fake.alice, fake.bot_id])       # a direct chat
        fake.user_says(dm, "hello")                                  # Alice writes
        [sent] = await fake.wait_until(lambda: fake.bot_messages(dm))

It behaves like a homeserver where a client can tell:

- ``Authorization: Bearer <token>`` on every client call (401 ``M_MISSING_TOKEN`` /
  ``M_UNKNOWN_TOKEN``); errors are ``{"errcode", "error"}``; ``429 M_LIMIT_EXCEEDED`` carries
  ``retry_after_ms`` (and ``Retry-After``).
- ``/sync``: one stream of events with ``s<N>`` tokens; without ``since`` an initial sync (the
  rooms' state and their latest events), with ``since`` only what came after, long-polled up to
  ``timeout`` ms; a room's timeline is cut at the filter's ``timeline.limit`` (``limited``,
  ``prev_batch``); rooms the bot is invited to are under ``rooms.invite``. The bot's own events
  come back too.
- ``/rooms/{id}/messages`` pages backwards from a token (``dir=b``, ``from``, ``to``,
  ``limit``), so a client can fill a gap.
- ``PUT /rooms/{id}/send/{type}/{txnId}``: idempotent per transaction id; ``m.replace`` edits
  (from the original sender only) change what the original shows; the bot must be joined.
- ``POST /_matrix/media/v3/upload`` → ``mxc://``; authenticated downloads
  (``/_matrix/client/v1/media/download/{server}/{id}``, Matrix 1.11).
- ``whoami``, ``profile/{user}/displayname``, ``rooms/{id}/joined_members``,
  ``rooms/{id}/event/{id}``, ``rooms/{id}/join``, ``rooms/{id}/typing/{user}``.

Test controls: ``add_room``, ``invite``, ``user_says`` (``reply_to``: a rich reply),
``user_reacts`` (an ``m.reaction`` annotation), ``replay`` (the next sync carries an
event again), ``fail_next``, and the records ``calls``, ``typing``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

from tests.fakes.changes import Changes

__all__ = ["FakeMatrix", "MatrixFailure", "TOKEN", "SERVER"]

TOKEN = "syt_cGx1dG8_FakePlutoMatrixToken_0123456789"
SERVER = "fake.local"


class MatrixFailure(Exception):
    def __init__(self, errcode: str, error: str = "", status: int = 400,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(errcode)
        self.errcode, self.error, self.status = errcode, error or errcode, status
        self.retry_after_ms = retry_after_ms

    def response(self) -> web.Response:
        body: dict[str, Any] = {"errcode": self.errcode, "error": self.error}
        headers = {}
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = self.retry_after_ms
            headers["Retry-After"] = str(max(1, round(self.retry_after_ms / 1000)))
        return web.json_response(body, status=self.status, headers=headers)


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    time: float = field(default_factory=time.monotonic)


@dataclass
class Room:
    id: str
    members: list[str]
    invited: list[str] = field(default_factory=list)
    encrypted: bool = False


class FakeMatrix(Changes):
    """One homeserver with a bot account. Use ``async with`` or ``start()`` / ``stop()``."""

    FAKE = "Matrix"

    def __init__(self, *, token: str = TOKEN, bot_localpart: str = "pluto",
                 bot_name: str = "Pluto") -> None:
        self.token = token
        self.bot_id = f"@{bot_localpart}:{SERVER}"
        self.bot_name = bot_name
        self.alice = f"@alice:{SERVER}"
        self.names: dict[str, str] = {self.bot_id: bot_name, self.alice: "Alice"}
        self.rooms: dict[str, Room] = {}
        self.stream: list[tuple[int, str, dict[str, Any]]] = []  # (position, room, event)
        self.events: dict[str, tuple[str, dict[str, Any]]] = {}
        self.media: dict[str, tuple[bytes, str, str]] = {}
        self.calls: list[Call] = []
        self.typing: list[tuple[str, bool]] = []
        self.edits: dict[str, list[dict[str, Any]]] = {}  # original → its edits
        self.txns: dict[str, str] = {}
        self.sent_at: dict[str, float] = {}  # the bot's events: when accepted (monotonic)
        self.replays: list[int] = []
        self._failures: list[tuple[Callable[[Call], bool], MatrixFailure]] = []
        self._pos = 0
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeMatrix:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/_matrix/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        self._notify()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeMatrix:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # test controls ----------------------------------------------------------------------------

    def add_room(self, room_id: str | None = None, *, members: list[str],
                 encrypted: bool = False, invite_bot: bool = False) -> str:
        room_id = room_id or f"!room{next(self._ids)}:{SERVER}"
        joined = [m for m in members if not (invite_bot and m == self.bot_id)]
        room = Room(room_id, joined, [self.bot_id] if invite_bot else [], encrypted)
        self.rooms[room_id] = room
        self._append(room_id, self._state(room_id, "m.room.create", "", {"creator": members[0]},
                                          members[0]))
        for member in joined:
            self._append(room_id, self._member(room_id, member, "join"))
        if invite_bot:
            self._append(room_id, self._member(room_id, self.bot_id, "invite", sender=members[0]))
        if encrypted:
            self._append(room_id, self._state(room_id, "m.room.encryption", "",
                                              {"algorithm": "m.megolm.v1.aes-sha2"}, members[0]))
        return room_id

    def add_user(self, user_id: str, name: str) -> None:
        self.names[user_id] = name

    def user_says(self, room_id: str, text: str = "", *, sender: str | None = None,
                  mention: bool = False, reply_to: str | None = None, thread: str | None = None,
                  file: tuple[str, bytes, str] | None = None,
                  edit_of: str | None = None) -> dict[str, Any]:
        """A person writes in a room; the event (it reaches the bot by the next sync)."""
        sender = sender or self.alice
        content: dict[str, Any] = {"msgtype": "m.text", "body": text}
        if mention:
            content["body"] = f"{self.bot_name}: {text}"
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = (f'<a href="https://matrix.to/#/{self.bot_id}">'
                                         f"{self.bot_name}</a>: {text}")
            content["m.mentions"] = {"user_ids": [self.bot_id]}
        if file is not None:
            name, data, mime = file
            mxc = self._store_media(data, mime, name)
            msgtype = ("m.image" if mime.startswith("image/") else
                       "m.audio" if mime.startswith("audio/") else "m.file")
            content = {"msgtype": msgtype, "body": text or name, "filename": name, "url": mxc,
                       "info": {"mimetype": mime, "size": len(data)}}
            if msgtype == "m.audio":  # (Element's voice message)
                content |= {"org.matrix.msc3245.voice": {}, "org.matrix.msc1767.audio": {}}
        if thread:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread,
                                       "is_falling_back": True,
                                       "m.in_reply_to": {"event_id": reply_to or thread}}
        elif reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        if edit_of:
            content = {"msgtype": "m.text", "body": f"* {text}",
                       "m.new_content": {"msgtype": "m.text", "body": text},
                       "m.relates_to": {"rel_type": "m.replace", "event_id": edit_of}}
        event = self._event(room_id, "m.room.message", content, sender)
        self._append(room_id, event)
        return event

    def user_reacts(self, room_id: str, event_id: str, key: str, *,
                    sender: str | None = None) -> dict[str, Any]:
        """A person reacts to an event (``m.reaction``, an ``m.annotation`` with ``key``, as
        Element sends it); the reaction event (it reaches the bot by the next sync)."""
        if event_id not in self.events:
            raise KeyError(f"no event {event_id}")
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id,
                                    "key": key}}
        event = self._event(room_id, "m.reaction", content, sender or self.alice)
        self._append(room_id, event)
        return event

    def invite(self, room_id: str) -> None:
        room = self.rooms[room_id]
        room.invited.append(self.bot_id)
        self._append(room_id, self._member(room_id, self.bot_id, "invite",
                                           sender=room.members[0]))

    def replay(self, event_id: str) -> None:
        """The next sync carries this event again (as an overlapping batch does)."""
        for pos, _, event in self.stream:
            if event["event_id"] == event_id:
                self.replays.append(pos)
        self._notify()

    def fail_next(self, failure: MatrixFailure,
                  when: Callable[[Call], bool] = lambda c: True) -> None:
        self._failures.append((when, failure))

    # what the bot shows ---------------------------------------------------------------------

    def bot_messages(self, room_id: str) -> list[dict[str, Any]]:
        """The bot's messages in a room (edits applied, not listed), oldest first."""
        out = []
        for _, room, event in self.stream:
            content = event.get("content") or {}
            if (room == room_id and event["type"] == "m.room.message"
                    and event["sender"] == self.bot_id
                    and (content.get("m.relates_to") or {}).get("rel_type") != "m.replace"):
                out.append(event)
        return out

    def current(self, event: dict[str, Any]) -> dict[str, Any]:
        """The content an event shows now (its latest edit's ``m.new_content``)."""
        edits = self.edits.get(event["event_id"])
        return edits[-1]["content"]["m.new_content"] if edits else event["content"]

    def media_bytes(self, mxc: str) -> bytes | None:
        found = self.media.get(mxc.removeprefix(f"mxc://{SERVER}/"))
        return found[0] if found else None

    # events --------------------------------------------------------------------------------

    def _event(self, room_id: str, kind: str, content: dict[str, Any], sender: str
               ) -> dict[str, Any]:
        return {"type": kind, "event_id": f"$ev{next(self._ids)}FAKE", "sender": sender,
                "origin_server_ts": int(time.time() * 1000), "room_id": room_id,
                "content": content}

    def _state(self, room_id: str, kind: str, key: str, content: dict[str, Any],
               sender: str) -> dict[str, Any]:
        return {**self._event(room_id, kind, content, sender), "state_key": key}

    def _member(self, room_id: str, user: str, membership: str,
                sender: str | None = None) -> dict[str, Any]:
        return self._state(room_id, "m.room.member", user,
                           {"membership": membership, "displayname": self.names.get(user, user)},
                           sender or user)

    def _append(self, room_id: str, event: dict[str, Any]) -> None:
        self._pos += 1
        self.stream.append((self._pos, room_id, event))
        self.events[event["event_id"]] = (room_id, event)
        self._notify()

    def _store_media(self, data: bytes, mime: str, name: str) -> str:
        media_id = f"media{next(self._ids)}"
        self.media[media_id] = (data, mime, name)
        return f"mxc://{SERVER}/{media_id}"

    # the client-server API -----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        body: Any = None
        if request.method in ("POST", "PUT") and request.can_read_body:
            raw = await request.read()
            if request.path.startswith("/_matrix/media/"):
                body = raw
            else:
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return MatrixFailure("M_NOT_JSON", "Content not JSON.").response()
        call = Call(request.method, path, dict(request.query), body)
        self.calls.append(call)
        try:
            if path != "client/versions":
                self._auth(request)
            for i, (when, failure) in enumerate(self._failures):
                if when(call):
                    del self._failures[i]
                    raise failure
            response = await self._route(request, path, call)
        except MatrixFailure as failure:
            response = failure.response()
        call.status = response.status
        self._notify()
        return response

    def _auth(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization", "")
        if not auth:
            raise MatrixFailure("M_MISSING_TOKEN", "Missing access token.", 401)
        if auth != f"Bearer {self.token}":
            raise MatrixFailure("M_UNKNOWN_TOKEN", "Unknown access token.", 401)

    async def _route(self, request: web.Request, path: str, call: Call) -> web.StreamResponse:
        parts = path.split("/")
        method = request.method
        if path == "client/versions":
            return web.json_response({"versions": ["v1.9", "v1.10", "v1.11"]})
        if path == "client/v3/account/whoami":
            return web.json_response({"user_id": self.bot_id, "device_id": "FAKEDEVICE"})
        if parts[:3] == ["client", "v3", "profile"] and parts[-1] == "displayname":
            user = parts[3]
            if user not in self.names:
                raise MatrixFailure("M_NOT_FOUND", "Profile was not found", 404)
            return web.json_response({"displayname": self.names[user]})
        if path == "client/v3/sync":
            return web.json_response(await self._sync(request.query))
        if path == "media/v3/upload" and method == "POST":
            mxc = self._store_media(call.body or b"", request.content_type,
                                    request.query.get("filename", "file"))
            return web.json_response({"content_uri": mxc})
        if parts[:4] == ["client", "v1", "media", "download"] and len(parts) >= 6:
            found = self.media.get(parts[5])
            if parts[4] != SERVER or found is None:
                raise MatrixFailure("M_NOT_FOUND", "Not found", 404)
            return web.Response(body=found[0], content_type=found[1])
        if parts[:3] == ["client", "v3", "rooms"] and len(parts) >= 5:
            return await self._room_call(method, parts[3], parts[4:], call, request)
        if parts[:3] == ["client", "v3", "join"] and len(parts) == 4:
            return self._join(parts[3])
        raise MatrixFailure("M_UNRECOGNIZED", f"Unrecognized request {method} {path}", 404)

    async def _room_call(self, method: str, room_id: str, rest: list[str], call: Call,
                         request: web.Request) -> web.StreamResponse:
        room = self.rooms.get(room_id)
        if room is None:
            raise MatrixFailure("M_FORBIDDEN", "You are not in this room.", 403)
        if rest == ["join"] and method == "POST":
            return self._join(room_id)
        if self.bot_id not in room.members:
            raise MatrixFailure("M_FORBIDDEN", "You are not in this room.", 403)
        if rest[0] == "send" and method == "PUT" and len(rest) == 3:
            return self._send(room, rest[1], rest[2], call.body)
        if rest[0] == "typing" and method == "PUT":
            if rest[1:] != [self.bot_id]:
                raise MatrixFailure("M_FORBIDDEN", "Cannot set typing for other users", 403)
            self.typing.append((room_id, bool((call.body or {}).get("typing"))))
            return web.json_response({})
        if rest == ["joined_members"]:
            return web.json_response({"joined": {m: {"display_name": self.names.get(m, m)}
                                                 for m in room.members}})
        if rest[0] == "event" and len(rest) == 2:
            found = self.events.get(rest[1])
            if found is None or found[0] != room_id:
                raise MatrixFailure("M_NOT_FOUND", "Event not found.", 404)
            return web.json_response(found[1])
        if rest == ["messages"]:
            return web.json_response(self._messages(room_id, request.query))
        raise MatrixFailure("M_UNRECOGNIZED", "Unrecognized request", 404)

    def _join(self, room_id: str) -> web.Response:
        room = self.rooms.get(room_id)
        if room is None or (self.bot_id not in room.invited and self.bot_id not in room.members):
            raise MatrixFailure("M_FORBIDDEN", "You are not invited to this room.", 403)
        if self.bot_id not in room.members:
            room.invited.remove(self.bot_id)
            room.members.append(self.bot_id)
            self._append(room_id, self._member(room_id, self.bot_id, "join"))
        return web.json_response({"room_id": room_id})

    def _send(self, room: Room, kind: str, txn: str, content: Any) -> web.Response:
        if not isinstance(content, dict):
            raise MatrixFailure("M_BAD_JSON", "Content must be a JSON object.")
        key = f"{room.id}/{txn}"
        if key in self.txns:  # the same transaction again: the same event
            return web.json_response({"event_id": self.txns[key]})
        if kind == "m.room.message" and not isinstance(content.get("body"), str):
            raise MatrixFailure("M_BAD_JSON", "'body' is a required property")
        if len(json.dumps(content)) > 65536:
            raise MatrixFailure("M_TOO_LARGE", "event too large", 413)
        relates = content.get("m.relates_to") or {}
        if relates.get("rel_type") == "m.replace":
            original = self.events.get(str(relates.get("event_id")))
            if original is None or original[1]["sender"] != self.bot_id:
                raise MatrixFailure("M_FORBIDDEN", "Cannot edit another user's event.", 403)
            if not isinstance(content.get("m.new_content"), dict):
                raise MatrixFailure("M_BAD_JSON", "an edit needs m.new_content")
        event = self._event(room.id, kind, copy.deepcopy(content), self.bot_id)
        if relates.get("rel_type") == "m.replace":
            self.edits.setdefault(str(relates["event_id"]), []).append(event)
        self.txns[key] = event["event_id"]
        self.sent_at[event["event_id"]] = time.monotonic()
        self._append(room.id, event)
        return web.json_response({"event_id": event["event_id"]})

    async def _sync(self, query: Any) -> dict[str, Any]:
        since = query.get("since")
        limit = _timeline_limit(query.get("filter"))
        if not since:
            return self._initial(limit)
        try:
            after = int(since.removeprefix("s"))
        except ValueError:
            raise MatrixFailure("M_INVALID_PARAM", "Invalid stream token") from None
        deadline = time.monotonic() + min(int(query.get("timeout") or 0), 60000) / 1000
        while self._pos <= after and not self.replays:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self._wait_change(remaining)
        replayed = [p for p in self.replays]
        self.replays.clear()
        items = [(p, r, e) for p, r, e in self.stream if p > after]
        items = sorted({p: (p, r, e) for p, r, e in
                        [x for x in self.stream if x[0] in replayed] + items}.values())
        return {"next_batch": f"s{max(self._pos, after)}",
                "rooms": self._rooms_section(items, limit, after)}

    def _initial(self, limit: int) -> dict[str, Any]:
        rooms = self._rooms_section(list(self.stream), limit, 0, initial=True)
        return {"next_batch": f"s{self._pos}", "rooms": rooms}

    def _rooms_section(self, items: list[tuple[int, str, dict[str, Any]]], limit: int,
                       after: int, initial: bool = False) -> dict[str, Any]:
        join: dict[str, Any] = {}
        invite: dict[str, Any] = {}
        for room in self.rooms.values():
            if self.bot_id in room.invited:
                invite[room.id] = {"invite_state": {"events": [
                    {k: e[k] for k in ("type", "state_key", "sender", "content")}
                    for _, r, e in self.stream if r == room.id and "state_key" in e]}}
                continue
            if self.bot_id not in room.members:
                continue
            events = [(p, e) for p, r, e in items if r == room.id]
            if not events and not initial:
                continue
            shown = events[-limit:]
            timeline: dict[str, Any] = {"events": [copy.deepcopy(e) for _, e in shown],
                                        "limited": len(events) > limit}
            if shown:
                timeline["prev_batch"] = f"s{shown[0][0] - 1}"
            section: dict[str, Any] = {"timeline": timeline, "state": {"events": []},
                                       "summary": {"m.joined_member_count": len(room.members)}}
            if initial:
                section["state"]["events"] = [copy.deepcopy(e) for p, r, e in self.stream
                                              if r == room.id and "state_key" in e
                                              and (p, e) not in shown]
            join[room.id] = section
        return {"join": join, "invite": invite, "leave": {}}

    def _messages(self, room_id: str, query: Any) -> dict[str, Any]:
        if query.get("dir", "b") != "b":
            raise MatrixFailure("M_INVALID_PARAM", "only dir=b is offered by the fake")
        start = int(str(query.get("from") or f"s{self._pos}").removeprefix("s"))
        stop = int(str(query.get("to") or "s0").removeprefix("s"))
        limit = min(int(query.get("limit") or 10), 1000)
        found = [(p, e) for p, r, e in self.stream if r == room_id and stop < p <= start]
        chunk = list(reversed(found))[:limit]
        out: dict[str, Any] = {"start": f"s{start}", "chunk": [copy.deepcopy(e) for _, e in chunk]}
        if len(found) > limit:
            out["end"] = f"s{chunk[-1][0] - 1}"
        return out


def _timeline_limit(raw: str | None) -> int:
    try:
        spec = json.loads(raw) if raw and raw.startswith("{") else {}
        return max(1, int(spec["room"]["timeline"]["limit"]))
    except (ValueError, KeyError, TypeError):
        return 10


def mxc_id(mxc: str) -> str:
    return quote(mxc.rsplit("/", 1)[-1])
