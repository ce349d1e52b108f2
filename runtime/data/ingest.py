"""Loading a file (or a folder of files of one format) into a new DuckDB database file,
with types kept, and DuckDB's errors turned into one or two sentences for people."""

from __future__ import annotations

import csv
import hashlib
import re
from pathlib import Path

import duckdb

from .child import DataError, clean_message
from .filetypes import FORMATS

MAX_FOLDER_FILES = 1000


class DatasetError(DataError):
    """A file cannot become a dataset, or a dataset operation is not possible."""


def source_fingerprint(source: Path) -> str:
    """`fingerprint_of` the file, or the files of the folder, that `source` names."""
    return fingerprint_of(collect(source)[1])


def fingerprint_of(files: list[Path]) -> str:
    """Changes when any of the files does (name, size, modification time)."""
    digest = hashlib.sha256()
    for f in files:
        st = f.stat()
        digest.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def collect(source: Path) -> tuple[str, list[Path]]:
    if not source.exists():
        raise DatasetError(f"{source.name} does not exist.")
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.name.startswith(".")) \
        if source.is_dir() else [source]
    if not files or len(files) > MAX_FOLDER_FILES:
        raise DatasetError(f"The folder {source.name} must hold 1 to {MAX_FOLDER_FILES} files.")
    formats = {FORMATS.get(f.suffix.lower()) for f in files}
    if None in formats:
        bad = next(f for f in files if f.suffix.lower() not in FORMATS)
        kind = bad.suffix or "no extension"
        raise DatasetError(f"{bad.name} is not a supported file type ({kind}). "
                           "Send CSV, TSV, Parquet, JSON or NDJSON.")
    if len(formats) > 1:
        raise DatasetError(f"The folder {source.name} mixes file formats; use one format.")
    return formats.pop(), files  # type: ignore[return-value]


def load(tmp: Path, spill: Path, table: str, fmt: str, files: list[Path], memory_limit: str,
          threads: int) -> tuple[int, list[tuple[str, str]]]:
    """Create `table` in the new database file `tmp` from `files`: (rows, [(column, type)])."""
    spill.mkdir()
    config = {"memory_limit": memory_limit, "threads": threads, "temp_directory": str(spill),
              "autoinstall_known_extensions": False, "autoload_known_extensions": False}
    try:
        with duckdb.connect(str(tmp), config=config) as con:
            if fmt in ("csv", "tsv"):
                _load_csv(con, table, "\t" if fmt == "tsv" else None, files)
            else:
                con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM {_reader(fmt, files)}')
            rows = con.execute(f'SELECT count(*) FROM "{table}"').fetchall()[0][0]
            described = con.execute(f'DESCRIBE "{table}"').fetchall()
            con.execute("CHECKPOINT")
    except duckdb.Error as e:
        raise DatasetError(_explain(str(e), files)) from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"Could not read {files[0].name}: it is not UTF-8 text (byte "
                           f"{e.start}). Save it as UTF-8 and send it again.") from None
    if rows == 0:
        raise DatasetError(f"{files[0].name} has no data rows.")
    return rows, [(r[0], r[1]) for r in described]


def _reader(fmt: str, files: list[Path], extra: str = "") -> str:
    paths = "[" + ", ".join(_literal(str(f)) for f in files) + "]"
    function = {"parquet": "read_parquet", "csv": "read_csv", "tsv": "read_csv"}.get(
        fmt, "read_json")
    if fmt == "ndjson":
        extra += ", format = 'newline_delimited'"
    return f"{function}({paths}, union_by_name = true{extra})"


def _load_csv(con: duckdb.DuckDBPyConnection, table: str, delim: str | None,
              files: list[Path]) -> None:
    """Auto-detected types, except that DOUBLE columns whose text is plain decimals
    (12.50, -3.1) become exact DECIMAL(18, scale)."""
    extra = f", delim = {_literal(delim)}" if delim else ""
    sniffed = con.execute(f"SELECT Delimiter, SkipRows, Columns FROM sniff_csv("
                          f"{_literal(str(files[0]))}{extra})").fetchone()
    found, skipped, columns = sniffed  # type: ignore[misc]
    if skipped or len(columns) == 1:  # DuckDB's answer to ragged rows: skip them, or one column
        _check_ragged(files[0], found if len(columns) > 1 else None)
    doubles = [c["name"] for c in columns if c["type"] == "DOUBLE"]
    if doubles:
        extra += ", types = {" + ", ".join(f"{_literal(n)}: 'VARCHAR'" for n in doubles) + "}"
    con.execute(f"CREATE TEMP TABLE raw AS SELECT * FROM {_reader('csv', files, extra)}")
    casts = [f'CAST("{_ident(n)}" AS {_decimal_type(con, n)}) AS "{_ident(n)}"' for n in doubles]
    replaced = f" REPLACE ({', '.join(casts)})" if casts else ""
    con.execute(f'CREATE TABLE "{table}" AS SELECT *{replaced} FROM raw')
    con.execute("DROP TABLE raw")


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


def _check_ragged(path: Path, delim: str | None) -> None:
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
                    raise DatasetError(f"Could not read {path.name}: line {reader.line_num} has "
                                       f"{len(row)} fields but the first line has {expected}. "
                                       "Give every row the same fields and send it again.")
        except csv.Error:
            return


def _explain(message: str, files: list[Path]) -> str:
    """DuckDB's error as one or two plain sentences: where (line, when DuckDB says) and why."""
    for file in files:  # never show server paths
        message = message.replace(str(file), file.name)
    name = next((f.name for f in files if f.name in message), files[0].name)
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
    else:
        why = re.sub(r"^[\w ]*Error: ", "", clean_message(message).splitlines()[0]).rstrip(".")
        why = f"{why} ({where})" if line else why
    return f"Could not read {name}: {why}. {fix}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(text: str) -> str:
    return text.replace('"', '""')


def human_size(size: int) -> str:
    return f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{size / 1024:.0f} KB"
