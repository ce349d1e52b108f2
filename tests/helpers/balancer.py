"""A small HTTP load balancer for cluster tests: round robin over the gateway instances, as a
real one in front of several ``pluto serve`` processes would be. A backend that refuses the
connection (its instance is dead) is skipped for the next; one that fails mid-request gives
the platform a 502, and the platform delivers again (as Telegram and Slack do)."""

from __future__ import annotations

import itertools

import aiohttp
from aiohttp import web

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Balancer:
    def __init__(self, backends: list[str]):
        self.backends = backends  # base URLs, e.g. http://127.0.0.1:8001
        self._next = itertools.count()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""
        self.forwarded: dict[str, int] = {}

    async def start(self) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        start = next(self._next)
        for i in range(len(self.backends)):
            backend = self.backends[(start + i) % len(self.backends)]
            try:
                async with self._session.request(request.method, backend + request.path_qs,
                                                 headers=headers, data=body) as resp:
                    data = await resp.read()
                    self.forwarded[backend] = self.forwarded.get(backend, 0) + 1
                    return web.Response(status=resp.status, body=data, headers={
                        k: v for k, v in resp.headers.items() if k.lower() not in HOP})
            except aiohttp.ClientConnectorError:
                continue  # not listening: try the next instance
            except (aiohttp.ClientError, TimeoutError):
                return web.Response(status=502, text="the instance failed mid-request")
        return web.Response(status=503, text="no instance is up")
