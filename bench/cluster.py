"""Several instances: the same WebSocket load (the instant ``echo`` model) through one
``pluto serve`` on SQLite (the baseline), one on PostgreSQL, and three on one PostgreSQL with
the clients spread over them (as a load balancer would). Throughput at 100 sessions and p50
latency with one client, as ratios to the SQLite instance measured in the same run.

On a 2-core machine three instances, PostgreSQL and the clients share the same two cores, so
the figure shows what coordinating through the database costs, not how far more machines
would go. PostgreSQL: ``PLUTO_BENCH_DATABASE_URL`` (default: the local server, database test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

from bench.common import Figure, Report, percentile
from bench.roundtrip import LoadResult, load
from bench.servers import Server

PG_URL = os.environ.get("PLUTO_BENCH_DATABASE_URL",
                        "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def schema() -> Iterator[str]:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def measure(instances: int, url: str | None, sessions: int, messages: int
            ) -> tuple[LoadResult, float]:
    env = {"DATABASE_URL": url} if url else {}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(Server("pluto", env)) for _ in range(instances)]
        cpu0 = sum(s.cpu_seconds() for s in servers)
        result = asyncio.run(load(servers, sessions, messages))
        cpu = sum(s.cpu_seconds() for s in servers) - cpu0
    return result, cpu / max(1, len(result.latencies))


def run(report: Report, quick: bool = False) -> None:
    sessions, total = (20, 400) if quick else (100, 3000)
    one = 200 if quick else 1000
    rows: dict[str, tuple[LoadResult, LoadResult, float]] = {}
    for label, instances, shared in (("1 SQLite", 1, False), ("1 PostgreSQL", 1, True),
                                     ("3 PostgreSQL", 3, True)):
        with (schema() if shared else contextlib.nullcontext(None)) as url:
            latency, _ = measure(instances, url, 1, one)
        with (schema() if shared else contextlib.nullcontext(None)) as url:
            busy, cpu = measure(instances, url, sessions, total)
        rows[label] = (latency, busy, cpu)
        print(f"  {label}: p50 {percentile(latency.latencies, 50) * 1000:.1f} ms, "
              f"{busy.rate:.0f} msg/s at {sessions} sessions, {cpu * 1000:.1f} ms CPU/message,"
              f" errors {busy.errors}", flush=True)
    base_latency, base_busy, base_cpu = rows["1 SQLite"]
    for label in ("1 PostgreSQL", "3 PostgreSQL"):
        latency, busy, cpu = rows[label]
        report.add(Figure("cluster", f"messages/s, {sessions} sessions, {label}", busy.rate,
                          "msg/s", "1 SQLite instance", base_busy.rate,
                          note=f"gateway CPU {cpu * 1000:.1f} ms/message (SQLite "
                               f"{base_cpu * 1000:.1f}); errors {busy.errors}"))
        report.add(Figure("cluster", f"p50 latency, 1 client, {label}",
                          percentile(latency.latencies, 50), "s", "1 SQLite instance",
                          percentile(base_latency.latencies, 50)))
