"""SQLite, the embedded default: one file under the data dir, every part of the store in it.

``async with SqliteStore(path) as store:`` opens the file, brings every table to its newest
schema and hands out the parts (``store.conversations``, ``store.outbox``, ...), which all share
one connection and one write path (:mod:`.engine`). The parts themselves are written once for
both engines, in :mod:`pluto.storage.sql`.
"""

from __future__ import annotations

from pathlib import Path

from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite.engine import SqliteEngine

__all__ = ["SqliteStore"]


class SqliteStore(SqlStore):
    def __init__(self, path: Path):
        self.path = path
        super().__init__(SqliteEngine(path))

    def describe(self) -> str:
        return f"SQLite at {self.path}"
