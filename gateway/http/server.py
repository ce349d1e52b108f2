"""The gateway's one HTTP server (aiohttp). Every HTTP-facing part mounts on it: the web widget,
the HTTP API, the admin API, platform webhooks, health and metrics."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import re
import socket
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pluto.gateway import fdpolicy
from pluto.gateway.http.guard import ConnectionGuard, HostPolicy, default_hosts, host_refusal
from pluto.redaction import redact_urls

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", "Gateway")  # type: ignore[arg-type]


@web.middleware
async def _client_gone(request: web.Request, handler: Any) -> web.StreamResponse:
    """A client that left before its answer began — a chat socket's handshake or an event
    stream's headers written after this process stalled (a stopped instance continued, a long
    pause of the loop) — makes the handler's first write raise ConnectionResetError, which
    aiohttp would log as a server error with its traceback. Nothing failed here and nobody is
    left to tell: one debug line. A reset from anything else (the client still connected: an
    outgoing call of the handler) goes on as an error."""
    try:
        return await handler(request)
    except ConnectionResetError:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            raise
        log.debug("http: %s %s: the client left before its answer began", request.method,
                  request.path)
        return web.Response(status=499, reason="Client Closed Request")  # (never sent)


class HttpServer:
    def __init__(self, gateway: Gateway, host: str, port: int):
        self.host = host
        self.port = port
        settings = gateway.config.http  # (a restart applies a change: gateway/reload.py)
        self.hosts = HostPolicy(settings.allowed_hosts or default_hosts(host))
        self.idle_timeout = settings.idle_timeout_seconds
        self.guard = ConnectionGuard(
            max_total=settings.max_connections or fdpolicy.http_connections(),
            max_per_client=settings.max_connections_per_client,
            exempt=settings.per_client_exempt, header_timeout=settings.header_timeout_seconds,
            body_timeout=settings.body_timeout_seconds)
        self.app = web.Application(client_max_size=32 * 1024 * 1024,
                                    middlewares=[_client_gone, self.guard.middleware,
                                                 self._check_host])
        self.app[GATEWAY_KEY] = gateway
        gateway.health_reports["http"] = self.guard.report  # (in /readyz: checks.http)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        # keepalive_timeout: aiohttp closes a kept-alive connection with no new request
        # (nor a whole one: a slow one's headers) after this long
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5,
                                     keepalive_timeout=self.idle_timeout)
        await self._runner.setup()
        assert self._runner.server is not None
        self.guard.attach(self._runner.server)
        if ConnectionGuard.can_listen(asyncio.get_running_loop()):
            # the guard accepts: a burst of connections is drained from the kernel's queue
            # as fast as it comes (gateway/http/guard.py)
            socks = await _listening_sockets(self.host, self.port, fdpolicy.listen_backlog())
            self.guard.listen(socks)
            self.port = socks[0].getsockname()[1]
        else:  # (asyncio accepts up to `backlog` connections at once: kept shallow)
            site = web.TCPSite(self._runner, self.host, self.port, backlog=fdpolicy.backlog())
            await site.start()
            if self.port == 0:  # an ephemeral port: find out which one we got
                self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("http: listening on %s (at most %d connections at once; host names: %s)",
                 self.url, self.guard.max_total, ", ".join(self.hosts.entries))
        if self.hosts.entries == default_hosts("") and not _loopback(self.host):
            log.warning("http: http.allowed_hosts is not set: requests by a name other than "
                        "localhost are refused (421); list the names this gateway is reached "
                        "by (IP addresses always work)")

    @web.middleware
    async def _check_host(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every request (pages, APIs, the chat socket, health) names an allowed host, or is
        answered 421: a page on another domain that rebinds its name to this address gets
        nothing (docs/security.md)."""
        host = request.headers.get("Host")
        if not self.hosts.allows(host):
            assert host is not None
            log.warning("http: refused a request for host %r (not in http.allowed_hosts)",
                        host[:100])
            return host_refusal(host)
        return await handler(request)

    async def stop(self) -> None:
        self.guard.stop_listening()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        gw = request.app[GATEWAY_KEY]
        gw.metrics.cluster(gw.instance, gw.shared, gw.cluster.held())
        body, content_type = gw.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _readyz(self, request: web.Request) -> web.Response:
        """200 when the gateway can take and answer messages; else 503 with what is wrong
        (``problems``: storage that cannot commit, a full disk, a provider's wedged sends)."""
        gw = request.app[GATEWAY_KEY]
        await gw.recovery.refresh()  # the disk's free space (off the loop, cached)
        problems = gw.problems()
        free = gw.recovery.disk.free
        checks = {
            "config": True,
            "storage": gw.store.is_open,
            "disk": {"free_mb": round(free / 1e6, 1) if free is not None else None},
            "providers": {name: h.state for name, h in gw.health.items()},
            "intake": {name: q.waiting for name, q in gw.intakes.items()},  # not yet handled
        }
        checks.update({name: report() for name, report in gw.health_reports.items()})
        body = {"checks": checks, "problems": problems}
        if not _admin(request, gw):  # public: states and counts, never paths, hosts or errors
            body = _public(body)
        else:  # the admin sees every detail, but never a password inside a URL
            body = _redacted(body)
        ready = gw.ready
        return web.json_response({"status": "ready" if ready else "not ready",
                                  "instance": gw.instance, **body},
                                 status=200 if ready else 503)


async def _listening_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (all interfaces for ``""``), as
    asyncio's ``create_server`` binds them; port 0: one ephemeral port, the same for all."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as e:
                raise OSError(e.errno, f"error while attempting to bind on address "
                                       f"{address!r}: {e.strerror}") from None
            sock.listen(backlog)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"no address to listen on for {host!r}")
    return socks


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


_WORD = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")  # a state, a name, an id: no spaces, no paths


def _redacted(value: Any) -> Any:
    """``value`` with every string's URL credentials masked (pluto.redaction)."""
    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def _public(value: Any, depth: int = 0) -> Any:
    """What ``/readyz`` shows without the admin key, from an allowlist of kinds of values:
    booleans, numbers, and single words (``running``, ``failed``, an instance id); free text
    (an error message, ``SQLite at /srv/...``, a database host) is left out."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if _WORD.fullmatch(value) and "/" not in value else None
    if depth >= 4:
        return None
    if isinstance(value, dict):
        shown = {str(k): _public(v, depth + 1) for k, v in list(value.items())[:100]
                 if _WORD.fullmatch(str(k))}
        return {k: v for k, v in shown.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [v for v in (_public(x, depth + 1) for x in list(value)[:100]) if v is not None]
    return None


def _admin(request: web.Request, gw: Gateway) -> bool:
    """Whether the request carries the admin API's key (then /readyz shows every detail)."""
    env = gw.config.admin.api_key_env
    key = os.environ.get(env, "") if env else ""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return len(key) >= 16 and scheme.lower() == "bearer" and hmac.compare_digest(
        token.strip().encode(), key.encode())
