"""The DuckDB warehouse: one `<name>.duckdb` file per dataset (one table named like the
dataset) under `<data_dir>/datasets/`, and `catalog.json` describing them.

A dataset is global (owner None: registered by an admin) or owned by one session (a file
sent in a chat). A `Scope` says what a session sees: the global datasets its agent allows,
plus its own. An ingest loads into a hidden temp file and renames it into place, so a
broken file never leaves a half-made dataset behind. Methods block: from async code, call
them through `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any, Literal

import duckdb

from .sandbox import RESERVED_NAMES, DataError, QueryResult, clean_message, run_query

FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
           ".json": "json", ".ndjson": "ndjson", ".jsonl": "ndjson"}
MAX_FOLDER_FILES = 1000
log = logging.getLogger(__name__)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


class DatasetError(DataError):
    """A file cannot become a dataset, or a dataset operation is not possible."""


class DatasetNotFound(DatasetError):
    """No dataset of that name is visible in the scope."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # DuckDB's type name: BIGINT, DECIMAL(18,2), DATE, TIMESTAMP, VARCHAR, ...


@dataclass(frozen=True, slots=True)
class DatasetInfo:
    name: str  # also the table name
    path: Path  # the .duckdb file
    source: str  # the file or folder name it came from
    owner: str | None  # the session id that uploaded it; None for a global dataset
    rows: int
    columns: tuple[Column, ...]
    created_at: datetime
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Scope:
    """What one session may see: its own uploads, and the global datasets in `allowed`."""

    session_id: str | None = None
    allowed: Sequence[str] | Literal["*"] = "*"
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.allowed, str) and self.allowed != "*":
            raise TypeError("Scope.allowed is '*' or a list of dataset names")
        if self.allowed != "*":
            object.__setattr__(self, "allowed", tuple(self.allowed))
        object.__setattr__(self, "_names", frozenset(self.allowed) - {"*"})

    def can_see(self, dataset: DatasetInfo) -> bool:
        if dataset.owner is not None:
            return dataset.owner == self.session_id
        return self.allowed == "*" or dataset.name in self._names


class Warehouse:
    def __init__(self, root: Path, max_file_bytes: int = 100 * 2**20, *,
                 memory_limit: str = "1GB", threads: int = 2) -> None:
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self.memory_limit = memory_limit  # for ingesting; queries have their own limits
        self.threads = threads
        self.root.mkdir(parents=True, exist_ok=True)
        self._catalog = self.root / "catalog.json"
        self._mutex = threading.Lock()
        self._pending: set[str] = set()

    # ---- reading ---------------------------------------------------------------------

    def list(self, scope: Scope | None = None) -> list[DatasetInfo]:
        """Datasets visible in `scope` (all of them when scope is None), by name."""
        found = self._read().values()
        return sorted((d for d in found if scope is None or scope.can_see(d)), key=lambda d: d.name)

    def get(self, name: str, scope: Scope | None = None) -> DatasetInfo:
        dataset = self._read().get(name)
        if dataset is None or (scope is not None and not scope.can_see(dataset)):
            names = ", ".join(d.name for d in self.list(scope)) or "none"
            raise DatasetNotFound(f"There is no dataset named {name!r}. Available: {names}.")
        return dataset

    async def query(self, sql: str, scope: Scope | None = None, **options: Any) -> QueryResult:
        """`run_query` over exactly the datasets visible in `scope`."""
        datasets = await asyncio.to_thread(self.list, scope)
        return await run_query(sql, datasets, **options)

    # ---- changing --------------------------------------------------------------------

    def ingest(self, source: Path, name: str | None = None, *, owner: str | None = None,
               replace: bool = False) -> DatasetInfo:
        """Load a CSV/TSV/Parquet/JSON/NDJSON file, or a folder of one format, as a dataset."""
        source = Path(source)
        fmt, files = _collect(source)
        size = sum(f.stat().st_size for f in files)
        if size > self.max_file_bytes:
            raise DatasetError(f"{source.name} is {_human(size)}; the limit is "
                               f"{_human(self.max_file_bytes)}.")
        if empty := next((f for f in files if f.stat().st_size == 0), None):
            raise DatasetError(f"{empty.name} is empty.")
        name = self._claim(name, source, owner, replace)
        token = uuid.uuid4().hex
        tmp, spill = self.root / f".ingest-{token}.duckdb", self.root / f".ingest-{token}.tmp"
        try:
            rows, columns = _load(tmp, spill, name, fmt, files, self.memory_limit, self.threads)
            info = DatasetInfo(name, self.root / f"{name}.duckdb", source.name, owner, rows,
                               columns, datetime.now(timezone.utc), tmp.stat().st_size)
            with self._locked():
                self._check_free(name, owner, replace)
                os.replace(tmp, info.path)
                self._write({**self._read(), name: info})
            return info
        finally:
            for leftover in (tmp, Path(f"{tmp}.wal")):
                leftover.unlink(missing_ok=True)
            shutil.rmtree(spill, ignore_errors=True)
            with self._mutex:
                self._pending.discard(name)

    def remove(self, name: str, scope: Scope | None = None) -> None:
        with self._locked():
            dataset = self.get(name, scope)
            datasets = self._read()
            del datasets[name]
            self._write(datasets)
            dataset.path.unlink(missing_ok=True)

    def share(self, name: str) -> DatasetInfo:
        """Make a session's upload a global dataset (agents still need it allowed)."""
        with self._locked():
            datasets = self._read()
            shared = dataclasses.replace(self.get(name), owner=None)
            self._write({**datasets, name: shared})
            return shared

    # ---- the catalog -----------------------------------------------------------------

    def _claim(self, name: str | None, source: Path, owner: str | None, replace: bool) -> str:
        with self._locked():
            taken = set(self._read()) | self._pending
            if name is None:
                base = name = dataset_name(source)
                counter = 2
                while name in taken:
                    name = f"{base[:56]}_{counter}"
                    counter += 1
            else:
                check_name(name)
                if name in self._pending:
                    raise DatasetError(f"Dataset {name} is being loaded right now; try again.")
                self._check_free(name, owner, replace)
            self._pending.add(name)
            return name

    def _check_free(self, name: str, owner: str | None, replace: bool) -> None:
        existing = self._read().get(name)
        if existing is not None and not (replace and existing.owner == owner):
            raise DatasetError(f"A dataset named {name} already exists; choose another name.")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time, across threads and processes (`pluto data add`)."""
        with self._mutex, open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _read(self) -> dict[str, DatasetInfo]:
        try:
            raw = json.loads(self._catalog.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        found = {name: DatasetInfo(
            name=name, path=self.root / f"{name}.duckdb", source=d["source"], owner=d["owner"],
            rows=d["rows"], columns=tuple(Column(n, t) for n, t in d["columns"]),
            created_at=datetime.fromisoformat(d["created_at"]), size_bytes=d.get("size_bytes", 0),
        ) for name, d in raw.get("datasets", {}).items()}
        for name, dataset in list(found.items()):
            if dataset.path.is_symlink() or not dataset.path.is_file():
                log.warning("dataset %s: %s is missing or a symlink; ignored", name, dataset.path)
                del found[name]
        return found

    def _write(self, datasets: dict[str, DatasetInfo]) -> None:
        raw = {"version": 1, "datasets": {d.name: {
            "source": d.source, "owner": d.owner, "rows": d.rows,
            "columns": [[c.name, c.type] for c in d.columns],
            "created_at": d.created_at.isoformat(), "size_bytes": d.size_bytes,
        } for d in sorted(datasets.values(), key=lambda d: d.name)}}
        tmp = self._catalog.with_name(f".catalog.{uuid.uuid4().hex}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._catalog)


# ---- names -------------------------------------------------------------------------------


@cache
def _reserved() -> frozenset[str]:
    with duckdb.connect(":memory:") as con:
        words = con.execute("SELECT keyword_name FROM duckdb_keywords() "
                            "WHERE keyword_category = 'reserved'").fetchall()
    return RESERVED_NAMES | {w[0].lower() for w in words}


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise DatasetError(f"Invalid dataset name {name!r}: use 1 to 63 lower-case letters, "
                           "digits and underscores, starting with a letter.")
    if name in _reserved():
        raise DatasetError(f"{name!r} is a reserved SQL word; choose another dataset name.")


def dataset_name(source: Path) -> str:
    """A valid dataset name from a file or folder name: 'Sales 2024.csv' -> 'sales_2024'."""
    stem = source.name if source.is_dir() else source.stem
    name = re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_") or "dataset"
    if not name[0].isalpha():
        name = f"d_{name}"
    name = name[:63].rstrip("_")
    return f"{name[:58]}_data" if name in _reserved() else name


# ---- loading ------------------------------------------------------------------------------


def _collect(source: Path) -> tuple[str, list[Path]]:
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


def _load(tmp: Path, spill: Path, table: str, fmt: str, files: list[Path], memory_limit: str,
          threads: int) -> tuple[int, tuple[Column, ...]]:
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
    return rows, tuple(Column(r[0], r[1]) for r in described)


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


def _human(size: int) -> str:
    return f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{size / 1024:.0f} KB"
