"""The SQLite engine: one writing connection, one way to write; reads apart.

Every change goes through :meth:`SqliteEngine.transact`: a function that runs against the
writing connection and makes one atomic change (one or many statements, reads in between as it
needs). Changes handed over in one pass of the event loop are committed together in the next
(group commit: one commit for many callers), each inside its own savepoint when one fails, so

- a change is never half-committed: it runs from start to end, and the batch commits only after
  every change in it has run;
- a change that fails is rolled back to its own savepoint and its caller gets the error; the
  other changes in the batch commit as if it had never been there;
- a caller continues only once its own change is durable (committed).

The batch runs on the event loop itself, not in a thread. A commit in WAL mode with
``synchronous=NORMAL`` is CPU work and a write into the page cache: no wait on the disk. In a
thread, each statement handed the interpreter's lock back and forth with the busy loop, so that
in a burst of a thousand questions a batch of starts took 718 ms of wall time for 112 ms of
CPU, and every answer's first words waited for it. What could make a commit wait is kept off
the loop: the WAL is checkpointed (written back and synced) by a connection and thread of its
own, at most every :data:`CHECKPOINT_SECONDS`, and the WAL is emptied once it holds
:data:`WAL_RESTART_FRAMES` (commits held meanwhile: it never grows for good); another process
holding the write lock is not waited for (``busy_timeout=0``): the batch is tried again after a
pause, like any error that passes; and a batch holds at most :data:`BATCH_MAX` changes (a pass
of the loop stays short).

Reads (:meth:`read`) run on a second, read-only connection in a thread of its own, each in
one read transaction: WAL mode shows them every committed change and never one that is not,
and they never wait in line behind the commits. A small read on a message's way (a chat's
session, its history: ``small=True``) runs on the loop instead, on a read-only connection of
its own, and in the thread only when the database is busy a moment. Nothing outside
``storage/`` holds a connection or writes SQL.

A batch that fails for a reason that passes (the disk is full, an I/O error, the database
locked by another process) is not failed: it goes back in line, first, and is tried again with
backoff (on a fresh connection after an I/O error), with whatever arrived meanwhile; each
change is given up only after :attr:`SqliteEngine.retry_seconds` (then its caller gets
:class:`~pluto.errors.StorageUnavailable`). A constraint violation is never retried. Meanwhile
:attr:`SqliteEngine.health` says what is wrong (readiness reports it; a lock held by another
process only once it has lasted :attr:`SqliteEngine.lock_grace`); the next commit that works
ends the outage, and :meth:`SqliteEngine.probe` is a cheap commit to find out.

aiosqlite (pinned) opens the connections, each with a thread of its own: the reads and the
checkpoints run there, the migrations at open too; the writing connection is used from the
loop's thread once open (``Connection._conn``). These private parts are used here and nowhere
else.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from pluto.errors import StorageError, StorageUnavailable
from pluto.storage.health import StorageHealth
from pluto.storage.sql import Change, Migration, Statement, migration_for, run_statements

log = logging.getLogger(__name__)

T = TypeVar("T")
HOLD_SECONDS = 0.05  # a held change waits this long for a commit to ride with
RETRY_SECONDS = 30.0  # a change that cannot be committed is tried again this long
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)  # between tries (then the last, again and again)
BATCH_MAX = 256  # changes in one commit (about 40 ms of the loop at most in a burst)
CHECKPOINT_SECONDS = 1.0  # the WAL is written back at most this often, while commits come
WAL_RESTART_FRAMES = 4096  # a WAL this long (16 MB of 4 KB pages) is emptied, commits held
RESTART_WAIT_MS = 100  # how long emptying it waits for the readers (or a process), at most
EMPTY_AGAIN_SECONDS = 30.0  # after a reader kept it from being emptied, the next try
LOCK_GRACE = 5.0  # the write lock held by another process this long before it is an outage
LOCK_RETRY_SECONDS = 0.02  # meanwhile the lock is tried for this often

# SQLite's primary result codes worth retrying, and what readiness says about each
_PASSING = {13: "the disk is full", 10: "the database cannot be written (a disk I/O error)",
            5: "the database is locked by another process",
            6: "the database is locked by another process",
            8: "the database cannot be written (it is read-only)",
            14: "the database file cannot be opened"}
_IOERR = 10
__all__ = ["Change", "SqliteEngine", "Statement", "run_statements"]


def _passing(error: BaseException) -> str | None:
    """What is wrong, when ``error`` is one that may pass (worth retrying); else None."""
    if isinstance(error, sqlite3.Error) and not isinstance(error, sqlite3.IntegrityError):
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None:
            return _PASSING.get(code & 0xFF)
        text = str(error).lower()  # (no code: the driver's own words)
        if "disk is full" in text:
            return _PASSING[13]
        if "disk i/o error" in text:
            return _PASSING[10]
        if "database is locked" in text:
            return _PASSING[5]
    return None


def _apply_batch(conn: sqlite3.Connection, changes: list[Change],
                 hooks: Sequence[Change] = ()) -> list[Any]:
    """Every change, then the ``hooks`` (:meth:`SqliteEngine.before_commit`), then one commit
    for all.

    A change that raises is rolled back alone and its exception is its result; the others
    commit. They are first run together, without a savepoint each (two statements fewer per
    change: the common case); when one of them fails, all are rolled back and run again, each
    in its own savepoint. If the commit itself fails, everything is rolled back and the error
    goes to every caller."""
    if len(changes) > 1:
        together = _apply(conn, changes, hooks, isolated=False)
        if together is not None:
            return together
    return _apply(conn, changes, hooks, isolated=True)  # type: ignore[return-value]


_FAILING_HOOKS: set[Change] = set()  # hooks whose last run failed (logged once until it works)


def _hooks(conn: sqlite3.Connection, hooks: Sequence[Change]) -> None:
    """Each hook in a savepoint of its own: one that fails for a reason that does not pass is
    rolled back alone and logged, once until it works again (the changes commit without it; it
    tries again at the next commit); one that may pass fails the batch, which is tried
    again."""
    for hook in hooks:
        conn.execute("SAVEPOINT hook")
        name = getattr(hook, "__qualname__", "a hook")
        try:
            hook(conn)
        except Exception as e:  # noqa: BLE001 - logged, the batch commits without it
            if _passing(e) is not None:
                raise
            conn.execute("ROLLBACK TO hook")
            if hook not in _FAILING_HOOKS:
                _FAILING_HOOKS.add(hook)
                log.error("storage: %s failed before a commit (tried again at each next one,"
                          " logged again once it works): %s", name, e)
        else:
            if hook in _FAILING_HOOKS:
                _FAILING_HOOKS.discard(hook)
                log.info("storage: %s works again", name)
        conn.execute("RELEASE hook")


def _apply(conn: sqlite3.Connection, changes: list[Change], hooks: Sequence[Change], *,
           isolated: bool) -> list[Any] | None:
    """One transaction; None when a change failed and ``isolated`` is False (rolled back)."""
    results: list[Any] = []
    savepoints = isolated and len(changes) > 1  # (one change alone: its transaction is enough)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for change in changes:
            if savepoints:
                conn.execute("SAVEPOINT change")
            try:
                results.append(change(conn))
            except Exception as e:  # noqa: BLE001 - handed to its caller
                if _passing(e) is not None:  # the whole batch is tried again
                    raise
                if not isolated:
                    conn.execute("ROLLBACK")
                    return None
                if not savepoints:
                    conn.execute("ROLLBACK")
                    return [_Failed(e)]
                conn.execute("ROLLBACK TO change")
                results.append(_Failed(e))
            if savepoints:
                conn.execute("RELEASE change")
        if hooks:
            _hooks(conn, hooks)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return results


async def _ended(db: aiosqlite.Connection) -> None:
    """Until aiosqlite's worker thread (private, pinned) has ended: it answers a close or a
    failed connect, then ends a moment later — closed means gone (2 s at most)."""
    thread = getattr(db, "_thread", None)
    for _ in range(400):
        if thread is None or not thread.is_alive():
            return
        await asyncio.sleep(0.005)


def _probe(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute(f"PRAGMA user_version = {int(version)}")  # (a write of page 1, unchanged)


def _snapshot(query: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    """``query`` in one read transaction: its statements see the database as of one moment."""
    conn.execute("BEGIN")
    try:
        return query(conn)
    finally:
        conn.execute("COMMIT")


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


class SqliteEngine:
    dialect = "sqlite"
    shared = False  # one gateway process serves a SQLite file
    in_order = True  # one writer: changes commit in the order handed over
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def turn_sql(self, name: str) -> str | None:
        return None  # one writer: every change has the database to itself

    def __init__(self, path: Path):
        self.path = path
        self._db: aiosqlite.Connection | None = None
        # reads run on a connection (and a thread) of their own: WAL lets them see every
        # committed change without waiting in line behind the commits
        self._reader: aiosqlite.Connection | None = None
        # small reads on the loop's hot path (a chat's session, its history): run on the loop
        # itself, on a read-only connection used from its thread only (no hand-over)
        self._quick: aiosqlite.Connection | None = None
        # the WAL is written back to the database (and synced) here, off the loop
        self._checkpointer: aiosqlite.Connection | None = None
        self._checkpointing: asyncio.Task[None] | None = None
        self._emptying = False  # the WAL is being emptied: no commit starts meanwhile
        self._empty_after = 0.0  # (monotonic) not emptied before (a reader kept it from it)
        self._held_back = False  # a commit came due meanwhile: it starts once it is empty
        self._migrating = 0  # migrations under way (the WAL is not emptied meanwhile)
        self._next_checkpoint = 0.0  # (monotonic) the next checkpoint, once a commit comes
        self._pending: list[tuple[Change, asyncio.Future[Any]]] = []
        self._committing = False  # a batch is due (in the loop's next pass) or being retried
        self._waiting = False  # a change pending is not held: the next commit starts at once
        self._closing = False  # nothing is held any more
        self._hold_timer: asyncio.TimerHandle | None = None  # held changes go alone then
        self._idle = asyncio.Event()
        self._idle.set()
        self.retry_seconds = RETRY_SECONDS
        self.lock_grace = LOCK_GRACE
        self._locked_since: float | None = None  # (monotonic) another process has the lock
        self.health = StorageHealth("SQLite")
        self._deadlines: dict[asyncio.Future[Any], float] = {}  # changes being retried
        self._tries = 0  # failed tries of the batch in line
        self._retry: asyncio.TimerHandle | asyncio.Task[None] | None = None
        self._before_commit: list[Change] = []  # run in every batch, before its commit

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StorageError("storage is not open")
        return self._db

    async def open(self) -> None:
        self._closing = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot open the database {self.path}: {e}") from None
        self._db = await self._writer()
        try:
            await self._db.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions (component TEXT PRIMARY KEY,"
                " version INTEGER NOT NULL)")
        except sqlite3.Error as e:
            await self.close()
            raise StorageError(f"cannot use the database {self.path}: {e}") from None
        # the reading thread's connection; the loop's own for small reads (busy_timeout=0:
        # never a wait on the loop, the thread reads then); the checkpoints'
        for attr, pragmas, on_loop in (
                ("_reader", ("query_only=ON", "busy_timeout=5000", "temp_store=MEMORY"), False),
                ("_quick", ("query_only=ON", "busy_timeout=0", "temp_store=MEMORY"), True),
                ("_checkpointer", (f"busy_timeout={RESTART_WAIT_MS}",), False)):
            connecting = aiosqlite.connect(self.path, isolation_level=None,
                                           check_same_thread=not on_loop)
            try:
                db = await connecting
                setattr(self, attr, db)
                db.row_factory = sqlite3.Row
                for pragma in pragmas:
                    await db.execute(f"PRAGMA {pragma}")
            except (OSError, sqlite3.Error) as e:
                if getattr(self, attr) is None:
                    await _ended(connecting)
                await self.close()
                raise StorageError(f"cannot open the database {self.path}: {e}") from None

    async def _writer(self) -> aiosqlite.Connection:
        """A new writing connection (at open, and after a disk I/O error): opened in a thread,
        used from the loop's."""
        connecting = aiosqlite.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db = await connecting
        except (OSError, sqlite3.Error) as e:
            await _ended(connecting)  # its worker was told to stop: gone before we say so
            raise StorageError(f"cannot open the database {self.path}: {e}") from None
        db.row_factory = sqlite3.Row
        try:
            # temp_store=MEMORY: a batch run again change by change (one failed) puts each in a
            # savepoint, whose journal would otherwise be a temporary file (40 µs; 8 in memory).
            # busy_timeout=0 and wal_autocheckpoint=0: the loop never waits for another
            # process's lock nor for a sync of the disk (see the module's notes)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                           "busy_timeout=0", "wal_autocheckpoint=0", "temp_store=MEMORY"):
                await db.execute(f"PRAGMA {pragma}")
        except sqlite3.Error as e:
            await db.close()
            await _ended(db)
            raise StorageError(f"cannot use the database {self.path}: {e}") from None
        return db

    async def close(self) -> None:
        self._closing = True  # held changes wait no longer
        if not self._committing:
            self._next()
        await self._idle.wait()  # every change handed over is committed (or failed)
        if self._checkpointing is not None:
            await asyncio.gather(self._checkpointing, return_exceptions=True)
        for attr in ("_checkpointer", "_quick", "_reader", "_db"):
            db = getattr(self, attr)
            if db is not None:
                setattr(self, attr, None)
                await db.close()
                await _ended(db)

    # schema -------------------------------------------------------------------------------

    async def migrate(self, component: str, migrations: Sequence[Migration]) -> None:
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
                script = migration_for("sqlite", migrations[i])
                assert isinstance(script, str)  # (online steps are PostgreSQL's)
                conn.executescript(
                    f"BEGIN; {script}; INSERT INTO schema_versions (component, version)"
                    f" VALUES ('{component}', {i + 1}) ON CONFLICT(component) DO UPDATE SET"
                    f" version = excluded.version; COMMIT;")
            return len(migrations) - version

        # (the WAL is not emptied meanwhile: that holds the write lock, and this step, on the
        # writing connection, would be refused it)
        while self._checkpointing is not None:
            await asyncio.shield(self._checkpointing)
        self._migrating += 1
        try:
            applied = await self._conn._execute(step, self._conn._conn)  # (it writes)
        finally:
            self._migrating -= 1
        if applied:
            log.info("storage: migrated %s to %s schema %d", self.path, component,
                     len(migrations))

    # the one write path -------------------------------------------------------------------

    async def transact(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``change`` atomically on the writing connection; return its result once
        committed.

        ``change`` must not commit, roll back or await: it is plain synchronous SQL, with no
        effect outside the database — it may run twice (the first time rolled back) when
        another change of its batch fails."""
        return await self.queue(change)

    def queue(self, change: Callable[[sqlite3.Connection], T], *,
              hold: bool = False) -> asyncio.Future[T]:
        """``change`` in line now (committed before every change handed over after it); its
        future settles once it is committed or has failed.

        ``hold``: it starts no commit of its own; it rides with the next change handed over
        (one commit for both), or goes alone after :data:`HOLD_SECONDS` when none comes."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((change, fut))
        self._idle.clear()
        if not hold:
            self._waiting = True
        if not self._committing:  # (else the commit's end hands over what is pending)
            self._next()
        return fut

    def _next(self) -> None:
        """With no commit due: commit what is pending, unless all of it is held (then it waits
        for company, at most :data:`HOLD_SECONDS`)."""
        if not self._pending or self._db is None:
            self._idle.set()
        elif self._waiting or self._closing:
            self._commit_next()
        elif self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_SECONDS,
                                                                     self._flush_held)

    def _flush_held(self) -> None:
        self._hold_timer = None
        if self._pending and not self._committing and self._db is not None:
            self._commit_next()

    def before_commit(self, hook: Change) -> None:
        """Run ``hook`` in every batch, after its changes and before its commit: work that
        costs less done once for many changes than once each (the search index of the
        messages the batch wrote). It must be idempotent and cheap when there is nothing to
        do; it never fails a change: one that fails is rolled back alone and logged."""
        if hook not in self._before_commit:
            self._before_commit.append(hook)

    async def write(self, *statements: Statement) -> int:
        """Statements as one atomic change; returns the row count of the last one."""
        return await self.transact(run_statements(statements))

    async def write_together(self, *statements: Statement) -> int:
        return await self.write(*statements)  # (commits are grouped here already)

    async def write_returning(self, statement: Statement) -> Any | None:
        return await self.transact(lambda conn: conn.execute(*statement).fetchone())

    async def write_returning_all(self, statement: Statement) -> list[Any]:
        return await self.transact(lambda conn: conn.execute(*statement).fetchall())

    def _commit_next(self) -> None:
        """Commit what is pending in the loop's next pass: what is handed over until then goes
        in the same commit. Its end settles each change and hands over what is left."""
        if self._hold_timer is not None:  # what was held goes in this batch
            self._hold_timer.cancel()
            self._hold_timer = None
        self._committing = True
        self._idle.clear()
        asyncio.get_running_loop().call_soon(self._commit)

    def _commit(self) -> None:
        if self._emptying:  # (the WAL is being emptied: this commit starts right after)
            self._held_back = True
            return
        batch, self._pending = self._pending[:BATCH_MAX], self._pending[BATCH_MAX:]
        self._waiting = bool(self._pending)  # (the rest goes in the next pass, at once)
        db = self._db
        if db is None:  # (closed by force meanwhile)
            self._committed(batch, StorageError("storage is not open"))
            return
        try:
            results: list[Any] | BaseException = _apply_batch(
                db._conn, [c for c, _ in batch], self._before_commit)
        except Exception as e:  # noqa: BLE001 - every caller gets it
            results = e
        self._committed(batch, results)

    def _committed(self, batch: list[tuple[Change, asyncio.Future[Any]]],
                   results: list[Any] | BaseException) -> None:
        if isinstance(results, BaseException):
            problem = _passing(results)
            if problem is not None:
                self._again(batch, problem, results)
                return
            log.error("storage: a commit of %d change(s) failed: %s", len(batch), results)
            results = [_Failed(results if isinstance(results, Exception) else StorageError(
                "the commit was interrupted"))] * len(batch)
        else:
            self._tries = 0
            self._locked_since = None
            self.health.working()
            self._checkpoint_soon()
        if self._deadlines:
            for _, fut in batch:
                self._deadlines.pop(fut, None)
        for (_, fut), result in zip(batch, results):
            if fut.done():
                continue
            if isinstance(result, _Failed):
                fut.set_exception(result.error)
            else:
                fut.set_result(result)
        self._committing = False
        self._next()

    # when a commit fails for a reason that may pass ------------------------------------------

    def _again(self, batch: list[tuple[Change, asyncio.Future[Any]]], problem: str,
               error: BaseException) -> None:
        """The batch back in line, first, to be tried again after a pause; a change that has
        waited :attr:`retry_seconds` is given up (its caller gets StorageUnavailable). The
        write lock held by another process (a command writing meanwhile) is an outage only
        once it has lasted :attr:`lock_grace`; it is tried for again every few milliseconds."""
        now = time.monotonic()
        locked = problem == _PASSING[5]
        if locked and self._locked_since is None:
            self._locked_since = now
        if not locked or now - (self._locked_since or now) >= self.lock_grace:
            self.health.failing(problem, str(error))
        keep = []
        for change, fut in batch:
            if now < self._deadlines.setdefault(fut, now + self.retry_seconds):
                keep.append((change, fut))
                continue
            del self._deadlines[fut]
            self.health.gave_up()
            if not fut.done():
                fut.set_exception(StorageUnavailable(problem))
        self._pending[:0] = keep
        self._waiting = True  # (no waiting for held company: they have waited)
        delay = RETRY_DELAYS[min(self._tries, len(RETRY_DELAYS) - 1)]
        self._tries += 1
        if locked:
            delay = min(delay, LOCK_RETRY_SECONDS)
        if getattr(error, "sqlite_errorcode", 0) & 0xFF == _IOERR or "i/o" in str(error).lower():
            self._retry = asyncio.get_running_loop().create_task(self._reconnect(delay))
        else:
            self._retry = asyncio.get_running_loop().call_later(delay, self._resume)

    def _resume(self) -> None:
        self._retry = None
        self._committing = False
        self._next()

    async def _reconnect(self, delay: float) -> None:
        """After a disk I/O error: the next try on a fresh writing connection."""
        try:
            await asyncio.sleep(delay)
            old = self._db
            try:
                self._db = await self._writer()
            except StorageError as e:
                log.debug("storage: reconnecting failed: %s", e)
            else:
                if old is not None:
                    try:
                        await old.close()
                    except Exception as e:  # noqa: BLE001 - it is being replaced
                        log.debug("storage: closing the failed connection: %s", e)
        finally:
            self._resume()

    def _checkpoint_soon(self) -> None:
        """After a commit: the WAL written back to the database by the checkpointing
        connection, in its thread, unless one is under way or was started less than
        :data:`CHECKPOINT_SECONDS` ago (the loop never waits for the disk's sync)."""
        now = time.monotonic()
        if self._checkpointing is not None or now < self._next_checkpoint or \
                self._checkpointer is None or self._closing:
            return
        self._next_checkpoint = now + CHECKPOINT_SECONDS
        self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint(
            self._checkpointer), name="sqlite-checkpoint")

    async def _checkpoint(self, db: aiosqlite.Connection) -> None:
        """PASSIVE: what no reader still needs, with no wait for readers or the writer.

        That alone never starts the WAL over while commits keep coming: SQLite starts it over
        only at a write that began when every frame was written back, and commits land while
        the checkpoint runs. Under steady traffic the file grew for good (950 MB in 4 s of a
        synthetic burst; 39 KB a widget message), until the disk was full. So once the WAL
        holds :data:`WAL_RESTART_FRAMES`, it is emptied (:meth:`_empty`)."""
        try:
            cursor = await db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            row = await cursor.fetchone()
            await cursor.close()
            if row is not None and row[1] >= WAL_RESTART_FRAMES and not self._migrating and \
                    time.monotonic() >= self._empty_after:
                await self._empty(db)
        except (sqlite3.Error, ValueError) as e:  # (the disk is full: the next one tries again)
            log.debug("storage: a checkpoint failed: %s", e)
        finally:
            self._checkpointing = None

    async def _empty(self, db: aiosqlite.Connection) -> None:
        """A TRUNCATE checkpoint, with no commit started meanwhile (they wait in line, none
        fails for it): it writes back what came since the PASSIVE one, syncs, waits for the
        readers at most :data:`RESTART_WAIT_MS` and cuts the file to nothing. Commits wait for
        it (20-40 ms at 800 widget messages a second on a 2-core test machine), at most once
        every :data:`CHECKPOINT_SECONDS`. A reader that outlasts the wait (another process's
        long read) keeps part of it: then no commit waits for another try before
        :data:`EMPTY_AGAIN_SECONDS`."""
        self._emptying = True
        try:
            cursor = await db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            row = await cursor.fetchone()
            await cursor.close()
            if row is not None and row[0]:
                self._empty_after = time.monotonic() + EMPTY_AGAIN_SECONDS
                log.info("storage: the WAL (%d pages) could not be emptied: a reader, perhaps "
                         "another process, held on to it; tried again in %.0f s", row[1],
                         EMPTY_AGAIN_SECONDS)
        finally:
            self._emptying = False
            if self._held_back:
                self._held_back = False
                self._commit()

    async def probe(self) -> bool:
        """A cheap commit (it writes the file's header): whether storage can commit now. It
        waits behind the changes in line, and is retried like them."""
        try:
            await self.transact(_probe)
        except StorageError:
            return False
        return True

    # reads --------------------------------------------------------------------------------

    async def read(self, query: Callable[[sqlite3.Connection], T], *,
                   small: bool = False) -> T:
        """Run ``query`` (reads only) on the reading connection; return its result. It sees
        every change whose commit was awaited, and never waits for a commit in progress.

        ``small``: a read of a few rows by an index, on the hot path of a message — run on the
        loop itself (a hop to the reading thread hands the interpreter's lock back and forth
        at each statement: in a burst, more than the read); in the thread after all when the
        database is busy a moment."""
        if self._reader is None:
            raise StorageError("storage is not open")
        if small and self._quick is not None:
            try:
                return _snapshot(query, self._quick._conn)
            except sqlite3.OperationalError as e:
                log.debug("storage: a small read goes to the reading thread: %s", e)
        return await self._reader._execute(_snapshot, query, self._reader._conn)

    async def fetchall(self, sql: str, params: tuple[Any, ...] = (), *,
                       small: bool = False) -> list[sqlite3.Row]:
        return await self.read(lambda conn: conn.execute(sql, params).fetchall(), small=small)

    async def fetchone(self, sql: str, params: tuple[Any, ...] = (), *,
                       small: bool = False) -> sqlite3.Row | None:
        return await self.read(lambda conn: conn.execute(sql, params).fetchone(), small=small)
