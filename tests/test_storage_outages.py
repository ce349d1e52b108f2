"""Storage errors that pass (a full disk, a locked database, a dropped connection) are retried,
bounded in time, and said: the engines' health, then StorageUnavailable; never a silent drop.

The full disk itself, with a gateway and the fake Telegram, is in test_full_disk.py."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from pathlib import Path

import aiohttp
import pytest

from pluto.errors import StorageUnavailable
from pluto.gateway import recovery
from pluto.gateway.app import Gateway
from pluto.runtime.runner import STORAGE_FAILED
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from pluto.storage.postgres import PostgresStore
from pluto.storage.sqlite import SqliteStore
from pluto.storage.sqlite import engine as sqlite_engine
from tests.helpers.gateway import RecordingProvider
from tests.helpers.pg import connect as _connect
from tests.helpers.pg import fresh_schema
from tests.helpers.pg import terminate as _terminate


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
        store.engine.lock_grace = 0.1  # (an outage after 0.1 s of the lock, not 5 s: quicker)
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


async def test_postgres_gives_up_when_the_server_is_away(tmp_path):
    with fresh_schema() as url:
        async with PostgresStore(url, min_size=1, max_size=2) as store:
            engine = store.engine
            engine.retry_seconds = 0.5
            pool = engine._pool
            await asyncio.to_thread(pool.close)  # nothing can be reached any more
            await engine._apool.close()  # (the single statements' pool, asyncpg's)
            try:
                with pytest.raises(StorageUnavailable):  # a change of several statements
                    await engine.write(("INSERT INTO schema_versions VALUES ('x', 1)", ()),
                                       ("INSERT INTO schema_versions VALUES ('y', 1)", ()))
                assert engine.health.problem == "the database cannot be reached"
                with pytest.raises(StorageUnavailable):  # one statement
                    await engine.write(("INSERT INTO schema_versions VALUES ('x', 1)", ()))
                assert engine.health.problem == "the database cannot be reached"
            finally:
                engine._pool = engine._apool = None  # (closed already)


# a gateway whose storage fails ------------------------------------------------------------

async def served(config_dir: Path, data_dir: Path, model: ScriptedModel) -> Gateway:
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir,
                                                gateway={"reload_interval_seconds": 0}),
                 serve=True, http_bind=("127.0.0.1", 0), model_factory=model)
    await gw.start()
    return gw


async def until(condition, timeout: float = 20.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


async def readyz(gw: Gateway) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.http.url}/readyz") as r:  # type: ignore[union-attr]
            return r.status, await r.json()


async def test_an_answer_that_cannot_be_saved_ends_the_run_with_an_error_the_user_sees(
        config_dir, data_dir, monkeypatch, caplog):
    gw = await served(config_dir, data_dir, ScriptedModel())
    provider = RecordingProvider()
    conversations = gw.store.conversations
    complete = conversations.complete_run
    calls: list[str] = []

    async def failing_complete(run_id, *args, **kw):
        calls.append(run_id)
        if len(calls) == 1:
            raise StorageUnavailable("the disk is full")
        return await complete(run_id, *args, **kw)

    monkeypatch.setattr(conversations, "complete_run", failing_complete)
    try:
        gw.add_provider(provider)
        await provider.say("first")
        assert await provider.wait_finals(1) == [STORAGE_FAILED]
        await gw.settled()
        run = await conversations.run(calls[0])
        assert run is not None and run.status == "error" and run.error == STORAGE_FAILED
        await provider.say("second")  # the chat goes on
        assert await provider.wait_finals(2) == [STORAGE_FAILED, "echo: second"]
    finally:
        await gw.stop()
    assert not [r for r in caplog.records if r.exc_info]  # a log line, no traceback


@pytest.mark.parametrize("when", ["model", "answer"])
async def test_a_run_storage_could_not_even_end_is_answered_once_storage_works(
        config_dir, data_dir, monkeypatch, when):
    """The disk fails while the model answers (``model``: the run's start may not be saved;
    ``answer``: its start is, its answer is not): the answer, the error, the fallback's error
    all fail to commit (each after its retries). /readyz says so; when storage works again,
    by itself, the probe notices, the sweep finds the run nobody runs or the message nobody
    handles, and the message is answered — once."""
    monkeypatch.setattr(recovery, "SETTLE_SECONDS", 0.2)
    broken = [False]
    apply_batch = sqlite_engine._apply_batch

    def apply(conn, changes, *hooks):
        if broken[0]:
            raise sqlite3.OperationalError("database or disk is full")
        return apply_batch(conn, changes, *hooks)

    monkeypatch.setattr(sqlite_engine, "_apply_batch", apply)
    answers = [0]

    def answer(messages):
        answers[0] += 1
        if answers[0] == 1 and when == "model":
            broken[0] = True  # the disk fills up while the model writes the first answer
        return Scripted(text=f"echo: {messages[-1]['content']}")

    gw = await served(config_dir, data_dir, ScriptedModel(fallback=answer))
    gw.store.engine.retry_seconds = 0.3
    complete = gw.store.conversations.complete_run

    async def complete_run(*args, **kw):
        if when == "answer" and answers[0] == 1:
            broken[0] = True  # the disk fills up as the answer is saved
        return await complete(*args, **kw)

    monkeypatch.setattr(gw.store.conversations, "complete_run", complete_run)
    provider = RecordingProvider()
    try:
        gw.add_provider(provider)
        await provider.running.wait()
        assert provider.intake is not None
        await provider.intake.submit(provider.msg("are you there?"))
        await until(lambda: broken[0] and not gw.pipeline.live)  # it gave up on the run
        status, body = await readyz(gw)
        assert status == 503 and body["problems"] == {"storage": {"state": "failing"}}
        assert provider.finals() == []
        broken[0] = False  # space again: nothing else happens, no message arrives
        assert await provider.wait_finals(1) == ["echo: are you there?"]
        await until(lambda: gw.store.engine.health.problem is None)
        status, body = await readyz(gw)
        assert status == 200 and body["problems"] == {}
        await gw.settled()
        assert provider.finals() == ["echo: are you there?"]
        assert answers[0] == 2
    finally:
        await gw.stop()


async def test_readyz_is_503_while_the_data_dirs_disk_is_full(config_dir, data_dir,
                                                               monkeypatch):
    gw = await served(config_dir, data_dir, ScriptedModel())
    try:
        assert (await readyz(gw))[0] == 200
        monkeypatch.setattr(recovery, "_free_bytes", lambda path: 1024)
        gw.recovery.disk.checked = 0.0  # (the cached figure is stale)
        status, body = await readyz(gw)
        assert status == 503 and body["problems"] == {"disk": {"state": "full"}}
        assert body["checks"]["disk"] == {"free_mb": 0.0}
    finally:
        await gw.stop()


async def test_a_saved_answer_whose_reply_could_not_be_recorded_is_sent_once_storage_works(
        config_dir, data_dir, monkeypatch):
    monkeypatch.setattr(recovery, "SETTLE_SECONDS", 0.2)
    gw = await served(config_dir, data_dir, ScriptedModel())
    rows = gw.outbox.rows
    record = rows.record_claimed
    failures: list[str] = []

    async def record_claimed(recorded, *args, **kw):
        if not failures and recorded[0].kind == "reply":  # the answer's reply, once
            failures.append(recorded[0].reply_id)
            gw.store.engine.health.failing("the disk is full", "(the test)")
            raise StorageUnavailable("the disk is full")
        return await record(recorded, *args, **kw)

    monkeypatch.setattr(rows, "record_claimed", record_claimed)
    provider = RecordingProvider()
    try:
        gw.add_provider(provider)
        await provider.say("hello")
        assert await provider.wait_finals(1) == ["echo: hello"]  # sent after the probe
        await gw.settled()
        assert provider.finals() == ["echo: hello"] and len(failures) == 1
        run = await gw.store.conversations.run(failures[0])
        assert run is not None and run.status == "ok"  # (no error appended to it)
        assert [e.type for e in await gw.store.conversations.events(failures[0])][-1] == \
            "run.end"
    finally:
        await gw.stop()


async def test_readyz_names_a_wedged_send_path_publicly_by_state_and_to_the_admin_by_reason(
        config_dir, data_dir, monkeypatch):
    monkeypatch.setenv("PLUTO_ADMIN_KEY", "k" * 24)
    gw = Gateway(config_dir, config=PlutoConfig(
        data_dir=data_dir, admin={"api_key_env": "PLUTO_ADMIN_KEY"},
        gateway={"reload_interval_seconds": 0}), serve=True, http_bind=("127.0.0.1", 0),
        model_factory=ScriptedModel())
    await gw.start()
    try:
        monkeypatch.setattr(gw.watchdog, "wedged", lambda: {
            "telegram": "Pool timeout: all connections in the pool are occupied"})
        status, public = await readyz(gw)
        assert status == 503 and public["problems"] == {"sends:telegram": {"state": "wedged"}}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{gw.http.url}/readyz",  # type: ignore[union-attr]
                                headers={"Authorization": "Bearer " + "k" * 24}) as r:
                full = await r.json()
        assert full["problems"]["sends:telegram"]["reason"] == (
            "telegram sends fail: Pool timeout: all connections in the pool are occupied")
    finally:
        await gw.stop()
