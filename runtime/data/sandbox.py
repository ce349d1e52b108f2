"""The SQL sandbox: run one untrusted, read-only SELECT over chosen datasets.

Layers, outermost first:

1. The gate (`check_sql`): DuckDB's own parser must find exactly one SELECT, calling no
   function in `DENIED_FUNCTIONS` (dynamic SQL, file readers, logging, checkpoints, ...).
2. A fresh child process per query: this file run as a script, so it imports nothing
   from Pluto, with an empty environment and rlimits on address space (DuckDB's
   `memory_limit` does not cover every allocation: `repeat('x', 3e9)` bypasses it),
   file size 0 (it cannot write a byte to a file) and CPU time. It is killed on timeout
   and when the awaiting task is cancelled.
3. In it, DuckDB on an in-memory database, the visible datasets attached READ_ONLY and
   nothing else, no temp directory, no extension loading, no Python replacement scans,
   then `enable_external_access=false` and, last, `lock_configuration=true`.

Rows come back over a pipe as length-prefixed pickles read by an allow-list unpickler.
This module must stay importable as a plain script: standard library and duckdb only.
"""

from __future__ import annotations

import asyncio
import ctypes
import csv
import io
import json
import os
import pickle
import re
import resource
import signal
import struct
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time as dtime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import duckdb

MAX_SQL_CHARS = 20_000
CSV_MAX_ROWS = 1_000_000
MAX_CONCURRENT = 4  # queries at once per event loop; each child is capped in memory
STARTUP_TIMEOUT = 30.0
_FRAME_LIMIT = 32 * 2**20
_CHUNK = 2048
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
RESERVED_NAMES = frozenset({"memory", "system", "temp", "main", "information_schema", "pg_catalog"})
DENIED_FUNCTIONS = frozenset({
    # dynamic SQL would hide calls from this gate
    "query", "query_table", "json_execute_serialized_sql",
    # files (also blocked by enable_external_access; refused here with a clearer message)
    "read_csv", "read_csv_auto", "read_single_csv_file", "sniff_csv", "read_parquet",
    "parquet_scan", "read_single_parquet_file", "parquet_metadata", "parquet_schema",
    "parquet_file_metadata", "parquet_kv_metadata", "parquet_full_metadata",
    "parquet_bloom_probe", "read_json", "read_json_auto", "read_json_objects",
    "read_json_objects_auto", "read_ndjson", "read_ndjson_auto", "read_ndjson_objects",
    "read_single_json_file", "read_text", "read_blob", "read_duckdb", "glob",
    # state: logging, profiling, checkpoints, sequences, secrets, external resources
    "enable_logging", "disable_logging", "truncate_duckdb_logs", "write_log",
    "enable_profiling", "disable_profiling", "checkpoint", "force_checkpoint",
    "nextval", "currval", "setval", "which_secret", "register_external_resource",
    "register_external_resource_type", "create_external_resource",
    "deregister_external_resource", "destroy_external_resource",
    # Python-client scans of in-process objects
    "arrow_scan", "arrow_scan_dumb", "python_arrow_scan", "pandas_scan", "python_map_function",
})
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_$]*)\s*\(")


class DataError(Exception):
    """Root of every error raised by `runtime.data`; messages are meant for the model."""


class QueryRefused(DataError):
    """The SQL is not one read-only SELECT over the datasets; it was never run."""


class QueryError(DataError):
    """DuckDB rejected or failed the query; the message is DuckDB's, cleaned up."""


class QueryTimeout(QueryError):
    """The query ran past its time limit and was stopped."""


class QueryMemoryError(QueryError):
    """The query needed more memory than its limit and was stopped."""


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


# ---- the gate ------------------------------------------------------------------------


def check_sql(sql: str) -> None:
    """Raise unless `sql` is exactly one SELECT that calls no denied function."""
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"The query is longer than {MAX_SQL_CHARS} characters; shorten it.")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(clean_message(str(e))) from None
    if not statements:
        raise QueryRefused("The query is empty; send one SELECT statement.")
    kinds = [_kind(s) for s in statements]
    if len(kinds) > 1:
        raise QueryRefused(f"Only a single read-only SELECT is allowed; got {len(kinds)} "
                           f"statements ({', '.join(kinds)}). Send one, with no ';' inside.")
    if kinds[0] != "SELECT":
        raise QueryRefused(f"Only a single read-only SELECT is allowed; got {kinds[0]}.")
    denied = sorted(called_functions(sql) & DENIED_FUNCTIONS)
    if denied:
        raise QueryRefused(f"Function {denied[0]}() is not allowed: the sandbox cannot read "
                           "files, run dynamic SQL or change state. Query the datasets by "
                           "their table names, e.g. SELECT * FROM sales LIMIT 5.")


def _kind(statement: duckdb.Statement) -> str:
    kind = statement.type.name
    if kind == "MULTI":
        return "PIVOT without an IN list (list the values: PIVOT t ON c IN ('a', 'b') ...)"
    word = re.match(r"\s*([A-Za-z]+)", statement.query)
    return word.group(1).upper() if kind in ("SET", "LOAD", "CALL") and word else kind


def called_functions(sql: str) -> set[str]:
    """Lower-case names of the functions `sql` calls, from DuckDB's syntax tree (or, when
    DuckDB cannot serialize the statement, every `name(` in the text: over-inclusive)."""
    try:
        with duckdb.connect(":memory:") as con:
            row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()
        tree = json.loads(row[0])
    except (duckdb.Error, RecursionError, ValueError, TypeError):
        tree = {"error": True}
    if tree.get("error"):
        return {m.lower() for m in _CALL.findall(sql.replace('"', ""))}
    names: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("function_name"), str):
                names.add(node["function_name"].lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def clean_message(message: str) -> str:
    """DuckDB's message without Python tracebacks and advice the model cannot follow."""
    message = message.split("Traceback (most recent call last)")[0]
    for cut in ("\nPossible solutions:", "\nPossible fixes:", "\nDatabase is launched"):
        message = message.split(cut)[0]
    return message.strip()[:2000]


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
    await asyncio.to_thread(check_sql, sql)
    request = {"sql": sql, "attach": _attachments(datasets), "memory_limit": memory_limit,
               "threads": threads, "timeout": timeout, "max_rows": max_rows,
               "csv_max_rows": csv_max_rows if csv_path is not None else 0}
    loop = asyncio.get_running_loop()
    async with _SEMAPHORES.setdefault(loop, asyncio.Semaphore(MAX_CONCURRENT)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-B", str(Path(__file__).resolve()), cwd="/", env=_WORKER_ENV,
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
        if not _NAME.fullmatch(ds.name) or ds.name in RESERVED_NAMES:
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
    if kind == "memory":
        raise QueryMemoryError(f"The query needed more than its memory limit "
                               f"({request['memory_limit']}) and was stopped. Filter or "
                               "aggregate more, or return fewer or smaller values.")
    raise (QueryRefused if kind == "refused" else QueryError)(text)


async def _read_frame(proc: asyncio.subprocess.Process) -> tuple[Any, ...]:
    assert proc.stdout is not None
    try:
        (size,) = struct.unpack(">I", await proc.stdout.readexactly(4))
        if size > _FRAME_LIMIT:
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


def parse_bytes(size: str) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30 (DuckDB's units: KB=1000, KiB=1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*", size.lower())
    if not m:
        raise ValueError(f"bad memory size {size!r}")
    unit = m.group(2).rstrip("b") or "b"
    scale = {"b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}[unit]
    return int(float(m.group(1)) * scale)


# ---- the child process ---------------------------------------------------------------


def _worker_main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the frames
    try:
        request = json.loads(sys.stdin.buffer.read())
        _limit_resources(request)
        con = _connect(request)
        _send(out, ("ready",))
        check_sql(request["sql"])  # again: what runs is what was checked
        _stream(con.execute(request["sql"]), request, out)
    except QueryRefused as e:
        _send(out, ("error", "refused", str(e)))
    except DataError as e:
        _send(out, ("error", "error", str(e)))
    except MemoryError:
        _send(out, ("error", "memory", ""))
    except duckdb.Error as e:
        text = str(e)
        oom = isinstance(e, duckdb.OutOfMemoryException) or "bad allocation" in text
        _send(out, ("error", "memory" if oom else "error", clean_message(text)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, never raised there raw
        _send(out, ("error", "error", f"{type(e).__name__}: {clean_message(str(e))}"))
    out.flush()


def _limit_resources(request: dict[str, Any]) -> None:
    with open("/proc/self/status") as status:
        found = re.search(r"VmSize:\s+(\d+)", status.read())
    vm_kb = int(found.group(1)) if found else 0
    address_space = vm_kb * 1024 + 2 * parse_bytes(request["memory_limit"]) + 256 * 2**20
    cpu = int(request["timeout"] * max(1, request["threads"])) + 10
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails instead of killing
    for limit, value in ((resource.RLIMIT_AS, address_space), (resource.RLIMIT_FSIZE, 0),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU, then SIGKILL
    try:  # die with the gateway (Linux: PR_SET_PDEATHSIG)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _connect(request: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:", config={
        "memory_limit": request["memory_limit"], "threads": request["threads"],
        "temp_directory": "", "max_temp_directory_size": "0B",
        "autoinstall_known_extensions": False, "autoload_known_extensions": False,
        "allow_community_extensions": False, "python_enable_replacements": False})
    names = []
    for name, path in request["attach"]:
        if not _NAME.fullmatch(name) or name in RESERVED_NAMES:
            raise ValueError(f"invalid dataset name {name!r}")
        con.execute(f"ATTACH {_literal(path)} AS {name} (READ_ONLY)")
        names.append(name)
    if names:
        con.execute(f"SET search_path = {_literal(','.join(names))}")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _stream(cursor: duckdb.DuckDBPyConnection, request: dict[str, Any], out: Any) -> None:
    keep, csv_rows = request["max_rows"], request["csv_max_rows"]
    description = cursor.description or []
    names = [d[0] for d in description]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if csv_rows:
        writer.writerow(names)
    _send(out, ("columns", names, [str(d[1]) for d in description], _drain(buffer)))
    seen, limit = 0, max(keep, csv_rows) + 1
    while seen < limit and (chunk := cursor.fetchmany(min(_CHUNK, limit - seen))):
        if seen < keep:
            _send(out, ("rows", [tuple(map(_plain, r)) for r in chunk[: keep - seen]]))
        if seen < csv_rows:
            writer.writerows([cell_text(v, null="") for v in r] for r in chunk[: csv_rows - seen])
            _send(out, ("csv", _drain(buffer)))
        seen += len(chunk)
    _send(out, ("end", seen))


def _drain(buffer: io.StringIO) -> bytes:
    data = buffer.getvalue().encode()
    buffer.seek(0)
    buffer.truncate()
    return data


def _send(out: Any, message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message, protocol=5)
    if len(data) > _FRAME_LIMIT:
        raise QueryError("The result has too much data per row; select fewer or smaller columns.")
    out.write(struct.pack(">I", len(data)))
    out.write(data)
    out.flush()


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_PLAIN_TYPES = frozenset({type(None), bool, int, float, str, bytes, Decimal, date, timedelta, UUID})


def _plain(value: Any) -> Any:
    """A value the parent's unpickler accepts: aware times in datetime.timezone, else str."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is datetime:
        return value if value.tzinfo is None else value.astimezone(timezone.utc)
    if kind is dtime:
        offset = value.utcoffset()
        return value if offset is None else value.replace(tzinfo=timezone(offset))
    if kind in (list, tuple):
        return [_plain(v) for v in value]
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    return str(value)


# ---- text for people and models ------------------------------------------------------


def cell_text(value: Any, null: str = "NULL") -> str:
    """One value as text: ISO dates, exact decimals, lists and structs as JSON."""
    if value is None:
        return null
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (date, dtime)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=cell_text, ensure_ascii=False)
    return str(value)


def format_table(result: QueryResult, max_bytes: int = 4000, *, max_cell: int = 200) -> str:
    """A compact ' | '-separated table for the model, never longer than max_bytes."""
    def line(values: Sequence[str]) -> str:
        cells = (v if len(v) <= max_cell else v[: max_cell - 1] + "…" for v in values)
        return " | ".join(c.replace("\n", "\\n").replace("|", "\\|") for c in cells)

    lines = [line(result.columns)]
    used = len(lines[0].encode()) + 1
    budget = max_bytes - 100  # room for the footer
    for row in result.rows:
        text = line([cell_text(v) for v in row])
        if used + len(text.encode()) + 1 > budget:
            break
        lines.append(text)
        used += len(text.encode()) + 1
    shown = len(lines) - 1
    total = result.total_rows
    if shown == total:
        lines.append(f"({total} row{'s' if total != 1 else ''})")
    else:
        of = f"{total}" if total is not None else f"more than {len(result.rows)}"
        lines.append(f"(showing {shown} of {of} rows; aggregate or add LIMIT to see the rest)")
    return "\n".join(lines).encode()[:max_bytes].decode("utf-8", "ignore")


def write_csv(result: QueryResult, path: Path) -> Path:
    """Write the rows a result holds as CSV, atomically (for the full result of a query,
    pass csv_path to run_query instead)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(result.columns)
            writer.writerows([cell_text(v, null="") for v in row] for row in result.rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    _worker_main()
