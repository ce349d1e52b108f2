"""A gateway serving HTTP on loopback (web chat, API), and a chat-socket client for tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.runtime.testing import ScriptedModel

API_KEY = "test-api-key-0123456789"


@asynccontextmanager
async def served(config_dir: Path, data_dir: Path, model: ScriptedModel | None = None, *,
                 web: dict[str, Any] | None = None, api: dict[str, Any] | None = None,
                 **config: Any) -> AsyncIterator[Gateway]:
    """``pluto serve`` in-process on an ephemeral port, with the web and API providers."""
    providers = {"web": {"enabled": True, **(web or {})},
                 "api": {"enabled": True, "keys_env": "PLUTO_TEST_API_KEYS", **(api or {})}}
    cfg = PlutoConfig(data_dir=data_dir, providers=providers, **config)
    gw = Gateway(config_dir, config=cfg, model_factory=model or ScriptedModel(), serve=True,
                 http_bind=("127.0.0.1", 0))
    async with gw:
        for name in providers:
            await wait_for(lambda n=name: gw.health[n].state == "running")
        yield gw


async def wait_for(condition: Callable[[], Any], timeout: float = 10) -> Any:
    """Wait until ``condition()`` (sync or async) is truthy; its value."""
    async def loop() -> Any:
        while True:
            value = condition()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.01)
    return await asyncio.wait_for(loop(), timeout)


def disk_full_once(gw: Gateway) -> None:
    """The next message the gateway's inbox records fails as a full SQLite disk would."""
    import sqlite3
    inbox = gw.store.inbound
    real = inbox.accept

    async def full(*args: Any) -> Any:
        inbox.accept = real  # type: ignore[method-assign]  # (once)
        raise sqlite3.OperationalError("database or disk is full")

    inbox.accept = full  # type: ignore[method-assign]


def url(gw: Gateway, path: str = "") -> str:
    assert gw.http is not None
    return f"http://127.0.0.1:{gw.http.port}{path}"


class Tab:
    """One browser tab's chat socket: send frames, read frames until one matches."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self.close_code: int | None = None  # as the server's close frame said

    @classmethod
    async def open(cls, session: aiohttp.ClientSession, gw: Gateway, *, token: str | None = None,
                   agent: str | None = None, origin: str | None = None,
                   hello: bool = True) -> Tab:
        headers = {"Origin": origin} if origin else {}
        tab = cls(await session.ws_connect(url(gw, "/ws"), headers=headers))
        if hello:
            await tab.send(type="hello", token=token, agent=agent)
            await tab.until("history")
        return tab

    @property
    def ready(self) -> dict[str, Any]:
        return next(f for f in self.frames if f["type"] == "ready")

    @property
    def history(self) -> list[dict[str, Any]]:
        return next(f for f in self.frames if f["type"] == "history")["messages"]

    async def send(self, **frame: Any) -> None:
        await self.ws.send_json(frame)

    async def next(self, timeout: float = 10) -> dict[str, Any] | None:
        msg = await self.ws.receive(timeout)
        if msg.type == aiohttp.WSMsgType.CLOSE:
            self.close_code = msg.data
        if msg.type != aiohttp.WSMsgType.TEXT:
            return None
        frame = msg.json()
        self.frames.append(frame)
        return frame

    async def until(self, kind: str, match: Callable[[dict[str, Any]], bool] = lambda f: True,
                    timeout: float = 10) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            while True:
                frame = await self.next(timeout)
                if frame is None:
                    raise ConnectionError(f"the socket closed while waiting for {kind}: "
                                          f"{self.ws.close_code}")
                if frame["type"] == kind and match(frame):
                    return frame
        return await asyncio.wait_for(read(), timeout)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]

    async def ask(self, text: str, msg_id: str | None = None) -> dict[str, Any]:
        """Send a message; the final frame of its answer (run or command)."""
        await self.send(type="message", text=text, **({"id": msg_id} if msg_id else {}))
        return await self.until("message.final")
