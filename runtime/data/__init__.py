"""Data tools' library: the DuckDB warehouse of datasets and the read-only SQL sandbox.

No dependency on the rest of Pluto but the shared files (`pluto.runtime.files`: with
several instances, datasets and artifacts are kept for all of them). The runtime's data tools
are built on these names.
Modules: `warehouse` (datasets, scopes, the catalog), `ingest` (files into DuckDB, through
`loader`, a locked-down child process; its settings in `ingest_limits`), `sandbox` (a query in
a locked-down child process), `child` (the gate and that process),
`format` (results as text), `demo` (the demo dataset), `service` (one gateway's data),
`filetypes` (which files can be datasets).

Names are imported on first use, so importing this package (or `service`) does not import
DuckDB: start-up stays fast for commands that never touch data. Async code first awaits
`preload(...)`, which imports the modules it names in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import TYPE_CHECKING, Any

_HOMES = {
    "child": ("DataError", "QueryError", "QueryMemoryError", "QueryRefused", "QueryTimeout",
              "cell_text", "check_sql", "sql_name"),
    "sandbox": ("CSV_MAX_ROWS", "QueryResult", "run_query"),
    "format": ("counted", "format_table", "markdown_table", "result_markdown", "write_csv"),
    "ingest": ("DatasetError",),
    "warehouse": ("Column", "DatasetInfo", "DatasetNotFound", "Scope", "Warehouse", "check_name",
                  "dataset_name"),
    "demo": ("ensure_demo",),
    "service": ("DataService", "DatasetSource", "QueryLimits"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_WHERE)


async def preload(*modules: str) -> None:
    """Import these modules of the package (e.g. ``"warehouse"``, which imports DuckDB) in a
    worker thread, unless done already, so that importing them on the event loop is free."""
    missing = [m for m in modules if not _imported(f"{__name__}.{m}")]
    if missing:
        await asyncio.to_thread(lambda: [importlib.import_module(f".{m}", __name__)
                                         for m in missing])


def _imported(module: str) -> bool:
    found = sys.modules.get(module)
    return found is not None and not getattr(getattr(found, "__spec__", None), "_initializing",
                                             False)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .child import (DataError, QueryError, QueryMemoryError, QueryRefused, QueryTimeout,
                        cell_text, check_sql, sql_name)
    from .demo import ensure_demo
    from .format import counted, format_table, markdown_table, result_markdown, write_csv
    from .ingest import DatasetError
    from .sandbox import CSV_MAX_ROWS, QueryResult, run_query
    from .service import DataService, DatasetSource, QueryLimits
    from .warehouse import (Column, DatasetInfo, DatasetNotFound, Scope, Warehouse, check_name,
                            dataset_name)
