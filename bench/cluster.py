"""Several instances: the same WebSocket load (the instant ``echo`` model) through one
``pluto serve`` on SQLite (the baseline), one on PostgreSQL, and three on one PostgreSQL with
the clients spread over them (as a load balancer would). Throughput at 100 sessions and p50
latency with one client, as ratios to the SQLite instance measured in the same run; and what a
message costs the servers' CPU — the gateways and the PostgreSQL server's processes (read from
/proc) together — on one PostgreSQL instance against SQLite's (target: at most 2x), and with
three instances against one (messages per CPU-second, target: at least 0.9x). The statements a
message costs PostgreSQL, and an idle instance's, are counted by ``--only statements``.

On a 2-core machine three instances, PostgreSQL and the clients share the same two cores, so
the figure shows what coordinating through the database costs, not how far more machines
would go. The load at 100 sessions runs three rounds, the set-ups taking turns, and each figure
is the rounds' total CPU over their total messages (one round's moves 10-20% from noise alone).
PostgreSQL: ``PLUTO_BENCH_DATABASE_URL`` (default: the local server, database test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
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


def postgres_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each PostgreSQL server process on this machine: its
    backends (one per pooled connection) and its helpers (WAL writer, checkpointer...)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # (gone meanwhile)
        name, _, rest = text.partition(" (")[2].rpartition(") ")
        if name.startswith("postgres"):
            fields = rest.split()
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def measure(instances: int, url: str | None, sessions: int, messages: int
            ) -> tuple[LoadResult, float, float]:
    """The load's result, and CPU seconds per answered message: the gateways', and the
    database server's (0 on SQLite: there it is the gateway's own)."""
    env = {"DATABASE_URL": url} if url else {}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(Server("pluto", env)) for _ in range(instances)]
        cpu0, db0 = sum(s.cpu_seconds() for s in servers), postgres_cpu()
        result = asyncio.run(load(servers, sessions, messages))
        cpu = sum(s.cpu_seconds() for s in servers) - cpu0
        db1 = postgres_cpu()  # (before the gateways close their connections)
    db = sum(t - db0.get(pid, 0.0) for pid, t in db1.items()) if url else 0.0
    n = max(1, len(result.latencies))
    return result, cpu / n, db / n


ROUNDS = 3  # of the load at 100 sessions, the three set-ups taking turns (one with --quick)


def run(report: Report, quick: bool = False) -> None:
    sessions, total = (20, 400) if quick else (100, 6000)
    one = 200 if quick else 1000
    setups = (("1 SQLite", 1, False), ("1 PostgreSQL", 1, True), ("3 PostgreSQL", 3, True))
    latency: dict[str, LoadResult] = {}
    for label, instances, shared in setups:
        with (schema() if shared else contextlib.nullcontext(None)) as url:
            latency[label], _, _ = measure(instances, url, 1, one)
    # On two shared cores one round's CPU figures move by 10-20% from noise alone: the set-ups
    # take turns over several rounds and each figure is the rounds' total CPU over their total
    # messages (every round's ratios printed beside it).
    rounds: dict[str, list[tuple[LoadResult, float, float]]] = {s[0]: [] for s in setups}
    for r in range(1 if quick else ROUNDS):
        for label, instances, shared in setups:
            with (schema() if shared else contextlib.nullcontext(None)) as url:
                busy, cpu, db = measure(instances, url, sessions, total)
            rounds[label].append((busy, cpu, db))
            print(f"  round {r + 1}, {label}: {busy.rate:.0f} msg/s at {sessions} sessions, "
                  f"{cpu * 1000:.2f} ms gateway CPU + {db * 1000:.2f} ms database CPU per "
                  f"message, errors {busy.errors}", flush=True)

    def cost(label: str) -> tuple[float, float, float, int]:
        """Messages per second over the rounds, gateway and database CPU per message, errors."""
        done = [len(b.latencies) for b, _, _ in rounds[label]]
        n = max(1, sum(done))
        return (sum(done) / sum(b.elapsed for b, _, _ in rounds[label]),
                sum(c * k for (_, c, _), k in zip(rounds[label], done)) / n,
                sum(d * k for (_, _, d), k in zip(rounds[label], done)) / n,
                sum(b.errors for b, _, _ in rounds[label]))

    base_rate, base_cpu, _, _ = cost("1 SQLite")
    for label in ("1 PostgreSQL", "3 PostgreSQL"):
        rate, cpu, db, errors = cost(label)
        report.add(Figure("cluster", f"messages/s, {sessions} sessions, {label}", rate,
                          "msg/s", "1 SQLite instance", base_rate,
                          note=f"gateway CPU {cpu * 1000:.1f} ms/message (SQLite "
                               f"{base_cpu * 1000:.1f}); errors {errors}"))
        report.add(Figure("cluster", f"p50 latency, 1 client, {label}",
                          percentile(latency[label].latencies, 50), "s", "1 SQLite instance",
                          percentile(latency["1 SQLite"].latencies, 50)))
    # the figures: what a message costs the servers, gateway and database together
    each = list(zip(*(rounds[s[0]] for s in setups)))  # (SQLite, 1 PG, 3 PG) round by round
    _, pg_cpu, pg_db, _ = cost("1 PostgreSQL")
    one_pg = (pg_cpu + pg_db) * 1000
    ratios = ", ".join(f"{(p[1] + p[2]) / s[1]:.2f}" for s, p, _ in each)
    report.add(Figure("cluster", "server CPU per message, 1 PostgreSQL (gateway + database)",
                      one_pg, "ms", "1 SQLite instance", base_cpu * 1000,
                      target="ratio <= 2", met=one_pg <= 2 * base_cpu * 1000,
                      note=f"gateway {pg_cpu * 1000:.2f} ms + PostgreSQL {pg_db * 1000:.2f} ms;"
                           f" {len(each)} round(s), each: {ratios}"))
    _, three_cpu, three_db, _ = cost("3 PostgreSQL")
    per_cpu_one, per_cpu_three = 1 / (pg_cpu + pg_db), 1 / (three_cpu + three_db)
    ratios = ", ".join(f"{(p[1] + p[2]) / (t[1] + t[2]):.2f}" for _, p, t in each)
    report.add(Figure("cluster", "messages per server CPU-second, 3 PostgreSQL instances",
                      per_cpu_three, "msg/CPU-s", "1 PostgreSQL instance", per_cpu_one,
                      target="ratio >= 0.9", met=per_cpu_three >= 0.9 * per_cpu_one,
                      note=f"gateways {three_cpu * 1000:.2f} ms + PostgreSQL "
                           f"{three_db * 1000:.2f} ms per message; {len(each)} round(s), "
                           f"each: {ratios}"))
