"""Who may talk to the HTTP server, and for how long (docs/security.md, "HTTP").

- :class:`HostPolicy`: the names the ``Host`` header may carry. A page on an attacker's domain
  that rebinds its name to 127.0.0.1 reaches the gateway with ``Host: attacker.example``: it is
  answered 421 before any handler (the web chat's socket included) runs.
- :class:`ConnectionGuard`: a new connection must send its first request within the header
  timeout; a request body that stalls is answered 408; connections are limited in total (below
  the open-files limit) and per client address. At a limit the connection idle the longest
  makes room; when every one is busy the newcomer gets a 503 and is closed at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = ("", "0.0.0.0", "::", "*")
MIN_IDLE = 1.0  # a connection answered less than this ago is never closed to make room
SCAN = 64  # ... looked for among this many of the longest idle
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: 5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s")
BUSY_BODY = (b'{"error": "The server has too many connections open; try again in a few '
             b'seconds."}')


# ---- Host --------------------------------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` as (lower-case name, port or None); None when it is no host at all."""
    value = value.strip().lower()
    if value.startswith("["):  # [IPv6]:port
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[:end + 1], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    elif value.count(":") > 1:  # a bare IPv6 address is no Host
        return None
    else:
        name, sep, port_text = value.partition(":")
        port_text = port_text if sep else None
    name = name.rstrip(".")
    if not name or len(name) > 253:
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or len(port_text) > 5:
        return None
    return name, int(port_text)


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
        return True
    except ValueError:
        return False


def default_hosts(bind_host: str) -> list[str]:
    """``http.allowed_hosts`` when it is not set: the loopback names, plus the bind host when
    it is a name (``http.host: chat.internal``)."""
    name = bind_host.strip().lower().rstrip(".")
    if name in WILDCARD_BINDS or is_ip(name) or name in LOOPBACK_NAMES:
        return list(LOOPBACK_NAMES)
    return [*LOOPBACK_NAMES, name]


class HostPolicy:
    """Whether a request's ``Host`` is one this gateway answers to.

    Always accepted: an IP address (a browser sends one only for a page loaded from that very
    address, which DNS rebinding cannot arrange; load balancers' and Kubernetes' health probes
    send one) and a request without ``Host`` (HTTP/1.0 tools; never a browser)."""

    def __init__(self, entries: Iterable[str]):
        self.entries = list(entries)
        self.any = "*" in self.entries
        self._exact: set[tuple[str, int | None]] = set()
        self._domains: list[tuple[str, int | None]] = []
        for entry in self.entries:
            parsed = split_host(entry.lstrip("."))
            if parsed is None or entry == "*":
                continue
            if entry.startswith("."):
                self._domains.append(parsed)
            else:
                self._exact.add(parsed)

    def allows(self, host: str | None) -> bool:
        if host is None:
            return True
        parsed = split_host(host)
        if parsed is None:
            return False
        name, port = parsed
        if self.any or is_ip(name):
            return True
        if (name, None) in self._exact or (name, port) in self._exact:
            return True
        return any((name == d or name.endswith("." + d)) and p in (None, port)
                   for d, p in self._domains)


def host_refusal(host: str) -> web.Response:
    shown = "".join(c for c in host if c.isprintable())[:100] or "(empty)"
    return web.json_response(
        {"error": f"This server does not answer to the name '{shown}'; its admin can add the "
                  "name to http.allowed_hosts in pluto.yaml."}, status=421)


# ---- connections -------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Conn:
    transport: Any
    client: str | None  # None: exempt from the per-client limit
    opened: float
    busy: int = 0  # requests in progress
    requests: int = 0
    idle_since: float = 0.0
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class Counters:
    """What the guard did since start (for logs and tests)."""

    refused: int = 0  # 503 at a limit
    evicted: int = 0  # idle connections closed to make room
    header_timeouts: int = 0
    body_timeouts: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class ConnectionGuard:
    """Attached to aiohttp's low-level server (``runner.server``): sees every connection open
    and close; its :meth:`middleware` sees every request start and end."""

    def __init__(self, *, max_total: int, max_per_client: int, exempt: Iterable[str] = (),
                 header_timeout: float = 10.0, body_timeout: float = 30.0):
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.exempt = [ipaddress.ip_network(e, strict=False) for e in exempt]
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.min_idle = MIN_IDLE
        self.conns: dict[Any, _Conn] = {}  # by aiohttp's RequestHandler
        self.per_client: dict[str, int] = {}
        self._idle: OrderedDict[Any, None] = OrderedDict()  # oldest idle first
        self._idle_of: dict[str, OrderedDict[Any, None]] = {}
        self.counters = Counters()

    @property
    def open(self) -> int:
        return len(self.conns)

    def report(self) -> dict[str, int]:
        """For ``/readyz`` (``checks.http``): connections now, the limit, what was cut since
        start."""
        c = self.counters
        return {"open": self.open, "limit": self.max_total, "refused": c.refused,
                "evicted": c.evicted, "header_timeouts": c.header_timeouts,
                "body_timeouts": c.body_timeouts}

    def attach(self, server: web.Server) -> None:
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: Any) -> None:
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            lost(handler, exc)
            self._closed(handler)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    # connections -----------------------------------------------------------------------

    def _client(self, transport: Any) -> str | None:
        peer = transport.get_extra_info("peername")
        if not isinstance(peer, tuple) or not peer:
            return None  # (a Unix socket)
        try:
            ip = ipaddress.ip_address(str(peer[0]).split("%")[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.exempt):
            return None
        return str(ip)

    def _opened(self, handler: Any, transport: Any) -> None:
        now = time.monotonic()
        client = self._client(transport)
        if self.open >= self.max_total and not self._evict(None, now):
            self._refuse(transport, "total")
            return
        if client is not None and self.max_per_client and \
                self.per_client.get(client, 0) >= self.max_per_client and \
                not self._evict(client, now):
            self._refuse(transport, "client")
            return
        conn = _Conn(transport, client, now, idle_since=now)
        conn.timer = asyncio.get_running_loop().call_later(
            self.header_timeout, self._header_timeout, handler)
        self.conns[handler] = conn
        if client is not None:
            self.per_client[client] = self.per_client.get(client, 0) + 1
        self._set_idle(handler, conn)

    def _closed(self, handler: Any) -> None:
        conn = self.conns.pop(handler, None)
        if conn is None:
            return
        if conn.timer is not None:
            conn.timer.cancel()
        self._unset_idle(handler, conn)
        if conn.client is not None:
            left = self.per_client.get(conn.client, 1) - 1
            if left > 0:
                self.per_client[conn.client] = left
            else:
                self.per_client.pop(conn.client, None)

    def _set_idle(self, handler: Any, conn: _Conn) -> None:
        self._idle[handler] = None
        if conn.client is not None:
            self._idle_of.setdefault(conn.client, OrderedDict())[handler] = None

    def _unset_idle(self, handler: Any, conn: _Conn) -> None:
        self._idle.pop(handler, None)
        if conn.client is not None and (mine := self._idle_of.get(conn.client)) is not None:
            mine.pop(handler, None)
            if not mine:
                del self._idle_of[conn.client]

    def _evict(self, client: str | None, now: float) -> bool:
        """Close the connection (of ``client``, or any) idle the longest: one that never sent
        a whole request, or one whose last answer ended :data:`MIN_IDLE` ago at least (it may
        still be being written). Whether one was closed."""
        idle = self._idle if client is None else self._idle_of.get(client)
        if not idle:
            return False
        for handler in itertools.islice(idle, SCAN):
            conn = self.conns[handler]
            if conn.requests == 0 or now - conn.idle_since >= self.min_idle:
                self.counters.evicted += 1
                log.info("http: at the connection limit (%s); closed the connection idle the "
                         "longest (%d so far)", "in total" if client is None else
                         "from one address", self.counters.evicted)
                self._close(handler, conn)
                self._closed(handler)  # (aiohttp tells us later; the room is needed now)
                return True
        return False

    def _refuse(self, transport: Any, which: str) -> None:
        self.counters.refused += 1
        self.counters.by_kind[which] = self.counters.by_kind.get(which, 0) + 1
        log.warning("http: too many connections (%s); a new one was answered 503 (%d open, "
                    "%d refused so far)", "in total" if which == "total" else "from one address",
                    self.open, self.counters.refused)
        try:
            transport.write(BUSY % (len(BUSY_BODY), BUSY_BODY))
        finally:
            transport.close()  # (once written; a peer that never reads it is cut after 5 s)
            asyncio.get_running_loop().call_later(5, transport.abort)

    @staticmethod
    def _close(handler: Any, conn: _Conn) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        handler.force_close()  # aiohttp's own way: stops its request loop, closes the socket
        conn.transport.abort()  # ... at once, even with unsent bytes for a peer that is gone

    def _header_timeout(self, handler: Any) -> None:
        conn = self.conns.get(handler)
        if conn is None or conn.requests:
            return
        conn.timer = None
        self.counters.header_timeouts += 1
        log.info("http: closed a connection that sent no whole request in %g s (%d so far)",
                 self.header_timeout, self.counters.header_timeouts)
        self._close(handler, conn)

    # requests --------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = request.protocol
        conn = self.conns.get(key)
        if conn is None:  # (not seen open: a test client, or refused meanwhile)
            return await handler(request)
        conn.busy += 1
        conn.requests += 1
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        self._unset_idle(key, conn)
        watch = self._watch_body(request) if request.body_exists and \
            request.headers.get("Upgrade") is None else None
        try:
            response = await handler(request)
        except web.HTTPRequestTimeout:
            if watch is None or not watch.fired:
                raise
            response = None
        finally:
            conn.busy -= 1
            if watch is not None:
                watch.stop()
            if conn.busy == 0 and key in self.conns:
                conn.idle_since = time.monotonic()
                self._set_idle(key, conn)
        if watch is not None and watch.fired:
            if response is None or not response.prepared:
                return await self._timed_out(request)
            request.protocol.force_close()  # an answer already begun: the connection ends
        assert response is not None
        return response

    def _watch_body(self, request: web.Request) -> _BodyWatch:
        return _BodyWatch(request, self.body_timeout)

    async def _timed_out(self, request: web.Request) -> web.StreamResponse:
        """The body stalled: 408 with one sentence, then the connection is closed (what is
        left of the body is never read)."""
        self.counters.body_timeouts += 1
        log.info("http: %s %s: the request body stalled for %g s; answered 408 (%d so far)",
                 request.method, request.path, self.body_timeout, self.counters.body_timeouts)
        response = web.json_response(
            {"error": "The request body stopped arriving: nothing came for "
                      f"{self.body_timeout:g} s."},
            status=408, headers={"Connection": "close"})
        try:
            await response.prepare(request)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        request.protocol.force_close()
        return response


class _BodyWatch:
    """Every ``timeout`` seconds: if no byte of the body arrived since the last look and it is
    not whole, the handler's next read raises 408 (it is answered by the middleware)."""

    def __init__(self, request: web.Request, timeout: float):
        self.request = request
        self.timeout = timeout
        self.fired = False
        self.seen = request.content.total_bytes  # (what came with the headers)
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout, self._look)

    def _look(self) -> None:
        content = self.request.content
        if content.is_eof():
            self._handle = None
            return
        if content.total_bytes == self.seen:
            self.fired = True
            self._handle = None
            content.set_exception(web.HTTPRequestTimeout(
                text="The request body stopped arriving."))
            return
        self.seen = content.total_bytes
        self._handle = self._loop.call_later(self.timeout, self._look)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
