"""Start-up: `pluto --help`, and `pluto serve` until /readyz answers, against bare Python.

Measured as an installed Pluto starts: with its modules' bytecode compiled once (pip compiles
it at install time; here a warm-up run writes it to a cache dir of the bench's own, since a
development environment often sets PYTHONDONTWRITEBYTECODE, and then every start compiles
Pluto's modules anew). The same start in the caller's environment as it is is kept beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench.common import ROOT, Figure, Report, free_port, median, pluto_exe, timed_runs

RUNS = 7
SERVE_RUNS = 5  # each a whole start; the median of these


def serve_ready_time(env: dict[str, str]) -> float:
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*pluto_exe(), "serve", "--port", str(port), "--data-dir", data],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                        if r.status == 200:
                            return time.perf_counter() - t0
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError("pluto serve exited before it was ready") from None
                    time.sleep(0.005)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def installed(env: dict[str, str], cache: str) -> dict[str, str]:
    """The environment with Pluto's bytecode written to (and read from) ``cache``."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"} | {
        "PYTHONPYCACHEPREFIX": cache}


def run(report: Report) -> None:
    source = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    with tempfile.TemporaryDirectory(prefix="pluto-bytecode-") as cache:
        env = installed(source, cache)
        serve_ready_time(env)  # the warm-up: compiles what serve imports, fills the page cache
        bare = median(timed_runs([sys.executable, "-c", "pass"], RUNS, env))
        aiohttp = median(timed_runs([sys.executable, "-c", "import aiohttp"], RUNS, env))
        help_time = median(timed_runs([*pluto_exe(), "--help"], RUNS, env))
        report.add(Figure("startup", "pluto --help", help_time, "s", "python -c pass", bare,
                          target="< 0.3 s", met=help_time < 0.3))
        ready = median([serve_ready_time(env) for _ in range(SERVE_RUNS)])
    as_is = median([serve_ready_time(source) for _ in range(SERVE_RUNS)])
    report.add(Figure("startup", "pluto serve until /readyz = 200", ready, "s",
                      "python -c 'import aiohttp'", aiohttp, target="< 1 s", met=ready < 1.0,
                      note="offline model, empty data dir, bytecode compiled once; "
                           f"{as_is:.2f} s in the environment as it is",
                      extra={"serve_ready_env_as_is_s": as_is}))
