"""The usage ledger, budgets and how they are read.

The ledger part runs on SQLite and on PostgreSQL (tests/helpers/pg.py: it fails, never skips,
when the server is not reachable)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.storage.postgres import PostgresStore
from pluto.storage.sqlite import SqlStore, SqliteStore
from pluto.storage.sqlite.usage import UsageCall
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


def call(run: str = "r1", *, agent: str = "a", user: str = "u1", chat: str = "c1",
         model: str = "m", i: int = 10, o: int = 5, cached: int = 0, cost: float | None = 0.5,
         outcome: str = "ok", attempt: int = 0) -> UsageCall:
    return UsageCall(run_id=run, session_id="s", agent=agent, model=model, input_tokens=i,
                     output_tokens=o, cached_tokens=cached, latency=0.25, outcome=outcome,
                     route="default", provider="telegram", user_id=user, chat_id=chat,
                     attempt=attempt, cost=cost)


# the ledger, on both engines ---------------------------------------------------------------

async def test_ledger_rows_sums_and_groups(store):
    usage = store.usage
    await usage.record(call("r1", i=100, o=20, cached=40, cost=0.01))
    await usage.record(call("r1", i=0, o=0, cost=None, outcome="retried", attempt=1,
                            model="local"))
    await usage.record(call("r2", agent="b", user="u2", i=7, o=3, cost=0.002))
    rows = await usage.calls(run_id="r1")
    assert [(r.input_tokens, r.output_tokens, r.cached_tokens, r.outcome, r.attempt)
            for r in rows] == [(100, 20, 40, "ok", 0), (0, 0, 0, "retried", 1)]
    assert rows[0].cost == pytest.approx(0.01) and rows[1].cost is None
    assert rows[0].ts > 0 and rows[0].estimated is False or rows[0].estimated == 0
    by_agent = {t.key: t for t in await usage.totals("agent")}
    assert (by_agent["a"].calls, by_agent["a"].total_tokens, by_agent["a"].cached_tokens,
            by_agent["a"].unpriced_calls) == (2, 120, 40, 1)
    assert by_agent["a"].cost == pytest.approx(0.01)
    assert by_agent["b"].total_tokens == 10
    assert [t.key for t in await usage.totals("user")] == ["telegram:u1", "telegram:u2"]
    assert [t.key for t in await usage.totals("chat")] == ["telegram:c1"]
    assert {t.key for t in await usage.totals("model")} == {"m", "local"}
    future = rows[0].ts + 3600
    assert await usage.totals("agent", since=future) == []
    with pytest.raises(ValueError, match="cannot group usage by"):
        await usage.totals("nonsense; DROP TABLE usage_calls")


async def test_spent_counts_from_the_later_of_the_period_and_a_reset(store):
    usage = store.usage
    await usage.record(call(user="u1", i=50, o=50, cost=1.0))
    await usage.record(call(user="u2", i=5, o=5, cost=None))
    spent = await usage.spent("user", "telegram:u1", 0.0)
    assert (spent.total_tokens, spent.cost, spent.calls) == (100, pytest.approx(1.0), 1)
    assert (await usage.spent("agent", "a", 0.0)).total_tokens == 110
    assert (await usage.spent("chat", "telegram:c1", 0.0)).calls == 2
    await usage.reset("user", "telegram:u1")
    assert (await usage.spent("user", "telegram:u1", 0.0)).total_tokens == 0
    assert (await usage.spent("user", "telegram:u2", 0.0)).total_tokens == 10  # not reset
    await usage.record(call(user="u1", i=1, o=2))
    assert (await usage.spent("user", "telegram:u1", 0.0)).total_tokens == 3
    await usage.reset("user", "telegram:u1")  # again: moves the reset forward
    assert (await usage.spent("user", "telegram:u1", 0.0)).total_tokens == 0
    assert set(await usage.resets()) == {("user", "telegram:u1")}
    with pytest.raises(ValueError, match="no budget by"):
        await usage.spent("planet", "x", 0.0)
