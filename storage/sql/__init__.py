"""What the store's parts need of an SQL engine, whichever it is.

Each part of the store (conversations, outbox, inbox, tasks, pairing, leases) is written once,
as plain synchronous changes (``Change``: a function of a DB-API connection) in one SQL dialect
that SQLite and PostgreSQL both speak: ``?`` placeholders, ``INSERT … ON CONFLICT``,
``RETURNING``, no engine-only functions. An :class:`Engine` runs a change atomically — SQLite on
its one writing connection with group commit (:mod:`.sqlite.engine`), PostgreSQL in a worker
thread holding a pooled connection, or a single statement on the event loop through asyncpg
(:mod:`.postgres.engine`) — and the part never learns which.

Migrations are kept with their part, one versioned list for both engines. A step is either one
script for both (the PostgreSQL engine spells two column types its way: an autoincrement key
and ``REAL``) or a ``{"sqlite": …, "postgres": …}`` pair where the engines truly differ. A
PostgreSQL step that builds an index on a table that grows with use (messages, runs) is
:func:`online_index`: built while the table keeps being read and written, so that instances
of the previous version keep answering while a new one migrates (a rolling upgrade).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import orjson

T = TypeVar("T")
Statement = tuple[str, tuple[Any, ...]]
Change = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Online:
    """A PostgreSQL migration step run outside a transaction, statement by statement
    (``CREATE INDEX CONCURRENTLY`` cannot run inside one); each statement must be safe to run
    again, as the whole step is when it was cut short before its version was recorded."""

    statements: tuple[str, ...]


def online_index(name: str, definition: str) -> Online:
    """The index ``name`` as ``CREATE INDEX name ON definition``, built without holding the
    table against writes (``CONCURRENTLY``: a plain build, or dropping an index, locks writers
    out of the table for the whole build — minutes on a large one), replacing an index of that
    name once the new one is whole. A build cut short leaves an invalid index under the
    building name: the step run again drops it first."""
    building = f"{name}_building"
    return Online((f"DROP INDEX CONCURRENTLY IF EXISTS {building}",
                   f"CREATE INDEX CONCURRENTLY {building} ON {definition}",
                   f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
                   f"ALTER INDEX {building} RENAME TO {name}"))


Migration = str | Mapping[str, "str | Online"]


_AS_STDLIB = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def json_text(value: Any) -> str:
    """``value`` as the JSON text a row keeps (events, an inbox's payload, a run's usage):
    orjson, about a tenth of the standard library's time (three to five rows a message), with
    what it would write differently — dates, dataclasses — given to ``str`` as the standard
    library's ``default=str`` does; what it refuses (an integer past 64 bits, a key that is not
    a string) by the standard library. Readers parse either alike. Text compared in SQL (an
    inbox outcome) stays with ``json.dumps``: the same value must give the same text."""
    try:
        return orjson.dumps(value, default=str, option=_AS_STDLIB).decode()
    except TypeError:
        return json.dumps(value, default=str)


def run_statements(statements: tuple[Statement, ...]) -> Change:
    """A change made of plain statements; its result is the row count of the last one. On
    PostgreSQL they go in one round trip (:func:`pipelined`)."""
    def change(conn: Any) -> int:
        with pipelined(conn):
            cursors = [conn.execute(sql, params) for sql, params in statements]
        return cursors[-1].rowcount if cursors else 0
    return change


def pipelined(conn: Any) -> contextlib.AbstractContextManager[Any]:
    """Statements executed in this block are sent together where the connection can
    (psycopg's pipeline mode: one round trip, and a transaction's row locks held that much
    shorter); their cursors' results are there once the block ends. Elsewhere (SQLite, in
    its own thread) it changes nothing."""
    pipeline = getattr(conn, "pipeline", None)
    return pipeline() if pipeline is not None else contextlib.nullcontext()


def together(parts: Sequence[tuple[str, Statement]], result: str) -> Statement:
    """``WITH name AS (statement), … SELECT result`` (PostgreSQL): data-modifying statements
    as one statement — one round trip, atomic without BEGIN and COMMIT. Each part sees the
    database as it was before any of them, so they must change different rows; a part refers
    to an earlier one by its name (``… FROM name``) to depend on it."""
    return ("WITH " + ", ".join(f"{name} AS ({sql})" for name, (sql, _) in parts)
            + f" SELECT {result}", tuple(p for _, (_, ps) in parts for p in ps))


def migration_for(dialect: str, step: Migration) -> str | Online:
    """One migration step as the engine ``dialect`` runs it (:class:`Online`: PostgreSQL's
    only)."""
    if not isinstance(step, str):
        return step[dialect]
    if dialect == "postgres":
        step = re.sub(r"INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY", step)
        step = re.sub(r"\bREAL\b", "DOUBLE PRECISION", step)
    return step


class Engine(Protocol):
    """An open database that runs changes atomically (see the module's docstring)."""

    dialect: str  # "sqlite" or "postgres"
    shared: bool  # several gateway processes use this database at once
    now_sql: str  # the database's clock, in seconds since the epoch (one clock for everyone)
    # changes commit in the order they were handed over (one writer); False: several
    # connections commit side by side, and a change handed over later may commit first
    in_order: bool

    def turn_sql(self, name: str) -> str | None:
        """A condition (always true) for a statement's ``WHERE`` that waits for, and takes
        until its transaction ends, the turn ``name``, before the statement touches a row:
        rows shared by many transactions, each writing several of them (the usage counters),
        are written only in that turn, so no two transactions each hold a row the other
        waits for (a deadlock, which PostgreSQL breaks only after a second). None when
        writers take turns anyway (SQLite's one writer)."""
        ...

    @property
    def is_open(self) -> bool: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def migrate(self, component: str, migrations: Sequence[Migration]) -> None:
        """Bring one component's tables to its newest schema, each step with its version."""
        ...

    async def transact(self, change: Callable[[Any], T]) -> T:
        """Run ``change`` atomically; return its result once committed. ``change`` is plain
        synchronous SQL: it never commits, rolls back or awaits."""
        ...

    async def write(self, *statements: Statement) -> int:
        """Statements as one atomic change; the row count of the last one."""
        ...

    async def write_together(self, *statements: Statement) -> int:
        """:meth:`write` of statements that change different rows (``INSERT … VALUES`` or
        ``UPDATE``, no ``RETURNING``): on PostgreSQL one statement (:func:`together`), a round
        trip instead of one per statement plus BEGIN and COMMIT."""
        ...

    async def write_returning(self, statement: Statement) -> Any | None:
        """One statement that changes data and returns a row, committed; that row."""
        ...

    async def write_returning_all(self, statement: Statement) -> list[Any]:
        """One statement that changes data and returns rows, committed; those rows (one
        round trip on PostgreSQL: no BEGIN and COMMIT around it)."""
        ...

    def queue(self, change: Callable[[Any], T], *, hold: bool = False) -> asyncio.Future[T]:
        """``change`` handed over now, without waiting: its future settles once committed. A
        single writer (SQLite) commits it before every change handed over after it, and with
        ``hold`` starts no commit for it: it rides with the next change (or goes alone soon)."""
        ...

    async def read(self, query: Callable[[Any], T], *, small: bool = False) -> T:
        """Run ``query`` against committed data; return its result. ``small``: a few rows by
        an index, on a message's hot path (SQLite runs it on the loop)."""
        ...

    async def fetchall(self, sql: str, params: tuple[Any, ...] = (), *,
                       small: bool = False) -> list[Any]: ...

    async def fetchone(self, sql: str, params: tuple[Any, ...] = (), *,
                       small: bool = False) -> Any | None: ...
