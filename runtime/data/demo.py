"""The demo dataset: a deterministic global `sales` table, so a fresh gateway has data
to ask about. Made with DuckDB from integer arithmetic only: the same rows on every run."""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb

from .warehouse import DatasetInfo, DatasetNotFound, Warehouse

DEMO_NAME = "sales"
DEMO_ROWS = 2000

# Two years of orders (2023-2024) over 4 regions and 5 products. `k` is a fixed
# pseudo-random sequence (a multiplicative hash of the row number), never random().
_DEMO_SQL = f"""
WITH base AS (
    SELECT i, DATE '2023-01-01' + CAST(i * 731 // {DEMO_ROWS} AS INTEGER) AS date,
           (i * 2654435761 + 40503) % 4294967296 AS k
    FROM range({DEMO_ROWS}) t(i)
), orders AS (
    SELECT date,
        ['North', 'South', 'East', 'West'][1 + (k // 16777216) % 4] AS region,
        ['Widget', 'Gadget', 'Gizmo', 'Doohickey', 'Sprocket'][1 + (k // 65536) % 5] AS product,
        [19.99, 34.50, 7.25, 120.00, 3.10][1 + (k // 65536) % 5] AS price,
        CAST(1 + (k // 1024) % 12 + CASE WHEN month(date) >= 11 THEN 3 ELSE 0 END AS INTEGER)
            AS units,
        (k // 128) % 100 AS pct
    FROM base
)
SELECT date, region, product, units,
       CAST(units * price * (90 + pct % 21) / 100 AS DECIMAL(10,2)) AS amount,
       pct < 4 AS returned
FROM orders ORDER BY date, region, product
"""


def ensure_demo(warehouse: Warehouse) -> DatasetInfo:
    """Create the global `sales` demo dataset unless a dataset of that name exists."""
    try:
        return warehouse.get(DEMO_NAME)
    except DatasetNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="pluto-demo-") as tmp:
        path = Path(tmp) / f"{DEMO_NAME}.parquet"
        with duckdb.connect(":memory:") as con:
            con.execute(f"COPY ({_DEMO_SQL}) TO '{path}' (FORMAT parquet)")
        return warehouse.ingest(path, DEMO_NAME)
