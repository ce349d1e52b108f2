"""The gate, and what runs inside the sandbox's child process.

`check_sql` is the first layer (the parent calls it before starting a child, and the child
again before running anything): DuckDB's own parser must find exactly one SELECT that calls
no function in `DENIED_FUNCTIONS` (dynamic SQL, file readers, logging, checkpoints, ...).

Run as a script (`python -I -B child.py`), this file is the child: it reads one JSON request
on stdin, limits itself (address space, file size 0, CPU time, death with its parent), opens
DuckDB in memory with the request's datasets attached READ_ONLY and nothing else, locks the
configuration and streams the result back as length-prefixed pickles. It imports only the
standard library and duckdb: nothing of Pluto, and the gateway's environment is not passed.
"""

from __future__ import annotations

import csv
import ctypes
import functools
import io
import json
import os
import pickle
import re
import resource
import signal
import struct
import sys
from datetime import date, datetime, time as dtime, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import duckdb

MAX_SQL_CHARS = 20_000
FRAME_LIMIT = 32 * 2**20
_CHUNK = 2048
NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
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
# Introspection that shows the server's paths (attached files, settings, the environment),
# called as functions or read as views (no parentheses).
INTROSPECTION = frozenset({
    "duckdb_databases", "duckdb_settings", "current_setting", "pragma_database_list",
    "duckdb_temporary_files", "duckdb_extensions", "duckdb_secrets", "duckdb_logs",
    "duckdb_log_contexts", "pragma_metadata_info", "pragma_storage_info",
    "pg_settings"})
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")  # linear: no nested or overlapping repeats


if not __package__:  # a child (this script, or the loader's): the standard library and duckdb
    _Root = Exception
else:
    from pluto.errors import PlutoError as _Root


class DataError(_Root):
    """Root of every error raised by `runtime.data`; messages are meant for the model."""


class QueryRefused(DataError):
    """The SQL is not one read-only SELECT over the datasets; it was never run."""


class QueryError(DataError):
    """DuckDB rejected or failed the query; the message is DuckDB's, cleaned up."""


class QueryTimeout(QueryError):
    """The query ran past its time limit and was stopped."""


class QueryMemoryError(QueryError):
    """The query needed more memory than its limit and was stopped."""


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
    functions, tables = referenced_names(sql)
    if hidden := sorted((functions | tables) & INTROSPECTION):
        raise QueryRefused(f"{hidden[0]} is not available here: it describes the server, not "
                           "the data. Query the datasets by their table names.")
    denied = sorted(functions & DENIED_FUNCTIONS)
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
    """Lower-case names of the functions `sql` calls (see `referenced_names`)."""
    return referenced_names(sql)[0]


def referenced_names(sql: str) -> tuple[set[str], set[str]]:
    """Lower-case names of the functions `sql` calls and the tables it reads, from DuckDB's
    syntax tree (or, when DuckDB cannot serialize the statement, from the text: every word
    before a '(' is a call and every word a table, over-inclusive). Linear in the input."""
    try:
        with duckdb.connect(":memory:") as con:
            row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()
        tree = json.loads(row[0])  # type: ignore[index]
    except (duckdb.Error, RecursionError, ValueError, TypeError):
        tree = {"error": True}
    if tree.get("error"):
        return _words(sql)
    functions: set[str] = set()
    tables: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("function_name"), str):
                functions.add(node["function_name"].lower())
            if node.get("type") == "BASE_TABLE" and isinstance(node.get("table_name"), str):
                tables.add(node["table_name"].lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return functions, tables


def _words(sql: str) -> tuple[set[str], set[str]]:
    """(words followed by '(', every word) of the text, quotes dropped, in one pass."""
    text = sql.replace('"', "")
    calls: set[str] = set()
    words: set[str] = set()
    size = len(text)
    for m in _WORD.finditer(text):
        word = m.group(0).lower()
        words.add(word)
        j = m.end()
        while j < size and text[j] in " \t\r\n\f\v":  # each blank is looked at once
            j += 1
        if j < size and text[j] == "(":
            calls.add(word)
    return calls, words


@functools.cache
def _keywords() -> frozenset[str]:
    """The words DuckDB's parser cannot take as a bare table name (reserved, and the
    type/function words: semi, anti, asof, positional, join, left, ...)."""
    with duckdb.connect(":memory:") as con:
        words = con.execute("SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category "
                            "IN ('reserved', 'type_function')").fetchall()
    return frozenset(w[0].lower() for w in words)


def sql_name(name: str) -> str:
    """A dataset's name as a query must write it: double-quoted when it is an SQL keyword
    (``"semi"``), else as it is (``sales``)."""
    return f'"{name}"' if name.lower() in _keywords() else name


def quoting_hint(message: str, names: Any) -> str:
    """DuckDB's syntax error at a dataset named like a keyword, with the fix added."""
    found = re.search(r'syntax error at or near "([A-Za-z_][A-Za-z0-9_]*)"', message)
    if not found or found.group(1).lower() not in set(names):
        return message
    word = found.group(1).lower()
    head, newline, rest = message.partition("\n")  # before DuckDB's echo of the query
    return (f"{head.rstrip('.')}. {word} is an SQL keyword: write the table name in double "
            f'quotes, e.g. SELECT * FROM "{word}".{newline}{rest}')


def clean_message(message: str) -> str:
    """DuckDB's message without Python tracebacks and advice the model cannot follow."""
    message = message.split("Traceback (most recent call last)")[0]
    for cut in ("\nPossible solutions:", "\nPossible fixes:", "\nDatabase is launched",
                "\n\tCandidate functions:", "\nCandidate functions:"):
        message = message.split(cut)[0]
    if re.search(r"argument types '\w+\([^)]*VARCHAR", message):
        message = message.rstrip() + (" The column holds text: convert it, e.g. "
                                      "TRY_CAST(column AS DOUBLE).")
    return message.strip()[:2000]


def parse_bytes(size: str) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30 (DuckDB's units: KB=1000, KiB=1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*", size.lower())
    if not m:
        raise ValueError(f"bad memory size {size!r}")
    unit = m.group(2).rstrip("b") or "b"
    scale = {"b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}[unit]
    return int(float(m.group(1)) * scale)


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


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: Any) -> str:
    """One value for a CSV file people open in a spreadsheet: text that a spreadsheet would
    run as a formula (=HYPERLINK(…), =cmd|…, +…, -…, @…) gets a leading ' so it stays text.
    Numbers, and text that is a plain number (-4, +1.5), are kept as they are."""
    text = cell_text(value, null="")
    if isinstance(value, str) and text.startswith(_FORMULA_START) \
            and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


# ---- the child process ---------------------------------------------------------------


def worker_main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the frames
    try:
        request = json.loads(sys.stdin.buffer.read())
        limit_resources(request)
        con = connect(request)
        _send(out, ("ready",))
        check_sql(request["sql"])  # the gate: here, where it cannot stall the gateway
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
        _send(out, ("error", "memory" if oom else "error",
                    without_paths(clean_message(text), request["attach"])))
    except Exception as e:  # noqa: BLE001 - reported to the parent, never raised there raw
        text = without_paths(clean_message(str(e)), request.get("attach", []))
        _send(out, ("error", "error", f"{type(e).__name__}: {text}"))
    out.flush()


def without_paths(message: str, attached: list[Any]) -> str:
    """A message for the model without the server paths of the dataset files: each one
    becomes the dataset's name."""
    for name, path in attached:
        message = message.replace(str(path), name)
    return message


def limit_resources(request: dict[str, Any], file_size: int = 0) -> None:
    """Address space, CPU time, the size of any file written (0: none), no core; and death
    with the parent."""
    with open("/proc/self/status") as status:
        found = re.search(r"VmSize:\s+(\d+)", status.read())
    vm_kb = int(found.group(1)) if found else 0
    address_space = vm_kb * 1024 + 2 * parse_bytes(request["memory_limit"]) + 256 * 2**20
    cpu = int(request["timeout"] * max(1, request["threads"])) + 10
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails instead of killing
    for limit, value in ((resource.RLIMIT_AS, address_space), (resource.RLIMIT_FSIZE, file_size),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU, then SIGKILL
    try:  # die with the gateway (Linux: PR_SET_PDEATHSIG)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def connect(request: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """The locked-down connection: the datasets attached read-only, nothing else."""
    con = duckdb.connect(":memory:", config={
        "memory_limit": request["memory_limit"], "threads": request["threads"],
        "temp_directory": "", "max_temp_directory_size": "0B",
        "autoinstall_known_extensions": False, "autoload_known_extensions": False,
        "allow_community_extensions": False, "python_enable_replacements": False})
    names = []
    for name, path in request["attach"]:
        if not NAME.fullmatch(name) or name in RESERVED_NAMES:
            raise ValueError(f"invalid dataset name {name!r}")
        # quoted: a dataset may be named like a keyword (semi, anti, asof, positional)
        con.execute(f'ATTACH {_literal(path)} AS "{name}" (READ_ONLY)')
        names.append(f'"{name}"')
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
        writer.writerow([csv_cell(n) for n in names])
    _send(out, ("columns", names, [str(d[1]) for d in description], _drain(buffer)))
    seen, limit = 0, max(keep, csv_rows) + 1
    while seen < limit and (chunk := cursor.fetchmany(min(_CHUNK, limit - seen))):
        if seen < keep:
            _send(out, ("rows", [tuple(map(_plain, r)) for r in chunk[: keep - seen]]))
        if seen < csv_rows:
            writer.writerows([csv_cell(v) for v in r] for r in chunk[: csv_rows - seen])
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
    if len(data) > FRAME_LIMIT:
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


if __name__ == "__main__":
    worker_main()
