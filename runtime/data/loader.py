"""Loading a file into a new DuckDB database file, in a locked-down child process.

Run as a script (``python -I -B loader.py``), like the query sandbox's child: it imports only
the standard library, duckdb and `child.py` (by path), reads one JSON request on stdin, limits
itself (address space, CPU time, the size of any file it writes, death with its parent), lets
DuckDB read only the files to load (external access off, configuration locked), loads
the file(s) with at most ``max_columns`` columns and ``max_rows`` rows, and answers one JSON
line: ``{"rows": n, "columns": [[name, type], ...]}`` or ``{"error": "one or two sentences"}``.
A hostile file (50,000 columns, a Parquet file that expands to 300 M rows) costs this child,
never the gateway: it is refused by a cap or stopped by a limit.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import duckdb

NULLS = ("NA", "N/A", "NULL", "")  # read as NULL by default, as pandas and R do
_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\s*\(\s*\d+(\s*,\s*\d+)?\s*\))?(\[\])?")


def _sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


if __name__ == "__main__":
    _child = _sibling("child")
    clean_message, LoadFailed = _child.clean_message, _child.DataError
else:
    from .child import DataError as LoadFailed, clean_message


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        request = json.loads(sys.stdin.buffer.read())
        _child.limit_resources(request, file_size=request["max_file_bytes"])
        rows, columns = load(request)
        answer: dict[str, Any] = {"rows": rows, "columns": columns}
    except LoadFailed as e:
        answer = {"error": str(e)}
    except MemoryError:
        answer = {"error": "memory"}
    except duckdb.Error as e:
        text = str(e)
        oom = isinstance(e, duckdb.OutOfMemoryException) or "bad allocation" in text
        answer = {"error": "memory" if oom else _explain(text, request["files"])}
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line
        answer = {"error": f"{type(e).__name__}: {clean_message(str(e))}"}
    out.write(json.dumps(answer) + "\n")
    out.flush()


def load(request: dict[str, Any]) -> tuple[int, list[list[str]]]:
    files, table, fmt = request["files"], request["table"], request["format"]
    given = {k: v for k, v in (request.get("csv") or {}).items() if v not in (None, {}, [])}
    if given and fmt not in ("csv", "tsv"):
        raise LoadFailed(f"{_name(files[0])} is {fmt.upper()}: --null, --delimiter, --header "
                         "and --type apply to CSV and TSV files only.")
    config = {"memory_limit": request["memory_limit"], "threads": request["threads"],
              "temp_directory": request["spill"],
              "autoinstall_known_extensions": False, "autoload_known_extensions": False}
    try:
        with duckdb.connect(request["tmp"], config=config) as con:
            _lock_down(con, request)
            if fmt in ("csv", "tsv"):
                _load_csv(con, request, "\t" if fmt == "tsv" else None)
            else:
                if fmt == "parquet":  # the count is in the footers: refuse before reading
                    paths = "[" + ", ".join(_literal(f) for f in files) + "]"
                    _check_rows(con.execute(f"SELECT sum(num_rows) FROM "
                                            f"parquet_file_metadata({paths})").fetchall()[0][0]
                                or 0, request)
                reader = _reader(fmt, files)
                if len(files) > 1:
                    _check_alike(files, [_described(con, fmt, f) for f in files])
                _check_columns(len(con.execute(f"DESCRIBE SELECT * FROM {reader}").fetchall()),
                               request)
                con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM {reader} '
                            f'LIMIT {request["max_rows"] + 1}')
            rows = con.execute(f'SELECT count(*) FROM "{table}"').fetchall()[0][0]
            _check_rows(rows, request)
            described = con.execute(f'DESCRIBE "{table}"').fetchall()
            con.execute("CHECKPOINT")
    except UnicodeDecodeError as e:
        raise LoadFailed(f"Could not read {_name(files[0])}: it is not UTF-8 text (byte "
                         f"{e.start}). Save it as UTF-8 and send it again.") from None
    except duckdb.Error as e:
        if "File too large" in str(e) or "Could not write" in str(e):
            raise LoadFailed(f"{_name(files[0])} makes a dataset larger than "
                             f"{request['max_file_bytes'] // 2**20} MB, the limit.") from None
        raise
    if rows == 0:
        raise LoadFailed(f"{_name(files[0])} has no data rows.")
    return rows, [[r[0], r[1]] for r in described]


def _lock_down(con: duckdb.DuckDBPyConnection, request: dict[str, Any]) -> None:
    """DuckDB may read the files being loaded and spill to its own folder, nothing else."""
    paths = "[" + ", ".join(_literal(f) for f in request["files"]) + "]"
    con.execute(f"SET allowed_paths = {paths}")
    con.execute(f"SET allowed_directories = [{_literal(request['spill'])}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _check_columns(count: int, request: dict[str, Any], file: str | None = None) -> None:
    if count > request["max_columns"]:
        raise LoadFailed(f"{_name(file or request['files'][0])} has {count:,} columns; a "
                         f"dataset may have at most {request['max_columns']:,}.")


def _described(con: duckdb.DuckDBPyConnection, fmt: str, file: str) -> list[str]:
    """The column names DuckDB finds in one file of a folder (of JSON or Parquet)."""
    return [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {_reader(fmt, [file])}")
            .fetchall()]


def _check_alike(files: list[str], columns: list[list[str]]) -> None:
    """The files of a folder are one table: each must share column names with the first
    (one may add or lack a column). A file that shares none is refused, by name: it is
    malformed, has no header, or is another table, and would be merged as extra columns."""
    first = set(columns[0])
    for file, names in zip(files[1:], columns[1:]):
        if not first & set(names):
            raise LoadFailed(
                f"{_name(file)} does not match {_name(files[0])}: its columns "
                f"({_listed(names)}) share no name with {_listed(columns[0])}. Give every file "
                "of the folder the same header, or move that file out, and add it again.")


def _listed(names: list[str], most: int = 6) -> str:
    shown = ", ".join(names[:most])
    return shown + (", …" if len(names) > most else "")


def _check_rows(rows: int, request: dict[str, Any]) -> None:
    if rows > request["max_rows"]:
        raise LoadFailed(f"{_name(request['files'][0])} has more than {request['max_rows']:,} "
                         "rows, the limit for a dataset.")


def _reader(fmt: str, files: list[str], extra: str = "") -> str:
    paths = "[" + ", ".join(_literal(f) for f in files) + "]"
    function = {"parquet": "read_parquet", "csv": "read_csv", "tsv": "read_csv"}.get(
        fmt, "read_json")
    if fmt == "ndjson":
        extra += ", format = 'newline_delimited'"
    return f"{function}({paths}, union_by_name = true{extra})"


def csv_options(options: dict[str, Any], delim: str | None) -> str:
    """read_csv's options from the request: nulls, delimiter, header."""
    nulls = options.get("nulls")
    nulls = list(NULLS) if nulls is None else nulls
    extra = ", nullstr = [" + ", ".join(_literal(n) for n in nulls) + "]" if nulls else ""
    delim = options.get("delimiter") or delim
    if delim:
        extra += f", delim = {_literal(delim)}"
    if options.get("header") is not None:
        extra += f", header = {'true' if options['header'] else 'false'}"
    return extra


def _load_csv(con: duckdb.DuckDBPyConnection, request: dict[str, Any], delim: str | None) -> None:
    """Auto-detected types (the common null markers read as NULL), except the types given,
    and DOUBLE columns whose text is plain decimals (12.50, -3.1) become DECIMAL(18, scale)."""
    files, table, options = request["files"], request["table"], request.get("csv") or {}
    extra = csv_options(options, delim)
    sniffs = [_sniff(con, file, request, options.get("delimiter") or delim, extra)
              for file in files]
    if len(files) > 1:
        _check_alike(files, [[c["name"] for c in s] for s in sniffs])
    columns = sniffs[0]
    given = _types(options.get("types") or {}, [c["name"] for c in columns])
    doubles = [c["name"] for c in columns if c["type"] == "DOUBLE" and c["name"] not in given]
    types = {**given, **{n: "VARCHAR" for n in doubles}}
    if types:
        extra += ", types = {" + ", ".join(f"{_literal(n)}: {_literal(t)}"
                                           for n, t in types.items()) + "}"
    con.execute(f"CREATE TEMP TABLE raw AS SELECT * FROM {_reader('csv', files, extra)} "
                f"LIMIT {request['max_rows'] + 1}")
    _check_rows(con.execute("SELECT count(*) FROM raw").fetchall()[0][0], request)
    casts = [f'CAST("{_ident(n)}" AS {_decimal_type(con, n)}) AS "{_ident(n)}"' for n in doubles]
    replaced = f" REPLACE ({', '.join(casts)})" if casts else ""
    con.execute(f'CREATE TABLE "{table}" AS SELECT *{replaced} FROM raw')
    con.execute("DROP TABLE raw")


def _sniff(con: duckdb.DuckDBPyConnection, file: str, request: dict[str, Any],
           delim: str | None, extra: str) -> list[dict[str, str]]:
    """One file's columns as DuckDB detects them; a file of ragged rows is refused (by line),
    as is one of too many columns (counted cheaply first)."""
    _check_columns(_header_fields(file, delim), request, file)
    sniffed = con.execute(f"SELECT Delimiter, SkipRows, Columns FROM sniff_csv("
                          f"{_literal(file)}{extra})").fetchone()
    found, skipped, columns = sniffed  # type: ignore[misc]
    _check_columns(len(columns), request, file)
    if skipped or len(columns) == 1:  # DuckDB's answer to ragged rows: skip them, or one column
        _check_ragged(file, found if len(columns) > 1 else None)
    return list(columns)


def _types(given: dict[str, str], columns: list[str]) -> dict[str, str]:
    unknown = sorted(set(given) - set(columns))
    if unknown:
        raise LoadFailed(f"--type names no column {unknown[0]!r}; the columns are "
                         f"{', '.join(columns[:20])}{', …' if len(columns) > 20 else ''}.")
    bad = next((t for t in given.values() if not _TYPE.fullmatch(t.strip())), None)
    if bad is not None:
        raise LoadFailed(f"{bad!r} is not a column type; use e.g. VARCHAR, BIGINT, DOUBLE, "
                         "DECIMAL(18,2), DATE, TIMESTAMP.")
    return {n: t.strip().upper() for n, t in given.items()}


def _header_fields(path: str, delim: str | None) -> int:
    """The fields of the first line, counted cheaply before DuckDB sniffs (a 300 KB line of
    50,000 columns would cost the sniffer a gigabyte)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        line = f.readline(8 * 2**20)
    delim = delim or max(",;\t|", key=line.count)
    return line.count(delim) + 1


def _decimal_type(con: duckdb.DuckDBPyConnection, column: str) -> str:
    value = f'trim("{_ident(column)}")'
    plain, scale, digits = con.execute(
        f"SELECT bool_and(regexp_full_match({value}, '[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)')), "
        f"max(length(regexp_extract({value}, '[.]([0-9]*)$', 1))), "
        f"max(length(ltrim(regexp_extract({value}, '^[+-]?([0-9]*)', 1), '0'))) "
        f'FROM raw WHERE "{_ident(column)}" IS NOT NULL').fetchone()  # type: ignore[misc]
    if plain and scale and digits + scale <= 18:
        return f"DECIMAL(18,{scale})"
    return "DOUBLE"


def _check_ragged(path: str, delim: str | None) -> None:
    """Raise at the first row whose field count differs from the first row's."""
    with open(path, newline="", encoding="utf-8") as f:
        if delim is None:
            header = f.readline()
            delim = max(",;\t|", key=header.count)
            if header.count(delim) == 0:
                return  # one column indeed
            f.seek(0)
        reader, expected = csv.reader(f, delimiter=delim), None
        try:
            for row in reader:
                if expected is None:
                    expected = len(row)
                elif row and len(row) != expected:
                    raise LoadFailed(f"Could not read {_name(path)}: line {reader.line_num} has "
                                     f"{len(row)} fields but the first line has {expected}. "
                                     "Give every row the same fields and send it again.")
        except csv.Error:
            return


def _explain(message: str, files: list[str]) -> str:
    """DuckDB's error as one or two plain sentences: where (line, when DuckDB says) and why."""
    for file in files:  # never show server paths
        message = message.replace(file, _name(file))
    names = [_name(f) for f in files]
    name = next((n for n in names if n in message), names[0])
    line = re.search(r"\bLine: (\d+)", message)
    where = f"line {line.group(1)}" if line else "it"
    fix = "Fix the file and send it again."
    if "Invalid unicode" in message or "not utf-8" in message:
        why, fix = f"{where} is not UTF-8 text", "Save it as UTF-8 and send it again."
    elif m := re.search(r"Expected Number of Columns: (\d+) Found: (\d+)", message):
        why = f"{where} has {m.group(2)} fields but the header has {m.group(1)}"
    elif "not possible to automatically detect" in message:
        why = "it does not look like delimited text (no consistent delimiter or quoting)"
    elif "magic bytes" in message or "to be a Parquet file" in message:
        why = "it is not a valid Parquet file"
    elif m := re.search(r"Malformed JSON[^,]*, at byte (\d+) in record/value (\d+): (.*)",
                        message):
        why = f"it is not valid JSON (record {m.group(2)}, byte {m.group(1)}: " \
              f"{m.group(3).strip().rstrip('. ')})"
    elif m := re.search(r"Type with name (\S+) does not exist", message):
        return (f"{m.group(1)!r} is not a column type; use e.g. VARCHAR, BIGINT, DOUBLE, "
                "DECIMAL(18,2), DATE, TIMESTAMP.")
    elif m := re.search(r'Could not convert string "([^"]*)" to \'(\w+)\'', message):
        column = re.search(r'Column at position: \d+ Set type: \w+ Sniffed type: \w+|'
                           r'column "([^"]+)"', message)
        named = f" in column {column.group(1)}" if column and column.group(1) else ""
        article = "an" if m.group(2)[:1] in "AEIOU" else "a"
        why = f"{where}: {m.group(1)!r}{named} is not {article} {m.group(2)}"
        fix = "Give that column another type (--type), or fix the file."
    else:
        why = re.sub(r"^[\w ]*Error: ", "", clean_message(message).splitlines()[0]).rstrip(".")
        why = f"{why} ({where})" if line else why
    return f"Could not read {name}: {why}. {fix}"


def _name(path: str) -> str:
    return os.path.basename(path)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(text: str) -> str:
    return text.replace('"', '""')


if __name__ == "__main__":
    main()
