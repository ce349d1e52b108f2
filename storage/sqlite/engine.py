"""The SQLite engine: one connection, one thread, one way to write.

Every change goes through :meth:`SqliteEngine.transact`: a function that runs in the database
thread against the connection and makes one atomic change (one or many statements, reads in
between as it needs). Changes that arrive while a commit is in progress are committed together
in the next one (group commit: one trip to the database thread and one commit for many callers),
each inside its own savepoint, so

- a change is never half-committed: it runs from start to end in the database thread, and the
  batch commits only after every change in it has run;
- a change that fails is rolled back to its own savepoint and its caller gets the error; the
  other changes in the batch commit as if it had never been there;
- a caller continues only once its own change is durable (committed).

Reads (:meth:`read`) run in the same thread between batches, so they never see a change that
is not committed. Nothing outside ``storage/`` holds the connection or writes SQL.

aiosqlite (pinned) runs each call in its thread; ``Connection._execute`` runs one function
there, which is what lets a whole batch cost one hop. It is used here and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from pluto.errors import StorageError

log = logging.getLogger(__name__)

T = TypeVar("T")
Statement = tuple[str, tuple[Any, ...]]
Change = Callable[[sqlite3.Connection], Any]


def run_statements(statements: tuple[Statement, ...]) -> Change:
    """A change made of plain statements; its result is the row count of the last one."""
    def change(conn: sqlite3.Connection) -> int:
        count = 0
        for sql, params in statements:
            count = conn.execute(sql, params).rowcount
        return count
    return change


def _apply_batch(conn: sqlite3.Connection, changes: list[Change]) -> list[Any]:
    """In the database thread: each change in its own savepoint, then one commit for all.

    A change that raises is rolled back to its savepoint and its exception is its result. If
    the commit itself fails, everything is rolled back and the error goes to every caller."""
    results: list[Any] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for change in changes:
            conn.execute("SAVEPOINT change")
            try:
                results.append(change(conn))
            except Exception as e:  # noqa: BLE001 - handed to its caller
                conn.execute("ROLLBACK TO change")
                results.append(_Failed(e))
            conn.execute("RELEASE change")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return results


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


class SqliteEngine:
    def __init__(self, path: Path):
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._pending: list[tuple[Change, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StorageError("storage is not open")
        return self._db

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = await aiosqlite.connect(self.path, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise StorageError(f"cannot open the database {self.path}: {e}") from None
        self._db.row_factory = sqlite3.Row
        try:
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                           "busy_timeout=5000"):
                await self._db.execute(f"PRAGMA {pragma}")
            await self._db.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions (component TEXT PRIMARY KEY,"
                " version INTEGER NOT NULL)")
        except sqlite3.Error as e:
            await self.close()
            raise StorageError(f"cannot use the database {self.path}: {e}") from None

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait({self._flusher})
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    # schema -------------------------------------------------------------------------------

    async def migrate(self, component: str, migrations: list[str]) -> None:
        """Bring one component's tables to its newest schema (each component is versioned on
        its own, so features evolve apart). Each step commits with its version."""
        def step(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT version FROM schema_versions WHERE component = ?",
                               (component,)).fetchone()
            version = row[0] if row else 0
            if version > len(migrations):
                raise StorageError(f"the {component} tables in {self.path} were written by a "
                                   f"newer Pluto (schema {version})")
            for i in range(version, len(migrations)):
                conn.executescript(
                    f"BEGIN; {migrations[i]}; INSERT INTO schema_versions (component, version)"
                    f" VALUES ('{component}', {i + 1}) ON CONFLICT(component) DO UPDATE SET"
                    f" version = excluded.version; COMMIT;")
            return len(migrations) - version

        applied = await self.read(step)
        if applied:
            log.info("storage: migrated %s to %s schema %d", self.path, component,
                     len(migrations))

    # the one write path -------------------------------------------------------------------

    async def transact(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``change`` atomically in the database thread; return its result once committed.

        ``change`` must not commit, roll back or await: it is plain synchronous SQL."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((change, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="storage:commit")
        return await fut

    async def write(self, *statements: Statement) -> int:
        """Statements as one atomic change; returns the row count of the last one."""
        return await self.transact(run_statements(statements))

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                results = await self._conn._execute(_apply_batch, self._conn._conn,
                                                     [change for change, _ in batch])
            except Exception as e:  # the commit itself failed: nobody's change is durable
                log.error("storage: a commit of %d change(s) failed: %s", len(batch), e)
                results = [_Failed(e)] * len(batch)
            for (_, fut), result in zip(batch, results):
                if fut.done():
                    continue
                if isinstance(result, _Failed):
                    fut.set_exception(result.error)
                else:
                    fut.set_result(result)

    # reads --------------------------------------------------------------------------------

    async def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``query`` in the database thread (between commits); return its result."""
        return await self._conn._execute(query, self._conn._conn)

    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return await self.read(lambda conn: conn.execute(sql, params).fetchall())

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        return await self.read(lambda conn: conn.execute(sql, params).fetchone())
