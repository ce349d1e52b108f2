"""Loading a file (or a folder of files of one format) into a new DuckDB database file, with
types kept: the parent's side. The loading itself runs in a locked-down child process
(`loader.py`) with caps on memory, time, rows, columns and the size of what it writes, and
DuckDB's errors come back as one or two sentences for people."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import loader
from .child import DataError
from .filetypes import FORMATS
from .ingest_limits import CsvOptions, IngestLimits

MAX_FOLDER_FILES = 1000
LOADER = Path(loader.__file__).resolve()
_WORKER_ENV = {"PATH": os.defpath, "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2",
               "HOME": "/nonexistent"}  # nothing of the gateway's environment


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


def load(tmp: Path, spill: Path, table: str, fmt: str, files: list[Path],
         limits: IngestLimits = IngestLimits(), csv: CsvOptions | None = None
         ) -> tuple[int, list[tuple[str, str]]]:
    """Create `table` in the new database file `tmp` from `files`, in a child process:
    (rows, [(column, type)]). Blocking: from async code, call it in a thread."""
    spill.mkdir()
    request = {"tmp": str(tmp), "spill": str(spill), "table": table, "format": fmt,
               "files": [str(f) for f in files], "memory_limit": limits.memory_limit,
               "threads": limits.threads, "timeout": limits.timeout,
               "max_rows": limits.max_rows, "max_columns": limits.max_columns,
               "max_file_bytes": limits.max_file_bytes,
               "csv": (csv or CsvOptions()).as_json()}
    name = files[0].name
    try:
        done = subprocess.run([sys.executable, "-I", "-B", str(LOADER)], cwd="/",
                              env=_WORKER_ENV, input=json.dumps(request).encode(),
                              capture_output=True, timeout=limits.timeout)
    except subprocess.TimeoutExpired:
        raise DatasetError(f"Loading {name} took longer than {limits.timeout:g} s and was "
                           "stopped.") from None
    try:
        answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": _died(done.returncode, name, limits)}
    if "error" in answer:
        error = answer["error"]
        raise DatasetError(_memory(name, limits) if error == "memory" else error)
    return answer["rows"], [(n, t) for n, t in answer["columns"]]


def _died(code: int, name: str, limits: IngestLimits) -> str:
    if code in (-signal.SIGKILL, -signal.SIGABRT, -signal.SIGSEGV):
        return "memory"
    if code == -signal.SIGXCPU:
        return f"Loading {name} used up its CPU time and was stopped."
    return f"Loading {name} failed: the loader process ended unexpectedly (exit code {code})."


def _memory(name: str, limits: IngestLimits) -> str:
    return (f"Loading {name} needed more than its memory limit ({limits.memory_limit}) and was "
            "stopped.")


def human_size(size: int) -> str:
    """'512 B', '17 KB', '31.2 MB', '2.1 GB'."""
    if size < 1024:
        return f"{size} B"
    if size < 2**20:
        return f"{size / 1024:.0f} KB"
    return f"{size / 2**20:.1f} MB" if size < 2**30 else f"{size / 2**30:.1f} GB"
