"""The storage seam: one write path on SQLite. A change is atomic, group-committed with the
changes that arrive meanwhile, and never half-committed nor rolled back by anyone else's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pluto.errors import StorageError
from pluto.events import MessageDelta, RunEnd, RunStart
from pluto.storage.sql import json_text, run_statements
from pluto.storage.sqlite import SqliteStore
from pluto.storage.sql.conversations import PREVIEWS_AHEAD

SESSION = "INSERT INTO sessions (id, key, agent, created_at, updated_at) VALUES (?,?,?,?,?)"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(tmp_path / "pluto.db") as s:
        yield s


def other_connection(store: SqliteStore) -> sqlite3.Connection:
    """A second reader of the same file, as another process would be."""
    return sqlite3.connect(store.path, timeout=5)


def session_ids(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id")]


async def test_group_commit_isolates_a_failing_write(store):
    ok = (SESSION, ("s-ok", "k-ok", "a", 1.0, 1.0))
    dup = (SESSION, ("s-ok", "k-dup", "a", 1.0, 1.0))
    other = (SESSION, ("s-2", "k-2", "a", 1.0, 1.0))
    engine = store.engine
    results = await asyncio.gather(engine.write(ok), engine.write(dup), engine.write(other),
                                   return_exceptions=True)
    assert results[0] == 1 and results[2] == 1
    assert isinstance(results[1], Exception) and "UNIQUE" in str(results[1])
    assert [r[0] for r in await engine.fetchall("SELECT id FROM sessions ORDER BY id")] == [
        "s-2", "s-ok"]


async def test_a_failing_change_in_a_batch_leaves_no_trace_with_savepoints_in_memory(store):
    """Each change of a batch runs in its own savepoint, journalled in memory (not in a
    temporary file per commit); a change that fails half-way is undone to its savepoint."""
    assert (await store.engine.fetchone("PRAGMA temp_store"))[0] == 2  # MEMORY

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute(SESSION, ("s-half", "k-half", "a", 1.0, 1.0))
        raise ValueError("second statement refused")

    ok = store.engine.write((SESSION, ("s-ok", "k-ok", "a", 1.0, 1.0)))
    results = await asyncio.gather(ok, store.engine.transact(half_then_fail),
                                   return_exceptions=True)
    assert results[0] == 1 and isinstance(results[1], ValueError)
    assert [r[0] for r in await store.engine.fetchall("SELECT id FROM sessions")] == ["s-ok"]


async def test_a_batch_runs_together_and_again_change_by_change_only_when_one_fails(store):
    """Changes of a batch run together without savepoints; when one fails, the batch is rolled
    back and each change runs again in its own savepoint: the others commit exactly once."""
    runs: list[str] = []

    def insert(sid: str, fail: bool = False):
        def change(conn: sqlite3.Connection) -> str:
            runs.append(sid)
            conn.execute(SESSION, (sid, f"k-{sid}", "a", 1.0, 1.0))
            if fail:
                raise ValueError(f"{sid} refused")
            return sid
        return change

    engine = store.engine
    assert await asyncio.gather(engine.transact(insert("a")), engine.transact(insert("b")),
                                engine.transact(insert("c"))) == ["a", "b", "c"]
    assert sorted(runs) == ["a", "b", "c"]  # all ran once, together
    runs.clear()
    results = await asyncio.gather(engine.transact(insert("d")),
                                   engine.transact(insert("e", fail=True)),
                                   engine.transact(insert("f")), return_exceptions=True)
    assert results[0] == "d" and results[2] == "f" and isinstance(results[1], ValueError)
    assert [r[0] for r in await engine.fetchall("SELECT id FROM sessions ORDER BY id")] == [
        "a", "b", "c", "d", "f"]


async def until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def queued(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The changes handed to the writer from now on (committed in that order)."""
    changes: list[object] = []
    queue = store.engine.queue

    def recorded(change, **kw):  # type: ignore[no-untyped-def]
        changes.append(change)
        return queue(change, **kw)

    monkeypatch.setattr(store.engine, "queue", recorded)
    return changes


async def test_a_multi_statement_write_is_neither_half_committed_nor_undone(store):
    """Caller A's change half-way (one row written, one to go) is seen by nobody; B's write,
    handed over while A's commit is under way, is committed after it — not lost when A fails
    (rolled back alone), and whole beside A's when A succeeds; a change failing in A's batch
    leaves A's work."""
    engine = store.engine
    reader = other_connection(store)
    fail = {"value": True}
    halfway: list[list[str]] = []
    b: list[asyncio.Future[int]] = []

    def change_a(conn: sqlite3.Connection) -> str:
        conn.execute(SESSION, ("a-1", "ka-1", "a", 1.0, 1.0))
        halfway.append(session_ids(reader))  # from another connection, half-way
        n = len(b) + 1  # B handed over now, as a caller on the loop would during a commit
        b.append(engine.queue(run_statements(
            ((SESSION, (f"b-{n}", f"kb-{n}", "a", 1.0, 1.0)),))))
        if fail["value"]:
            raise RuntimeError("A changed its mind")
        conn.execute(SESSION, ("a-2", "ka-2", "a", 1.0, 1.0))
        return "a done"

    try:
        # 1. A fails after its first statement: rolled back alone, B's write committed
        with pytest.raises(RuntimeError, match="changed its mind"):
            await engine.transact(change_a)
        assert halfway == [[]]  # A's first row was not visible half-way
        assert await b[0] == 1
        assert session_ids(reader) == ["b-1"]  # B's work survives A's rollback
        # 2. A succeeds with B handed over during its commit: both whole
        fail["value"] = False
        assert await engine.transact(change_a) == "a done" and await b[1] == 1
        assert halfway[1] == ["b-1"]
        assert session_ids(reader) == ["a-1", "a-2", "b-1", "b-2"]
        # 3. B fails while A's change is in the same batch: A's work is not rolled back
        a = asyncio.create_task(engine.transact(lambda c: c.execute(
            SESSION, ("a-3", "ka-3", "a", 1.0, 1.0)).rowcount))
        bad = asyncio.create_task(engine.write((SESSION, ("a-3", "dup", "a", 1.0, 1.0))))
        assert await a == 1
        with pytest.raises(sqlite3.IntegrityError):
            await bad
        assert "a-3" in session_ids(reader)
    finally:
        reader.close()


async def test_run_events_are_numbered_as_they_are_committed(store):
    conv = store.conversations
    session = await conv.session("k", "a")
    await conv.queue_run("r1", session.id, "a", "hi")
    assert (await conv.run("r1")).status == "queued"
    start = await conv.start_run("r1", session.id, "a", "hi",
                                 RunStart(run_id="r1", session_id=session.id, agent="a"))
    delta = await conv.append_event(MessageDelta(run_id="r1", text="x"))
    end = await conv.end_run("r1", "ok", event=RunEnd(run_id="r1", outcome="ok"))
    assert [start.seq, delta.seq, end.seq] == [1, 2, 3]
    assert await conv.events("r1") == [start, delta, end]
    assert await conv.events("r1", after=2) == [end]
    assert (await conv.run("r1")).status == "ok"


async def test_a_queued_run_ended_before_it_started_has_a_run_end(store):
    conv = store.conversations
    session = await conv.session("k", "a")
    await conv.queue_run("r1", session.id, "a", "hi")
    end = await conv.end_run("r1", "cancelled", event=RunEnd(run_id="r1", outcome="cancelled"))
    assert end is not None and end.seq == 1
    assert await conv.events("r1") == [end]


async def test_recovery_ends_queued_and_running_runs_of_a_dead_process(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        conv = store.conversations
        session = await conv.session("k", "a")
        await conv.queue_run("waiting", session.id, "a", "later")
        await conv.start_run("going", session.id, "a", "now",
                             RunStart(run_id="going", session_id=session.id, agent="a"))
    async with SqliteStore(tmp_path / "pluto.db") as store:  # the next process
        ended = await store.conversations.recover_interrupted()
        # past any preview the dead process may have shown but not committed (issue 29)
        assert {e.run_id: e.seq for e in ended} == {"waiting": 1, "going": 2 + PREVIEWS_AHEAD}
        for run_id in ("waiting", "going"):
            assert (await store.conversations.run(run_id)).status == "interrupted"


async def test_a_message_that_starts_a_run_is_handled_in_the_same_commit(store):
    assert await store.inbound.accept("telegram", "1:1", {"text": "hi"})
    assert await store.inbound.unhandled("telegram") == [{"text": "hi"}]
    session = await store.conversations.session("k", "a")
    await store.conversations.queue_run("r1", session.id, "a", "hi",
                                        source=("telegram", "1:1"))
    assert await store.inbound.unhandled("telegram") == []


async def test_a_database_written_by_a_newer_pluto_is_refused(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        await store.engine.write(("UPDATE schema_versions SET version = 99"
                                  " WHERE component = 'outbox'", ()))
    with pytest.raises(StorageError, match="newer Pluto"):
        async with SqliteStore(tmp_path / "pluto.db"):
            pass


async def test_an_unusable_database_path_is_one_sentence(tmp_path):
    (tmp_path / "pluto.db").mkdir()  # a directory where the file should be
    store = SqliteStore(tmp_path / "pluto.db")
    with pytest.raises(StorageError, match="cannot"):
        await store.open()
    assert not store.is_open


@contextlib.contextmanager
def locked_by_another_process(store: SqliteStore) -> Iterator[None]:
    """Another process holds the database's write lock meanwhile: the writes handed over wait
    in line (tried for again and again, quietly at first)."""
    other = other_connection(store)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_a_read_never_waits_for_a_commit_in_progress(store):
    """Reads have a connection and a thread of their own: they answer while a write waits in
    line, from what is committed (and a write once awaited is seen by the next read)."""
    engine = store.engine
    with locked_by_another_process(store):
        write = asyncio.create_task(engine.write((SESSION, ("s-1", "k-1", "a", 1.0, 1.0))))
        row = await asyncio.wait_for(engine.fetchone("SELECT COUNT(*) FROM sessions"), 5)
        assert row[0] == 0 and not write.done()
        assert engine.health.problem is None  # (a lock of a moment is no outage)
    assert await write == 1
    assert (await engine.fetchone("SELECT COUNT(*) FROM sessions"))[0] == 1
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # reads only, there
        await engine.read(lambda conn: conn.execute(SESSION, ("s-2", "k-2", "a", 1.0, 1.0)))


async def test_a_new_session_is_used_before_its_row_is_committed(store, monkeypatch):
    """A new chat's session comes without waiting for a commit; what uses it next (its run's
    start) is committed after the session's row, and every lookup meanwhile finds the same
    session, never a second one."""
    conversations = store.conversations
    with locked_by_another_process(store):
        session = await asyncio.wait_for(conversations.session("chat-1", "a"), 5)
        assert await conversations.session("chat-1", "a") is session
        conversations._sessions.clear()  # the cache let go of it: still the same session
        assert (await conversations.session("chat-1", "a")).id == session.id
        in_line = queued(store, monkeypatch)
        start = asyncio.create_task(conversations.start_run(
            "r1", session.id, "a", "hi", RunStart(run_id="r1", session_id=session.id,
                                                  agent="a")))
        await until(lambda: in_line)  # the start is queued (behind the session's row) ...
        assert not start.done()  # ... and waits for its commit
    assert (await start).seq == 1
    rows = await store.engine.fetchall("SELECT id, key, active FROM sessions")
    assert [tuple(r) for r in rows] == [(session.id, "chat-1", 1)]
    assert await conversations.history(session.id, 10, 10_000) == [
        {"role": "user", "content": "hi"}]


async def test_a_new_session_whose_row_is_refused_is_forgotten(store, caplog):
    """The session's row fails to commit: its run fails with it (never a run without its
    session), it is logged, and the chat's next message gets a session that exists."""
    engine = store.engine
    await engine.write(("CREATE TRIGGER refuse BEFORE INSERT ON sessions BEGIN"
                        " SELECT RAISE(ABORT, 'the disk is full'); END", ()))
    session = await store.conversations.session("chat-1", "a")
    with pytest.raises(sqlite3.IntegrityError):
        await store.conversations.start_run("r1", session.id, "a", "hi", RunStart(
            run_id="r1", session_id=session.id, agent="a"))
    assert "a new session for chat-1 was not saved: the disk is full" in caplog.text
    await engine.write(("DROP TRIGGER refuse", ()))
    again = await store.conversations.session("chat-1", "a")
    assert again.id != session.id
    await store.conversations.start_run("r2", again.id, "a", "hi", RunStart(
        run_id="r2", session_id=again.id, agent="a"))
    assert [r[0] for r in await engine.fetchall("SELECT id FROM sessions")] == [again.id]


def counting_batches(store: SqliteStore, monkeypatch) -> list[int]:
    """The size of every batch the engine commits, as it commits it."""
    from pluto.storage.sqlite import engine as engine_module
    sizes: list[int] = []
    apply = engine_module._apply_batch

    def counted(conn: sqlite3.Connection, changes: list, *hooks: Any) -> list:
        sizes.append(len(changes))
        return apply(conn, changes, *hooks)
    monkeypatch.setattr(engine_module, "_apply_batch", counted)
    return sizes


async def test_a_held_change_rides_with_the_next_commit(store, monkeypatch):
    """A held change (a run's ledger row) starts no commit: it is committed with the next
    change handed over (the run's answer), in one batch and in order."""
    from pluto.storage.sqlite import engine as engine_module
    from pluto.storage.sql import run_statements
    monkeypatch.setattr(engine_module, "HOLD_SECONDS", 60.0)
    sizes = counting_batches(store, monkeypatch)
    engine = store.engine
    held = engine.queue(run_statements(((SESSION, ("s-held", "k-held", "a", 1.0, 1.0)),)),
                        hold=True)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not held.done() and sizes == []  # waiting for company
    assert await engine.write((SESSION, ("s-next", "k-next", "a", 1.0, 1.0))) == 1
    assert held.done() and held.result() == 1
    assert sizes == [2]
    assert [r[0] for r in await engine.fetchall("SELECT id FROM sessions ORDER BY rowid")] == [
        "s-held", "s-next"]


async def test_a_held_change_with_no_company_goes_alone_soon_and_at_close(tmp_path, monkeypatch):
    from pluto.storage.sqlite import engine as engine_module
    from pluto.storage.sql import run_statements
    monkeypatch.setattr(engine_module, "HOLD_SECONDS", 0.01)
    async with SqliteStore(tmp_path / "pluto.db") as store:
        held = store.engine.queue(run_statements(((SESSION, ("s-1", "k-1", "a", 1.0, 1.0)),)),
                                  hold=True)
        assert await asyncio.wait_for(held, 5) == 1
        monkeypatch.setattr(engine_module, "HOLD_SECONDS", 60.0)
        late = store.engine.queue(run_statements(((SESSION, ("s-2", "k-2", "a", 1.0, 1.0)),)),
                                  hold=True)
    assert late.done() and late.result() == 1  # closing commits it at once, not in 60 s
    with other_connection(store) as conn:
        assert session_ids(conn) == ["s-1", "s-2"]


async def test_a_held_change_that_fails_fails_alone(store, monkeypatch):
    from pluto.storage.sqlite import engine as engine_module
    from pluto.storage.sql import run_statements
    monkeypatch.setattr(engine_module, "HOLD_SECONDS", 60.0)
    await store.engine.write((SESSION, ("s-1", "k-1", "a", 1.0, 1.0)))
    held = store.engine.queue(run_statements(((SESSION, ("s-1", "k-dup", "a", 1.0, 1.0)),)),
                              hold=True)
    assert await store.engine.write((SESSION, ("s-2", "k-2", "a", 1.0, 1.0))) == 1
    with pytest.raises(sqlite3.IntegrityError):
        await held
    assert [r[0] for r in await store.engine.fetchall("SELECT id FROM sessions ORDER BY id")] \
        == ["s-1", "s-2"]


def rows_in_main_file(path: Path) -> int:
    """Sessions in the database file itself, not counting what is only in its WAL."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    finally:
        conn.close()


async def test_the_wal_is_written_back_by_a_connection_of_its_own(tmp_path, monkeypatch):
    """The writing connection never checkpoints (a checkpoint syncs the disk: the loop would
    wait) nor waits for another process's lock; the WAL is written back after commits by the
    checkpointing connection, in its own thread."""
    from pluto.storage.sqlite import engine as engine_module
    monkeypatch.setattr(engine_module, "CHECKPOINT_SECONDS", 0.0)  # after every commit
    path = tmp_path / "pluto.db"
    async with SqliteStore(path) as store:
        engine = store.engine
        writer = engine._db._conn  # type: ignore[union-attr]
        assert writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 0
        for i in range(20):
            await engine.write((SESSION, (f"s-{i}", f"k-{i}", "a", 1.0, 1.0)))
        await until(lambda: engine._checkpointing is None)
        await engine.write((SESSION, ("s-last", "k-last", "a", 1.0, 1.0)))
        assert engine._checkpointing is not None  # (started by that commit)
        await engine._checkpointing
        assert rows_in_main_file(path) == 21


def wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def held_truncate(engine, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                  error: Exception | None = None) -> tuple[asyncio.Event, asyncio.Event]:
    """The checkpointing connection's TRUNCATE held until ``release`` is set (``started``
    once it is), then run — or ``error`` raised instead."""
    checkpointer = engine._checkpointer
    assert checkpointer is not None
    started, release = asyncio.Event(), asyncio.Event()
    execute = checkpointer.execute

    async def held(sql, *args):  # type: ignore[no-untyped-def]
        if "TRUNCATE" in sql:
            started.set()
            await release.wait()
            if error is not None:
                raise error
        return await execute(sql, *args)

    monkeypatch.setattr(checkpointer, "execute", held)
    return started, release


async def test_the_wal_stays_small_while_commits_keep_coming(tmp_path, monkeypatch):
    """Commits that never pause, with reads between them: the WAL is emptied whenever it
    holds WAL_RESTART_FRAMES (a checkpoint that only writes back never starts it over while
    commits land during it: it grew for good, to a full disk)."""
    from pluto.storage.sqlite import engine as engine_module
    monkeypatch.setattr(engine_module, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(engine_module, "WAL_RESTART_FRAMES", 64)  # 256 KB
    path = tmp_path / "pluto.db"
    async with SqliteStore(path) as store:
        engine = store.engine
        pad = "x" * 2000  # about a page a row
        emptied, largest, stop = 0, 0, False
        empty = engine._empty

        async def counted(db):  # type: ignore[no-untyped-def]
            nonlocal emptied
            emptied += 1
            await empty(db)

        monkeypatch.setattr(engine, "_empty", counted)

        async def writer(w: int) -> None:
            nonlocal largest
            for i in range(150):
                await engine.write((SESSION, (f"s-{w}-{i}", f"k-{w}-{i}-{pad}", "a", 1.0, 1.0)))
                largest = max(largest, wal_bytes(path))

        async def reader() -> None:
            while not stop:
                await engine.fetchall("SELECT COUNT(*) FROM sessions")

        readers = [asyncio.create_task(reader()) for _ in range(2)]
        await asyncio.gather(*(writer(w) for w in range(8)))
        stop = True
        await asyncio.gather(*readers)
        assert emptied >= 2
        assert largest < 8 << 20, largest  # (never emptied: 23 MB; emptied: 1.3-3.6 MB)
        assert (await engine.fetchall("SELECT COUNT(*) FROM sessions"))[0][0] == 1200


async def test_commits_wait_while_the_wal_is_emptied_and_none_fails_for_it(tmp_path,
                                                                           monkeypatch):
    """Emptying the WAL holds the write lock: commits due meanwhile wait in line and start
    right after; none is tried and refused (the lock is ours, not another process's)."""
    from pluto.storage.sqlite import engine as engine_module
    path = tmp_path / "pluto.db"
    async with SqliteStore(path) as store:
        engine = store.engine
        for i in range(20):
            await engine.write((SESSION, (f"s-{i}", f"k-{i}", "a", 1.0, 1.0)))
        refused: list[str] = []
        again = engine._again
        monkeypatch.setattr(engine, "_again", lambda batch, problem, error: (
            refused.append(problem), again(batch, problem, error)))
        started, release = held_truncate(engine, monkeypatch)
        emptying = asyncio.create_task(engine._empty(engine._checkpointer))
        await started.wait()
        writes = [asyncio.create_task(engine.write((SESSION, (f"t-{i}", f"u-{i}", "a", 1.0,
                                                              1.0)))) for i in range(5)]
        await asyncio.sleep(0.05)  # (a commit would have run by now)
        assert not any(w.done() for w in writes)
        assert engine._held_back
        release.set()
        await emptying
        assert await asyncio.gather(*writes) == [1] * 5
        assert refused == []
        assert wal_bytes(path) < 64 * 1024  # (emptied; only the five commits since)
        assert rows_in_main_file(path) == 20
    assert engine_module.WAL_RESTART_FRAMES >= 1024  # a WAL of megabytes, not every second


async def test_a_long_reader_of_another_process_holds_commits_up_once(tmp_path, monkeypatch,
                                                                       caplog):
    """Another process keeps a read open (an admin's query): the WAL cannot be emptied. The
    commits wait for it once, at most about RESTART_WAIT_MS, and not again before
    EMPTY_AGAIN_SECONDS; the log says why the WAL grows."""
    from pluto.storage.sqlite import engine as engine_module
    monkeypatch.setattr(engine_module, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(engine_module, "WAL_RESTART_FRAMES", 16)
    path = tmp_path / "pluto.db"
    async with SqliteStore(path) as store:
        engine = store.engine
        await engine.write((SESSION, ("s-0", "k-0", "a", 1.0, 1.0)))
        admin = other_connection(store)
        admin.execute("BEGIN")
        admin.execute("SELECT COUNT(*) FROM sessions").fetchone()  # (its snapshot, kept)
        tries: list[float] = []
        empty = engine._empty

        async def timed(db):  # type: ignore[no-untyped-def]
            started = time.monotonic()
            await empty(db)
            tries.append(time.monotonic() - started)

        monkeypatch.setattr(engine, "_empty", timed)
        try:
            with caplog.at_level(logging.INFO, logger="pluto.storage.sqlite.engine"):
                for i in range(300):
                    await engine.write((SESSION, (f"s-{i + 1}", f"k-{i + 1}-{'x' * 2000}",
                                                  "a", 1.0, 1.0)))
                    await asyncio.sleep(0)  # (the checkpoints' turn)
        finally:
            admin.rollback()
            admin.close()
        assert len(tries) == 1, tries  # (then not again for EMPTY_AGAIN_SECONDS)
        assert tries[0] < 2.0  # (about RESTART_WAIT_MS: 0.1 s)
        assert "could not be emptied" in caplog.text
        assert (await engine.fetchall("SELECT COUNT(*) FROM sessions"))[0][0] == 301


async def test_an_emptying_that_fails_lets_the_held_commits_go(tmp_path, monkeypatch):
    """The disk full (or any error) while the WAL is emptied: the commits held meanwhile go
    right after, and the store closes cleanly."""
    from pluto.storage.sqlite import engine as engine_module
    monkeypatch.setattr(engine_module, "WAL_RESTART_FRAMES", 0)  # (every checkpoint empties)
    path = tmp_path / "pluto.db"
    async with SqliteStore(path) as store:
        engine = store.engine
        started, release = held_truncate(
            engine, monkeypatch, sqlite3.OperationalError("database or disk is full"))
        checkpoint = asyncio.create_task(engine._checkpoint(engine._checkpointer))
        await started.wait()
        writes = [asyncio.create_task(engine.write((SESSION, (f"t-{i}", f"u-{i}", "a", 1.0,
                                                              1.0)))) for i in range(3)]
        await asyncio.sleep(0.02)
        assert not any(w.done() for w in writes)
        release.set()
        await checkpoint  # (the error is the checkpoint's own: logged, not raised)
        assert await asyncio.gather(*writes) == [1] * 3
        assert not engine._emptying and not engine._held_back
        later = asyncio.create_task(engine.write((SESSION, ("t-9", "u-9", "a", 1.0, 1.0))))
    assert await later == 1  # (committed before the store closed)


async def test_a_small_read_runs_on_the_loop_and_in_the_thread_when_busy(store, monkeypatch):
    """A chat's session and history (``small``) are read on the loop, with no hop to the
    reading thread; when the database is busy a moment the read goes to the thread after all,
    never failing for it."""
    from pluto.storage.sqlite import engine as engine_module
    engine = store.engine
    await engine.write((SESSION, ("s-1", "k-1", "a", 1.0, 1.0)))
    hops: list[int] = []
    execute = engine._reader._execute  # type: ignore[union-attr]

    async def counted(*args, **kw):  # type: ignore[no-untyped-def]
        hops.append(1)
        return await execute(*args, **kw)

    monkeypatch.setattr(engine._reader, "_execute", counted)
    row = await engine.fetchone("SELECT id FROM sessions WHERE key = ?", ("k-1",), small=True)
    assert row["id"] == "s-1" and hops == []
    assert (await engine.fetchone("SELECT COUNT(*) FROM sessions"))[0] == 1 and hops == [1]

    snapshot = engine_module._snapshot

    def busy(query, conn):  # type: ignore[no-untyped-def]
        if conn is engine._quick._conn:  # type: ignore[union-attr]
            raise sqlite3.OperationalError("database is locked")
        return snapshot(query, conn)

    monkeypatch.setattr(engine_module, "_snapshot", busy)
    rows = await engine.fetchall("SELECT id FROM sessions", small=True)
    assert [r["id"] for r in rows] == ["s-1"] and hops == [1, 1]


@pytest.mark.parametrize("value", [
    {"type": "message.final", "run_id": "r1", "seq": 2, "text": "héllo \u2028 \"q\"", "ts": 1.5},
    {"at": datetime.datetime(2026, 1, 2, 3, 4, 5)},  # str(), as json.dumps(default=str) did
    {"price": decimal.Decimal("1.50")},
    {"big": 2**70},  # past 64 bits: orjson refuses, the standard library writes it
    {1: "a key that is not a string"},
    {"nested": [{"a": [1, 2.5, None, True]}]},
])
def test_json_kept_in_rows_reads_back_as_the_standard_library_wrote_it(value) -> None:
    assert json.loads(json_text(value)) == json.loads(json.dumps(value, default=str))


async def test_foreign_keys_guard_sqlite_and_cost_postgres_nothing_on_a_messages_way(tmp_path):
    """SQLite checks that a run's events, a session's messages and runs have their parent
    (one index lookup each: the tests catch a row written before it); PostgreSQL keeps no such
    key on a message's way (a trigger's query and a row lock each: see the migration)."""
    from pluto.storage.postgres import PostgresStore
    from tests.helpers.pg import fresh_schema
    orphans = [("INSERT INTO run_events (run_id, seq, type, data) VALUES (?, 1, 'x', '{}')",
                ("no-such-run",)),
               ("INSERT INTO messages (session_id, role, content, created_at) VALUES"
                " (?, 'user', 'hi', 1.0)", ("no-such-session",)),
               ("INSERT INTO runs (id, session_id, agent, status, started_at) VALUES"
                " ('r-orphan', ?, 'a', 'ok', 1.0)", ("no-such-session",))]
    async with SqliteStore(tmp_path / "p.db") as store:
        for stmt in orphans:
            with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
                await store.engine.write(stmt)
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=2) as pg:
            keys = await pg.engine.fetchall(
                "SELECT tc.table_name FROM information_schema.table_constraints tc WHERE"
                " tc.constraint_type = 'FOREIGN KEY' AND tc.table_schema = current_schema()")
            assert sorted(r[0] for r in keys) == ["api_steps", "blob_chunks"]  # (off that way)
            for stmt in orphans:
                await pg.engine.write(stmt)
