"""The store on both engines: every part behaves the same on SQLite and on PostgreSQL, and on
PostgreSQL two instances sharing the database never both win a claim, a lease or a message.

The PostgreSQL tests use the server named by ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py)
and fail when it is not reachable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.events import MessageDelta, MessageFinal, RunEnd, RunStart
from pluto.storage import store_for
from pluto.storage.postgres import PostgresStore, redact
from pluto.storage.rows import OutboxRow
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore
from tests.helpers.pg import fresh_schema


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        async with SqliteStore(tmp_path / "pluto.db") as s:
            yield s
    else:
        with fresh_schema() as url:
            async with PostgresStore(url) as s:
                yield s


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    with fresh_schema() as url:
        yield url


def chunk(reply_id: str, n: int, text: str = "hello", chat: str = "c1") -> OutboxRow:
    return OutboxRow(id=0, reply_id=reply_id, chunk=n, run_id=reply_id, seq=0,
                     provider="telegram", chat_id=chat, thread_id=None, reply_to=None,
                     answers=None, edit_of=None, kind="reply", markup="plain", text=text,
                     attachments=[], status="pending", attempts=0, platform_id=None, error=None)


# every part, on both engines -------------------------------------------------------------

async def test_a_run_is_recorded_numbered_and_completed(store):
    conv = store.conversations
    session = await conv.session("k", "agent")
    assert (await conv.session("k", "agent")).id == session.id
    await conv.queue_run("r1", session.id, "agent", "hi")
    assert (await conv.run("r1")).status == "queued"
    await conv.queue_run("r1", session.id, "agent", "hi")  # recorded before: unchanged
    start = await conv.start_run("r1", session.id, "agent", "hi",
                                 RunStart(run_id="r1", session_id=session.id, agent="agent"))
    delta = await conv.append_event(MessageDelta(run_id="r1", text="he"))
    final, end = await conv.complete_run(
        "r1", session.id, MessageFinal(run_id="r1", text="hello"),
        RunEnd(run_id="r1", outcome="ok"), usage={"total_tokens": 3})
    assert [start.seq, delta.seq, final.seq, end.seq] == [1, 2, 3, 4]
    assert await conv.events("r1", after=2) == [final, end]
    run = await conv.run("r1")
    assert (run.status, run.usage) == ("ok", {"total_tokens": 3})
    history = await conv.history(session.id, 10, 10_000)
    assert history == [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "hello"}]
    assert await conv.reset_session("k")
    assert (await conv.session("k", "agent")).id != session.id
    assert (await conv.stats())["runs"] == 1


async def test_a_run_s_events_become_visible_in_seq_order_even_when_a_preview_write_is_slow(
        pg_url, monkeypatch):
    # a streamed preview is committed behind the run by a task of its own; on PostgreSQL (a
    # pool: changes commit side by side) the run's next durable event could commit first,
    # and a watcher on another instance reading seq 3 before 2 takes 2 for a number skipped
    # by a crash. (SQLite's one writer commits in the order handed over.)
    async with PostgresStore(pg_url) as store:
        await _events_in_order(store, monkeypatch)


async def _events_in_order(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    conv = store.conversations
    session = await conv.session("k", "agent")
    await conv.start_run("r1", session.id, "agent", "hi",
                         RunStart(run_id="r1", session_id=session.id, agent="agent"))
    write = store.engine.write
    preview_started = asyncio.Event()

    async def slow_previews(*stmts):
        if any("message.delta" in str(params) for _, params in stmts):
            preview_started.set()
            await asyncio.sleep(0.3)  # (a slow connection; the durable write must wait)
        return await write(*stmts)

    monkeypatch.setattr(store.engine, "write", slow_previews)
    preview = await conv.append_event(MessageDelta(run_id="r1", text="he"), durable=False)
    await preview_started.wait()
    durable = await conv.append_event(MessageFinal(run_id="r1", text="hello"))
    assert [e.seq for e in await conv.events("r1")] == [1, preview.seq, durable.seq] == [1, 2, 3]


async def test_a_run_cancelled_before_it_started(store):
    conv = store.conversations
    session = await conv.session("k", "agent")
    end = await conv.cancel_run("r9", session.id, "agent", "hi",
                                RunEnd(run_id="r9", outcome="cancelled"), error="stopped")
    assert end is not None and end.seq == 1
    assert (await conv.run("r9")).status == "cancelled"
    again = await conv.cancel_run("r9", session.id, "agent", "hi",
                                  RunEnd(run_id="r9", outcome="cancelled"), error="stopped")
    assert again is None  # it has ended: nothing more


async def test_the_inbox_dedupes_and_keeps_arrival_order(store):
    for i in (3, 1, 2):
        assert await store.inbound.accept("telegram", f"m{i}", {"n": i})
    assert not await store.inbound.accept("telegram", "m1", {"n": 1})
    assert await store.inbound.unhandled("telegram") == [{"n": 3}, {"n": 1}, {"n": 2}]
    await store.inbound.handled("telegram", "m1")
    assert await store.inbound.unhandled("telegram") == [{"n": 3}, {"n": 2}]
    assert await store.inbound.count() == 3


async def test_the_inbox_is_bounded(store):
    store.inbound.max_rows = 5
    for i in range(8):
        await store.inbound.accept("telegram", f"m{i}", {"n": i})
        await asyncio.sleep(0.001)  # distinct arrival times
    await store.inbound.prune()
    assert await store.inbound.count() == 5


async def test_outbox_chunks_are_recorded_once_and_claimed_by_one_owner(store):
    await store.leases.acquire("instance:a", "a", ttl=30)  # a is a live instance
    rows, claimed = await store.outbox.record_claimed([chunk("r1", 0), chunk("r1", 1)], "a", 30)
    assert claimed and [r.chunk for r in rows] == [0, 1]
    # the sender's first call is counted with the record: the first chunk's, not the next
    # one's (counted when the first is marked sent: never a call that was not made)
    assert [r.attempts for r in rows] == [1, 0]
    assert [r.attempts for r in await store.outbox.reply("r1")] == [1, 0]
    again, claimed_again = await store.outbox.record_claimed([chunk("r1", 0)], "b", 30)
    assert not claimed_again and [r.id for r in again] == [r.id for r in rows]
    assert not await store.outbox.claim("r1", "b", 30)
    await store.outbox.sent(rows[0].id, "p1", release=None)
    await store.outbox.sent(rows[1].id, "p2", release=("r1", "a"))
    assert await store.outbox.claim("r1", "b", 30)  # released: free for anyone
    assert [r.status for r in await store.outbox.reply("r1")] == ["sent", "sent"]
    assert await store.outbox.pending("telegram") == []
    # recorded before (a retried delivery): the call counted is on its first pending chunk
    await store.outbox.record_claimed([chunk("r2", 0), chunk("r2", 1)], "a", 30, count=False)
    await store.outbox.release("r2", "a")
    [first, _] = await store.outbox.reply("r2")
    await store.outbox.sent(first.id, "p3")
    again, claimed = await store.outbox.record_claimed([chunk("r2", 0), chunk("r2", 1)], "a", 30)
    assert claimed and [(r.status, r.attempts) for r in again] == [("sent", 0), ("pending", 1)]


async def test_pairing_codes_and_approvals(store):
    req = await store.pairing.request("telegram", "u1", "c1", "Ann", ttl=60)
    assert req.new and (await store.pairing.request("telegram", "u1", "c1", "Ann", 60)).code \
        == req.code
    approval = await store.pairing.approve(req.code, by="admin")
    assert approval.user_id == "u1" and await store.pairing.is_approved("telegram", "u1")
    assert await store.pairing.revoke("telegram", "u1")
    assert not await store.pairing.is_approved("telegram", "u1")


async def test_tasks_and_steps(store):
    task = await store.tasks.create_task("agent", "hi", {})
    step = await store.tasks.add_step(task.id, "hi", {})
    await store.tasks.started(step.id, "run-1")
    assert await store.tasks.has_run("run-1")
    await store.tasks.answered(step.id, output="hello")
    assert (await store.tasks.last_step(task.id)).id == step.id
    tasks, total = await store.tasks.tasks(0, 10)
    assert total == 1 and tasks[0].id == task.id


async def test_a_lease_has_one_holder_and_a_takeover_fences_the_old_one(store):
    leases = store.leases
    token = await leases.acquire("chat:1", "a", ttl=30)
    assert token == 1
    assert await leases.acquire("chat:1", "b", ttl=30) is None
    assert await leases.acquire("chat:1", "a", ttl=30) == 1  # its own: same token
    assert (await leases.holder("chat:1")).owner == "a"
    await leases.renew("chat:1", "a", token, ttl=-1)  # ran out (a paused instance)
    taken = await leases.acquire("chat:1", "b", ttl=30)
    assert taken is not None and taken > token  # tokens only grow
    assert not await leases.renew("chat:1", "a", token, ttl=30)  # fenced: a lost it
    assert await leases.renew_all("a", {"chat:1": token}, 30) == {"chat:1"}
    assert not await leases.release("chat:1", "a", token)
    assert [lease.owner for lease in await leases.held("chat:")] == ["b"]
    assert await leases.release("chat:1", "b", taken)
    assert await leases.holder("chat:1") is None


# PostgreSQL: several instances on one database ---------------------------------------------

async def test_store_for_picks_the_engine_by_url(tmp_path, pg_url):
    assert isinstance(store_for(tmp_path), SqliteStore)
    pg = store_for(tmp_path, pg_url)
    assert isinstance(pg, PostgresStore) and pg.shared
    assert redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert "secret" not in PostgresStore("postgresql://u:secret@h/db").describe()


async def test_an_unreachable_server_is_one_sentence_without_the_password():
    from pluto.errors import StorageError

    store = PostgresStore("postgresql://u:secret@127.0.0.1:1/db")
    store.engine.connect_timeout = 2
    store.engine.open_patience = 0  # (tried once: see below for the patience)
    with pytest.raises(StorageError) as e:
        await store.open()
    assert "cannot open the PostgreSQL database" in str(e.value)
    assert "secret" not in str(e.value) and not store.is_open


async def test_a_server_not_reachable_yet_is_waited_for_and_a_wrong_database_is_not(
        pg_url, caplog):
    """An instance started beside a PostgreSQL still starting (docker-compose), or restarted
    while every connection is cut (found by tests/test_cluster_chaos_web.py: the instance
    exited at start), opens once the server answers; a database that does not exist is said
    at once."""
    from urllib.parse import urlsplit

    from pluto.errors import StorageError
    from tests.helpers.tcp_proxy import TcpProxy
    from tests.test_cluster_faults import through

    target = urlsplit(pg_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    refusing = asyncio.ensure_future(proxy.refuse(2.0))  # nothing listens for 2 s
    store = PostgresStore(through(pg_url, proxy.port))
    store.engine.connect_timeout = 1
    try:
        with caplog.at_level("WARNING"):
            await asyncio.wait_for(store.open(), 30)
        assert store.is_open and refusing.done()
        assert await store.engine.fetchone("SELECT 1") is not None
    finally:
        await store.close()
        await proxy.stop()
    missing = PostgresStore(pg_url.replace("/test", "/no_such_database_here", 1))
    started = asyncio.get_running_loop().time()
    with pytest.raises(StorageError, match="no_such_database_here"):
        await missing.open()
    assert asyncio.get_running_loop().time() - started < 10  # not the patience's 30 s


async def test_instances_starting_together_migrate_once(pg_url):
    stores = [PostgresStore(pg_url) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        rows = await stores[0].engine.fetchall("SELECT component, version FROM schema_versions")
        assert {r["component"] for r in rows} >= {"conversations", "outbox", "inbound", "leases"}
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_across_instances_one_message_one_claim_one_lease(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    async with a, b:
        # the same message delivered to both instances at once: one of them takes it
        won = await asyncio.gather(*[s.inbound.accept("slack", "ev1", {"n": 1})
                                     for s in (a, b) for _ in range(5)])
        assert won.count(True) == 1
        # fifty senders (live instances) race for one reply: exactly one claim
        for i in range(50):
            await a.leases.acquire(f"instance:o{i}", f"o{i}", ttl=30)
        await a.outbox.record([chunk("r1", 0)])
        claims = await asyncio.gather(*[(a if i % 2 else b).outbox.claim("r1", f"o{i}", 30)
                                        for i in range(50)])
        assert claims.count(True) == 1
        # twenty instances race for the Telegram poller's lease: one holder
        tokens = await asyncio.gather(*[(a if i % 2 else b).leases.acquire(
            "provider:telegram", f"i{i}", 30) for i in range(20)])
        assert len([t for t in tokens if t is not None]) == 1


async def test_a_new_session_on_one_instance_is_seen_by_another(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    async with a, b:
        first = await a.conversations.session("k", "agent")
        assert (await b.conversations.session("k", "agent")).id == first.id
        await b.conversations.reset_session("k")  # /new, handled by instance b
        assert (await a.conversations.session("k", "agent")).id != first.id
        s = await a.conversations.session("k", "agent")
        await a.conversations.add_message(s.id, "user", "from a")
        await b.conversations.add_message(s.id, "user", "from b")
        assert [m["content"] for m in await a.conversations.history(s.id, 10, 1000)] == [
            "from a", "from b"]


async def test_a_claim_holds_while_its_instance_lives_and_ends_with_it(pg_url):
    async with PostgresStore(pg_url) as a:
        token = await a.leases.acquire("instance:a", "a", ttl=30)
        await a.outbox.record([chunk("r1", 0)])
        assert await a.outbox.claim("r1", "a", 300)
    async with PostgresStore(pg_url) as b:  # another instance starts: a's claim still holds
        assert not await b.outbox.claim("r1", "b", 300)
        await b.leases.renew("instance:a", "a", token, ttl=-1)  # a's heartbeat stopped
        assert await b.outbox.claim("r1", "b", 300)  # its claims end with it


async def test_an_answer_whose_instance_died_before_the_outbox_is_found(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    async with a, b:
        a.conversations.owner, b.conversations.owner = "a", "b"
        assert await a.inbound.accept("telegram", "m1", {"chat_id": "c1", "text": "hi"})
        session = await a.conversations.session("k", "agent")
        await a.conversations.start_run("r1", session.id, "agent", "hi",
                                        RunStart(run_id="r1", session_id=session.id,
                                                 agent="agent"), source=("telegram", "m1"))
        await a.conversations.complete_run("r1", session.id,
                                           MessageFinal(run_id="r1", text="hello"),
                                           RunEnd(run_id="r1", outcome="ok"), usage={})
        # a dies here, before its reply reached the outbox
        assert await b.conversations.orphaned_chats(alive={"b"}) == [("telegram", "c1")]
        # the same, with the instances alive told by their heartbeat leases in one statement
        assert await b.leases.acquire("instance:a", "a", 0.5) is not None
        assert await b.leases.acquire("instance:b", "b", 60) is not None
        assert await b.conversations.orphaned_chats(None) == []  # a's heartbeat is current
        async with asyncio.timeout(10):  # until a's heartbeat runs out, on the database's clock
            while await b.conversations.orphaned_chats(None) != [("telegram", "c1")]:
                await asyncio.sleep(0.05)
        [(payload, final)] = await b.conversations.undelivered_in_chat("telegram", "c1")
        assert payload["text"] == "hi" and final.text == "hello" and final.run_id == "r1"
        await b.outbox.record([chunk("r1", 0, "hello", chat="c1")])  # b delivers it
        assert await b.conversations.undelivered_in_chat("telegram", "c1") == []
        assert await b.conversations.orphaned_chats(alive={"b"}) == []


async def test_the_sweep_finds_only_the_runs_of_instances_gone(pg_url):
    """The cluster's sweep (one statement): runs not ended, or answered with no reply in the
    outbox, of an instance with no current heartbeat — one that stopped (its lease given
    back) or died (run out) — and never a run answered in the feed (the widget's)."""
    stores = {name: PostgresStore(pg_url) for name in ("alive", "stopped", "died")}
    async with stores["alive"], stores["stopped"], stores["died"]:
        for name, store in stores.items():
            store.conversations.owner = name
            for provider, chat in (("telegram", f"t-{name}"), ("web", f"w-{name}")):
                message, run = f"m-{chat}", f"r-{chat}"
                assert await store.inbound.accept(provider, message, {"chat_id": chat})
                session = await store.conversations.session(chat, "agent")
                await store.conversations.start_run(
                    run, session.id, "agent", "hi", RunStart(run_id=run, session_id=session.id,
                                                             agent="agent"),
                    source=(provider, message))
                await store.conversations.complete_run(
                    run, session.id, MessageFinal(run_id=run, text="hello"),
                    RunEnd(run_id=run, outcome="ok"), usage={})
        sweep = stores["alive"]
        assert await sweep.leases.acquire("instance:alive", "alive", 60) is not None
        token = await sweep.leases.acquire("instance:stopped", "stopped", 60)
        assert token is not None and await sweep.leases.release("instance:stopped", "stopped",
                                                                token)
        assert await sweep.leases.acquire("instance:died", "died", 0.2) is not None
        async with asyncio.timeout(10):  # until died's heartbeat runs out
            while len(found := await sweep.conversations.orphaned_chats(
                    None, answered_in_feed=("web",))) < 2:
                await asyncio.sleep(0.05)
        assert sorted(found) == [("telegram", "t-died"), ("telegram", "t-stopped")]


async def test_the_sweep_reads_a_day_of_answered_runs_not_every_run_kept(pg_url):
    """Runs are kept; the sweep runs every half lease on each instance. With 30 days of
    answered runs (30,000) it reads the runs not ended and the last day's answered ones by
    their indexes — never all of them (0.6 s for 200,000 when it did) — and still finds a run
    of a gone instance answered an hour ago with no reply."""
    import json
    import time

    from tests.helpers.pg import connect

    async with PostgresStore(pg_url) as store:
        conversations = store.conversations
        now = time.time()
        with connect(pg_url) as conn:
            conn.execute("INSERT INTO sessions (id, key, agent, created_at, updated_at)"
                         " VALUES ('s', 'k', 'agent', 0, 0)")
            conn.execute(  # one an instance answered every 86 s for 30 days, each delivered
                "INSERT INTO runs (id, session_id, agent, status, started_at, ended_at, owner,"
                " source_provider, source_id) SELECT 'r' || g, 's', 'agent', 'ok', %s - g * 86.4,"
                " %s - g * 86.4, 'gone', 'telegram', 'm' || g FROM generate_series(1, 30000) g",
                (now, now))
            conn.execute("INSERT INTO inbound_seen (provider, message_id, seen_at, payload,"
                         " handled, chat_id) SELECT 'telegram', 'm' || g, 0, '{}', 1, 'c' ||"
                         " (g % 100) FROM generate_series(1, 30000) g")
            conn.execute("INSERT INTO outbox (reply_id, chunk, provider, chat_id, kind, markup,"
                         " text, status, created_at, updated_at) SELECT 'r' || g, 0, 'telegram',"
                         " 'c', 'reply', 'plain', 'x', 'sent', 0, 0"
                         " FROM generate_series(1, 30000) g WHERE g <> 42")  # (42: an hour ago)
            conn.execute("ANALYZE")
            sql, params = conversations._orphans_query(True, ("web",), 20.0)
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql.replace("?", "%s"),
                                params).fetchone()[0]

        def nodes(node: dict) -> list[dict]:  # type: ignore[type-arg]
            return [node] + [n for child in node.get("Plans", []) for n in nodes(child)]

        scans = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan[0]["Plan"])
                 if n.get("Relation Name") == "runs"]
        assert scans and all(kind != "Seq Scan" for kind, _ in scans), json.dumps(plan)
        assert {"runs_status", "runs_answered"} <= {name for _, name in scans}, scans
        assert await conversations.orphaned_chats(None, answered_in_feed=("web",)) == [
            ("telegram", "c42")]


async def test_a_run_taken_over_cannot_answer_and_its_message_is_answered_again(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    async with a, b:
        a.conversations.owner, b.conversations.owner = "a", "b"
        assert await a.inbound.accept("telegram", "m1", {"chat_id": "c1", "text": "hi"})
        session = await a.conversations.session("k", "agent")
        await a.conversations.start_run("r1", session.id, "agent", "hi",
                                        RunStart(run_id="r1", session_id=session.id,
                                                 agent="agent"), source=("telegram", "m1"))
        ended = await b.conversations.take_over_chat("telegram", "c1")  # a seemed dead
        assert [e.run_id for e in ended] == ["r1"]
        assert await b.inbound.unhandled_in_chat("telegram", "c1") == [
            {"chat_id": "c1", "text": "hi"}]
        from pluto.errors import RunTakenOver
        with pytest.raises(RunTakenOver):  # a was only slow: its late answer is refused
            await a.conversations.complete_run("r1", session.id,
                                               MessageFinal(run_id="r1", text="late"),
                                               RunEnd(run_id="r1", outcome="ok"), usage={})
        assert (await b.conversations.run("r1")).status == "interrupted"
        await b.conversations.queue_run("r2", session.id, "agent", "hi",
                                        source=("telegram", "m1"))  # b answers it again
        with pytest.raises(RunTakenOver):  # and a cannot start another run for it
            await a.conversations.queue_run("r3", session.id, "agent", "hi",
                                            source=("telegram", "m1"))


async def test_chats_whose_messages_nobody_took_come_with_the_orphans(store):
    """The cluster's one sweep: a message not handled for longer than asked for names its
    chat in the same statement as the orphaned runs (a message just received does not; one
    handled does not; each chat once)."""
    assert await store.inbound.accept("telegram", "m1", {"chat_id": "c1", "text": "hi"})
    assert await store.inbound.accept("telegram", "m2", {"chat_id": "c1", "text": "again"})
    assert await store.inbound.accept("web", "w1", {"chat_id": "s9", "text": "hey"})
    assert await store.conversations.orphaned_chats(set(), waiting_longer_than=60) == []
    async with asyncio.timeout(10):  # (received 0.3 s ago at least, on the inbox's clock)
        while len(found := await store.conversations.orphaned_chats(
                set(), waiting_longer_than=0.3)) < 2:
            await asyncio.sleep(0.05)
    assert sorted(found) == [("telegram", "c1"), ("web", "s9")]
    await store.inbound.handled("web", "w1")
    assert await store.conversations.orphaned_chats(set(), waiting_longer_than=0.3) == [
        ("telegram", "c1")]
    assert await store.conversations.orphaned_chats(set()) == []  # (not asked: runs only)


async def test_a_flood_hold_kept_by_one_instance_holds_the_chat_on_another(pg_url):
    """A platform's retry-after met on instance a: the statement that keeps it tells every
    instance (NOTIFY), and b's flood control holds the chat as long — no periodic read. A note
    that is not a hold is ignored; a gap in the notes (None) reads every hold again."""
    from pluto.gateway.delivery.flood import FloodControl

    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    async with a, b:
        a.flood.notify = await a.bus.scoped("pluto_flood")
        at_a, at_b = FloodControl(a.flood), FloodControl(b.flood)
        heard: list[str | None] = []
        b.bus.subscribe("pluto_flood", lambda p: (heard.append(p), at_b.heard(p)))
        key = ("telegram", "c1")
        async with asyncio.timeout(10):  # (until b's listening connection is in place)
            for probe in range(1000):
                await a.flood.hold("telegram", f"probe{probe}", 0.0)
                await asyncio.sleep(0.1)
                if heard:
                    break
        await at_a.hold(key, 30.0)
        async with asyncio.timeout(10):
            while not at_b.remaining(key):
                await asyncio.sleep(0.02)
        assert 25 < at_b.remaining(key) <= 30.5
        await at_a.hold(key, 5.0)  # (an earlier deadline than the one kept: not told)
        await at_a.hold(("telegram", "c|with|bars"), 12.0)
        async with asyncio.timeout(10):
            while not at_b.remaining(("telegram", "c|with|bars")):
                await asyncio.sleep(0.02)
        assert 25 < at_b.remaining(key)
        for bad in ("hold|telegram", "hold|telegram|c2|soon", "stop|x|y|3", "", "hold||c3|4",
                    "hold|telegram|c2|inf", "hold|telegram|c2|nan"):
            at_b.heard(bad)
        assert not any(at_b.remaining(("telegram", c)) for c in ("c2", "y", "c3"))
        fresh = FloodControl(b.flood)
        fresh.heard(None)  # notes may have been missed: the holds in force read again
        async with asyncio.timeout(10):
            while not fresh.remaining(key):
                await asyncio.sleep(0.02)
        assert 25 < fresh.remaining(key) <= 30.5
