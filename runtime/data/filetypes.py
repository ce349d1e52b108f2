"""The kinds of files that can become datasets: plain tables, no DuckDB needed to tell (so a
file sent in a chat is sorted on the event loop without importing anything heavy)."""

from __future__ import annotations

FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
           ".json": "json", ".ndjson": "ndjson", ".jsonl": "ndjson"}  # suffix → what ingest reads
MIME_FORMATS = {"text/csv": ".csv", "application/csv": ".csv", "text/x-csv": ".csv",
                "text/tab-separated-values": ".tsv", "application/json": ".json",
                "application/x-ndjson": ".ndjson", "application/jsonl": ".jsonl",
                "application/vnd.apache.parquet": ".parquet", "application/x-parquet": ".parquet"}
SPREADSHEETS = frozenset({".xlsx", ".xls", ".xlsm", ".ods", ".numbers"})  # refused, politely
