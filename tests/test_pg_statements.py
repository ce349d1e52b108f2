"""Single statements on PostgreSQL go through asyncpg on the event loop (no worker thread):
their placeholders and types mean what they meant through psycopg, and they hold under the
faults the cluster tests make — backends terminated mid-traffic, a server out of reach."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit

import pytest

from pluto.errors import StorageUnavailable
from pluto.storage.postgres import PostgresStore
from pluto.storage.postgres.engine import _count, _keyed, _kind, _numbered
from tests.helpers.pg import connect as _connect
from tests.helpers.pg import fresh_schema
from tests.helpers.pg import terminate as _terminate
from tests.helpers.tcp_proxy import TcpProxy
from tests.test_cluster_faults import through


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


def test_a_statement_is_rewritten_to_go_with_others_only_when_it_fits():
    """Several runs of one statement sent together tell their rows apart by one more column:
    the statement becomes the last part of a ``WITH`` (its own parts kept before it, at the
    top level, where PostgreSQL wants data-modifying ones). A statement that returns no rows,
    locks rows, or touches session state goes alone."""
    assert _keyed("SELECT a FROM t WHERE b = $1") == (
        "WITH pluto_q AS (SELECT a FROM t WHERE b = $1) "
        "SELECT $2::int4 AS pluto_k, pluto_q.* FROM pluto_q")
    assert _keyed("WITH x(c) AS (INSERT INTO t VALUES ($2) RETURNING c), y AS MATERIALIZED "
                  "(SELECT ')' AS p) UPDATE u SET n = $1 FROM x RETURNING n") == (
        "WITH x(c) AS (INSERT INTO t VALUES ($2) RETURNING c), y AS MATERIALIZED "
        "(SELECT ')' AS p), pluto_q AS (UPDATE u SET n = $1 FROM x RETURNING n) "
        "SELECT $3::int4 AS pluto_k, pluto_q.* FROM pluto_q")
    for alone in ("UPDATE t SET a = $1", "DELETE FROM t",  # nothing to tell apart
                  "SELECT a FROM t WHERE b = $1 FOR UPDATE",
                  "SELECT pg_advisory_xact_lock($1)", "SELECT set_config('x', $1, false)",
                  "WITH RECURSIVE r AS (SELECT 1) SELECT * FROM r", "SHOW search_path",
                  "WITH a AS (SELECT 1", "WITH a AS (SELECT ')'), b AS (SELECT 2"):
        assert _keyed(alone) is None, alone


async def test_statements_asked_for_at_once_share_a_round_trip_and_keep_their_rows():
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=3) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", ()))
            rows = await asyncio.gather(*(engine.write_returning(
                ("INSERT INTO t (id, v) VALUES (?, ?) RETURNING id, v", (i, f"v{i}")))
                for i in range(40)))
            assert [(r["id"], r[1]) for r in rows] == [(i, f"v{i}") for i in range(40)]
            assert engine.batches >= 1 and engine.batched >= 40
            # none, one and many rows each (a WITH that writes, as the store's statements do)
            reads = await asyncio.gather(*(engine.fetchall(
                "WITH n AS (UPDATE t SET v = v WHERE id = -1 RETURNING id) "
                "SELECT id, v FROM t WHERE id < ? ORDER BY id", (n,)) for n in (0, 1, 5, 40)))
            assert [[r["id"] for r in rs] for rs in reads] == [[], [0], list(range(5)),
                                                               list(range(40))]
            assert all(r.keys() == ["id", "v"] for r in reads[3])
            one, none = await asyncio.gather(engine.fetchone("SELECT v FROM t WHERE id = ?", (3,)),
                                             engine.fetchone("SELECT v FROM t WHERE id = ?", (99,)))
            assert one is not None and one["v"] == "v3" and none is None
            # a write's count: the rows its statement returned (as the inbox's first sight)
            seen = "WITH i AS (INSERT INTO t (id) VALUES (?) ON CONFLICT DO NOTHING RETURNING id)" \
                   " SELECT 1 FROM i"
            assert await asyncio.gather(*(engine.write((seen, (i,))) for i in (1, 77, 2, 78))) \
                == [0, 1, 0, 1]
            assert engine.batches >= 4


async def test_under_load_a_statement_waits_for_others_a_lone_client_never(monkeypatch):
    """A text that went in a batch lately is busy: its next statement, with none of its text on
    its way, waits GATHER for others, and those asked meanwhile (each in a pass of the loop of
    its own, as chats reach the same step) go with it. Statements of a text not busy — a lone
    client's, one after the other — go at once, each alone."""
    from pluto.storage.postgres import engine as engine_module

    monkeypatch.setattr(engine_module, "GATHER", 0.5)  # (wide: no race with a slow machine)
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=3) as store:
            engine = store.engine
            read = "SELECT ? + 1 AS n"
            for i in range(5):  # a lone client: at once, alone
                assert (await engine.fetchone(read, (i,)))["n"] == i + 1  # type: ignore[index]
            assert engine.batches == 0
            await asyncio.gather(*(engine.fetchone(read, (i,)) for i in range(10)))
            batches, batched = engine.batches, engine.batched
            assert batches >= 1  # (the text is busy now)
            asked = []
            for i in range(5):  # the same step of five chats, a pass of the loop apart
                asked.append(asyncio.ensure_future(engine.fetchone(read, (i,))))
                await asyncio.sleep(0)
            assert [r["n"] for r in await asyncio.gather(*asked)] == [1, 2, 3, 4, 5]  # type: ignore[index]
            assert (engine.batches, engine.batched) == (batches + 1, batched + 5)
            other = "SELECT ? + 2 AS n"  # (another text: not busy)
            assert (await engine.fetchone(other, (1,)))["n"] == 3  # type: ignore[index]
            assert engine.batches == batches + 1


async def test_a_statement_failing_among_others_fails_alone():
    """A batch is one transaction: one statement's error undoes it whole, so each is run again
    on its own — the one that fails fails, the others commit once."""
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=3) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE t (id INTEGER PRIMARY KEY)", ()))
            await engine.write(("INSERT INTO t (id) VALUES (5)", ()))
            results = await asyncio.gather(*(engine.write_returning(
                ("INSERT INTO t (id) VALUES (?) RETURNING id", (i,))) for i in range(10)),
                return_exceptions=True)
            assert engine.batches >= 1
            assert "duplicate key" in str(results[5])
            assert [r["id"] for i, r in enumerate(results) if i != 5] == [  # type: ignore[index]
                i for i in range(10) if i != 5]
            assert await engine.fetchone("SELECT count(*) AS n FROM t") == (10,)


async def test_a_statement_whose_rewriting_the_server_refuses_goes_alone(monkeypatch):
    """(A safety net: no statement of the store's is known to need it.)"""
    from pluto.storage.postgres import engine as module

    monkeypatch.setattr(module, "_keyed", lambda query: f"{query} WHERE nonsense")
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=3) as store:
            engine = store.engine
            read = "SELECT ? + 1 AS n"
            found = await asyncio.gather(*(engine.fetchone(read, (i,)) for i in range(3)))
            assert [f["n"] for f in found] == [1, 2, 3]  # type: ignore[index]
            assert _numbered(read, ("::int2",)) in engine._alone
            batches = engine.batches
            found = await asyncio.gather(*(engine.fetchone(read, (i,)) for i in range(3)))
            assert [f["n"] for f in found] == [1, 2, 3] and engine.batches == batches  # type: ignore[index]


async def test_a_statement_held_by_a_lock_holds_up_no_other_chat():
    """A row locked by another transaction holds up the statement that writes it, not the
    statements of the same text for other rows asked for after it."""
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=4) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER)", ()))
            await engine.write(("INSERT INTO t SELECT g, 0 FROM generate_series(1, 6) g", ()))
            bump = "UPDATE t SET n = n + 1 WHERE id = ? RETURNING id, n"
            locker = await asyncio.to_thread(_connect, url)
            try:
                await asyncio.to_thread(_lock_row, locker)
                held = asyncio.ensure_future(engine.write_returning((bump, (1,))))
                await asyncio.sleep(0)
                others = await asyncio.wait_for(asyncio.gather(*(
                    engine.write_returning((bump, (i,))) for i in range(2, 7))), 30)
                assert [tuple(r) for r in others] == [(i, 1) for i in range(2, 7)]
                assert not held.done()
            finally:
                await asyncio.to_thread(locker.close)  # its transaction ends: the row is free
            assert tuple(await asyncio.wait_for(held, 30)) == (1, 1)


def _lock_row(conn) -> None:  # type: ignore[no-untyped-def]
    conn.execute("BEGIN")
    conn.execute("SELECT * FROM t WHERE id = 1 FOR UPDATE")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("returning", [False, True], ids=["alone", "together"])
async def test_backends_terminated_mid_traffic_lose_and_double_nothing(returning: bool):
    """Twenty writers insert rows with keys of their own while every backend of the store is
    terminated five times a second: each write commits once (a duplicate key would say a
    committed statement was run again), none is lost, and no connection broken mid-statement
    is handed to the next caller (asyncpg#1069): the writes go on until the end. Writes that
    return rows go several at a time (one round trip); a batch cut off is run again, each on
    its own."""
    with fresh_schema() as url:
        name = f"pluto-statements-{uuid.uuid4().hex[:8]}"
        url += ("&" if "?" in url else "?") + f"application_name={name}"
        async with PostgresStore(url, min_size=2, max_size=6) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE w (id TEXT PRIMARY KEY)", ()))
            w = _Writers(engine, returning)
            # (maybe: refused after the fault lasted — committed or not, once)
            written, maybe, failed, stop = w.written, w.refused, w.failed, w.stop
            writers = w.start(20)
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
            assert not returning or engine.batches > 0


class _Writers:
    """Writers inserting rows with keys of their own until ``stop``: the keys written, those
    refused with StorageUnavailable, and any other error (which ends its writer)."""

    def __init__(self, engine, returning: bool):  # type: ignore[no-untyped-def]
        self.engine, self.returning = engine, returning
        self.written: list[str] = []
        self.refused: list[str] = []
        self.failed: list[BaseException] = []
        self.stop = asyncio.Event()

    def start(self, n: int) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._write()) for _ in range(n)]

    async def _write(self) -> None:
        while not self.stop.is_set():
            key = uuid.uuid4().hex
            try:
                if self.returning:
                    row = await self.engine.write_returning(
                        ("INSERT INTO w (id) VALUES (?) RETURNING id", (key,)))
                    assert row is not None and row["id"] == key
                else:
                    assert await self.engine.write(("INSERT INTO w (id) VALUES (?)",
                                                    (key,))) == 1
            except StorageUnavailable:
                self.refused.append(key)
                continue
            except Exception as e:  # noqa: BLE001 - anything else fails the test
                self.failed.append(e)
                return
            self.written.append(key)


async def _until(condition, timeout: float = 30.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


async def test_the_bus_hears_notes_and_says_when_it_may_have_missed_some():
    """Notes are heard through asyncpg's listener. Once it listens the bus hands every callback
    None (a look taken before may have missed a note: re-read what you follow) and says it
    hears; the listening connection terminated, it says it does not until it connects again,
    hands every callback None again, and hears on."""
    with fresh_schema() as url:
        name = f"pluto-bus-{uuid.uuid4().hex[:8]}"
        url += ("&" if "?" in url else "?") + f"application_name={name}"
        async with PostgresStore(url, min_size=1, max_size=2) as store:
            heard: list[str | None] = []
            assert not store.bus.hearing
            store.bus.subscribe("pluto_test", heard.append)
            await _until(lambda: _listening(store, name), 10)
            await _until(lambda: heard == [None])
            assert store.bus.hearing
            await store.bus.publish("pluto_test", ["a", "b"])
            await _until(lambda: heard[1:] == ["a", "b"])
            killer = await asyncio.to_thread(_connect, url)
            try:
                await asyncio.to_thread(_terminate, killer, name)
            finally:
                killer.close()
            await _until(lambda: not store.bus.hearing, 10)  # (back 0.2 s later at the soonest)
            await _until(lambda: heard[3:] == [None])
            await _until(lambda: _listening(store, name), 10)
            assert store.bus.hearing
            await store.bus.publish("pluto_test", ["c"])
            await _until(lambda: heard[4:] == ["c"])


async def test_a_listening_connection_cut_without_a_word_is_given_up_and_opened_again():
    """A partition (or a NAT forgetting an idle flow) tells the listening connection nothing:
    asked to answer now and then, it does not, and the bus says it no longer hears, opens a
    new connection once the database is reachable again, hands every callback None and hears
    on."""
    with fresh_schema() as url:
        proxy = TcpProxy("127.0.0.1", urlsplit(url).port or 5432)
        port = await proxy.start()
        try:
            async with PostgresStore(through(url, port), min_size=1, max_size=2) as far, \
                    PostgresStore(url, min_size=1, max_size=2) as near:
                far.bus.ping_every, far.bus.ping_timeout = 0.2, 0.5
                heard: list[str | None] = []
                far.bus.subscribe("pluto_test", heard.append)
                await _until(lambda: far.bus.hearing and heard == [None], 10)
                await near.bus.publish("pluto_test", ["a"])
                await _until(lambda: heard[1:] == ["a"])
                proxy.silent = True  # (nothing is closed: only the questions go unanswered)
                await _until(lambda: not far.bus.hearing, 10)
                await near.bus.publish("pluto_test", ["lost"])
                proxy.silent = False
                proxy.cut()  # (the flows the partition left half-open: gone for good)
                await _until(lambda: far.bus.hearing and heard[2:] == [None], 20)
                await near.bus.publish("pluto_test", ["b"])
                await _until(lambda: heard[3:] == ["b"])
        finally:
            proxy.silent = False
            await proxy.stop()


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


async def test_a_full_disk_under_batched_writes_loses_and_doubles_nothing(monkeypatch):
    """The server's disk fills (every write refused: 53100) under twenty writers whose writes
    go several at a time. A short one: each batch refused is run again statement by statement
    with the single statement's retries, and every write commits once, none refused. One past
    the retry window: the writes then asked for fail with StorageUnavailable (never silently),
    storage's health names the full disk meanwhile, none of them is in the table, and writing
    goes on by itself once space returns."""
    import asyncpg

    from pluto.storage.postgres.engine import DISK_FULL

    full = [False]
    for method in ("fetchmany", "fetch", "fetchrow", "execute"):
        real = getattr(asyncpg.connection.Connection, method)

        def refusing(self, query, *args, _real=real, **kw):  # type: ignore[no-untyped-def]
            if full[0] and "INSERT INTO w" in str(query):
                async def refuse():  # type: ignore[no-untyped-def]
                    raise asyncpg.exceptions.DiskFullError(
                        "could not extend file: No space left on device")
                return refuse()
            return _real(self, query, *args, **kw)
        monkeypatch.setattr(asyncpg.connection.Connection, method, refusing)

    with fresh_schema() as url:
        async with PostgresStore(url, min_size=2, max_size=6) as store:
            engine = store.engine
            await engine.write(("CREATE TABLE w (id TEXT PRIMARY KEY)", ()))
            w = _Writers(engine, returning=True)
            written, refused, failed, stop = w.written, w.refused, w.failed, w.stop
            problems: set[str | None] = set()

            async def outage(seconds: float) -> None:
                full[0] = True
                end = asyncio.get_running_loop().time() + seconds
                while asyncio.get_running_loop().time() < end:
                    problems.add(engine.health.problem)
                    await asyncio.sleep(0.05)
                full[0] = False

            writers = w.start(20)
            try:
                await _until(lambda: engine.batches > 0 and len(written) >= 200)
                await outage(0.6)  # (within the retry window: nobody is refused)
                before = len(written)
                await _until(lambda: len(written) >= before + 200)
                assert not refused and DISK_FULL in problems
                await outage(engine.retry_seconds + 1.5)  # past it: refused, said, not lost
                before = len(written)
                await _until(lambda: len(written) >= before + 200)  # back by itself
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(*writers), 30)
            assert not failed, failed[:3]
            assert refused
            rows = {r["id"] for r in await engine.fetchall("SELECT id FROM w")}
            assert rows == set(written) and not rows & set(refused)
            assert len(written) == len(set(written))
            assert engine.health.problem is None
