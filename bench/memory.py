"""Memory: RSS idle, the cost of each idle WebSocket client, and a soak that must stay flat."""

from __future__ import annotations

import asyncio
import resource
import time

import aiohttp

from bench.common import Figure, Report
from bench.roundtrip import Client, connect_many
from bench.servers import Server


async def _idle_cost(server: Server, n: int) -> float:
    """RSS (MB) of the server with ``n`` idle, greeted clients connected."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        clients = await connect_many(session, server, n)
        await asyncio.sleep(1.0)
        rss = server.rss_mb()
        await asyncio.gather(*(c.close() for c in clients))
    return rss


SPARE_FILES = 500  # descriptors each process needs beside the clients' sockets


def _fitting(counts: tuple[int, ...]) -> tuple[int, ...]:
    """``counts``, each at most what the open-files limit lets both this process (the clients)
    and a server (their sockets) hold; the limit raised to its hard value first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    room = hard - SPARE_FILES if hard != resource.RLIM_INFINITY else max(counts)
    return tuple(min(n, room) for n in counts)


def idle_connections(report: Report, counts: tuple[int, ...]) -> None:
    asked, counts = counts, _fitting(counts)
    idle: dict[str, float] = {}
    for kind in ("pluto", "echo"):
        # idle clients hold no model connection: the gateway may keep one socket for each
        # (by default it keeps half its open-files limit, and closes the idlest beyond it)
        with Server(kind, max_connections=max(counts) + 100) as server:
            time.sleep(1.0)
            idle[kind] = server.rss_mb()
            costs[kind] = {n: (asyncio.run(_idle_cost(server, n)) - idle[kind]) * 1024 / n
                           for n in counts}
    report.add(Figure("memory", "RSS idle, pluto serve", idle["pluto"], "MB",
                      "bare aiohttp echo", idle["echo"]))
    for want, n in zip(asked, counts):
        report.add(Figure("memory", f"per idle WebSocket client, {n:,} clients",
                          costs["pluto"][n], "kB", "bare echo", costs["echo"][n],
                          note="" if n == want else f"{want:,} asked: this machine's open-files "
                          f"limit holds {n:,} sockets in each process"))


costs: dict[str, dict[int, float]] = {}


async def _soak(server: Server, sessions: int, messages: int) -> list[tuple[int, float]]:
    """Send ``messages`` over ``sessions`` clients; sample RSS as it goes."""
    samples: list[tuple[int, float]] = []
    sent = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        clients = await connect_many(session, server, sessions)
        per = messages // sessions
        step = max(1, per // 20)

        async def run(c: Client, index: int) -> None:
            nonlocal sent
            for i in range(per):
                await c.ask(f"soak message {i} from client {index}")
                sent += 1
                if index == 0 and i % step == 0:
                    samples.append((sent, server.rss_mb()))

        await asyncio.gather(*(run(c, i) for i, c in enumerate(clients)))
        samples.append((sent, server.rss_mb()))
        await asyncio.gather(*(c.close() for c in clients))
    return samples


def soak(report: Report, messages: int, sessions: int = 200) -> None:
    with Server("pluto") as server:
        t0 = time.perf_counter()
        samples = asyncio.run(_soak(server, sessions, messages))
        elapsed = time.perf_counter() - t0
    warm = next(s for s in samples if s[0] >= messages * 0.1)  # after warm-up (caches filled)
    middle = min(samples, key=lambda s: abs(s[0] - messages / 2))
    end = samples[-1]
    growth = (end[1] - warm[1]) / warm[1] * 100
    report.add(Figure("soak", f"RSS after {warm[0]:,} messages", warm[1], "MB"))
    report.add(Figure("soak", f"RSS after {middle[0]:,} messages", middle[1], "MB"))
    report.add(Figure("soak", f"RSS after {end[0]:,} messages", end[1], "MB",
                      f"after {warm[0]:,}", warm[1], target="growth < 10%", met=growth < 10,
                      note=f"growth {growth:+.1f}%, {end[0] / elapsed:,.0f} msg/s over "
                           f"{sessions} sessions"))


def run(report: Report, quick: bool = False) -> None:
    idle_connections(report, (100, 1000) if quick else (1000, 10_000))
    soak(report, 20_000 if quick else 200_000)
