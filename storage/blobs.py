"""Files every instance can read: blob keys, their checks, and the one-instance store.

A blob is a file of the data dir that another instance may need — a chart or result a tool
made (``artifacts/…``), a file a user sent (``uploads/…``), a dataset (``datasets/…``) — keyed
by its path relative to the data dir, so that every instance finds it at the same place in
its own data dir. Keys are checked here, once, for every engine: relative, ``/``-separated,
under one of those folders, no ``..``, no hidden or empty parts, no control characters.

With SQLite (one instance) the data dir is the only copy: :class:`LocalBlobs` keeps nothing
and costs nothing. With PostgreSQL the files are kept in the database as well
(:mod:`pluto.storage.postgres.blobs`), within size caps.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pluto.errors import StorageError

FOLDERS = ("artifacts", "uploads", "datasets")  # what may be shared, nothing else of the data dir
MAX_KEY_CHARS = 512
_PART = re.compile(r"[^\x00-\x1f\x7f/\\]+")


class BlobError(StorageError):
    """A file cannot be kept in, or read from, the shared file store (the message says why)."""


class BlobNameRefused(BlobError):
    """A blob key that is not a plain path under a shared folder (``..``, absolute, …)."""


class BlobTooLarge(BlobError):
    """A file over the size cap, or one that would take the store past its total cap."""


def check_key(key: Any) -> str:
    """``key`` when it names a file under a shared folder of the data dir; else
    :class:`BlobNameRefused` naming the problem."""
    if not isinstance(key, str) or not key:
        raise BlobNameRefused("a file name is needed")
    shown = key[:80]
    if len(key) > MAX_KEY_CHARS:
        raise BlobNameRefused(f"the file name {shown!r}… is longer than {MAX_KEY_CHARS} characters")
    if key.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", key):
        raise BlobNameRefused(f"{shown!r} is an absolute path; give one relative to the data dir")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", "..") or part.startswith(".") or not _PART.fullmatch(part):
            raise BlobNameRefused(f"{shown!r} is not a plain path ({part!r} is not allowed)")
    if len(parts) < 2 or parts[0] not in FOLDERS:
        raise BlobNameRefused(f"{shown!r} is not under {', '.join(f + '/' for f in FOLDERS)}")
    return key


def local_path(data_dir: Path, key: str) -> Path:
    """Where the file of ``key`` lives in ``data_dir`` (the key is checked first)."""
    return data_dir / check_key(key)


class LocalBlobs:
    """One instance (SQLite): the data dir is the store; nothing is copied, nothing fetched."""

    shared = False

    async def migrate(self) -> None:
        return None

    async def put(self, key: str, path: Path, *, meta: str = "", max_bytes: int,
                  max_total: int) -> str:
        check_key(key)
        return ""

    async def fetch(self, key: str, dest: Path) -> bool:
        check_key(key)
        return False

    async def delete(self, key: str) -> bool:
        check_key(key)
        return False

    async def listing(self, prefix: str) -> list[tuple[str, int, str, str]]:
        return []

    async def prune(self, prefixes: tuple[str, ...], older_than: float,
                    max_total: int) -> int:
        return 0
