"""Data tools' library: the DuckDB warehouse of datasets and the read-only SQL sandbox.

No dependency on the rest of Pluto. The runtime's data tools are built on these names.
"""

from .demo import ensure_demo
from .sandbox import (
    CSV_MAX_ROWS,
    DataError,
    QueryError,
    QueryMemoryError,
    QueryRefused,
    QueryResult,
    QueryTimeout,
    cell_text,
    check_sql,
    format_table,
    run_query,
    write_csv,
)
from .warehouse import (
    Column,
    DatasetError,
    DatasetInfo,
    DatasetNotFound,
    Scope,
    Warehouse,
    check_name,
    dataset_name,
)

__all__ = [
    "CSV_MAX_ROWS", "Column", "DataError", "DatasetError", "DatasetInfo", "DatasetNotFound",
    "QueryError", "QueryMemoryError", "QueryRefused", "QueryResult", "QueryTimeout", "Scope",
    "Warehouse", "cell_text", "check_name", "check_sql", "dataset_name", "ensure_demo",
    "format_table", "run_query", "write_csv",
]
