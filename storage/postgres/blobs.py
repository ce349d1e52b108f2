"""Files every instance can read, kept in PostgreSQL (see :mod:`pluto.storage.blobs`).

A blob is one row of ``blobs`` (its key, size, SHA-256, creation time on the database's
clock, and a short text the caller keeps with it) and its content in ``blob_chunks``, 1 MiB
``bytea`` each, so that no statement carries a large value. Writing replaces the whole blob in
one transaction (the engine may run it again: it starts by removing what a try left); reading
writes the chunks to a temporary file next to the destination, checks size and SHA-256, then
renames it into place — all in the engine's worker thread, never on the event loop.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

from pluto.storage.blobs import BlobError, BlobTooLarge, check_key
from pluto.storage.sql import Engine

COMPONENT = "blobs"
CHUNK = 2**20
BATCH = 8  # chunks read per statement (8 MiB at most in memory)
MIGRATIONS: list[Any] = [{
    "sqlite": "SELECT 1",  # never used: one instance keeps its files in the data dir
    "postgres": """
    CREATE TABLE blobs (
        key TEXT PRIMARY KEY,
        size BIGINT NOT NULL,
        sha256 TEXT NOT NULL,
        chunks INTEGER NOT NULL,
        meta TEXT NOT NULL DEFAULT '',
        created_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX blobs_created ON blobs(created_at);
    CREATE TABLE blob_chunks (
        key TEXT NOT NULL REFERENCES blobs(key) ON DELETE CASCADE,
        n INTEGER NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (key, n)
    );
    """,
}]


def _size(size: int) -> str:
    if size < 2**20:
        return f"{size / 1024:.0f} KB"
    return f"{size / 2**20:.1f} MB" if size < 2**30 else f"{size / 2**30:.1f} GB"


class PgBlobs:
    """The shared file store on PostgreSQL."""

    shared = True

    def __init__(self, engine: Engine):
        self.engine = engine

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def put(self, key: str, path: Path, *, meta: str = "", max_bytes: int,
                  max_total: int) -> str:
        """Keep the file at ``path`` as ``key`` (replacing it); its SHA-256.
        :class:`BlobTooLarge` when it is over ``max_bytes``, or would take every blob together
        over ``max_total``."""
        check_key(key)
        now = self.engine.now_sql

        def change(conn: Any) -> str:
            size = os.stat(path).st_size
            if size > max_bytes:
                raise BlobTooLarge(f"{path.name} is {_size(size)}; files shared between "
                                   f"instances may be at most {_size(max_bytes)}.")
            others = conn.execute("SELECT coalesce(sum(size), 0) FROM blobs WHERE key <> ?",
                                  (key,)).fetchone()[0]
            if others + size > max_total:
                raise BlobTooLarge(f"{path.name} ({_size(size)}) does not fit in the shared "
                                   f"file store: {_size(int(others))} of {_size(max_total)} "
                                   "are in use.")
            conn.execute("DELETE FROM blob_chunks WHERE key = ?", (key,))
            conn.execute(f"INSERT INTO blobs (key, size, sha256, chunks, meta, created_at) "
                         f"VALUES (?, 0, '', 0, ?, {now}) ON CONFLICT (key) DO UPDATE SET "
                         f"meta = excluded.meta, created_at = excluded.created_at", (key, meta))
            digest, written, n = hashlib.sha256(), 0, 0
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    written += len(block)
                    if written > max_bytes:  # it grew meanwhile
                        raise BlobTooLarge(f"{path.name} is over {_size(max_bytes)}.")
                    digest.update(block)
                    conn.execute("INSERT INTO blob_chunks (key, n, data) VALUES (?, ?, ?)",
                                 (key, n, block))
                    n += 1
            conn.execute("UPDATE blobs SET size = ?, sha256 = ?, chunks = ? WHERE key = ?",
                         (written, digest.hexdigest(), n, key))
            return digest.hexdigest()

        return await self.engine.transact(change)

    async def fetch(self, key: str, dest: Path) -> bool:
        """Write the blob ``key`` to ``dest`` (whole, or not at all); False when there is none."""
        check_key(key)

        def change(conn: Any) -> bool:
            row = conn.execute("SELECT size, sha256, chunks FROM blobs WHERE key = ?",
                               (key,)).fetchone()
            if row is None:
                return False
            size, sha, chunks = row[0], row[1], row[2]
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
            try:
                digest, written = hashlib.sha256(), 0
                with open(tmp, "wb") as f:
                    for first in range(0, chunks, BATCH):
                        for (block,) in conn.execute(
                                "SELECT data FROM blob_chunks WHERE key = ? AND n >= ? AND n < ?"
                                " ORDER BY n", (key, first, first + BATCH)).fetchall():
                            block = bytes(block)
                            digest.update(block)
                            written += f.write(block)
                if written != size or digest.hexdigest() != sha:
                    raise BlobError(f"{dest.name} changed while it was read; try again.")
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            return True

        return await self.engine.transact(change)

    async def delete(self, key: str) -> bool:
        check_key(key)
        return bool(await self.engine.write(("DELETE FROM blobs WHERE key = ?", (key,))))

    async def listing(self, prefix: str) -> list[tuple[str, int, str, str]]:
        """(key, size, sha256, meta) of every complete blob whose key starts with ``prefix``."""
        rows = await self.engine.fetchall(
            "SELECT key, size, sha256, meta FROM blobs WHERE left(key, ?) = ? AND sha256 <> ''"
            " ORDER BY key", (len(prefix), prefix))
        return [(r[0], int(r[1]), r[2], r[3]) for r in rows]

    async def prune(self, prefixes: tuple[str, ...], older_than: float,
                    max_total: int) -> int:
        """Delete blobs under ``prefixes`` created before ``older_than`` (seconds since the
        epoch, the database's clock), then the oldest of them until every blob together fits
        ``max_total``; how many were deleted."""
        def change(conn: Any) -> int:
            rows = conn.execute("SELECT key, size, created_at FROM blobs ORDER BY created_at"
                                ).fetchall()
            total = sum(int(r[1]) for r in rows)
            doomed = []
            for key, size, created in rows:
                if not key.startswith(prefixes):
                    continue
                if created >= older_than and total <= max_total:
                    break
                doomed.append(key)
                total -= int(size)
            for key in doomed:
                conn.execute("DELETE FROM blobs WHERE key = ?", (key,))
            return len(doomed)

        return await self.engine.transact(change)
