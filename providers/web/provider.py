"""The web provider: a chat widget any page embeds, talking to the gateway over a WebSocket.

It mounts on the gateway's HTTP server: ``/ws`` (the chat socket), ``/widget.js`` and
``/widget.css`` (the widget), ``/`` (a demo page) and ``/web/file/…`` (signed links to charts).
A visitor's chat id comes from their verified session token only. The answer to a message is
shown from the run's own event stream (stored, then live: :func:`gateway.watch.follow_run`), so
every tab of the chat sees the same frames, in order, with tool results (tables, charts).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import WSCloseCode, web

from pluto.errors import ConfigError
from pluto.gateway.http.server import GATEWAY_KEY
from pluto.gateway.ports import Inbox, Provider, ProviderContext
from pluto.types import Capabilities, IncomingMessage, OutgoingMessage, Route, RunStart
from pluto.gateway.transcript import follow_run
from pluto.providers.web import pages, protocol
from pluto.providers.web.rooms import Rooms
from pluto.providers.web.settings import WebSettings, load_settings
from pluto.providers.web.socket import serve_socket
from pluto.providers.web.tokens import FileLinks, SessionSigner, load_key

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

FINISHED_RUNS_KEPT = 2000


class WebProvider(Provider):
    name = "web"
    capabilities = Capabilities(max_message_length=100_000, markup="markdown",
                                streams_deltas=True)

    def __init__(self, settings: WebSettings, *, key: bytes, data_dir: Path, backend: Gateway):
        self.settings = settings
        self.signer = SessionSigner(key, max_age=settings.session_days * 86400)
        self.links = FileLinks(key, data_dir)
        self.backend = backend
        self.rooms = Rooms()
        self.sockets: set[web.WebSocketResponse] = set()
        self._inbox: Inbox | None = None
        self._ready = asyncio.Event()
        self._follows: dict[str, asyncio.Task[None]] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._message_ids: dict[str, str] = {}  # run id → the client's message id

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> WebProvider:
        settings = load_settings(ctx.config.model_dump())
        if ctx.http is None:
            raise ConfigError([("pluto.yaml", None, "providers.web",
                                "the web chat needs the HTTP server: run 'pluto serve'")])
        backend = ctx.http.app[GATEWAY_KEY]
        provider = cls(settings, key=load_key(ctx.data_dir, settings.session_secret_env),
                       data_dir=ctx.data_dir, backend=backend)
        provider.mount(ctx.http.app)
        backend.run_listeners.append(provider.on_run)
        return provider

    def mount(self, app: web.Application) -> None:
        app.router.add_get("/ws", self._socket)
        pages.mount(app, self)
        app.on_shutdown.append(self._on_shutdown)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        return await serve_socket(self, request)

    # the gateway side ---------------------------------------------------------------------

    async def run(self, inbox: Inbox) -> None:
        self._inbox = inbox
        self._ready.set()
        try:
            await asyncio.Event().wait()  # messages arrive through the sockets
        finally:
            self._ready.clear()

    async def deliver(self, msg: IncomingMessage) -> None:
        """Hand a visitor's message to the gateway (waiting while the provider (re)starts)."""
        await self._ready.wait()
        assert self._inbox is not None
        await self._inbox(msg)

    def route(self, probe: IncomingMessage) -> Route | None:
        return self.backend.routes.route(probe)

    async def on_run(self, msg: IncomingMessage, run_id: str) -> None:
        """A run starts for one of our chats: show it to every tab of the chat, live."""
        if msg.provider == self.name:
            client_id = (msg.message_id or "").removeprefix(f"{msg.chat_id}:")
            self._message_ids[run_id] = client_id
            self._follow(msg.chat_id, run_id)

    def _follow(self, chat_id: str, run_id: str) -> None:
        if run_id in self._follows or run_id in self._finished:
            return
        self.rooms.run_started(chat_id, run_id)
        self._follows[run_id] = asyncio.create_task(self._show_run(run_id),
                                                    name=f"web:run:{run_id}")

    async def _show_run(self, run_id: str) -> None:
        try:
            async with aclosing(follow_run(self.backend.store, self.backend.hub,
                                           run_id)) as events:
                async for seq, event in events:
                    frame = protocol.run_frame(seq, event, self.links.link)
                    if frame is not None and isinstance(event, RunStart):
                        frame["message_id"] = self._message_ids.get(run_id)
                    if frame is not None:
                        self.rooms.run_frame(run_id, frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("web: showing run %s failed", run_id)
        finally:
            self.rooms.run_ended(run_id)
            self._follows.pop(run_id, None)
            self._message_ids.pop(run_id, None)
            self._finished[run_id] = None
            while len(self._finished) > FINISHED_RUNS_KEPT:
                self._finished.popitem(last=False)

    async def send(self, message: OutgoingMessage) -> str | None:
        run_id = message.run_id
        if run_id is not None and (run_id in self._follows or run_id in self._finished
                                   or await self.backend.store.run(run_id) is not None):
            # A run's text, tools and errors reach the tabs from its event stream; this only
            # makes sure that stream is being shown (e.g. a run we did not see start).
            self._follow(message.chat_id, run_id)
            return run_id
        match message.kind:
            case "reply" | "delta":
                frame = protocol.frame("message.final", run_id=None, text=message.text)
            case "notice":
                frame = protocol.frame("notice", text=message.text)
            case _:
                frame = protocol.error("gateway", message.text)
        self.rooms.broadcast(message.chat_id, frame)
        return str(frame["id"])

    # shutting down ------------------------------------------------------------------------

    async def _on_shutdown(self, app: web.Application) -> None:
        for ws in list(self.sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def close(self) -> None:
        for task in list(self._follows.values()):
            task.cancel()
        await asyncio.gather(*self._follows.values(), return_exceptions=True)
        for client in self.rooms.all():
            await client.close()
