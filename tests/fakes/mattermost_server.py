"""A fake Mattermost server (API v4) for tests: the provider talks to it over HTTP and a
WebSocket, as it talks to a real one.

    async with FakeMattermost() as fake:
        dm = fake.add_direct(fake.alice)                      # Alice's direct channel with the bot
        fake.user_says(dm, "hello")                           # a posted event on the bot's sockets
        [reply] = await fake.wait_until(lambda: fake.bot_posts(dm))

It behaves like Mattermost where a client can tell:

- ``Authorization: Bearer <token>`` on every REST call (401 ``api.context.session_expired``);
  errors are ``{"id", "message", "status_code"}``; a rate-limit window answers ``429`` in
  plain text with ``X-Ratelimit-Reset`` (seconds left) and ``Retry-After``.
- The WebSocket (``/api/v4/websocket``): ``authentication_challenge`` with the token (a wrong
  one: ``FAIL`` and the socket closes), then ``hello``; events carry a ``seq`` growing by one
  per connection; ``posted`` events carry the post as a JSON string. An event is sent once, to
  the sockets open at that moment: nothing is kept for a socket that reconnects — a client
  catches up with ``GET /channels/{id}/posts?since=<ms>`` (posts created or changed after it).
  ``user_typing`` actions are answered and recorded.
- Posts: ``POST /posts`` (member of the channel, at most 16383 characters, a ``root_id`` in the
  same channel, ``file_ids`` uploaded by the bot to that channel), ``PUT /posts/{id}/patch``
  (the author only), ``DELETE /posts/{id}``, ``GET /posts/{id}``.
- Files: ``POST /files`` (multipart ``channel_id`` + ``files``), ``GET /files/{id}``,
  ``GET /files/{id}/info``.
- ``GET /users/me``, ``/users/me/teams``, ``/users/me/teams/{id}/channels``, ``/channels/{id}``.

Interactive message buttons, and clicks posted to their integration URL: mattermost_buttons.py.
Test controls (``mattermost_state.State``): ``add_direct``, ``add_channel``, ``user_says``,
``touch``, ``disconnect`` (every socket closes, as a network blip does), ``throttle``,
``fail_next``; records ``calls``, ``typing``, ``edits``, ``refused``, ``sockets_opened``.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.mattermost_buttons import Buttons, actions_of, check_attachments
from tests.fakes.mattermost_state import (FILES_PER_POST, MAX_FILE, MAX_MESSAGE, ApiFailure,
                                          Call, Channel, State, new_id)

__all__ = ["ApiFailure", "FakeMattermost", "TOKEN"]

TOKEN = "mmfakebottoken0123456789abc"
API = "/api/v4"


class _Socket:
    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.seq = 0

    async def send(self, event: str, data: dict[str, Any], broadcast: dict[str, Any]) -> None:
        frame = {"event": event, "data": data, "broadcast": broadcast, "seq": self.seq}
        self.seq += 1
        if not self.ws.closed:
            await self.ws.send_json(frame)


class FakeMattermost(Buttons, State):
    """One server with a bot account. Use ``async with`` or ``start()`` / ``stop()``."""

    def __init__(self, *, token: str = TOKEN, bot_username: str = "pluto") -> None:
        super().__init__(token, bot_username)
        self._init_buttons()
        self.sockets: list[_Socket] = []
        self.sockets_opened = 0  # authenticated sockets so far
        self._runner: web.AppRunner | None = None
        self.port = 0

    # lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeMattermost:
        app = web.Application(client_max_size=MAX_FILE + 1024 * 1024)
        app.router.add_get(f"{API}/websocket", self._websocket)
        app.router.add_route("*", API + "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        await self.disconnect()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeMattermost:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def disconnect(self) -> None:
        """Every open socket closes (what was sent on them stays sent; nothing is kept)."""
        sockets, self.sockets = self.sockets, []
        for sock in sockets:
            await sock.ws.close(code=1001, message=b"going away")
        self.notify()

    # what people do ---------------------------------------------------------------------------

    async def user_says(self, channel_id: str, text: str = "", *,
                        sender: dict[str, Any] | None = None, mention: bool = False,
                        root_id: str = "", file: tuple[str, bytes, str] | None = None
                        ) -> dict[str, Any]:
        """A person posts; the ``posted`` event goes to the sockets open now."""
        sender = sender or self.alice
        channel = self.channels[channel_id]
        if mention:
            text = f"@{self.bot['username']} {text}"
        files = [self.store_file(file[1], file[0], file[2], channel_id, sender["id"])["id"]
                 ] if file else []
        post = self.make_post(channel, sender["id"], text, root_id, files)
        await self._broadcast_post(channel, post, sender)
        return post

    async def _broadcast_post(self, channel: Channel, post: dict[str, Any],
                              sender: dict[str, Any]) -> None:
        data: dict[str, Any] = {
            "channel_display_name": channel.display_name, "channel_name": channel.name,
            "channel_type": channel.type, "post": json.dumps(post),
            "sender_name": f"@{sender['username']}", "set_online": True,
            "team_id": channel.team_id}
        mentioned = [u for u in channel.members if u != sender["id"]
                     and f"@{self.users[u]['username']}" in post["message"]]
        if mentioned:
            data["mentions"] = json.dumps(mentioned)
        await self._broadcast("posted", data, channel)

    async def _broadcast(self, event: str, data: dict[str, Any], channel: Channel) -> None:
        if self.bot["id"] in channel.members:
            for sock in list(self.sockets):
                await sock.send(event, data, {"channel_id": channel.id, "team_id": "",
                                              "user_id": "", "omit_users": None})
        self.notify()

    # the WebSocket ------------------------------------------------------------------------------

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=None)
        await ws.prepare(request)
        sock = _Socket(ws)
        authed = request.headers.get("Authorization") == f"Bearer {self.token}"
        if authed:
            await self._hello(sock)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                frame = json.loads(msg.data)
            except ValueError:
                continue
            action, seq = frame.get("action"), frame.get("seq")
            data = frame.get("data") if isinstance(frame.get("data"), dict) else {}
            if action == "authentication_challenge" and not authed:
                if data.get("token") != self.token:
                    await ws.send_json({"status": "FAIL", "seq_reply": seq, "error": {
                        "id": "api.web_socket_router.not_authenticated.app_error"}})
                    await ws.close()
                    break
                authed = True
                await ws.send_json({"status": "OK", "seq_reply": seq})
                await self._hello(sock)
            elif not authed:
                await ws.close()  # the server wants the challenge first
                break
            elif action == "user_typing":
                self.typing.append((str(data.get("channel_id") or ""),
                                    str(data.get("parent_id") or "")))
                await ws.send_json({"status": "OK", "seq_reply": seq})
                self.notify()
        if sock in self.sockets:
            self.sockets.remove(sock)
        self.notify()
        return ws

    async def _hello(self, sock: _Socket) -> None:
        self.sockets.append(sock)
        self.sockets_opened += 1
        await sock.send("hello", {"server_version": "10.5.0.fake", "connection_id": new_id()},
                        {"user_id": self.bot["id"]})
        self.notify()

    # the REST API -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        call = Call(request.method, path, dict(request.query))
        self.calls.append(call)
        try:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise ApiFailure(401, "api.context.session_expired.app_error",
                                 "Invalid or expired session, please login again.")
            self.check_failures(call)
            response = await self._route(request, path.strip("/").split("/"))
        except ApiFailure as failure:
            response = failure.response()
        call.status = response.status
        self.notify()
        return response

    async def _route(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        method = request.method
        match parts:
            case ["users", "me"]:
                return web.json_response(self.bot)
            case ["users", user_id] if user_id in self.users:
                return web.json_response(self.users[user_id])
            case ["users", "me", "teams"]:
                return web.json_response([self.team])
            case ["users", "me", "teams", team, "channels"]:
                return web.json_response(self._my_channels(team))
            case ["channels", channel_id]:
                return web.json_response(self._member_of(channel_id).as_json())
            case ["channels", channel_id, "posts"]:
                return web.json_response(self._posts_since(channel_id, request.query))
            case ["posts"] if method == "POST":
                return await self._create_post(await _json(request))
            case ["posts", post_id] if method == "GET":
                return web.json_response(self._visible_post(post_id))
            case ["posts", post_id] if method == "DELETE":
                return await self._delete_post(post_id)
            case ["posts", post_id, "patch"] if method == "PUT":
                return await self._patch_post(post_id, await _json(request))
            case ["files"] if method == "POST":
                return await self._upload(request)
            case ["files", file_id]:
                data, info = self._file(file_id)
                return web.Response(body=data, content_type=info["mime_type"])
            case ["files", file_id, "info"]:
                return web.json_response(self._file(file_id)[1])
        raise ApiFailure(404, "api.context.404.app_error", "Sorry, we could not find the page.")

    def _my_channels(self, team: str) -> list[dict[str, Any]]:
        if team != self.team["id"]:
            raise ApiFailure(403, "api.context.permissions.app_error", "no permission")
        return [c.as_json() for c in self.channels.values()
                if self.bot["id"] in c.members and c.team_id in ("", team)]

    def _member_of(self, channel_id: str) -> Channel:
        channel = self.channels.get(channel_id)
        if channel is None:
            raise ApiFailure(404, "app.channel.get.existing.app_error", "Channel not found")
        if self.bot["id"] not in channel.members:
            raise ApiFailure(403, "api.context.permissions.app_error",
                             "You do not have the appropriate permissions.")
        return channel

    def _posts_since(self, channel_id: str, query: Any) -> dict[str, Any]:
        self._member_of(channel_id)
        try:
            since = int(query.get("since") or 0)
        except ValueError:
            raise ApiFailure(400, "api.context.invalid_url_param.app_error",
                             "Invalid or missing since parameter.") from None
        posts = [self.posts[i] for i in self.order if self.posts[i]["channel_id"] == channel_id]
        if since:
            found = [p for p in posts if p["update_at"] > since]
        else:
            found = posts[-60:]
        found.sort(key=lambda p: p["create_at"], reverse=True)
        return {"order": [p["id"] for p in found], "posts": {p["id"]: p for p in found},
                "next_post_id": "", "prev_post_id": ""}

    def _visible_post(self, post_id: str) -> dict[str, Any]:
        post = self.posts.get(post_id)
        if post is None or post["delete_at"]:
            raise ApiFailure(404, "app.post.get.app_error", "Unable to get the post.")
        self._member_of(post["channel_id"])
        return post

    def _own_post(self, post_id: str) -> dict[str, Any]:
        post = self._visible_post(post_id)
        if post["user_id"] != self.bot["id"]:
            raise ApiFailure(403, "api.context.permissions.app_error",
                             "You do not have the appropriate permissions.")
        return post

    async def _create_post(self, body: dict[str, Any]) -> web.Response:
        channel = self._member_of(str(body.get("channel_id") or ""))
        message = body.get("message", "")
        if not isinstance(message, str) or len(message) > MAX_MESSAGE:
            raise ApiFailure(400, "model.post.is_valid.message_length.app_error",
                             f"Message must be at most {MAX_MESSAGE} characters.")
        root = str(body.get("root_id") or "")
        if root and (root not in self.posts or self.posts[root]["channel_id"] != channel.id
                     or self.posts[root]["root_id"]):
            raise ApiFailure(400, "api.post.create_post.root_id.app_error", "Invalid RootId.")
        file_ids = self._files_for(body.get("file_ids"), channel.id)
        if not message and not file_ids:
            raise ApiFailure(400, "model.post.is_valid.msg.app_error", "A post needs text.")
        props = check_attachments(body.get("props"))
        post = self.make_post(channel, self.bot["id"], message, root, file_ids)
        post["props"].update(props)
        if actions_of(post):
            self.created_actions[post["id"]] = copy.deepcopy(actions_of(post))
        self.sent_at[post["id"]] = time.monotonic()
        await self._broadcast_post(channel, post, self.bot)
        return web.json_response(post, status=201)

    def _files_for(self, raw: Any, channel_id: str) -> list[str]:
        ids = raw if isinstance(raw, list) else []
        if len(ids) > FILES_PER_POST:
            raise ApiFailure(400, "model.post.is_valid.file_ids.app_error", "Too many files.")
        for file_id in ids:
            found = self.files.get(str(file_id))
            if found is None or found[1]["channel_id"] != channel_id or found[1]["post_id"]:
                raise ApiFailure(400, "api.post.create_post.file_ids.app_error",
                                 "A file is unknown or already attached.")
        return [str(f) for f in ids]

    async def _patch_post(self, post_id: str, body: dict[str, Any]) -> web.Response:
        post = self._own_post(post_id)
        message = body.get("message")
        if message is not None:
            if not isinstance(message, str) or len(message) > MAX_MESSAGE:
                raise ApiFailure(400, "model.post.is_valid.message_length.app_error",
                                 f"Message must be at most {MAX_MESSAGE} characters.")
            post["message"] = message
            post["edit_at"] = post["update_at"] = self.now_ms()
            self.edits.setdefault(post_id, []).append(message)
        channel = self.channels[post["channel_id"]]
        await self._broadcast("post_edited", {"post": json.dumps(post)}, channel)
        return web.json_response(post)

    async def _delete_post(self, post_id: str) -> web.Response:
        post = self._own_post(post_id)
        post["delete_at"] = post["update_at"] = self.now_ms()
        channel = self.channels[post["channel_id"]]
        await self._broadcast("post_deleted", {"post": json.dumps(post)}, channel)
        return web.json_response({"status": "OK"})

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        channel = self._member_of(str(form.get("channel_id") or ""))
        upload = form.get("files")
        if not isinstance(upload, web.FileField):
            raise ApiFailure(400, "api.file.upload_file.incorrect_number_of_files.app_error",
                             "Unable to upload files. Incorrect number of files specified.")
        data = upload.file.read()
        if len(data) > MAX_FILE:
            raise ApiFailure(413, "api.file.file_upload.exceeds", "File too large.")
        info = self.store_file(data, upload.filename, upload.content_type, channel.id,
                               self.bot["id"])
        return web.json_response({"file_infos": [info], "client_ids": []}, status=201)

    def _file(self, file_id: str) -> tuple[bytes, dict[str, Any]]:
        found = self.files.get(file_id)
        if found is None:
            raise ApiFailure(404, "app.file_info.get.app_error", "Unable to get the file.")
        self._member_of(found[1]["channel_id"])
        return found


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError:
        raise ApiFailure(400, "api.context.invalid_body_param.app_error",
                         "Invalid or missing body.") from None
    if not isinstance(body, dict):
        raise ApiFailure(400, "api.context.invalid_body_param.app_error", "Invalid body.")
    return body
