"""Budgets hold under concurrency: each model call reserves its estimated maximum from the
running counter before it is made (one conditional statement per counter, in the database) and
its ledger row settles it. 50 parallel runs from one user against a 3,000-token budget spend at
most one call's maximum over it — on SQLite, and on PostgreSQL with two gateways (two stores,
two runners, each with its own connection pool) on one schema. PostgreSQL is required
(tests/helpers/pg.py fails, never skips, without it)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from pluto.agents.spec import AgentSpec, HistoryWindow
from pluto.agents.spec import Budget as AgentBudget
from pluto.events import MessageFinal, RunError
from pluto.runtime.errors import ModelError
from pluto.runtime.model import ModelSettings
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.usage import Attribution, UsageMeter, period_start
from pluto.settings import Budget
from pluto.storage.postgres import PostgresStore
from pluto.storage.rows import estimate_tokens
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore
from tests.helpers.inspect_store import reserved_tokens
from tests.helpers.pg import fresh_schema

LIMIT = 3_000
MAX_OUTPUT = 200  # the model's max_output_tokens: what a call may write at most
WRITES = 150  # what each answer really writes (its prompt is reported as the runner counts it)


def prompt_of(messages: list[dict[str, Any]]) -> int:
    return sum(estimate_tokens(json.dumps(m)) for m in messages)


def answering(messages: list[dict[str, Any]]) -> Scripted:
    return Scripted(text="a fairly short answer, in pieces", chunk=6, delay=0.02,
                    usage={"prompt_tokens": prompt_of(messages), "completion_tokens": WRITES})


def spec(tmp_path: Path) -> AgentSpec:
    return AgentSpec(name="a", description="", model="scripted", api_base=None,
                     api_key_env=None, temperature=None, instructions="Be brief.",
                     tools=(), datasets=(), budget=AgentBudget(), history=HistoryWindow(),
                     source=tmp_path)


def runner_for(store: SqlStore, tmp_path: Path, model: ScriptedModel,
               per: str = "user") -> Runner:
    meter = UsageMeter(store.usage, budgets=lambda: [Budget(per=per, period="day",
                                                            tokens=LIMIT)])
    return Runner(store.conversations, models={"scripted": ModelSettings(
        model="scripted", max_output_tokens=MAX_OUTPUT)}, tools={}, data_dir=tmp_path,
        model_factory=model, usage=meter)


async def one_run(store: SqlStore, runner: Runner, tmp_path: Path, i: int) -> str:
    session = await store.conversations.session(f"chat-{i}", "a")
    req = RunRequest(uuid.uuid4().hex, session, spec(tmp_path), f"question number {i}",
                     who=Attribution("test", "one-key" if i % 4 else "another-key", f"c{i}",
                                     "default"))
    outcome = "?"
    async for event in runner.run(req):
        if isinstance(event, MessageFinal):
            outcome = "answered"
        elif isinstance(event, RunError):
            outcome = event.kind
    return outcome


async def spent_and_reserved(store: SqlStore, per: str = "user") -> tuple[int, int]:
    import time
    key, start = "test:one-key" if per == "user" else "a", period_start("day", time.time())
    spent = await store.usage.spent(per, key, "day", start)
    return (spent.input_tokens + spent.output_tokens,
            await reserved_tokens(store, per, key, "day", start))


async def fifty_in_parallel(stores: list[SqlStore], tmp_path: Path, per: str = "user") -> None:
    """50 runs at once against a 3,000-token budget ``per`` user (all of one key) or agent
    (of two keys)."""
    model = ScriptedModel(fallback=answering)
    runners = [runner_for(s, tmp_path, model, per) for s in stores]
    if per == "user":  # 50 runs of the one key (a run i % 4 == 0 is another key's)
        runs = [i for i in range(1, 80) if i % 4][:50]
    else:  # 50 runs of both keys
        runs = list(range(50))
    outcomes = await asyncio.gather(*(
        one_run(stores[i % len(stores)], runners[i % len(runners)], tmp_path, i)
        for i in runs))
    spent, reserved = await spent_and_reserved(stores[0], per)
    one_call_max = max(prompt_of(c) for c in model.calls) + MAX_OUTPUT
    answered = outcomes.count("answered")
    print(f"\n{len(stores)} instance(s), per {per}: {answered} of 50 runs answered, {spent} "
          f"tokens spent of a {LIMIT}-token budget ({spent / LIMIT:.2f}x); one call at most "
          f"{one_call_max}")
    assert set(outcomes) == {"answered", "budget"}, outcomes  # some ran, the rest were refused
    assert len(model.calls) == answered  # a refused run never reached the model
    assert spent <= LIMIT + one_call_max, (spent, one_call_max)
    assert spent >= LIMIT - one_call_max  # the budget was used, not refused early
    assert reserved == 0  # every reservation was settled by its call's ledger row
    ledger = await stores[0].usage.calls()
    assert sum(c.total_tokens for c in ledger) == spent


async def test_fifty_parallel_runs_spend_at_most_one_call_over_the_budget_sqlite(tmp_path):
    async with SqliteStore(tmp_path / "p.db") as store:
        await fifty_in_parallel([store], tmp_path)


async def test_fifty_parallel_runs_on_two_gateways_sharing_postgresql(tmp_path):
    with fresh_schema() as url:
        async with PostgresStore(url) as first, PostgresStore(url) as second:
            await fifty_in_parallel([first, second], tmp_path)


async def test_fifty_parallel_runs_of_two_keys_against_an_agent_budget_postgresql(tmp_path):
    with fresh_schema() as url:
        async with PostgresStore(url) as first, PostgresStore(url) as second:
            await fifty_in_parallel([first, second], tmp_path, per="agent")


async def test_a_failed_call_gives_its_whole_reservation_back(tmp_path):
    model = ScriptedModel(Scripted(error=ModelError("the model is down", retryable=False)))
    async with SqliteStore(tmp_path / "p.db") as store:
        runner = runner_for(store, tmp_path, model)
        assert await one_run(store, runner, tmp_path, 1) == "error"
        assert await spent_and_reserved(store) == (0, 0)
        [row] = await store.usage.calls()
        assert row.outcome == "error" and row.total_tokens == 0
