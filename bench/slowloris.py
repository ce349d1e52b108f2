"""Slowloris (issue 38): ``/healthz`` of ``pluto serve`` while 5,000 sockets from another process
each send part of a request head and trickle a header line every 2 s, until the header timeout
(10 s) closes them. Every probe is a new connection, as a load balancer's or Kubernetes' is.
Baseline: the same probes with no flood, in the same run."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Figure, Report, percentile
from bench.servers import Server

SOCKETS = 5000
PROBES = 200  # at least, under the flood (more if the flood lasts longer)
GAP = 0.02  # between probes
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n"

# the attacker, from its own process (shared with the test: tests/test_slow_clients.py)
FLOOD = str(Path(__file__).resolve().parent.parent / "tests" / "helpers" / "slowloris.py")


def probe(port: int) -> tuple[float, bool]:
    """One ``GET /healthz`` on a new connection: seconds until the whole answer, and whether
    it was 200."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while block := s.recv(65536):
            answer += block
    return time.perf_counter() - t0, answer.startswith(b"HTTP/1.1 200")


def probes(port: int, until: subprocess.Popen[bytes] | None, count: int
           ) -> tuple[list[float], int]:
    """Probe ``count`` times (and on while ``until`` runs); latencies and failures."""
    times, failed = [], 0
    while len(times) < count or (until is not None and until.poll() is None):
        took, ok = probe(port)
        times.append(took)
        failed += not ok
        time.sleep(GAP)
    return times, failed


def run(report: Report, quick: bool = False) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    count = min(SOCKETS // (5 if quick else 1), hard - 1000)
    with Server("pluto") as server:
        quiet, _ = probes(server.port, None, PROBES)
        flood = subprocess.Popen([sys.executable, FLOOD, str(server.port), str(count),
                                  PARTIAL.decode()], stdout=subprocess.PIPE)
        try:
            loud, failed = probes(server.port, flood, PROBES)
            out = (flood.communicate(timeout=150)[0] or b"").decode().split()
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait()
        log = Path(server._tmp.name) / "data" / "pluto.log"
        log_size = log.stat().st_size if log.exists() else 0
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    note = (f"{count:,} sockets ({' '.join(out)}); {len(loud)} probes, {failed} not 200; "
            f"pluto.log {log_size:,} bytes")
    worst, p99 = max(loud), percentile(loud, 99)
    report.add(Figure("slowloris", f"/healthz worst, {count:,} slowloris", worst, "s",
                      "no flood", max(quiet), target="< 100 ms", met=worst < 0.1 and not failed,
                      note=note))
    report.add(Figure("slowloris", f"/healthz p99, {count:,} slowloris", p99, "s",
                      "no flood", percentile(quiet, 99), target="< 100 ms", met=p99 < 0.1))
    report.add(Figure("slowloris", f"/healthz median, {count:,} slowloris",
                      percentile(loud, 50), "s", "no flood", percentile(quiet, 50)))
