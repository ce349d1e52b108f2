"""The PostgreSQL engine, for several gateway instances: asyncpg for single statements,
psycopg 3 for changes of several.

The store's parts are written once as synchronous changes (:mod:`pluto.storage.sql`); here
each change runs in a worker thread holding one pooled psycopg connection, inside one
transaction, so the event loop never waits on the database and a change is never half-made.
Most of a message's work is single statements (each atomic by itself, several writes joined in
one ``WITH``): those — :meth:`PostgresEngine.write` of one statement, ``write_returning``,
``fetchone``, ``fetchall`` — run on the event loop through asyncpg, with no thread hop and no
Python-level protocol work per statement (asyncpg's is compiled): about 40% less gateway CPU
per message than the same statements through the worker threads (``bench/HISTORY.md``).
Statements of one text that return rows, asked for while one of that text is on its way (many
chats at the same step), go together: one round trip, one transaction, one commit for all
(asyncpg's ``fetchmany``), each run's rows told apart by one more column (:func:`_keyed`) —
on a PostgreSQL server the round trip and the commit are most of a short statement's cost
(``bench/HISTORY.md``: about 45% less server CPU per message at 100 sessions). A batch that
fails is run again statement by statement, so only the statement at fault fails; a batch held
up by a row lock (:data:`STALLED`) holds up no batch after it. Under load (a text that went in
a batch lately) a statement with none of its text on its way waits :data:`GATHER` (2 ms) for
others before it goes; a lone client's never waits. A
change that meets a serialization failure or a deadlock is run again (it is a pure function
of the database). Statements are written with ``?`` placeholders, which this module turns into
psycopg's ``%s`` or asyncpg's ``$n`` — the latter cast to the type psycopg would have sent the
value as, so a statement means the same through either driver; rows can be read by name or by
position, as SQLite's are.

A statement that fails because the connection was lost (a server restart, a terminated
backend, a pooled connection gone stale) is tried again at once on a fresh pooled connection
(the pool checks its idle ones first), then with backoff for :attr:`PostgresEngine.retry_seconds`
while the server is out of reach or out of disk; a change whose commit may have gone through
(the connection broke during COMMIT) is never run twice. A connection that failed under a
single statement is closed, never handed to the next caller (asyncpg can leave one broken
mid-statement: MagicStack/asyncpg#1069). Past that the caller gets
:class:`~pluto.errors.StorageUnavailable`; :attr:`PostgresEngine.health` says what is wrong
meanwhile. A constraint violation is never retried.

Migrations run under a transaction-scoped advisory lock, so instances starting together bring
the schema up once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import re
import time
import zlib
from decimal import Decimal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, TypeVar

from pluto.errors import StorageError, StorageUnavailable
from pluto.storage.health import StorageHealth
from pluto.storage.sql import (Migration, Online, Statement, migration_for, run_statements,
                               together)

log = logging.getLogger(__name__)

T = TypeVar("T")
MIGRATION_LOCK = zlib.crc32(b"pluto-migrations")  # held while one instance migrates
MIGRATION_POLL = 0.1  # seconds between asks for that lock
MIGRATION_NOTICE = 5.0  # seconds waited for it before saying so (once)
RETRIES = 5  # a change that meets a serialization failure or deadlock is run again
RETRY_SECONDS = 2.0  # a change that meets a lost connection or a full disk: tried this long
# (short: several instances' leases and fencing judge an instance that cannot write)
RETRY_DELAYS = (0.0, 0.1, 0.25, 0.5, 1.0)  # the first again at once, on a fresh connection
# opening: a server not reachable yet (starting beside this one, restarting) or a connection
# cut while the pools fill is tried again this long, with a line every OPEN_NOTICE seconds;
# a refusal that will not change (a wrong password, no such database) ends it at once
OPEN_PATIENCE = 30.0  # seconds
OPEN_NOTICE = 5.0  # seconds
STATEMENT_CACHE = 1024  # prepared statements kept per asyncpg connection
UNREACHABLE = "the database cannot be reached"
DISK_FULL = "the database server's disk is full"


@lru_cache(maxsize=1024)
def _pg(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


@contextlib.contextmanager
def _migrating(conn: _Conn) -> Iterator[None]:
    """Hold the migration lock (one instance migrates at a time) on ``conn`` — an autocommit
    connection — while the block runs. It is waited for by asking again, never inside a
    statement: one waiting inside a statement holds a snapshot, which another instance's
    ``CREATE INDEX CONCURRENTLY`` waits to see end while that instance holds the lock — a
    deadlock (the reason Rails' migrations ask the same way)."""
    notice: float | None = time.monotonic() + MIGRATION_NOTICE
    while not conn.execute("SELECT pg_try_advisory_lock(?)", (MIGRATION_LOCK,)).fetchone()[0]:
        if notice is not None and time.monotonic() >= notice:
            log.info("storage: waiting for another instance to finish migrating the database")
            notice = None
        time.sleep(MIGRATION_POLL)
    try:
        yield
    finally:
        try:
            conn.execute("SELECT pg_advisory_unlock(?)", (MIGRATION_LOCK,))
        except Exception:  # noqa: BLE001 - the session is gone, and its lock with it; were
            conn._conn.close()  # it not, closed: never back in the pool holding the lock


# the types psycopg names when it sends a Python value (the server infers the rest: a string
# and None go untyped), spelled as casts for asyncpg, which sends what the server inferred
_CASTS: dict[type, str] = {float: "::float8", bool: "::bool", bytes: "::bytea",
                           Decimal: "::numeric"}


def _kind(value: Any) -> Any:
    """What psycopg would name ``value`` as: its type, or for an int the smallest integer
    type it fits (as psycopg's dumpers choose)."""
    if type(value) is int:
        if -0x8000 <= value < 0x8000:
            return "::int2"
        if -0x80000000 <= value < 0x80000000:
            return "::int4"
        return "::int8" if -(1 << 63) <= value < (1 << 63) else "::numeric"
    return _CASTS.get(type(value), "")


@lru_cache(maxsize=4096)
def _numbered(sql: str, kinds: tuple[str, ...]) -> str:
    """``?`` placeholders as asyncpg's ``$1``, ``$2``, ..., each cast to the type psycopg
    would have sent its value as (``kinds``: from :func:`_kind`), so a statement means the
    same through either driver."""
    parts = sql.split("?")
    return "".join(f"{part}${i}{kinds[i - 1]}"
                   for i, part in enumerate(parts[:-1], 1)) + parts[-1]


BATCH_MAX = 64  # statements of one text sent together, at most
# a statement of a text that went in a batch lately (many chats at the same step) waits this
# long for others before it goes, when none of its text is on its way: under load a batch
# gathers about twice as many, nearly halving commits per message on three instances
# (bench/HISTORY.md); a lone client's statements never wait
GATHER = 0.002
CROWDED_FOR = 0.1  # seconds after a batch its text counts as busy
STALLED = 0.05  # a batch of statements on its way this long: the next is sent beside it


class _Line:
    """The statements of one text (run by one method) waiting to be sent, and how many
    batches of them are on their way."""

    __slots__ = ("key", "waiting", "sending", "timer")

    def __init__(self, key: tuple[str, str]):
        self.key = key  # (method, query)
        self.waiting: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self.sending = 0
        # armed while some wait behind a batch, or gather (:data:`GATHER`)
        self.timer: asyncio.TimerHandle | None = None


async def _settle(fut: asyncio.Future[Any], work: Any) -> None:
    try:
        result = await work
    except BaseException as e:
        if not fut.done():
            fut.set_exception(e)
        if not isinstance(e, Exception):
            raise
    else:
        if not fut.done():
            fut.set_result(result)


_WORD = re.compile(r"\s*([A-Za-z_]+)")


def _scan_group(sql: str, i: int) -> int:
    """The index after the parenthesis group opening at ``sql[i]`` (quotes skipped); -1 when
    it does not close."""
    depth = 0
    n = len(sql)
    while i < n:
        c = sql[i]
        if c == "'":
            j = sql.find("'", i + 1)
            if j < 0:
                return -1
            i = j + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _turn(name: str) -> str:
    """The condition of :meth:`PostgresEngine.turn_sql`: an uncorrelated scalar subquery is
    run once, before the statement reads a row (an InitPlan), and the transaction-scoped
    advisory lock it takes is held to the commit, across the statements of a batch too. (Not
    ``EXISTS (SELECT pg_advisory_xact_lock(…))``: PostgreSQL drops an ``EXISTS``'s select
    list unread, and the lock is never taken.)"""
    return f"(SELECT pg_advisory_xact_lock({zlib.crc32(name.encode())}::int8)) IS NOT NULL"


_TURNS = re.compile(r"\(SELECT pg_advisory_xact_lock\(\d+::int8\)\) IS NOT NULL")


@lru_cache(maxsize=1024)
def _keyed(query: str) -> str | None:
    """``query`` (numbered) with its rows led by one more parameter (an int): several runs
    of it sent together tell their rows apart by it. None when it cannot be rewritten so (it
    returns no rows, or its shape is not one known here): such a statement goes alone."""
    text = query.strip().rstrip(";")
    head, main = "", text
    m = _WORD.match(text)
    if m is None:
        return None
    if m.group(1).upper() == "WITH":
        i = m.end()
        r = _WORD.match(text, i)
        if r is not None and r.group(1).upper() == "RECURSIVE":
            return None
        while True:  # name [ (columns) ] AS [ [NOT] MATERIALIZED ] ( query ) [, ...]
            j = text.find("(", i)
            if j < 0:
                return None
            i = _scan_group(text, j)
            if i < 0:
                return None
            rest = text[i:].lstrip()
            if rest.startswith(","):
                i = text.index(",", i) + 1
                continue
            w = _WORD.match(text, i)
            if w is not None and w.group(1).upper() in ("AS", "MATERIALIZED", "NOT"):
                continue
            break
        head, main = text[:i] + ",", text[i:].strip()
    else:
        head = "WITH"
    word = _WORD.match(main)
    if word is None:
        return None
    verb = word.group(1).upper()
    if verb not in ("SELECT", "INSERT", "UPDATE", "DELETE", "VALUES"):
        return None
    if verb != "SELECT" and verb != "VALUES" and not re.search(r"\bRETURNING\b", main, re.I):
        return None
    if re.search(r"\b(FOR\s+(UPDATE|SHARE|NO KEY|KEY)|pg_advisory\w*|set_config)\b",
                 _TURNS.sub("", text), re.I):
        return None  # locks or session state: not to be held for other statements' sake
    # (a turn may: the statements sent together all take it, one after the other, in one
    # transaction — it is taken once for all of them)
    k = max((int(n) for n in re.findall(r"\$(\d+)", text)), default=0) + 1
    return f"{head} pluto_q AS ({main}) SELECT ${k}::int4 AS pluto_k, pluto_q.* FROM pluto_q"


def _count(status: str) -> int:
    """The row count of a command's status (``UPDATE 3``, ``INSERT 0 1``, ``SELECT 2``)."""
    last = status.rpartition(" ")[2]
    return int(last) if last.isdigit() else 0


class Row(tuple):
    """A result row readable by column name and by position, like ``sqlite3.Row``."""

    __slots__ = ()
    _index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


@lru_cache(maxsize=512)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"__slots__": (), "_index": {n: i for i, n in enumerate(names)}})


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    return _row_class(tuple(d.name for d in cursor.description or ()))


class _Conn:
    """The slice of a DB-API connection the changes use, over a psycopg connection."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any):
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self._conn.cursor(row_factory=_row_factory)
        if params:
            cur.execute(_pg(sql), params)  # prepared by psycopg once used a few times
        else:
            cur.execute(sql)
        return cur

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        cur = self._conn.cursor(row_factory=_row_factory)
        cur.executemany(_pg(sql), rows)
        return cur

    def pipeline(self) -> Any:
        """psycopg's pipeline mode (:func:`pluto.storage.sql.pipelined`)."""
        return self._conn.pipeline()


def redact(url: str) -> str:
    """A connection URL fit for a log line or an error: no password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


class PostgresEngine:
    dialect = "postgres"
    shared = True  # several gateway processes may use the database at once
    in_order = False  # a pool: changes commit side by side
    now_sql = "extract(epoch from clock_timestamp())::double precision"

    def turn_sql(self, name: str) -> str | None:
        return _turn(name)

    def __init__(self, url: str, *, min_size: int = 2, max_size: int = 10,
                 connect_timeout: float = 10.0):
        self.url = url
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self._pool: Any = None
        self._refreshing: asyncio.Future[None] | None = None  # psycopg's pool being replaced
        self._apool: Any = None  # asyncpg's pool: single statements, on the event loop
        self._asyncpg: Any = None  # the module, imported off the loop at open
        self._executor: ThreadPoolExecutor | None = None
        self._open_calls = 0  # changes handed to a thread and not yet settled
        self._idle = asyncio.Event()
        self._idle.set()
        self.retry_seconds = RETRY_SECONDS
        self.health = StorageHealth("PostgreSQL")
        # statements of one text asked for while one is on its way: sent together (_joined)
        self._lines: dict[tuple[str, str], _Line] = {}
        # (method, query) -> until when (loop time) its statements wait :data:`GATHER` for
        # others (it went in a batch lately); one entry per text, a bounded set
        self._crowded: dict[tuple[str, str], float] = {}
        self._alone: set[str] = set()  # statements the rewriting does not fit: each alone
        self.batches = self.batched = 0
        self.deadlocks = 0  # deadlocks met (each broken by the server after a second)
        # several instances: a transaction left open this long (its process paused before
        # COMMIT) is ended by the server, so it cannot commit after its claims were taken
        # (set from the lease's length before open; None: the server's setting)
        self.idle_in_transaction: float | None = None
        self.open_patience = OPEN_PATIENCE

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    def __repr__(self) -> str:
        return f"PostgresEngine({redact(self.url)})"

    async def open(self) -> None:
        """Both pools open and the schema table there; a server that cannot be reached yet
        (or a connection cut meanwhile) is tried again for :attr:`open_patience` seconds."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.open_patience
        told = loop.time()
        delay = 0.25
        asyncpg = await asyncio.to_thread(importlib.import_module, "asyncpg")
        while True:
            try:
                await self._probe(asyncpg)
                await self._open_once()
                return
            except _Unreachable as e:
                if loop.time() + delay > until:
                    raise StorageError(str(e)) from None
                if loop.time() - told >= OPEN_NOTICE:
                    told = loop.time()
                    log.warning("%s; trying again for %.0f s more", e, until - loop.time())
            await asyncio.sleep(delay)  # (the server's own pace: it is starting, or gone)
            delay = min(2.0, delay * 2)

    async def _probe(self, asyncpg: Any) -> None:
        """One connection, to tell a server not reachable yet (tried again) from a refusal
        that will not change — no such database, role or password (said at once): asyncpg
        names the server's reason (psycopg's pool would only time out)."""
        try:
            conn = await asyncpg.connect(self.url, timeout=self.connect_timeout)
        except Exception as e:
            sentence = f"cannot open the PostgreSQL database {redact(self.url)}: {_reason(e)}"
            if _lost(asyncpg.exceptions, e):
                raise _Unreachable(sentence) from None
            raise StorageError(sentence) from None
        await conn.close()

    async def _open_once(self) -> None:
        self._executor = ThreadPoolExecutor(self.max_size, thread_name_prefix="pluto-pg")
        try:
            self._pool = await self._in_thread(self._open_pool)
            self._asyncpg = await self._in_thread(importlib.import_module, "asyncpg")
            self._apool = await self._asyncpg.create_pool(
                self.url, min_size=min(self.min_size, self.max_size), max_size=self.max_size,
                timeout=self.connect_timeout, statement_cache_size=STATEMENT_CACHE,
                max_inactive_connection_lifetime=300.0, init=self._configure_async,
                reset=_kept_as_is)
        except Exception as e:
            if self._pool is not None:
                await self._in_thread(self._pool.close)
                self._pool = None
            if self._apool is not None:
                self._apool.terminate()
                self._apool = None
            self._executor.shutdown(wait=False)
            self._executor = None
            sentence = f"cannot open the PostgreSQL database {redact(self.url)}: {_reason(e)}"
            if _unreachable(e, self._asyncpg):  # (the server answered the probe just now)
                raise _Unreachable(sentence) from None
            raise StorageError(sentence) from None

    def _new_pool(self) -> Any:
        from psycopg_pool import ConnectionPool  # imported here: in a thread, only when used

        return ConnectionPool(self.url, min_size=self.min_size, max_size=self.max_size,
                              open=False, timeout=self.connect_timeout,
                              configure=self._configure,
                              kwargs={"autocommit": True, "connect_timeout":
                                      max(1, int(self.connect_timeout))},
                              name="pluto")

    def _open_pool(self) -> Any:
        pool = self._new_pool()
        try:
            pool.open(wait=True, timeout=self.connect_timeout)
            with pool.connection() as conn, _migrating(_Conn(conn)):
                conn.execute("CREATE TABLE IF NOT EXISTS schema_versions (component TEXT"
                             " PRIMARY KEY, version INTEGER NOT NULL)")
        except BaseException:
            pool.close()
            raise
        return pool

    def _configure(self, conn: Any) -> None:
        """Each new pooled connection, once (its session keeps the setting)."""
        if self.idle_in_transaction is not None:
            conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                         (str(max(1, int(self.idle_in_transaction * 1000))),))

    async def _configure_async(self, conn: Any) -> None:
        """Each new connection of asyncpg's pool, once (as :meth:`_configure`)."""
        if self.idle_in_transaction is not None:
            await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', $1,"
                               " false)", str(max(1, int(self.idle_in_transaction * 1000))))

    async def close(self) -> None:
        await self._idle.wait()
        apool, self._apool = self._apool, None
        if apool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(apool.close(), self.connect_timeout)
        pool, self._pool = self._pool, None
        executor, self._executor = self._executor, None
        if pool is not None and executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, pool.close)
        if executor is not None:
            executor.shutdown(wait=False)

    # schema -------------------------------------------------------------------------------

    async def migrate(self, component: str, migrations: Sequence[Migration]) -> None:
        """Each step commits with its version, in a transaction; an :class:`Online` step runs
        statement by statement outside one (an index built while the table is written), its
        version recorded after it. One instance migrates at a time (the others wait, then
        find nothing left to do)."""
        def run(conn: _Conn) -> int:
            with _migrating(conn):
                row = conn.execute("SELECT version FROM schema_versions WHERE component = ?",
                                   (component,)).fetchone()
                version = row[0] if row else 0
                if version > len(migrations):
                    raise StorageError(f"the {component} tables were written by a newer Pluto"
                                       f" (schema {version})")
                mark = ("INSERT INTO schema_versions (component, version) VALUES (?,?)"
                        " ON CONFLICT(component) DO UPDATE SET version = excluded.version")
                for i in range(version, len(migrations)):
                    step = migration_for("postgres", migrations[i])
                    if isinstance(step, Online):
                        for sql in step.statements:
                            conn._conn.execute(sql)
                        conn.execute(mark, (component, i + 1))
                        continue
                    with conn._conn.transaction():
                        conn._conn.execute(step)
                        conn.execute(mark, (component, i + 1))
                return len(migrations) - version

        applied = await self._in_thread(self._run, run, False)
        if applied:
            log.info("storage: migrated %s schema to %d", component, len(migrations))

    # changes and reads --------------------------------------------------------------------

    async def transact(self, change: Callable[[Any], T]) -> T:
        return await self._in_thread(self._run, change)

    def queue(self, change: Callable[[Any], T], *, hold: bool = False) -> asyncio.Future[T]:
        """(Several connections commit side by side here: no order among changes queued, and
        nothing to ride with: a held change goes at once.)"""
        return asyncio.ensure_future(self.transact(change))

    async def write(self, *statements: Statement) -> int:
        if len(statements) == 1:
            # one statement is atomic by itself: no BEGIN and COMMIT around it (two round trips)
            return int(await self._statement("count", *statements[0]))
        return await self._in_thread(self._run, run_statements(statements))

    async def write_together(self, *statements: Statement) -> int:
        if len(statements) < 2:
            return await self.write(*statements)
        *first, (last, params) = statements
        sql, values = together([*((f"w{i}", s) for i, s in enumerate(first)),
                                ("last", (last + " RETURNING 1", params))], "count(*) FROM last")
        row = await self.write_returning((sql, values))
        return int(row[0]) if row is not None else 0

    async def write_returning(self, statement: Statement) -> Any | None:
        # one statement is atomic by itself (as :meth:`write` of one)
        return await self._statement("fetchrow", *statement)

    async def write_returning_all(self, statement: Statement) -> list[Any]:
        return list(await self._statement("fetch", *statement))

    async def read(self, query: Callable[[Any], T], *, small: bool = False) -> T:
        return await self._in_thread(self._run, query, False)

    async def fetchall(self, sql: str, params: tuple[Any, ...] = (), *,
                       small: bool = False) -> list[Any]:
        return list(await self._statement("fetch", sql, params))  # (on the loop already)

    async def fetchone(self, sql: str, params: tuple[Any, ...] = (), *,
                       small: bool = False) -> Any | None:
        return await self._statement("fetchrow", sql, params)

    async def _statement(self, method: str, sql: str, params: Sequence[Any]) -> Any:
        """One statement through asyncpg on the event loop (no worker thread): prepared once
        per connection, retried as :meth:`_run` retries. ``method``: asyncpg's ``fetch`` or
        ``fetchrow``, or ``count`` (the number of rows it wrote or returned). A caller
        cancelled meanwhile does not stop it: it runs whole or fails whole."""
        if self._apool is None:
            raise StorageError("storage is not open")
        values = tuple(params)
        query = _numbered(sql, tuple(map(_kind, values)))
        if query not in self._alone and _keyed(query) is not None:
            return await self._whole(self._joined(method, query, values))
        return await self._whole(asyncio.ensure_future(
            self._statement_retried(method, query, values)))

    def _joined(self, method: str, query: str, values: tuple[Any, ...]) -> asyncio.Future[Any]:
        """The result of ``query`` run with ``values``: sent at once when no statement of the
        same text is on its way (with any asked for in the same pass of the loop); else with
        the others that come meanwhile, once that batch is back — one round trip and one
        commit for all (:meth:`_send`)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        key = (method, query)
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line(key)
        line.waiting.append((values, fut))
        if line.sending == 0:
            if loop.time() < self._crowded.get(key, 0.0):  # (others of its text follow)
                if line.timer is None:
                    line.timer = loop.call_later(GATHER, self._due, line)
            else:
                self._flush(line)
        elif line.timer is None:
            line.timer = loop.call_later(STALLED, self._due, line)
        return fut

    def _flush(self, line: _Line) -> None:
        if line.timer is not None:
            line.timer.cancel()
            line.timer = None
        line.sending += 1
        asyncio.ensure_future(self._send(line))

    def _due(self, line: _Line) -> None:
        """A batch has been on its way :data:`STALLED` (a row it writes is locked by another
        transaction): those waiting behind it go meanwhile. Or the first statement of a busy
        text has waited :data:`GATHER` for others: they go."""
        line.timer = None
        if line.waiting:
            self._flush(line)

    async def _send(self, line: _Line) -> None:
        """(A task; never raises: each caller's future gets its result or its error.) Takes
        what waits on ``line`` when it starts: the statements asked for in the same pass of the
        loop as the one that started it go with it."""
        batch = line.waiting[:BATCH_MAX]
        del line.waiting[:BATCH_MAX]
        if not line.waiting and line.timer is not None:
            line.timer.cancel()
            line.timer = None
        try:
            if batch:
                await self._send_batch(line.key[0], line.key[1], batch)
        finally:
            line.sending -= 1
            if line.waiting:
                if line.sending == 0:
                    self._flush(line)
                elif line.timer is None:
                    line.timer = asyncio.get_running_loop().call_later(
                        STALLED, self._due, line)
            elif line.sending == 0 and self._lines.get(line.key) is line:
                del self._lines[line.key]

    async def _send_batch(self, method: str, query: str,
                          batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        if len(batch) == 1:
            values, fut = batch[0]
            await _settle(fut, self._statement_retried(method, query, values))
            return
        self.batches += 1
        self.batched += len(batch)
        if len(self._crowded) >= 10_000:  # (texts made on the fly: never without bound)
            self._crowded.clear()
        self._crowded[(method, query)] = asyncio.get_running_loop().time() + CROWDED_FOR
        try:
            results = await self._together(method, query, [v for v, _ in batch])
        except Exception as e:  # each on its own: only the one that fails fails
            self.deadlocks += getattr(e, "sqlstate", None) == "40P01"
            if (getattr(e, "sqlstate", None) or "")[:2] in ("42", "0A"):
                self._alone.add(query)  # (the rewritten text does not fit it)
                log.warning("storage: a statement cannot be sent with others (%s): %s",
                            _reason(e), query[:200])
            await asyncio.gather(*(
                _settle(fut, self._statement_retried(method, query, values))
                for values, fut in batch))
            return
        for (_, fut), result in zip(batch, results):
            if not fut.done():
                fut.set_result(result)

    async def _together(self, method: str, query: str, args: list[tuple[Any, ...]]
                        ) -> list[Any]:
        """``query`` run once per set of ``args``, in one round trip and one transaction
        (asyncpg's ``fetchmany``): each run's rows, told apart by the number each run's added
        column carries."""
        keyed = _keyed(query)
        assert keyed is not None and self._apool is not None
        errors = self._asyncpg.exceptions
        async with self._apool.acquire() as conn:
            try:
                records = await conn.fetchmany(keyed, [(*a, i) for i, a in enumerate(args)])
            except BaseException as e:
                if not isinstance(e, errors.PostgresError) or _lost(errors, e):
                    with contextlib.suppress(Exception):
                        conn.terminate()
                raise
        self.health.working()
        rows: list[list[Any]] = [[] for _ in args]
        if records:
            cls = _row_class(tuple(records[0].keys())[1:])
            for r in records:
                rows[r[0]].append(cls(tuple(r)[1:]))
        if method == "fetchrow":
            return [r[0] if r else None for r in rows]
        if method == "count":
            return [len(r) for r in rows]
        return rows

    async def _statement_retried(self, method: str, sql: str, params: tuple[Any, ...]) -> Any:
        errors = self._asyncpg.exceptions
        conflicts = tries = 0
        deadline: float | None = None
        while True:
            pool = self._apool
            if pool is None:
                raise StorageError("storage is not open")
            try:
                async with pool.acquire() as conn:
                    try:
                        if method == "count":  # (a statement's rows: its status says)
                            result = _count(await conn.execute(sql, *params))
                        else:
                            result = await getattr(conn, method)(sql, *params)
                    except BaseException as e:
                        if not isinstance(e, errors.PostgresError) or _lost(errors, e):
                            # (asyncpg may hand a connection broken mid-statement to the next
                            # caller: MagicStack/asyncpg#1069) never used again (one the
                            # pool let go of meanwhile cannot be, and need not be)
                            with contextlib.suppress(Exception):
                                conn.terminate()
                        raise
            except (errors.SerializationError, errors.DeadlockDetectedError) as e:
                self.deadlocks += isinstance(e, errors.DeadlockDetectedError)
                conflicts += 1
                if conflicts == RETRIES:
                    raise
                await asyncio.sleep(0.01 * conflicts)
                continue
            except Exception as e:
                if not _lost(errors, e):
                    raise
                problem = DISK_FULL if isinstance(e, errors.DiskFullError) else UNREACHABLE
                self.health.failing(problem, _reason(e))
                if deadline is None:
                    deadline = time.monotonic() + self.retry_seconds
                if time.monotonic() >= deadline:
                    self.health.gave_up()
                    raise StorageUnavailable(problem) from None
                await asyncio.sleep(RETRY_DELAYS[min(tries, len(RETRY_DELAYS) - 1)])
                tries += 1
                if tries == 1:  # idle connections the server dropped go, not only this one
                    with contextlib.suppress(Exception):
                        await pool.expire_connections()
                continue
            if tries or self.health.problem is not None:  # the database answers again:
                self._refresh_soon()  # psycopg's pool may still be reconnecting
            self.health.working()
            return result

    def _refresh_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        with contextlib.suppress(Exception):  # (closing: nothing to refresh)
            await self._in_thread(self._refresh_pool)

    def _refresh_pool(self) -> None:
        """(In a worker thread, once asyncpg reaches the database again after losing it.)
        psycopg's pool, if it failed to connect since the last look, is replaced by a fresh one:
        it reconnects on its own schedule, its attempts backing off (1, 2, 4, 8, 16 s), and a
        change of several statements that asked it for a connection meanwhile waited for that
        — up to 20 s after the database was back, while the single statements went on at once
        (a run cut short by the outage was handed back that late). Changes under way on the old
        pool finish on their connections; those waiting for one are tried on the new pool."""
        pool = self._pool
        if pool is None or not pool.pop_stats().get("connections_errors"):
            return
        fresh = self._new_pool()
        fresh.open(wait=False)
        self._pool = fresh
        log.info("storage: psycopg's pool was still reconnecting after the database answered "
                 "again; replaced by a fresh one")
        pool.close(timeout=1.0)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StorageError("storage is not open")
        return await self._whole(
            asyncio.get_running_loop().run_in_executor(self._executor, fn, *args))

    async def _whole(self, fut: asyncio.Future[T]) -> T:
        """``fut``'s result; a caller cancelled meanwhile does not stop the change: it commits
        or fails whole (and :meth:`close` waits for it)."""
        self._open_calls += 1
        self._idle.clear()
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done():
                self._settled()
            else:
                fut.add_done_callback(lambda _: self._settled())

    def _settled(self) -> None:
        self._open_calls -= 1
        if self._open_calls == 0:
            self._idle.set()

    def _run(self, change: Callable[[Any], T], atomic: bool = True) -> T:
        """In a worker thread: ``change`` in one transaction on a pooled connection (a read,
        ``atomic=False``, runs as it is: one statement sees one committed state)."""
        import psycopg
        from psycopg_pool import PoolClosed

        conflicts = tries = 0
        # (from the first failure: a change that waited for a connection, or whose process
        # was paused, still gets its retries on a fresh connection)
        deadline: float | None = None
        while True:
            pool = self._pool  # (read each time: it may have been replaced, _refresh_pool)
            if pool is None:
                raise StorageError("storage is not open")
            ran = [False]  # the change ran whole: a failure now is in COMMIT (maybe done)
            try:
                result = self._once(pool, change, atomic, ran)
            except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as e:
                # (a count to look at: two threads may rarely lose an increment)
                self.deadlocks += isinstance(e, psycopg.errors.DeadlockDetected)
                conflicts += 1
                if conflicts == RETRIES:
                    raise
                time.sleep(0.01 * conflicts)
                continue
            except psycopg.errors.IdleInTransactionSessionTimeout:
                # the server ended the transaction while this process was away (paused past
                # idle_in_transaction_session_timeout, at a COMMIT it never got): nothing of
                # it was committed, so it is run whole again on a fresh connection — its
                # fences decide whether it still may write
                conflicts += 1
                if conflicts == RETRIES:
                    raise StorageUnavailable(UNREACHABLE) from None
                log.warning("storage: a transaction was ended by the server while this "
                            "process was paused; running it again")
                continue
            except psycopg.OperationalError as e:
                if isinstance(e, PoolClosed) and self._pool not in (None, pool):
                    continue  # it waited on a pool replaced meanwhile: on the new one
                problem = DISK_FULL if isinstance(e, psycopg.errors.DiskFull) else UNREACHABLE
                self.health.failing(problem, _reason(e))
                if deadline is None:
                    deadline = time.monotonic() + self.retry_seconds
                if (ran[0] and atomic) or time.monotonic() >= deadline:
                    self.health.gave_up()
                    raise StorageUnavailable(problem) from None
                time.sleep(RETRY_DELAYS[min(tries, len(RETRY_DELAYS) - 1)])
                tries += 1
                if tries == 1:  # idle connections the server dropped go, not only this one
                    with contextlib.suppress(Exception):
                        pool.check()
                continue
            self.health.working()
            return result

    @staticmethod
    def _once(pool: Any, change: Callable[[Any], T], atomic: bool, ran: list[bool]) -> T:
        with pool.connection() as conn:
            if not atomic:
                return change(_Conn(conn))
            with conn.transaction():
                result = change(_Conn(conn))
                ran[0] = True
                return result

    async def probe(self) -> bool:
        """A cheap round trip: whether the database answers now."""
        try:
            await self.fetchone("SELECT 1")
        except StorageError:
            return False
        return True


async def _kept_as_is(conn: Any) -> None:
    """A connection going back to asyncpg's pool keeps its session: the statements run on it
    are single autocommit statements that leave nothing behind (asyncpg's own reset would
    cost a round trip per statement, and undo :meth:`PostgresEngine._configure_async`)."""


class _Unreachable(StorageError):
    """Opening met a server it could not reach or a connection it lost: worth trying again."""


def _unreachable(e: BaseException, asyncpg: Any) -> bool:
    """Whether opening failed for a reason that may pass: a connection refused, cut or timed
    out, a server starting or shutting down — not a refusal that will not change."""
    import psycopg  # (loaded already: the pool opens first)

    if isinstance(e, psycopg.OperationalError):
        state = getattr(e, "sqlstate", None)
        return state is None or state[:2] in ("08", "53", "57", "58")
    if asyncpg is not None:
        return _lost(asyncpg.exceptions, e) if isinstance(e, Exception) else False
    return isinstance(e, (OSError, asyncio.TimeoutError, ConnectionError))


def _lost(errors: Any, e: Exception) -> bool:
    """Whether asyncpg's ``e`` says the connection or the server failed (psycopg's
    ``OperationalError``): worth trying again on a fresh connection."""
    if isinstance(e, errors.PostgresError):
        return (e.sqlstate or "")[:2] in ("08", "53", "57", "58")
    return isinstance(e, (errors.InterfaceError, errors.InternalClientError,
                          errors.ConnectionDoesNotExistError, OSError, asyncio.TimeoutError,
                          ConnectionError))


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
