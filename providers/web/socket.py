"""One chat socket (``GET /ws``): the origin check, ``hello``, then the visitor's frames.

Bad input never ends the connection with a stack trace: each wrong frame gets one ``error``
frame saying what was wrong. Only a frame over the hard size cap (closed by aiohttp with 1009),
a flood that goes on after the rate-limit notice, or a missing ``hello`` close it (1008).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, web

from pluto.gateway.ports import TranscriptItem
from pluto.providers.handover import NotRecorded
from pluto.ids import new_id
from pluto.types import IncomingMessage
from pluto.providers.web import history, protocol
from pluto.providers.web.protocol import (FileStart, Hello, Message, Ping, ProtocolError, Stop,
                                          TokenBucket)
from pluto.providers.web.rooms import Client
from pluto.providers.web.uploads import Uploads
from pluto.types import Attachment

if TYPE_CHECKING:
    from pluto.providers.web.provider import WebProvider

log = logging.getLogger(__name__)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
HEARTBEAT_SECONDS = 30.0
UNRECEIVED_HOLD = 30.0  # seconds a message not received holds back the ones sent after it
PINGS_FREE = 3  # pings per ping_seconds not counted against the rate limit (a tab sends one)


def origin_allowed(request: web.Request, allowed: list[str]) -> bool:
    """Browsers always send ``Origin`` on a WebSocket handshake; other clients may not (and
    could forge it anyway). Allowed: the configured ones, a page on this machine (loopback),
    and the gateway's own origin — ``Origin`` equal to ``Host``, which the HTTP server has
    already checked against ``http.allowed_hosts`` (a DNS-rebinding page's Host is its own
    name: answered 421 before this handler runs; docs/security.md)."""
    origin = request.headers.get("Origin")
    if origin is None or "*" in allowed:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    if f"{parts.scheme}://{parts.netloc.lower()}" in allowed or parts.hostname in LOCAL_HOSTS:
        return True
    return parts.netloc.lower() == (request.host or "").lower()


async def serve_socket(provider: WebProvider, request: web.Request) -> web.StreamResponse:
    if not origin_allowed(request, provider.settings.allowed_origins):
        log.info("web: refused a chat socket from origin %r", request.headers.get("Origin"))
        return web.json_response({"error": "This page's origin may not open the chat."},
                                 status=403)
    ws = web.WebSocketResponse(max_msg_size=provider.settings.max_frame_bytes,
                               heartbeat=HEARTBEAT_SECONDS)
    await ws.prepare(request)
    provider.sockets.add(ws)
    conn = Connection(provider, ws)
    try:
        await conn.serve()
    except Exception:
        log.exception("web: a chat socket failed")
    finally:
        provider.sockets.discard(ws)
        await conn.cleanup()
    return ws


class Connection:
    def __init__(self, provider: WebProvider, ws: web.WebSocketResponse):
        self.p = provider
        self.ws = ws
        s = provider.settings
        self.bucket = TokenBucket(s.rate_messages, s.rate_seconds)
        self.pings = TokenBucket(PINGS_FREE, s.ping_seconds)
        self.dropped = 0
        self.client: Client | None = None
        self.closing = False
        self.visitor = ""
        self.agent: str | None = None
        self.uploads = Uploads(provider.links.root / "uploads" / "web",
                               int(s.max_upload_mb * 2**20))
        # a message not received (storage failed) and until when the ones after it wait for
        # it: recorded ahead of it, they would be answered ahead of it when it comes again
        self.unreceived: tuple[str, float] | None = None

    def send(self, frame: dict[str, Any]) -> None:
        """After ``hello``: in order with the chat's other frames."""
        assert self.client is not None
        self.client.push(frame)

    async def _texts(self) -> str | None:
        """The next text frame that passes the rate limit; None when the socket closed."""
        while not self.closing:
            msg = await self.ws.receive()
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED,
                            WSMsgType.ERROR):
                return None
            if msg.type == WSMsgType.BINARY and self.uploads.receiving:  # a file's bytes
                if (reply := await self.uploads.chunk(msg.data)) is not None:
                    self.send(reply)
                continue
            if (msg.type == WSMsgType.TEXT and protocol.is_ping(msg.data)
                    and self.pings.take() == 0):  # (more pings than a tab sends are frames)
                await self._reply(protocol.frame("pong"))
                continue
            if not await self._admitted():
                continue
            if msg.type == WSMsgType.TEXT:
                return msg.data
            await self._reply(protocol.error("bad_frame", "Frames must be JSON text, "
                                             "not binary."))
        return None

    async def _admitted(self) -> bool:
        wait = self.bucket.take()
        if wait == 0:
            self.dropped = 0
            return True
        self.dropped += 1
        if self.dropped == 1:  # one notice per streak, not one per dropped frame
            await self._reply(protocol.error(
                "rate_limited", "You are sending messages too fast; please wait a few seconds.",
                retry_after=round(wait, 1)))
        elif self.dropped > 2 * self.p.settings.rate_messages:
            log.warning("web: closing a flooding chat socket (chat %s)",
                        self.client.chat_id if self.client else "before hello")
            self.closing = True
            if self.client is not None:
                self.client.stop(WSCloseCode.POLICY_VIOLATION, b"too many messages")
            else:
                await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"too many messages")
        return False

    async def _reply(self, frame: dict[str, Any]) -> None:
        if self.client is not None:
            self.send(frame)
        elif not self.ws.closed:
            await self.ws.send_str(protocol.encode(frame))

    async def serve(self) -> None:
        hello = await self._hello()
        if hello is None or not await self._join(hello):
            return
        max_chars = self.p.settings.max_message_chars
        while (raw := await self._texts()) is not None:
            try:
                frame = protocol.parse_frame(raw, max_chars)
            except ProtocolError as e:
                self.send(protocol.error(e.code, e.message, reply_to=e.reply_to))
                continue
            match frame:
                case Message():
                    await self._message(frame)
                case FileStart():
                    assert self.client is not None
                    self.send(await self.uploads.announce(frame, self.client.chat_id))
                case Stop():
                    await self._deliver("/stop", new_id(), stop=True)
                case Ping():
                    self.send(protocol.frame("pong"))
                case Hello():
                    self.send(protocol.error("bad_frame", "This connection already said hello."))

    async def _hello(self) -> Hello | None:
        try:
            async with asyncio.timeout(self.p.settings.hello_timeout_seconds):
                while (raw := await self._texts()) is not None:
                    try:
                        frame = protocol.parse_frame(raw, self.p.settings.max_message_chars)
                    except ProtocolError as e:
                        await self._reply(protocol.error(e.code, e.message, reply_to=e.reply_to))
                        continue
                    if isinstance(frame, Hello):
                        return frame
                    if isinstance(frame, Ping):
                        await self._reply(protocol.frame("pong"))
                        continue
                    await self._reply(protocol.error("hello_required",
                                                     "Say hello first (send a 'hello' frame)."))
        except TimeoutError:
            await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"expected hello")
        return None

    async def _join(self, hello: Hello) -> bool:
        verified = self.p.signer.verify(hello.token)
        self.visitor = verified.visitor or self.p.signer.new_visitor()
        self.agent = hello.agent
        chat_id = self.visitor if not self.agent else f"{self.visitor}:{self.agent}"
        if self.p.rooms.count(chat_id) >= self.p.settings.max_sockets_per_visitor:
            await self.ws.send_str(protocol.encode(protocol.error(
                "too_many_tabs", "This chat is open in too many tabs; close one and reload.")))
            await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"too many tabs")
            return False
        self.client = Client(self.ws, chat_id)
        self.p.rooms.join(self.client)  # frames from now on are held until the history is out
        probe = self._incoming("", None)
        route = self.p.route(probe)
        ready = protocol.frame(
            "ready", token=self.p.signer.issue(self.visitor), agent=route.agent if route else None,
            title=self.p.settings.title, reset=verified.problem if hello.token else None,
            limits={"max_message_chars": self.p.settings.max_message_chars,
                    "max_upload_bytes": self.uploads.max_bytes,
                    "max_files": protocol.MAX_FILES},
            ping_seconds=self.p.settings.ping_seconds)
        history = await self._history(probe)
        first = [ready, history]
        if route is None:
            first.append(protocol.error("no_agent", "This chat is not connected to an agent."))
        self.client.start(first)
        return True

    async def _history(self, probe: IncomingMessage) -> dict[str, Any]:
        # the transcript and the chat's messages waiting for their turn, as at one moment
        items, waiting = await self.p.conversation(probe)
        assert self.client is not None
        # the chat's last run, when it goes on elsewhere, is followed from storage
        last = next((i.run_id for i in reversed(items) if i.role == "user"), None)
        resumed = await self.p.resume(probe.chat_id, last, answered=any(
            i.role == "assistant" and i.run_id == last for i in items))
        live = self.client.held_runs() | resumed  # these come as frames after the history
        shown = await history.with_ends(self.p.runs, [
            d for item in items if not (item.role != "user" and item.run_id in live)
            if (d := self._shown(item)) is not None], live)
        prefix = f"{probe.chat_id}:"
        shown = self._cut_off(shown, prefix)
        # then the chat's messages waiting for their turn (their runs are shown as they begin)
        begun = {i.message_id for i in items if i.role == "user" and i.message_id}
        shown += [{"role": "user", "text": m.text, "run_id": None, "ts": m.timestamp,
                   "id": (m.message_id or "").removeprefix(prefix),
                   "files": [a.filename for a in m.attachments]}
                  for m in waiting if m.message_id not in begun
                  if m.firing is None and m.approval is None and m.text.strip() != "/stop"]
        return protocol.frame("history", messages=shown)

    def _cut_off(self, items: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
        """A run cut off (its instance stopped) is answered again by a run of its own: not
        shown as unfinished — its message is, waiting for that run (followed when it begins,
        drawn after the message: the message carries the id the tab gave it)."""
        again: dict[str, str] = {}  # run cut off -> its message's id in the tab
        for item in items:
            source = item.pop("source_id", None) or ""
            if item["role"] == "run.end" and item["outcome"] == "interrupted" and \
                    source.startswith(prefix):
                again[item["run_id"]] = source[len(prefix):]
                assert self.client is not None
                self.p.await_answer(self.client.chat_id, source)
        if not again:
            return items
        return [item | {"id": again[item["run_id"]]}
                if item["role"] == "user" and item["run_id"] in again else item
                for item in items if item["role"] == "user" or item["run_id"] not in again]

    def _shown(self, item: TranscriptItem) -> dict[str, Any] | None:
        out: dict[str, Any] = {"role": item.role, "text": item.text, "run_id": item.run_id,
                               "ts": item.ts}
        assert self.client is not None
        prefix = f"{self.client.chat_id}:"
        if item.message_id is not None and item.message_id.startswith(prefix):
            out["id"] = item.message_id[len(prefix):]  # (the tab's: drawn once, answers after)
        if item.role == "tool":
            details = protocol.display_details(item.details, self.p.links.link)
            if details is None:
                return None
            out |= {"name": item.name, "details": details}
        return out

    def _incoming(self, text: str, message_id: str | None,
                  files: tuple[Attachment, ...] = ()) -> IncomingMessage:
        assert self.client is not None
        return IncomingMessage(provider=self.p.name, chat_id=self.client.chat_id,
                               user_id=self.visitor, user_name="web visitor", text=text,
                               message_id=message_id, guild_id=self.agent, is_direct=True,
                               attachments=files)

    async def _message(self, frame: Message) -> None:
        assert self.client is not None
        if self.p.route(self._incoming(frame.text, None)) is None:
            self.send(protocol.error("no_agent", "This chat is not connected to an agent.",
                                     reply_to=frame.id))
            return
        files = self.uploads.take(frame.files)
        if isinstance(files, str):
            self.send(protocol.error("file_missing", files, reply_to=frame.id))
            return
        if not await self._deliver(frame.text, frame.id, files=files):
            return
        self.uploads.sent(frame.files)  # the gateway's now (kept as any platform's files)
        self.send(protocol.frame("ack", reply_to=frame.id))  # recorded: the tab may forget it
        self.p.rooms.broadcast(self.client.chat_id, protocol.frame(
            "message.user", id=frame.id, text=frame.text,
            files=[a.filename for a in files]), skip=self.client)

    async def _deliver(self, text: str, client_id: str, *, stop: bool = False,
                       files: tuple[Attachment, ...] = ()) -> bool:
        """Hand the message over; False (and the tab told why) when it was not recorded. A
        message sent after one that was not received is not received either until that one
        is (the tab sends them again in order) — or for :data:`UNRECEIVED_HOLD` seconds at
        most (a client that does not send it again)."""
        assert self.client is not None
        if self.unreceived is not None and not stop:
            first, until = self.unreceived
            if client_id != first and time.monotonic() < until:
                self._not_received(client_id)
                return False
            self.unreceived = None
        try:
            await self.p.deliver(self._incoming(text, f"{self.client.chat_id}:{client_id}",
                                                files))
        except NotRecorded:  # storage failed (logged once per outage): the tab sends it again
            if stop:  # (the tab keeps no stop to send again)
                self.send(protocol.error("internal", "The answer could not be stopped just "
                                         "now (a problem on our side); please try again."))
                return False
            self._not_received(client_id)
            if self.unreceived is None:
                self.unreceived = (client_id, time.monotonic() + UNRECEIVED_HOLD)
            return False
        except Exception:
            log.exception("web: handling a message of chat %s failed", self.client.chat_id)
            self.send(protocol.error("internal", "Something went wrong on our side; "
                                     "please try again.", reply_to=client_id))
            return False
        return True

    def _not_received(self, client_id: str) -> None:
        self.send(protocol.error(
            "not_received", "Your message was not received (a problem on our side); it "
            "will be sent again in a moment.", reply_to=client_id,
            retry_after=round(max(0.5, self.p.handover.backoff()), 1)))

    async def cleanup(self) -> None:
        await self.uploads.discard()
        if self.client is not None:
            self.p.rooms.leave(self.client)
            await self.client.close()
        if not self.ws.closed:
            await self.ws.close()
