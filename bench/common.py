"""Shared helpers for the benchmarks: timing, statistics, the results table and JSON."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@dataclass
class Figure:
    """One measured figure beside its baseline measured in the same run."""

    section: str
    name: str
    value: float
    unit: str
    baseline_name: str | None = None
    baseline: float | None = None
    target: str | None = None  # e.g. "< 0.3 s" or "ratio <= 2"
    met: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        return self.value / self.baseline  # type: ignore[operator]


class Report:
    def __init__(self) -> None:
        self.figures: list[Figure] = []
        self.started = time.time()

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        print(_line(figure), flush=True)
        return figure

    def write(self, path: Path | None = None) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = path or RESULTS / "latest.json"
        data = {"started": self.started, "python": sys.version.split()[0],
                "cpus": os.cpu_count(), "figures": [asdict(f) | {"ratio": f.ratio}
                                                      for f in self.figures]}
        path.write_text(json.dumps(data, indent=2))
        return path


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "MB":
        return f"{value:.1f} MB"
    return f"{value:,.1f} {unit}"


def _line(f: Figure) -> str:
    base = f"  vs {f.baseline_name} {_fmt(f.baseline, f.unit)}  ratio {f.ratio:.2f}" \
        if f.ratio is not None else ""
    verdict = "" if f.met is None else ("  [target met]" if f.met else "  [TARGET MISSED]")
    target = f"  target {f.target}" if f.target else ""
    note = f"  — {f.note}" if f.note else ""
    return f"{f.section:<11} {f.name:<38} {_fmt(f.value, f.unit):>12}{base}{target}{verdict}{note}"


def timed_runs(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       env=env, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), in MB, from /proc."""
    path = f"/proc/{pid or os.getpid()}/status"
    for line in Path(path).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pluto_exe() -> list[str]:
    import shutil

    exe = shutil.which("pluto")
    return [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
