"""The SQL sandbox: run one untrusted, read-only SELECT over chosen datasets.

Layers, outermost first:

1. The gate (`check_sql`, in `child.py`, run in the child before the query, so a hostile
   query never holds the gateway's GIL): DuckDB's own parser must find exactly one SELECT,
   calling no function in `DENIED_FUNCTIONS` (dynamic SQL, file readers, logging, ...).
2. A fresh child process per query: `child.py` run as a script, so it imports nothing
   from Pluto, with an empty environment and rlimits on address space (DuckDB's
   `memory_limit` does not cover every allocation: `repeat('x', 3e9)` bypasses it),
   file size 0 (it cannot write a byte to a file) and CPU time. It is killed on timeout
   and when the awaiting task is cancelled.
3. In it, DuckDB on an in-memory database, the visible datasets attached READ_ONLY and
   nothing else, no temp directory, no extension loading, no Python replacement scans,
   then `enable_external_access=false` and, last, `lock_configuration=true`.

Rows come back over a pipe as length-prefixed pickles read by an allow-list unpickler.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pickle
import signal
import struct
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import child
from .child import (FRAME_LIMIT, MAX_SQL_CHARS, NAME, RESERVED_NAMES, QueryError,
                    QueryMemoryError, QueryRefused, QueryTimeout, parse_bytes, quoting_hint,
                    without_paths)

CSV_MAX_ROWS = 1_000_000
MAX_CONCURRENT = 4  # queries at once per event loop; each child is capped in memory
STARTUP_TIMEOUT = 30.0
CHILD = Path(child.__file__).resolve()


class Attachable(Protocol):
    """What the sandbox needs from a dataset (`DatasetInfo` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> Path: ...


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: tuple[str, ...]
    column_types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]  # at most max_rows
    total_rows: int | None  # exact when the end of the result was seen, else None
    truncated: bool  # rows holds fewer rows than the query returned
    elapsed: float  # seconds, execution and fetch
    csv_path: Path | None = None  # the full result (up to csv_max_rows), when asked for


# ---- the parent side -----------------------------------------------------------------

_WORKER_ENV = {"PATH": os.defpath, "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2",
               "HOME": "/nonexistent"}  # nothing of the gateway's environment
_SEMAPHORES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary())


async def run_query(sql: str, datasets: Sequence[Attachable], *, timeout: float = 10,
                    max_rows: int = 1000, memory_limit: str = "256MB", threads: int = 1,
                    csv_path: Path | None = None, csv_max_rows: int = CSV_MAX_ROWS) -> QueryResult:
    """Run one SELECT over `datasets` (all attached, nothing else) in a sandboxed child.

    With `csv_path`, the full result (up to `csv_max_rows`) is also written there as CSV."""
    parse_bytes(memory_limit)
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"The query is longer than {MAX_SQL_CHARS} characters; shorten it.")
    # The gate itself (DuckDB's parser, the syntax tree walked) runs in the child, before
    # anything else there: never in this process, where it would hold the GIL.
    request = {"sql": sql, "attach": _attachments(datasets), "memory_limit": memory_limit,
               "threads": threads, "timeout": timeout, "max_rows": max_rows,
               "csv_max_rows": csv_max_rows if csv_path is not None else 0}
    loop = asyncio.get_running_loop()
    async with _SEMAPHORES.setdefault(loop, asyncio.Semaphore(MAX_CONCURRENT)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-B", str(CHILD), cwd="/", env=_WORKER_ENV,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        try:
            return await _converse(proc, request, timeout, csv_path)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


def _attachments(datasets: Sequence[Attachable]) -> list[tuple[str, str]]:
    found: dict[str, str] = {}
    for ds in datasets:
        if not NAME.fullmatch(ds.name) or ds.name in RESERVED_NAMES:
            raise ValueError(f"invalid dataset name {ds.name!r}")
        path = Path(ds.path)
        if path.is_symlink() or not path.is_file():
            raise QueryError(f"The data file of dataset {ds.name} is missing.")
        found[ds.name] = str(path.resolve())
    return sorted(found.items())


async def _converse(proc: asyncio.subprocess.Process, request: dict[str, Any], timeout: float,
                    csv_path: Path | None) -> QueryResult:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request).encode())
    await proc.stdin.drain()
    proc.stdin.close()
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            _check(await _read_frame(proc), request)
    except TimeoutError:
        raise QueryError("The SQL sandbox did not start in time; try again.") from None
    started = time.monotonic()
    columns: tuple[list[str], list[str]] = ([], [])
    rows: list[tuple[Any, ...]] = []
    with _CsvSink(csv_path) as sink:
        try:
            async with asyncio.timeout(timeout):
                while (msg := _check(await _read_frame(proc), request))[0] != "end":
                    if msg[0] == "columns":
                        columns = (msg[1], msg[2])
                        await sink.write(msg[3])
                    elif msg[0] == "rows":
                        rows.extend(msg[1])
                    else:
                        await sink.write(msg[1])
        except TimeoutError:
            raise QueryTimeout(f"The query ran longer than {timeout:g} s and was stopped. "
                               "Filter or aggregate more, or add a LIMIT.") from None
        sink.commit()
    seen, limit = msg[1], max(request["max_rows"], request["csv_max_rows"])
    total = seen if seen <= limit else None
    kept = tuple(tuple(r) for r in rows[: request["max_rows"]])
    return QueryResult(tuple(columns[0]), tuple(columns[1]), kept, total,
                       total is None or total > len(kept), time.monotonic() - started, csv_path)


def _check(msg: tuple[Any, ...], request: dict[str, Any]) -> tuple[Any, ...]:
    if msg[0] != "error":
        return msg
    kind, text = msg[1], msg[2]
    attached = request["attach"]
    text = quoting_hint(without_paths(text, attached), [name for name, _ in attached])
    if kind == "memory":
        raise QueryMemoryError(f"The query needed more than its memory limit "
                               f"({request['memory_limit']}) and was stopped. Filter or "
                               "aggregate more, or return fewer or smaller values.")
    raise (QueryRefused if kind == "refused" else QueryError)(text)


async def _read_frame(proc: asyncio.subprocess.Process) -> tuple[Any, ...]:
    assert proc.stdout is not None
    try:
        (size,) = struct.unpack(">I", await proc.stdout.readexactly(4))
        if size > FRAME_LIMIT:
            raise QueryError("The SQL sandbox sent an oversized reply.")
        return _SafeUnpickler(io.BytesIO(await proc.stdout.readexactly(size))).load()
    except pickle.UnpicklingError as e:
        raise QueryError(f"The SQL sandbox sent a value it may not send ({e}).") from None
    except asyncio.IncompleteReadError:
        code = await proc.wait()
    if code in (-signal.SIGKILL, -signal.SIGABRT):
        return ("error", "memory", "")  # the kernel's OOM killer, or an uncaught bad_alloc
    if code == -signal.SIGXCPU:
        raise QueryTimeout("The query used up its CPU time and was stopped.")
    raise QueryError(f"The SQL sandbox process ended unexpectedly (exit code {code}).")


class _SafeUnpickler(pickle.Unpickler):
    _ALLOWED = frozenset({("decimal", "Decimal"), ("datetime", "date"), ("datetime", "datetime"),
                          ("datetime", "time"), ("datetime", "timedelta"),
                          ("datetime", "timezone"), ("uuid", "UUID")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed")
        return super().find_class(module, name)


class _CsvSink:
    """Write CSV bytes to a hidden temp file, renamed into place only on commit."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(self)}.tmp") if path else None
        self.file: Any = None

    def __enter__(self) -> _CsvSink:
        if self.tmp is not None:
            self.file = open(self.tmp, "wb")
        return self

    async def write(self, data: bytes) -> None:
        if self.file is not None and data:
            await asyncio.to_thread(self.file.write, data)

    def commit(self) -> None:
        if self.file is not None:
            self.file.close()
            os.replace(self.tmp, self.path)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        if self.file is not None and not self.file.closed:
            self.file.close()
            self.tmp.unlink(missing_ok=True)  # type: ignore[union-attr]
