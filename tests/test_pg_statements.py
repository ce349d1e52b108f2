"""Single statements on PostgreSQL go through asyncpg on the event loop (no worker thread):
their placeholders and types mean what they meant through psycopg, and they hold under the
faults the cluster tests make — backends terminated mid-traffic, a server out of reach."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from pluto.errors import StorageUnavailable
from pluto.storage.postgres import PostgresStore
from pluto.storage.postgres.engine import _count, _kind, _numbered
from tests.helpers.pg import connect as _connect
from tests.helpers.pg import fresh_schema
from tests.helpers.pg import terminate as _terminate


def test_placeholders_are_numbered_and_typed_as_psycopg_sends_them():
    values = (7, 1.5, "x", b"\x00", None)
    sql = "INSERT INTO t (a, b, c, d) SELECT ?, ?, ?, ? WHERE ? IS NULL"
    assert _numbered(sql, tuple(map(_kind, values))) == (
        "INSERT INTO t (a, b, c, d) SELECT $1::int2, $2::float8, $3, $4::bytea"
        " WHERE $5 IS NULL")
    assert _numbered("SELECT 1", ()) == "SELECT 1"
    # an int: the smallest integer type it fits, as psycopg's dumpers choose
    assert [_kind(v) for v in (0, 40_000, 1 << 40, 1 << 70, True)] == [
        "::int2", "::int4", "::int8", "::numeric", "::bool"]


def test_a_status_gives_its_row_count():
    assert [_count(s) for s in ("INSERT 0 3", "UPDATE 1", "DELETE 0", "SELECT 2", "LISTEN")] \
        == [3, 1, 0, 2, 0]


async def test_values_keep_their_meaning_through_the_loop_driver():
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=2) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE kinds (id TEXT PRIMARY KEY, n INTEGER,"
                                " x DOUBLE PRECISION, b BYTEA, t TEXT)", ()))
            # an int where a float goes and a float where an integer goes: cast as the server
            # casts psycopg's typed values; a parameter only a SELECT list sees keeps its type
            assert await engine.write(("INSERT INTO kinds (id, n, x, b, t) SELECT ?, ?, ?, ?, ?",
                                       ("a", 2.6, 3, b"\x00\x01", None))) == 1
            row = await engine.write_returning(
                ("UPDATE kinds SET n = n + ? WHERE id = ? RETURNING n, x, b, t, ? AS echo",
                 (1, "a", 7)))
            assert (row["n"], row["x"], row["b"], row["t"], row["echo"]) == (4, 3.0, b"\x00\x01",
                                                                             None, 7)
            assert tuple(row) == (4, 3.0, b"\x00\x01", None, 7) and row[0] == 4
            rows = await engine.fetchall("SELECT id FROM kinds WHERE id = ANY(?)", (["a", "b"],))
            assert [r["id"] for r in rows] == ["a"]
            assert await engine.fetchone("SELECT id FROM kinds WHERE id = ?", ("zz",)) is None
            with pytest.raises(Exception, match="duplicate key"):  # not retried: said
                await engine.write(("INSERT INTO kinds (id) VALUES (?)", ("a",)))
            assert engine.health.problem is None


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_backends_terminated_mid_traffic_lose_and_double_nothing():
    """Twenty writers insert rows with keys of their own while every backend of the store is
    terminated five times a second: each write commits once (a duplicate key would say a
    committed statement was run again), none is lost, and no connection broken mid-statement
    is handed to the next caller (asyncpg#1069): the writes go on until the end."""
    with fresh_schema() as url:
        name = f"pluto-statements-{uuid.uuid4().hex[:8]}"
        url += ("&" if "?" in url else "?") + f"application_name={name}"
        async with PostgresStore(url, min_size=2, max_size=6) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE w (id TEXT PRIMARY KEY)", ()))
            written: list[str] = []
            maybe: list[str] = []  # refused after the fault lasted: committed or not, once
            failed: list[BaseException] = []
            stop = asyncio.Event()

            async def writer() -> None:
                while not stop.is_set():
                    key = uuid.uuid4().hex
                    try:
                        assert await engine.write(("INSERT INTO w (id) VALUES (?)", (key,))) == 1
                    except StorageUnavailable:
                        maybe.append(key)
                        continue
                    except Exception as e:  # noqa: BLE001 - anything else fails the test
                        failed.append(e)
                        return
                    written.append(key)

            writers = [asyncio.create_task(writer()) for _ in range(20)]
            killer = await asyncio.to_thread(_connect, url)
            try:
                killed = 0
                for _ in range(15):
                    await asyncio.sleep(0.2)
                    killed += await asyncio.to_thread(_terminate, killer, name)
                before = len(written)
                await _until(lambda: len(written) >= before + 200)  # still writing after it
            finally:
                stop.set()
                killer.close()
                # a writer stuck on a connection broken under it fails here, not hangs
                await asyncio.wait_for(asyncio.gather(*writers), 30)
            assert not failed, failed[:3]
            assert killed >= 15
            rows = {r["id"] for r in await engine.fetchall("SELECT id FROM w")}
            assert set(written) <= rows <= set(written) | set(maybe)
            assert engine.health.problem is None


async def _until(condition, timeout: float = 30.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


async def test_the_bus_hears_notes_and_says_when_it_may_have_missed_some():
    """Notes are heard through asyncpg's listener; the listening connection terminated, the bus
    connects again and hands every callback None (re-read what you follow), then hears on."""
    with fresh_schema() as url:
        name = f"pluto-bus-{uuid.uuid4().hex[:8]}"
        url += ("&" if "?" in url else "?") + f"application_name={name}"
        async with PostgresStore(url, min_size=1, max_size=2) as store:
            heard: list[str | None] = []
            store.bus.subscribe("pluto_test", heard.append)
            await _until(lambda: _listening(store, name), 10)
            await store.bus.publish("pluto_test", ["a", "b"])
            await _until(lambda: heard == ["a", "b"])
            killer = await asyncio.to_thread(_connect, url)
            try:
                await asyncio.to_thread(_terminate, killer, name)
            finally:
                killer.close()
            await _until(lambda: heard[2:] == [None])
            await _until(lambda: _listening(store, name), 10)
            await store.bus.publish("pluto_test", ["c"])
            await _until(lambda: heard[3:] == ["c"])


def _listening(store: PostgresStore, name: str) -> bool:
    """Whether the store's bus has its LISTEN in place (on a connection of its own)."""
    import psycopg
    with psycopg.connect(store.url, autocommit=True) as conn:
        return bool(conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query LIKE"
            " 'LISTEN %%' AND state = 'idle'", (name,)).fetchone()[0])


async def test_the_heartbeat_comes_back_with_a_messages_statements():
    """After an outage psycopg's pool waits out its own reconnect backoff (1, 2, 4, 8 s) while
    asyncpg connects at the next statement: the heartbeat renews on the path a message's
    statements take, so an instance that records answers again holds its leases again too.
    (Through psycopg, instances recorded answers with their own leases run out: the others'
    sweeps took their replies up, two at once, out of order.)"""
    with fresh_schema() as url:
        async with PostgresStore(url) as store:
            token = await store.leases.acquire("instance:a", "a", 60)
            assert token is not None

            async def backing_off(*args: object) -> object:
                raise StorageUnavailable("the database cannot be reached")

            store.engine._in_thread = backing_off  # type: ignore[method-assign]
            assert await store.leases.renew_all("a", {"instance:a": token}, 60) == set()
            assert await store.leases.acquire("instance:b", "b", 60) is not None


@pytest.mark.slow
async def test_psycopgs_pool_still_reconnecting_is_replaced_once_the_database_answers():
    """Connections refused for 4 s while changes of several statements keep asking psycopg's
    pool for one: its reconnect attempts back off (1, 2, 4 s...), so it would come back seconds
    after the database (2.5-3.9 s measured here; up to 20 s after a 10 s outage under three
    instances' traffic) while asyncpg's single statements go on at once. The first statement
    that finds the database again has the pool replaced: changes run on a fresh one, and a
    pool that never failed to connect is kept."""
    from urllib.parse import urlsplit

    from tests.helpers.tcp_proxy import TcpProxy
    from tests.test_cluster_faults import through

    with fresh_schema() as url:
        host = urlsplit(url)
        proxy = TcpProxy(host.hostname or "127.0.0.1", host.port or 5432)
        try:
            async with PostgresStore(through(url, await proxy.start()),
                                     connect_timeout=1) as store:  # (changes fail fast)
                engine = store.engine
                engine.retry_seconds = 0.5

                def change(conn):  # type: ignore[no-untyped-def]
                    return conn.execute("SELECT 1").fetchall()

                await engine.transact(change)
                await engine.fetchone("SELECT 1")
                healthy = engine._pool
                engine._refresh_soon()  # a look with nothing failed: the pool is kept
                await engine._refreshing
                assert engine._pool is healthy
                refusing = asyncio.create_task(proxy.refuse(4.0))
                until = asyncio.get_running_loop().time() + 3.0
                while asyncio.get_running_loop().time() < until:  # traffic meanwhile: fails
                    await asyncio.gather(*(engine.transact(change) for _ in range(5)),
                                         return_exceptions=True)
                    await asyncio.sleep(0.1)
                await refusing
                assert engine.health.problem is not None
                assert await engine.fetchone("SELECT 1") is not None  # asyncpg: back at once
                assert engine._refreshing is not None
                await engine._refreshing
                assert engine._pool is not healthy and healthy.closed
                assert await engine.transact(change) == [(1,)]
                assert engine.health.problem is None
        finally:
            await proxy.stop()
