"""Round trip and concurrency: WebSocket clients through the whole gateway (routing, runtime
with the instant ``echo`` model, storage, delivery) against a bare aiohttp echo server."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass

import aiohttp

from bench.common import Figure, Report, percentile
from bench.servers import Server

_ids = itertools.count()


@dataclass
class LoadResult:
    latencies: list[float]
    elapsed: float
    errors: int

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


class Client:
    """One visitor: a socket, a hello, then messages answered one at a time."""

    def __init__(self, session: aiohttp.ClientSession, server: Server):
        self.session = session
        self.server = server
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def connect(self) -> None:
        self.ws = await self.session.ws_connect(self.server.ws_url, origin=self.server.url,
                                                max_msg_size=1 << 22, heartbeat=None)
        await self.ws.send_str(json.dumps({"type": "hello", "token": None}))
        await self._until("ready")

    async def _until(self, kind: str) -> dict:
        assert self.ws is not None
        while True:
            msg = await self.ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"socket closed: {msg.type!r} {msg.data!r}")
            frame = json.loads(msg.data)
            if frame.get("type") == kind:
                return frame
            if frame.get("type") == "error":
                raise RuntimeError(f"server error: {frame}")

    async def ask(self, text: str) -> float:
        assert self.ws is not None
        t0 = time.perf_counter()
        await self.ws.send_str(json.dumps({"type": "message", "id": str(next(_ids)),
                                           "text": text}))
        await self._until("message.final")
        return time.perf_counter() - t0

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def connect_many(session: aiohttp.ClientSession, server: Server, n: int,
                       parallel: int = 200) -> list[Client]:
    clients = [Client(session, server) for _ in range(n)]
    gate = asyncio.Semaphore(parallel)

    async def one(c: Client) -> None:
        async with gate:
            await c.connect()

    await asyncio.gather(*(one(c) for c in clients))
    return clients


async def load(server: Server | list[Server], sessions: int, messages: int) -> LoadResult:
    """``sessions`` clients in parallel, each sending its share of ``messages`` in turn; with
    several servers (instances), the clients are spread over them as a load balancer would."""
    servers = server if isinstance(server, list) else [server]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        groups = [await connect_many(session, target, sessions // len(servers)
                                     + (i < sessions % len(servers)))
                  for i, target in enumerate(servers)]
        clients = [c for group in groups for c in group]
        for group in groups:  # every instance warmed up alike (its first messages' own costs)
            for c in group[: -(-min(sessions, 20) // len(groups))]:
                await c.ask("warm up")
        per = max(1, messages // sessions)
        latencies: list[float] = []
        errors = 0

        async def run(c: Client) -> None:
            nonlocal errors
            for i in range(per):
                try:
                    latencies.append(await c.ask(f"message {i} from a benchmark client"))
                except (ConnectionError, RuntimeError):
                    errors += 1
                    return

        t0 = time.perf_counter()
        await asyncio.gather(*(run(c) for c in clients))
        elapsed = time.perf_counter() - t0
        await asyncio.gather(*(c.close() for c in clients))
    return LoadResult(latencies, elapsed, errors)


def _measure(kind: str, sessions: int, messages: int) -> tuple[LoadResult, float, float]:
    with Server(kind) as server:
        cpu0 = server.cpu_seconds()
        result = asyncio.run(load(server, sessions, messages))
        cpu = server.cpu_seconds() - cpu0
    return result, cpu / result.elapsed, result.elapsed


def run(report: Report, quick: bool = False) -> None:
    # Latency: one client, one message at a time.
    n = 300 if quick else 2000
    gw, gw_cpu, _ = _measure("pluto", 1, n)
    echo, _, _ = _measure("echo", 1, n)
    p50, e50 = percentile(gw.latencies, 50), percentile(echo.latencies, 50)
    report.add(Figure("round trip", "p50 latency, 1 client", p50, "s", "bare echo", e50,
                      target="ratio <= 2", met=p50 <= 2 * e50,
                      note="" if p50 <= 2 * e50 else
                      f"missed by {p50 / (2 * e50):.1f}x: before it answers, the gateway routes, "
                      "reads the history and commits the run start, the delta, the final text "
                      "and the run end to SQLite; the echo does no work at all"))
    report.add(Figure("round trip", "p99 latency, 1 client", percentile(gw.latencies, 99), "s",
                      "bare echo", percentile(echo.latencies, 99)))
    report.add(Figure("round trip", "messages/s, 1 client", gw.rate, "msg/s", "bare echo",
                      echo.rate))
    # Throughput as sessions grow.
    levels = (1, 10, 100) if quick else (1, 10, 100, 1000)
    for sessions in levels:
        total = max(sessions * (3 if quick else 10), 300 if quick else 3000)
        gw, gw_cpu, _ = _measure("pluto", sessions, total)
        echo, _, _ = _measure("echo", sessions, total)
        report.add(Figure(
            "concurrency", f"messages/s, {sessions} sessions", gw.rate, "msg/s", "bare echo",
            echo.rate, target=">= 2000 msg/s" if sessions >= 100 else None,
            met=gw.rate >= 2000 if sessions >= 100 else None,
            note=f"p99 {percentile(gw.latencies, 99) * 1000:.0f} ms, gateway CPU "
                 f"{gw_cpu * 100:.0f}% of a core, errors {gw.errors}"
                 + (f"; missed by {(1 - gw.rate / 2000) * 100:.0f}%: the gateway is CPU-bound "
                    "in its one event loop (see docs/performance.md)"
                    if sessions >= 100 and gw.rate < 2000 else "")))
