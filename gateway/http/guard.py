"""Who may talk to the HTTP server, and for how long (docs/security.md, "HTTP").

- :class:`HostPolicy`: the names the ``Host`` header may carry. A page on an attacker's domain
  that rebinds its name to 127.0.0.1 reaches the gateway with ``Host: attacker.example``: it is
  answered 421 before any handler (the web chat's socket included) runs.
- :class:`ConnectionGuard`: a new connection must send its first request within the header
  timeout; a request body that stalls is answered 408; connections are limited in total (below
  the open-files limit) and per client address. At a limit the connection idle the longest
  makes room; when every one is busy the newcomer gets a 503 and is closed at once.

The guard accepts connections itself (:meth:`ConnectionGuard.listen`) and holds each one as a
bare descriptor until its first request's head is whole; only then does aiohttp see it. A
connection costs aiohttp a few hundred microseconds of the event loop to set up, asyncio's own
accept loop sets up a whole burst in one turn (5,000 slowloris sockets stalled the loop — and
``/healthz`` — for 1–3 s), and the kernel's queue of connections not yet accepted is first in,
first out: a health probe waits behind every attacker ahead of it. A bare descriptor costs
about 40 µs to accept, so the queue is drained about as fast as an attacker fills it
(docs/security.md, "Slow and idle clients").
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
import logging
import os
import select
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
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
ACCEPT_BATCH = 256  # connections accepted at one readiness of the listening socket (a few ms)
HEAD_MAX = 65_536  # a head not whole by this many bytes is handed to aiohttp (it answers 4xx)
ACCEPT_RETRY = 1.0  # after accept() failed for want of descriptors or memory (as asyncio does)
SWEEP = 0.25  # how often connections without a whole head are checked against the timeout


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


class _Pending:
    """A connection accepted but not yet handed to aiohttp: its descriptor, the listening
    socket it came from, and what it sent (not yet a whole request head)."""

    __slots__ = ("fd", "listening", "buf")

    def __init__(self, fd: int, listening: socket.socket):
        self.fd = fd
        self.listening = listening
        self.buf = bytearray()


@dataclass(eq=False, slots=True)
class _Conn:
    transport: Any  # (a _Pending's is the _Pending)
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
        self._listening: list[socket.socket] = []
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoll: Any = None  # (select.epoll: Linux only)
        self._pending: OrderedDict[_Pending, None] = OrderedDict()  # oldest first
        self._by_fd: dict[int, _Pending] = {}
        self._sweeper: asyncio.Handle | None = None
        self._clients: dict[Any, str | None] = {}  # address -> _client() (a cache)

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
        self._factory = server  # type: ignore[assignment]

    # accepting -------------------------------------------------------------------------

    @staticmethod
    def can_listen(loop: asyncio.AbstractEventLoop) -> bool:
        """Whether :meth:`listen` works on this loop (asyncio's selector loop on Linux);
        elsewhere aiohttp's own site serves, with the guard attached all the same."""
        return hasattr(select, "epoll") and isinstance(
            loop, asyncio.selector_events.BaseSelectorEventLoop)

    def listen(self, socks: list[socket.socket]) -> None:
        """Accept connections on ``socks`` (bound and listening; after :meth:`attach`).

        A connection not yet handed to aiohttp is a bare descriptor watched by an epoll of the
        guard's own (one descriptor in the event loop's): taken, read and closed a bounded
        batch at each turn of the loop, whatever a flood makes ready at once."""
        self._loop = asyncio.get_running_loop()
        self._epoll = select.epoll()
        self._loop.add_reader(self._epoll.fileno(), self._ready)
        self._listening = list(socks)
        for sock in socks:
            sock.setblocking(False)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def stop_listening(self) -> None:
        """Close the listening sockets and every connection not yet handed to aiohttp (those
        aiohttp holds, it closes itself)."""
        if self._loop is None:
            return
        for sock in self._listening:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._listening = []
        for pending in list(self._pending):
            self._close_pending(pending)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._epoll is not None:
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                fd, addr = listening._accept()  # type: ignore[attr-defined]  # (no socket object)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                log.warning("http: accept() failed (%s); accepting again in %g s", e,
                            ACCEPT_RETRY)
                assert self._loop is not None
                self._loop.remove_reader(listening.fileno())
                self._loop.call_later(ACCEPT_RETRY, self._resume, listening)
                return
            os.set_blocking(fd, False)
            pending = _Pending(fd, listening)
            if not self._admit(pending, addr, pending):
                continue
            self._pending[pending] = None
            self._by_fd[fd] = pending
            if not self._read_head(pending):  # (most clients' request is there already)
                assert self._epoll is not None
                self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
            if self._sweeper is None and pending in self._pending:
                self._sweep_later()

    def _resume(self, listening: socket.socket) -> None:
        if listening in self._listening and self._loop is not None:
            self._loop.add_reader(listening.fileno(), self._accept, listening)

    def _ready(self) -> None:
        """The guard's epoll is ready: read what the connections it watches sent (a bounded
        batch; the rest at the next turn)."""
        if self._epoll is None:
            return
        for fd, _ in self._epoll.poll(0, ACCEPT_BATCH):
            pending = self._by_fd.get(fd)
            if pending is not None:
                self._read_head(pending)

    def _read_head(self, pending: _Pending) -> bool:
        """Read what a connection sent before its first request's head was whole; once it is,
        the connection is aiohttp's. A peer gone meanwhile is forgotten (it was never a
        request). Whether it is no longer pending."""
        try:
            data = os.read(pending.fd, HEAD_MAX)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._close_pending(pending)
            return True
        seen = len(pending.buf)
        pending.buf += data
        tail = pending.buf[max(0, seen - 3):]
        if b"\n\r\n" in tail or b"\n\n" in tail or len(pending.buf) >= HEAD_MAX:
            self._hand_over(pending)
            return True
        return False

    def _forget(self, pending: _Pending, closing: bool = False) -> None:
        if self._by_fd.get(pending.fd) is pending:
            del self._by_fd[pending.fd]
            if self._epoll is not None and not closing:  # (closing it leaves the epoll too)
                try:
                    self._epoll.unregister(pending.fd)
                except OSError:  # (never registered: read whole at once)
                    pass
        self._pending.pop(pending, None)
        self._closed(pending)

    def _close_pending(self, pending: _Pending) -> None:
        self._forget(pending, closing=True)
        os.close(pending.fd)

    def _hand_over(self, pending: _Pending) -> None:
        """The connection to aiohttp, with what it sent so far: a transport on its socket (the
        selector loop's own kind, as its accept loop makes them)."""
        self._forget(pending)  # (counted again, as aiohttp's, when it sees it open)
        assert self._factory is not None and self._loop is not None
        lsock = pending.listening
        sock = socket.socket(lsock.family, lsock.type, lsock.proto, fileno=pending.fd)
        protocol = self._factory()
        transport = getattr(self._loop, "_make_socket_transport")(sock, protocol)
        # (after connection_made, which the transport has scheduled; before any read)
        self._loop.call_soon(_feed, protocol, transport, bytes(pending.buf))

    def _sweep_later(self) -> None:
        assert self._loop is not None
        self._sweeper = self._loop.call_later(min(SWEEP, self.header_timeout / 4), self._sweep)

    def _sweep(self) -> None:
        """Close the connections that sent no whole request head within the header timeout
        (a bounded batch at a time: 5,000 opened in a second time out in a second)."""
        self._sweeper = None
        deadline = time.monotonic() - self.header_timeout
        closed = 0
        for pending in list(itertools.islice(self._pending, ACCEPT_BATCH)):
            conn = self.conns.get(pending)
            if conn is not None and conn.opened > deadline:
                break
            closed += conn is not None
            self._close_pending(pending)
        else:
            if self._pending and self._loop is not None:  # (more may be overdue: at once)
                self._sweeper = self._loop.call_soon(self._sweep)
        if closed:  # (one line for the batch)
            self.counters.header_timeouts += closed
            log.info("http: closed %d connection(s) that sent no whole request in %g s (%d so "
                     "far)", closed, self.header_timeout, self.counters.header_timeouts)
        if self._pending and self._sweeper is None:
            self._sweep_later()

    # connections -----------------------------------------------------------------------

    def _client(self, peer: Any) -> str | None:
        """The address ``peer`` is counted under (None: exempt), remembered by address."""
        if not isinstance(peer, tuple) or not peer:
            return None  # (a Unix socket)
        try:
            return self._clients[peer[0]]
        except KeyError:
            pass
        if len(self._clients) >= 10_000:
            self._clients.clear()
        client = self._clients[peer[0]] = self._classify(peer)
        return client

    def _classify(self, peer: tuple[Any, ...]) -> str | None:
        if not peer:
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
        self._admit(handler, transport.get_extra_info("peername"), transport)

    def _admit(self, key: Any, peer: Any, transport: Any) -> bool:
        """Count a new connection (``key``: aiohttp's handler, or a :class:`_Pending`), making
        room at a limit, or refuse it (503). ``peer``: its address. Whether it was taken."""
        now = time.monotonic()
        client = self._client(peer)
        if self.open >= self.max_total and not self._evict(None, now):
            self._refuse(transport, "total")
            return False
        if client is not None and self.max_per_client and \
                self.per_client.get(client, 0) >= self.max_per_client and \
                not self._evict(client, now):
            self._refuse(transport, "client")
            return False
        conn = _Conn(transport, client, now, idle_since=now)
        if not isinstance(key, _Pending):  # (those: swept, see _sweep)
            conn.timer = asyncio.get_running_loop().call_later(
                self.header_timeout, self._header_timeout, key)
        self.conns[key] = conn
        if client is not None:
            self.per_client[client] = self.per_client.get(client, 0) + 1
        self._set_idle(key, conn)
        return True

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
        if isinstance(transport, _Pending):  # (a bare socket: its first bytes fit its buffer)
            try:
                os.write(transport.fd, BUSY % (len(BUSY_BODY), BUSY_BODY))
            except OSError:
                pass
            os.close(transport.fd)
            return
        try:
            transport.write(BUSY % (len(BUSY_BODY), BUSY_BODY))
        finally:
            transport.close()  # (once written; a peer that never reads it is cut after 5 s)
            asyncio.get_running_loop().call_later(5, transport.abort)

    def _close(self, handler: Any, conn: _Conn) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if isinstance(handler, _Pending):  # (no callback will say it closed: forget it now)
            self._close_pending(handler)
            return
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


def _feed(protocol: asyncio.Protocol, transport: asyncio.Transport, head: bytes) -> None:
    if not transport.is_closing():  # (refused at a limit meanwhile: nothing to read)
        protocol.data_received(head)


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
