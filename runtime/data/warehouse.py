"""The DuckDB warehouse: one `<name>.duckdb` file per dataset (one table named like the
dataset) under `<data_dir>/datasets/`, and `catalog.json` describing them.

A dataset is global (owner None: registered by an admin) or owned by one conversation (a
file sent in a chat; the gateway uses the chat's session key as the owner). A `Scope` says
what a conversation sees: the global datasets its agent allows, plus its own. An ingest loads into a hidden temp file and renames it into place, so a
broken file never leaves a half-made dataset behind. Methods block: from async code, call
them through `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
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

from .child import RESERVED_NAMES
from .ingest import (CsvOptions, DatasetError, IngestLimits, collect, fingerprint_of, human_size,
                     load)
from .sandbox import QueryResult, run_query

__all__ = ["Column", "DatasetError", "DatasetExists", "DatasetInfo", "DatasetNotFound", "Scope",
           "Warehouse", "check_name", "dataset_name"]
log = logging.getLogger(__name__)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


class DatasetNotFound(DatasetError):
    """No dataset of that name is visible in the scope."""


class DatasetExists(DatasetError):
    """A dataset of that name exists already (and replacing it was not asked for)."""

    def __init__(self, name: str):
        super().__init__(f"A dataset named {name} already exists; choose another name.")
        self.name = name


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
    fingerprint: str = ""  # of the source file(s) when loaded: name, size, modification time
    source_bytes: int = 0  # the size of the file(s) it was loaded from
    blob: str = ""  # several instances: the SHA-256 of the copy in the shared file store


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
                 limits: IngestLimits = IngestLimits()) -> None:
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self.limits = limits  # for ingesting (in a child process); queries have their own
        self.root.mkdir(parents=True, exist_ok=True)
        self._catalog = self.root / "catalog.json"
        self._mutex = threading.Lock()
        self._pending: set[str] = set()
        self.elsewhere: set[str] = set()  # several instances: names taken by datasets not here

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
               replace: bool = False, csv: CsvOptions | None = None) -> DatasetInfo:
        """Load a CSV/TSV/Parquet/JSON/NDJSON file, or a folder of one format, as a dataset
        (in a child process, within `self.limits`)."""
        source = Path(source).absolute()  # the loader's working directory is not ours
        fmt, files = collect(source)
        size = sum(f.stat().st_size for f in files)
        if size > self.max_file_bytes:
            raise DatasetError(f"{source.name} is {human_size(size)}; the limit is "
                               f"{human_size(self.max_file_bytes)}.")
        if empty := next((f for f in files if f.stat().st_size == 0), None):
            raise DatasetError(f"{empty.name} is empty.")
        name = self._claim(name, source, owner, replace)
        token = uuid.uuid4().hex
        tmp, spill = self.root / f".ingest-{token}.duckdb", self.root / f".ingest-{token}.tmp"
        try:
            rows, columns = load(tmp, spill, name, fmt, files, self.limits, csv)
            info = DatasetInfo(name, self.root / f"{name}.duckdb", source.name, owner, rows,
                               tuple(Column(n, t) for n, t in columns),
                               datetime.now(timezone.utc), tmp.stat().st_size,
                               fingerprint_of(files), size)
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

    # ---- several instances: datasets kept in the shared file store ---------------------

    def mark_shared(self, name: str, blob: str) -> None:
        """Record that the dataset's file is in the shared file store as ``blob``."""
        with self._locked():
            datasets = self._read()
            if name in datasets:
                self._write({**datasets, name: dataclasses.replace(datasets[name], blob=blob)})

    def adopt(self, name: str, entry: dict[str, Any], file: Path, blob: str) -> DatasetInfo:
        """A dataset another instance loaded: its file (fetched to ``file``, in this folder)
        moved into place, and its catalog ``entry`` (:func:`entry_of`) recorded."""
        check_name(name)
        info = DatasetInfo(
            name=name, path=self.root / f"{name}.duckdb", source=str(entry["source"]),
            owner=entry.get("owner"), rows=int(entry["rows"]),
            columns=tuple(Column(n, t) for n, t in entry["columns"]),
            created_at=datetime.fromisoformat(entry["created_at"]),
            size_bytes=int(entry.get("size_bytes", 0)), fingerprint=entry.get("fingerprint", ""),
            source_bytes=int(entry.get("source_bytes", 0)), blob=blob)
        with self._locked():
            os.replace(file, info.path)
            self._write({**self._read(), name: info})
        return info

    def forget(self, name: str) -> None:
        """Remove a dataset that was removed on another instance (no scope: it is gone)."""
        with self._locked():
            datasets = self._read()
            dataset = datasets.pop(name, None)
            if dataset is not None:
                self._write(datasets)
                dataset.path.unlink(missing_ok=True)

    # ---- the catalog -----------------------------------------------------------------

    def _claim(self, name: str | None, source: Path, owner: str | None, replace: bool) -> str:
        with self._locked():
            taken = set(self._read()) | self._pending | self.elsewhere
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
            raise DatasetExists(name)

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
            fingerprint=d.get("fingerprint", ""), source_bytes=d.get("source_bytes", 0),
            blob=d.get("blob", ""),
        ) for name, d in raw.get("datasets", {}).items()}
        for name, dataset in list(found.items()):
            if dataset.path.is_symlink() or not dataset.path.is_file():
                log.warning("dataset %s: %s is missing or a symlink; ignored", name, dataset.path)
                del found[name]
        return found

    def _write(self, datasets: dict[str, DatasetInfo]) -> None:
        raw = {"version": 1, "datasets": {d.name: {
            **entry_of(d), **({"blob": d.blob} if d.blob else {}),
        } for d in sorted(datasets.values(), key=lambda d: d.name)}}
        tmp = self._catalog.with_name(f".catalog.{uuid.uuid4().hex}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._catalog)


def entry_of(d: DatasetInfo) -> dict[str, Any]:
    """A dataset's catalog entry (as ``catalog.json`` and the shared file store keep it)."""
    return {"source": d.source, "owner": d.owner, "rows": d.rows,
            "columns": [[c.name, c.type] for c in d.columns],
            "created_at": d.created_at.isoformat(), "size_bytes": d.size_bytes,
            "fingerprint": d.fingerprint, "source_bytes": d.source_bytes}


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
