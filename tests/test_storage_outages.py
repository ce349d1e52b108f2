"""Storage errors that pass (a full disk, a locked database, a dropped connection) are retried,
bounded in time, and said: the engines' health, then StorageUnavailable; never a silent drop.

The full disk itself, with a gateway and the fake Telegram, is in test_full_disk.py."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid

import pytest

from pluto.errors import StorageUnavailable
from pluto.storage.postgres import PostgresStore
from pluto.storage.sqlite import SqliteStore
from tests.helpers.pg import fresh_schema


def failing(times: int, error: Exception, calls: list[int]):
    """A change that meets ``error`` ``times`` times, then inserts one row."""
    def change(conn: sqlite3.Connection) -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        conn.execute("INSERT INTO schema_versions (component, version) VALUES ('x', 1)")
        return "saved"
    return change


async def count_x(store: SqliteStore) -> int:
    row = await store.engine.fetchone(
        "SELECT COUNT(*) FROM schema_versions WHERE component = 'x'")
    return row[0]


async def test_a_full_disk_is_retried_until_it_passes_and_said_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pluto.storage")
    async with SqliteStore(tmp_path / "pluto.db") as store:
        calls: list[int] = []
        change = failing(4, sqlite3.OperationalError("database or disk is full"), calls)
        others = [store.engine.write(("INSERT INTO schema_versions VALUES (?, 1)", (f"o{i}",)))
                  for i in range(5)]  # arriving meanwhile: they wait in line, then commit
        assert await asyncio.gather(store.engine.transact(change), *others) == ["saved"] + [1] * 5
        assert len(calls) == 5 and await count_x(store) == 1
        assert store.engine.health.problem is None
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        infos = [r for r in caplog.records if "work again" in r.getMessage()]
        assert len(errors) == 1 and "the disk is full" in errors[0].getMessage()
        assert len(infos) == 1


async def test_a_change_is_given_up_after_the_retry_time_and_health_says_why(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        engine = store.engine
        engine.retry_seconds = 0.3
        calls: list[int] = []
        change = failing(10**6, sqlite3.OperationalError("disk I/O error"), calls)
        with pytest.raises(StorageUnavailable) as caught:
            await engine.transact(change)
        assert str(caught.value) == ("Nothing can be saved right now: the database cannot be "
                                     "written (a disk I/O error).")
        assert str(tmp_path) not in str(caught.value)
        assert engine.health.problem == "the database cannot be written (a disk I/O error)"
        assert engine.health.since is not None and engine.health.given_up == 1
        assert len(calls) > 1  # tried again (on fresh connections: an I/O error)
        assert await engine.probe()  # it works now: the outage is over
        assert engine.health.problem is None
        assert await count_x(store) == 0


async def test_a_constraint_violation_is_not_retried(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        calls: list[int] = []
        change = failing(1, sqlite3.IntegrityError("UNIQUE constraint failed"), calls)
        with pytest.raises(sqlite3.IntegrityError):
            await store.engine.transact(change)
        assert len(calls) == 1 and store.engine.health.problem is None


async def test_a_locked_database_waits_for_the_other_process(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        other = sqlite3.connect(tmp_path / "pluto.db", isolation_level=None)
        await store.engine._db.execute("PRAGMA busy_timeout = 50")  # (not 5 s: quicker)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        writing = asyncio.ensure_future(store.engine.write(
            ("INSERT INTO schema_versions VALUES ('x', 1)", ())))
        for _ in range(200):
            if store.engine.health.problem:
                break
            await asyncio.sleep(0.02)
        assert store.engine.health.problem == "the database is locked by another process"
        assert not writing.done()
        other.execute("ROLLBACK")
        other.close()
        assert await writing == 1
        assert store.engine.health.problem is None and await count_x(store) == 1


async def test_postgres_retries_on_a_fresh_connection_after_backends_are_terminated():
    with fresh_schema() as url:
        name = f"pluto-outage-{uuid.uuid4().hex[:8]}"  # (other tests may share the server)
        url += ("&" if "?" in url else "?") + f"application_name={name}"
        async with PostgresStore(url, min_size=3, max_size=3) as store:
            engine = store.engine
            await asyncio.gather(*(engine.read(lambda c: c.execute("SELECT 1").fetchone())
                                   for _ in range(6)))  # every pooled connection in use once
            killer = await asyncio.to_thread(_connect, url)
            try:
                killed = await asyncio.to_thread(_terminate, killer, name)
                assert killed >= 1
                assert await engine.write(
                    ("INSERT INTO schema_versions VALUES ('x', 1)", ())) == 1
                assert engine.health.problem is None
                row = await engine.fetchone(
                    "SELECT COUNT(*) FROM schema_versions WHERE component = 'x'")
                assert row[0] == 1
            finally:
                killer.close()


def _connect(url: str):
    import psycopg
    return psycopg.connect(url, autocommit=True)


def _terminate(conn, name: str) -> int:
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
        " AND pid <> pg_backend_pid()", (name,)).fetchall()
    return len(rows)


async def test_postgres_gives_up_when_the_server_is_away(tmp_path):
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=2) as store:
            engine = store.engine
            engine.retry_seconds = 0.5
            pool = engine._pool
            await asyncio.to_thread(pool.close)  # nothing can be reached any more
            try:
                with pytest.raises(StorageUnavailable):
                    await engine.write(("INSERT INTO schema_versions VALUES ('x', 1)", ()))
                assert engine.health.problem == "the database cannot be reached"
            finally:
                engine._pool = None  # (closed already)
