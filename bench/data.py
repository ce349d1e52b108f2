"""Data: an aggregation over a Parquet dataset through the agents' `run_sql` tool against
the same aggregation in pandas (see bench/bench_duckdb.py, which runs it on its own too)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.common import Figure, Report


def run(report: Report, quick: bool = False) -> None:
    from bench.bench_duckdb import best, generate, pandas_run, tool_run
    from pluto.runtime.data import DataService

    rows = 1_000_000 if quick else 10_000_000
    with tempfile.TemporaryDirectory(prefix="pluto-bench-data-") as tmp:
        parquet = Path(tmp) / "sales.parquet"
        generate(parquet, rows)
        DataService(Path(tmp), demo=False).warehouse().ingest(parquet, "sales")
        check: dict[str, int] = {}
        sandbox = best(tool_run(Path(tmp), 2, check))
        try:
            pandas = best(pandas_run(parquet, check))
        except ImportError:
            report.add(Figure("data", f"run_sql over {rows:,} rows", sandbox, "s",
                              note="pandas missing: pip install -e '.[bench]' for the baseline"))
            return
        report.add(Figure("data", f"run_sql aggregation, {rows:,} rows", sandbox, "s",
                          "pandas read_parquet + groupby", pandas,
                          note="includes the sandbox child process and the CSV artifact"))
