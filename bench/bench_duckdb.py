"""Benchmark: one aggregation through the agents' `run_sql` tool against the same in pandas.

    python bench/bench_duckdb.py [--rows N]      (default 10,000,000)

Generates a deterministic Parquet file of N rows (region, product, date, amount) with
DuckDB in a temp dir, ingests it as a warehouse dataset, then times, best of 3 each:

- the `run_sql` tool as an agent calls it (scope, gate, a fresh sandboxed child process per
  query, so the time includes starting it, the model's table and the CSV artifact), with
  1 thread and with 2;
- pandas: `pd.read_parquet` + groupby, on the same file.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb  # noqa: E402

from pluto.runtime.data import DataService, QueryLimits  # noqa: E402
from pluto.runtime.data_tools import run_sql  # noqa: E402
from pluto.runtime.tools import ToolContext  # noqa: E402

SQL = ("SELECT region, product, sum(amount) AS total, avg(amount) AS mean, count(*) AS n "
       "FROM sales GROUP BY ALL")
ROUNDS = 3


def generate(path: Path, rows: int) -> None:
    """N rows from integer arithmetic only (no random()): the same file on every run."""
    with duckdb.connect() as con:
        con.execute(f"""
            COPY (
                SELECT ['North', 'South', 'East', 'West'][1 + (k // 16777216) % 4] AS region,
                       ['Widget', 'Gadget', 'Gizmo', 'Doohickey', 'Sprocket'][1 + (k // 65536) % 5]
                           AS product,
                       DATE '2023-01-01' + CAST(i % 731 AS INTEGER) AS date,
                       (k % 100000) / 100.0 AS amount
                FROM (SELECT range AS i, (range * 2654435761 + 40503) % 4294967296 AS k
                      FROM range({rows}))
            ) TO '{path}' (FORMAT parquet)""")


def best(fn: Callable[[], None]) -> float:
    """Best wall time of ROUNDS runs."""
    walls = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - started)
    return min(walls)


def tool_run(data_dir: Path, threads: int, check: dict[str, int]) -> Callable[[], None]:
    service = DataService(data_dir, demo=False,
                          limits=QueryLimits(timeout=120, memory_limit="1GB", threads=threads))
    ctx = ToolContext("bench", "bench", "bench", "bench", data_dir, {"data": service}, "*")

    def run() -> None:
        result = asyncio.run(run_sql(ctx, {"sql": SQL}))
        if result.is_error:
            raise SystemExit(f"run_sql failed: {result.content}")
        check["duckdb"] = sum(int(row[4]) for row in result.details["table"]["rows"])
    return run


def pandas_run(path: Path, check: dict[str, int]) -> Callable[[], None]:
    import pandas as pd

    def run() -> None:
        frame = pd.read_parquet(path, columns=["region", "product", "amount"])
        grouped = frame.groupby(["region", "product"])["amount"].agg(["sum", "mean", "count"])
        check["pandas"] = int(grouped["count"].sum())
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pluto-bench-") as tmp:
        parquet = Path(tmp) / "sales.parquet"
        started = time.perf_counter()
        generate(parquet, args.rows)
        print(f"generated {args.rows:,} rows: {parquet.stat().st_size / 2**20:.1f} MB Parquet "
              f"in {time.perf_counter() - started:.2f} s")
        started = time.perf_counter()
        info = DataService(Path(tmp), demo=False).warehouse().ingest(parquet, "sales")
        print(f"ingested as dataset 'sales' ({info.size_bytes / 2**20:.1f} MB DuckDB file) "
              f"in {time.perf_counter() - started:.2f} s")
        print(f"query: {SQL}")
        check: dict[str, int] = {}
        timings = {f"run_sql, {n} thread{'s' if n > 1 else ''}":
                   best(tool_run(Path(tmp), n, check)) for n in (1, 2)}
        try:
            timings["pandas read_parquet + groupby"] = best(pandas_run(parquet, check))
        except ImportError:
            print("pandas is not installed: skipping it")
        for label, wall in timings.items():
            print(f"{label:32} best of {ROUNDS}: {wall:.3f} s")
        pandas_time = timings.get("pandas read_parquet + groupby")
        if pandas_time:
            for label, wall in list(timings.items())[:2]:
                print(f"pandas / {label}: {pandas_time / wall:.1f}x")
        if len(set(check.values())) != 1:
            print(f"row counts differ: {check}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
