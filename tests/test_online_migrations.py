"""PostgreSQL: a migration that builds an index on a table that grows with use is built while
the table keeps being written (a rolling upgrade: the previous version's instances answer on
while a new one migrates), survives being cut short, and does not deadlock with another
instance waiting to migrate.

The upgrade here is the memory component's last step (the search index made partial) on a
database one step behind; a transaction left open on ``messages`` holds the build at its
first wait (``CREATE INDEX CONCURRENTLY`` waits for the table's writers of the moment), which
makes "while the build goes on" a condition to wait for, not a race. A plain ``DROP INDEX`` /
``CREATE INDEX`` step, as this one was, queued for the table's exclusive lock behind that
transaction, and every writer queued behind it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest import mock

import pytest

from pluto.storage.postgres import PostgresStore
from pluto.storage.postgres.engine import MIGRATION_LOCK
from pluto.storage.sql import Online, memory, online_index
from tests.helpers.pg import connect, fresh_schema
from tests.helpers.served import wait_for

INDEX = "messages_fts"


@pytest.fixture
def behind() -> Iterator[str]:
    """A database whose memory tables are one step behind (the full-text index not partial)."""
    with fresh_schema() as url:
        async def open_old() -> None:
            with _one_behind():
                await (store := _store(url)).open()
            await store.close()
        asyncio.run(open_old())
        yield url


def _store(url: str) -> PostgresStore:
    """A store on ``url``; opened under :func:`_one_behind` it migrates nothing (the database is
    there): each test runs the last step itself, by ``engine.migrate``."""
    return PostgresStore(url, min_size=1, max_size=2)


def _one_behind() -> Any:
    return mock.patch.object(memory, "MIGRATIONS", memory.MIGRATIONS[:-1])


@contextlib.asynccontextmanager
async def _building(url: str, stores: int = 1
                    ) -> AsyncIterator[tuple[Any, list[PostgresStore], asyncio.Future[None]]]:
    """``stores`` stores opened on ``url`` one step behind, the first running the last step,
    whose build waits for a transaction left open on messages: (that transaction's
    connection — COMMIT lets the build go on —, the stores, the migration under way)."""
    holder = connect(url)
    opened: list[PostgresStore] = []
    try:
        holder.execute("BEGIN")
        _insert(holder, "a writer of the moment, still open")  # (the build waits for it)
        with _one_behind():
            for _ in range(stores):
                await (store := _store(url)).open()
                opened.append(store)
        migrating = asyncio.ensure_future(opened[0].engine.migrate(memory.COMPONENT,
                                                                   memory.MIGRATIONS))
        with connect(url) as look:
            await wait_for(lambda: _build_waiting(look))
        yield holder, opened, migrating
    finally:
        holder.close()  # (its transaction ends, were the test to fail before)
        for store in opened:
            await store.close()


def _insert(conn: Any, text: str) -> None:
    conn.execute("INSERT INTO messages (session_id, role, content, created_at)"
                 " VALUES ('s', 'user', %s, 0)", (text,))


def _build_waiting(conn: Any) -> bool:
    """A concurrent build of the index is under way and waiting for the table's writers."""
    row = conn.execute("SELECT phase FROM pg_stat_progress_create_index p JOIN pg_class c"
                       " ON c.oid = p.relid WHERE c.relname = 'messages'"
                       " AND c.relnamespace = current_schema()::regnamespace").fetchone()
    return row is not None and row[0].startswith("waiting")


def _indexes(conn: Any) -> dict[str, tuple[bool, str | None]]:
    """The schema's indexes on messages: name -> (valid, predicate)."""
    rows = conn.execute(
        "SELECT c.relname, i.indisvalid, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
        " WHERE t.relname = 'messages' AND c.relnamespace = current_schema()::regnamespace")
    return {name: (valid, pred) for name, valid, pred in rows}


def _migrated(conn: Any) -> None:
    """The memory tables at their newest schema: one valid partial search index, nothing
    left of a build, and search reads it."""
    indexes = _indexes(conn)
    assert f"{INDEX}_building" not in indexes
    valid, predicate = indexes[INDEX]
    assert valid and predicate is not None and "'assistant'" in predicate
    version = conn.execute("SELECT version FROM schema_versions WHERE component = 'memory'"
                           ).fetchone()[0]
    assert version == len(memory.MIGRATIONS)


def test_an_online_index_step_run_again_leaves_one_index() -> None:
    """A step cut short after its last statement, before its version was recorded, is run
    whole again: the same one valid index results (and the first statement of each of its
    statements may find its work done)."""
    step = online_index("things_at", "things(at) WHERE done = 1")
    assert isinstance(step, Online)
    with fresh_schema() as url, connect(url) as conn:
        conn.execute("CREATE TABLE things (at REAL, done INTEGER)")
        conn.execute("INSERT INTO things SELECT g, g % 2 FROM generate_series(1, 1000) g")
        for _ in range(2):
            for sql in step.statements:
                conn.execute(sql)
        rows = conn.execute(
            "SELECT c.relname, i.indisvalid, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'things'::regclass"
            ).fetchall()
        assert rows == [("things_at", True, "(done = 1)")]


async def test_the_table_is_written_while_its_index_is_built(behind: str) -> None:
    with connect(behind) as writer, connect(behind) as look:
        async with _building(behind) as (holder, _, migrating):
            # the previous version's instances go on: they write and read the table at once
            writer.execute("SET lock_timeout = '2s'")
            for n in range(5):
                _insert(writer, f"written during the build {n}")
            assert writer.execute("SELECT count(*) FROM messages WHERE content LIKE"
                                  " 'written during%%'").fetchone()[0] == 5
            assert not migrating.done() and _build_waiting(look)  # (it was under way)
            holder.execute("COMMIT")
            await asyncio.wait_for(migrating, 30)
            _migrated(look)
        rows = look.execute("SELECT count(*) FROM messages WHERE to_tsvector('simple',"
                            " coalesce(content, '')) @@ to_tsquery('simple', 'build')"
                            " AND role IN ('user', 'assistant')").fetchone()[0]
        assert rows == 5  # (what was written during the build is in the index)


async def test_a_build_cut_short_is_built_again(behind: str) -> None:
    with connect(behind) as look:
        async with _building(behind) as (holder, (store,), migrating):
            # the migrating instance's connection is cut mid-build: an invalid index is left
            cut = look.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE"
                               " query LIKE 'CREATE INDEX CONCURRENTLY%%'").fetchall()
            assert len(cut) == 1
            await wait_for(lambda: _indexes(look).get(f"{INDEX}_building") == (False, mock.ANY)
                           or migrating.done())
            holder.execute("COMMIT")
            try:
                await asyncio.wait_for(migrating, 30)  # (run again on a fresh connection)
            except Exception:  # noqa: BLE001 - or given up: the next start finishes it
                await store.engine.migrate(memory.COMPONENT, memory.MIGRATIONS)
            _migrated(look)
            # the migration lock was let go with the connection cut, and by the one that
            # finished: another migration takes it at once
            assert look.execute("SELECT pg_try_advisory_lock(%s)",
                                (MIGRATION_LOCK,)).fetchone()[0]
            look.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


async def test_instances_migrating_together_wait_for_an_online_build(behind: str) -> None:
    """One instance builds; the other waits for the migration lock without holding a snapshot
    (the build would wait for it while it waits for the lock: a deadlock, one of them failed
    by the server) and then finds nothing left to do."""
    with connect(behind) as look:
        async with _building(behind, stores=2) as (holder, (first, second), building):
            waiting = asyncio.ensure_future(second.engine.migrate(memory.COMPONENT,
                                                                  memory.MIGRATIONS))
            # the second asks for the lock now and then, holding nothing meanwhile
            seen: set[tuple[int, Any]] = set()
            await wait_for(lambda: _asks(look, seen) >= 2)
            assert not waiting.done() and _build_waiting(look)
            holder.execute("COMMIT")
            await asyncio.wait_for(asyncio.gather(building, waiting), 30)
            _migrated(look)
            assert first.engine.deadlocks == second.engine.deadlocks == 0


def _asks(conn: Any, seen: set[tuple[int, Any]]) -> int:
    """How many asks for the migration lock were seen from a backend that did not get it (each
    seen as its last statement, at a new start time)."""
    for pid, start in conn.execute(
            "SELECT pid, query_start FROM pg_stat_activity WHERE query LIKE"
            " 'SELECT pg_try_advisory_lock%%' AND state = 'idle'").fetchall():
        seen.add((pid, start))
    return len(seen)


GROWING = ("messages", "runs", "run_events", "usage_calls", "inbound_seen")  # (with use)
# plain builds made before online steps existed (each ran once, long ago, on every database)
BUILT_PLAIN = {("conversations", "runs_owner"), ("inbound", "inbound_unhandled"),
               ("inbound", "inbound_chat")}


def test_a_new_index_on_a_growing_table_is_built_online() -> None:
    """A later step (not a table's creation) that indexes a table growing with use is an
    :func:`online_index`: a plain ``CREATE INDEX`` holds every instance's writes to the table
    for the whole build during a rolling upgrade."""
    import importlib
    import pkgutil
    import re

    import pluto.storage.sql as sql
    plain = set()
    for info in pkgutil.iter_modules(sql.__path__):
        module = importlib.import_module(f"pluto.storage.sql.{info.name}")
        for step in list(getattr(module, "MIGRATIONS", []))[1:]:
            text = sql.migration_for("postgres", step)
            if isinstance(text, str):
                plain |= {(info.name, name) for name in re.findall(
                    rf"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(\w+)\s+ON\s+(?:{'|'.join(GROWING)})\b",
                    text)}
    assert plain == BUILT_PLAIN, "build these with storage.sql.online_index: " \
        f"{sorted(plain - BUILT_PLAIN)}"
