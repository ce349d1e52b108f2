"""The usage counters are written in turn on PostgreSQL: no deadlock between run ends.

Every run's end adds to eight counter rows (agent, route, user, chat × day, month), some shared
with other chats' runs. Run ends that end together on one instance go as one batch (one
transaction), so a transaction writes the rows of several runs, in no order common to all: two
instances' batches each held a row the other wanted. PostgreSQL breaks such a deadlock only
after ``deadlock_timeout`` (a second), and the runs waited: 1,000 runs over three agents and
three routes on two instances met 4–7 deadlocks and a slowest run of 4.8–7.9 s (the middle one
0.7 s). Now every statement that writes counters first takes one transaction-scoped turn
(``Engine.turn_sql``), before it touches a row.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pluto.agents.spec import AgentSpec, HistoryWindow
from pluto.agents.spec import Budget as AgentBudget
from pluto.events import MessageFinal, RunError
from pluto.runtime.model import ModelSettings
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.usage import Attribution, UsageMeter, period_start
from pluto.storage.postgres import PostgresStore
from pluto.storage.postgres.engine import _keyed, _kind, _numbered
from pluto.storage.sql.store import SqlStore
from pluto.storage.sql.usage import COUNTERS_TURN, Claim, _counters
from pluto.storage.sqlite import SqliteStore
from tests.helpers.inspect_store import reserved_tokens
from tests.helpers.pg import fresh_schema


def _counter(key: str) -> tuple[Any, ...]:
    return ("agent", key, "day", 0.0, 1, 10, 5, 0, 0.0, 0)


async def _waiting_for_a_lock(conn: psycopg.AsyncConnection[Any], pid: int) -> bool:
    cur = await conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                             (pid,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def test_two_transactions_writing_shared_counters_in_opposite_orders_take_turns():
    """T1 writes counter A then B, T2 writes B then A, interleaved as a deadlock needs: T2
    waits for the turn before it touches B, so T1 finishes and T2 follows. Both commit, the
    counters hold both."""
    with fresh_schema() as url:
        async with PostgresStore(url) as store:  # (the schema)
            turn = store.engine.turn_sql(COUNTERS_TURN)
            assert turn is not None

            def statement(key: str) -> tuple[str, tuple[Any, ...]]:
                sql, params = _counters([_counter(key)], None, turn)
                return sql.replace("?", "%s"), params

            one = await psycopg.AsyncConnection.connect(url)
            two = await psycopg.AsyncConnection.connect(url)
            watch = await psycopg.AsyncConnection.connect(url, autocommit=True)
            try:
                await one.execute(*statement("A"))  # T1 has A (and the turn)
                second = asyncio.create_task(two.execute(*statement("B")))
                deadline = time.monotonic() + 10
                while not await _waiting_for_a_lock(watch, two.info.backend_pid):
                    assert not second.done(), "T2 wrote B while T1 had the turn"
                    assert time.monotonic() < deadline, "T2 never waited"
                    await asyncio.sleep(0.01)
                await one.execute(*statement("B"))  # a deadlock here, without turns
                await one.commit()
                await second
                await two.execute(*statement("A"))
                await two.commit()
            finally:
                for conn in (one, two, watch):
                    await conn.close()
            assert store.engine.turn_sql(COUNTERS_TURN) == turn
            for key in ("A", "B"):
                total = await store.usage.spent("agent", key, "day", 0.0)
                assert (total.calls, total.input_tokens) == (2, 20)


def test_a_statement_that_takes_the_turn_still_goes_in_a_batch():
    """Run ends that end together go as one round trip: the turn does not keep them apart
    (it is taken once for the batch), where another advisory lock would."""
    turn = "(SELECT pg_advisory_xact_lock(12345::int8)) IS NOT NULL"
    sql, params = _counters([_counter("A")], None, turn)
    kinds = tuple(map(_kind, params))
    assert _keyed(_numbered(sql + " RETURNING 1", kinds)) is not None
    other = sql.replace(turn, "pg_advisory_xact_lock(12345) IS NOT NULL") + " RETURNING 1"
    assert _keyed(_numbered(other, kinds)) is None


async def test_a_thousand_run_ends_over_several_agents_on_two_instances_meet_no_deadlock():
    """The scenario that deadlocked: runs of three agents on three routes, ending together on
    two instances; no budget (the counters are kept all the same)."""
    def answering(messages: list[dict[str, Any]]) -> Scripted:
        return Scripted(text="a short answer", chunk=6, delay=0.005,
                        usage={"prompt_tokens": 50, "completion_tokens": 20})

    rng = random.Random(7)
    tmp = Path(tempfile.mkdtemp())
    with fresh_schema() as url:
        async with PostgresStore(url) as a, PostgresStore(url) as b:
            stores = (a, b)
            model = ScriptedModel(fallback=answering)
            runners = [Runner(s.conversations, models={"scripted": ModelSettings(
                model="scripted", max_output_tokens=50)}, tools={}, data_dir=tmp,
                model_factory=model, usage=UsageMeter(s.usage, budgets=list)) for s in stores]
            specs = [AgentSpec(name=n, description="", model="scripted", api_base=None,
                               api_key_env=None, temperature=None, instructions="Be brief.",
                               tools=(), datasets=(), budget=AgentBudget(),
                               history=HistoryWindow(), source=tmp) for n in "xyz"]

            async def one(i: int) -> str:
                spec = rng.choice(specs)
                session = await stores[i % 2].conversations.session(f"chat-{i}", spec.name)
                req = RunRequest(uuid.uuid4().hex, session, spec, f"question {i}",
                                 who=Attribution("test", f"u{i % 5}", f"c{i}",
                                                 f"route{rng.randrange(3)}"))
                outcome = "?"
                async for event in runners[i % 2].run(req):
                    if isinstance(event, MessageFinal):
                        outcome = "answered"
                    elif isinstance(event, RunError):
                        outcome = event.kind
                return outcome

            outcomes = await asyncio.gather(*(one(i) for i in range(1000)))
            assert outcomes == ["answered"] * 1000
            assert a.engine.deadlocks + b.engine.deadlocks == 0
            assert a.engine.batches > 0  # (run ends did go together)
            assert len(await a.usage.calls(limit=5000)) == 1000
            day = period_start("day", time.time())
            total = sum([(await a.usage.spent("agent", n, "day", day)).calls for n in "xyz"])
            assert total == 1000  # every call counted once, on both instances


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_reservation_takes_from_every_claim_or_from_none(engine, tmp_path):
    """Its claims are tried together (PostgreSQL: in one round trip): when one has no room,
    what the others took is given back in the same transaction, and the index of the first
    full one is told."""
    async def check(store: SqlStore) -> None:
        roomy = Claim("agent", "a", "day", 0.0, tokens=1_000)
        full = Claim("user", "u", "day", 0.0, tokens=40)  # (the prompt alone is 50)
        other = Claim("route", "r", "day", 0.0, tokens=1_000)
        assert await store.usage.reserve((roomy, full, other), 200, 0.0, 50) == 1
        for c in (roomy, full, other):
            assert await reserved_tokens(store, c.scope, c.key, c.period, c.start) == 0
        assert await store.usage.reserve((roomy, other), 200, 0.0, 50) is None
        for c in (roomy, other):
            assert await reserved_tokens(store, c.scope, c.key, c.period, c.start) == 200
        assert await reserved_tokens(store, "user", "u", "day", 0.0) == 0

    if engine == "sqlite":
        async with SqliteStore(tmp_path / "p.db") as store:
            await check(store)
        return
    with fresh_schema() as url:
        async with PostgresStore(url) as store:
            await check(store)


async def test_a_paused_holder_of_the_turn_holds_up_the_counters_only_until_the_server_ends_it(
        tmp_path):
    """An instance paused (SIGSTOP) inside a transaction that took the counters' turn — a
    budget's reservation — holds up every other instance's counter writes; the server ends
    that transaction after ``idle_in_transaction_session_timeout`` (half a lease in the
    gateway; 1 s here), the others' writes go on, and the paused change, once its instance
    resumes, is run again whole on a fresh connection."""
    import threading

    from pluto.storage.sql.usage import UsageCall, _taken

    with fresh_schema() as url:
        async with PostgresStore(url) as other:
            paused = PostgresStore(url)
            paused.engine.idle_in_transaction = 1.0
            async with paused:
                resume, took = threading.Event(), threading.Event()
                claim = Claim("agent", "a", "day", 0.0, tokens=10_000)
                turn = paused.engine.turn_sql(COUNTERS_TURN)
                runs = []

                def reserve_then_pause(conn: Any) -> int:
                    runs.append(1)
                    conn.execute(f"INSERT INTO usage_counters (scope, key, period, start, calls,"
                                 f" input_tokens, output_tokens, cached_tokens, cost,"
                                 f" unpriced_calls) SELECT ?, ?, ?, CAST(? AS DOUBLE PRECISION),"
                                 f" 0, 0, 0, 0, 0, 0 WHERE {turn} ON CONFLICT DO NOTHING",
                                 (claim.scope, claim.key, claim.period, claim.start))
                    got = conn.execute(*_taken(claim, 100, 0.0, 10)).rowcount
                    if len(runs) == 1:  # the instance stops here, the turn held
                        took.set()
                        resume.wait(30)
                    return got

                held = asyncio.ensure_future(paused.engine.transact(reserve_then_pause))
                assert await asyncio.to_thread(took.wait, 10)
                call = UsageCall(run_id="r", session_id="s", agent="a", model="m",
                                 input_tokens=5, output_tokens=7, latency=0.1, outcome="ok")
                # the other instance's write waits for the turn, then goes on
                await asyncio.wait_for(other.usage.record(call, {"day": 0.0}), 20)
                resume.set()
                assert await asyncio.wait_for(held, 30) == 1
                assert len(runs) == 2  # run again whole: the first transaction was ended
            total = await other.usage.spent("agent", "a", "day", 0.0)
            assert (total.calls, total.input_tokens, total.output_tokens) == (1, 5, 7)
            assert await reserved_tokens(other, "agent", "a", "day", 0.0) == 100
