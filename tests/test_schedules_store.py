"""Schedules in storage, on both engines: a due firing is claimed once, whoever asks; a one-off
never fires again; a late firing is recorded missed; never a catch-up burst."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.gateway.schedules.recurrence import When
from pluto.storage.postgres import PostgresStore
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore
from pluto.storage.sql.schedules import Schedule
from tests.helpers.pg import fresh_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        async with SqliteStore(tmp_path / "pluto.db") as s:
            yield s
    else:
        with fresh_schema() as url:
            async with PostgresStore(url) as s:
                yield s


def schedule(id: str, when: When, due: float | None, **kw: object) -> Schedule:
    values: dict[str, object] = dict(
        id=id, source="user", owner_provider="telegram", owner_user="u1", provider="telegram",
        chat_id="c1", thread_id=None, is_direct=True, agent="assistant", prompt="check",
        kind=when.kind, expr=when.expr, tz=when.tz, next_due=due, created_by="telegram:u1",
        created_at=0.0, active=True)
    values.update(kw)
    return Schedule(**values)  # type: ignore[arg-type]


async def fire_due(store: SqlStore, grace: float = 300.0, instance: str = "i1") -> list:
    """One look, as the scheduler takes it: every due schedule claimed."""
    now, due = await store.schedules.due()
    fired = []
    for s in due:
        when = When(s.kind, s.expr, s.tz)
        nxt = when.next_after(now, anchor=s.next_due)
        firing = await store.schedules.claim(s, now=now, next_due=nxt,
                                             missed=now - (s.next_due or now) > grace,
                                             instance=instance)
        if firing is not None:
            fired.append(firing)
    return fired


async def test_a_one_off_fires_once_and_never_again(store: SqlStore, tmp_path: Path):
    clock = [1000.0]
    store.schedules.clock = lambda: clock[0]
    when = When("at", "1005.0")
    await store.schedules.add(schedule("s1", when, 1005.0))
    assert await fire_due(store) == []  # not yet
    assert await store.schedules.next_due() == 1005.0
    clock[0] = 1006.0
    fired = await fire_due(store)
    assert [(f.schedule_id, f.due, f.outcome) for f in fired] == [("s1", 1005.0, "claimed")]
    clock[0] = 99999.0
    assert await fire_due(store) == []
    row = await store.schedules.get("s1")
    assert row is not None and not row.active and row.next_due is None
    assert await store.schedules.next_due() is None
    await store.schedules.fired(fired[0].id, "ran", run_id="r1")
    assert [(f.outcome, f.run_id) for f in await store.schedules.history("s1")] == [("ran", "r1")]


async def test_a_one_off_stays_fired_after_a_restart(tmp_path: Path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        store.schedules.clock = lambda: 2000.0
        await store.schedules.add(schedule("s1", When("at", "1500.0"), 1500.0))
        assert len(await fire_due(store)) == 1
    async with SqliteStore(tmp_path / "pluto.db") as store:  # the gateway restarted
        store.schedules.clock = lambda: 3000.0
        assert await fire_due(store) == []
        assert len(await store.schedules.history("s1")) == 1


async def test_late_beyond_the_grace_is_missed_and_no_burst_follows(store: SqlStore):
    clock = [0.0]
    store.schedules.clock = lambda: clock[0]
    every = When("every", "60.0")
    await store.schedules.add(schedule("s1", every, 60.0))
    clock[0] = 60.5
    assert [f.outcome for f in await fire_due(store, grace=30)] == ["claimed"]
    assert (await store.schedules.get("s1")).next_due == 120.0  # type: ignore[union-attr]
    clock[0] = 3600.0 + 45  # down for an hour: 59 firings passed
    fired = await fire_due(store, grace=30)
    assert [(f.due, f.outcome) for f in fired] == [(120.0, "missed")]  # one, not 59
    assert (await store.schedules.get("s1")).next_due == 3660.0  # type: ignore[union-attr]
    assert await fire_due(store, grace=30) == []
    clock[0] = 3661.0  # on time again
    assert [f.outcome for f in await fire_due(store, grace=30)] == ["claimed"]


async def test_within_the_grace_a_late_firing_runs_once(store: SqlStore):
    store.schedules.clock = lambda: 1000.0
    cron = When("cron", "*/5 * * * *")  # 900 was due; 1000 is 100 s late
    await store.schedules.add(schedule("s1", cron, 900.0))
    assert [f.outcome for f in await fire_due(store, grace=300)] == ["claimed"]
    assert (await store.schedules.get("s1")).next_due == 1200.0  # type: ignore[union-attr]


async def test_a_stale_claim_loses(store: SqlStore):
    """Two instances saw the same due row: the second claim, from the old next_due, finds
    nothing."""
    store.schedules.clock = lambda: 100.0
    await store.schedules.add(schedule("s1", When("every", "60.0"), 60.0))
    now, seen = await store.schedules.due()
    first = await store.schedules.claim(seen[0], now=now, next_due=120.0, missed=False)
    second = await store.schedules.claim(seen[0], now=now, next_due=120.0, missed=False)
    assert first is not None and second is None
    assert len(await store.schedules.history()) == 1


async def test_owners_list_count_and_cancel_their_own(store: SqlStore):
    await store.schedules.add(schedule("a", When("every", "3600.0"), 10.0))
    await store.schedules.add(schedule("b", When("every", "3600.0"), 5.0))
    await store.schedules.add(schedule("c", When("every", "3600.0"), 1.0, owner_user="u2"))
    mine = await store.schedules.list(owner=("telegram", "u1"))
    assert [s.id for s in mine] == ["b", "a"]
    assert await store.schedules.count(("telegram", "u1")) == 2
    assert not await store.schedules.cancel("c", owner=("telegram", "u1"))  # not theirs
    assert await store.schedules.cancel("a", owner=("telegram", "u1"))
    assert not await store.schedules.cancel("a", owner=("telegram", "u1"))  # already
    assert await store.schedules.count(("telegram", "u1")) == 1
    assert [s.id for s in await store.schedules.list(active=False)] == ["c", "b", "a"]
    assert await store.schedules.remove("c")
    assert await store.schedules.get("c") is None


async def test_run_now_makes_it_due_at_once(store: SqlStore):
    store.schedules.clock = lambda: 50.0
    await store.schedules.add(schedule("s1", When("cron", "0 9 * * *"), 32400.0))
    assert await fire_due(store) == []
    assert await store.schedules.due_now("s1")
    assert not await store.schedules.due_now("nope")
    fired = await fire_due(store)
    assert [f.due for f in fired] == [50.0]
    assert (await store.schedules.get("s1")).next_due == 32400.0  # type: ignore[union-attr]


@pytest.mark.postgres
async def test_three_instances_claim_a_due_firing_exactly_once():
    """Three stores (three gateways) on one PostgreSQL, claiming at once, many times over:
    each due firing is claimed by exactly one, on the database's clock."""
    with fresh_schema() as url:
        stores = [PostgresStore(url) for _ in range(3)]
        for s in stores:
            await s.open()
        try:
            for i in range(20):
                await stores[0].schedules.add(schedule(f"s{i}", When("at", "0.0"), 1.0))
            every = When("every", "3600.0")
            await stores[0].schedules.add(schedule("e", every, 1.0))
            results = await asyncio.gather(*(fire_due(s, grace=1e12, instance=f"i{n}")
                                             for n, s in enumerate(stores)))
            claimed = [f.schedule_id for fired in results for f in fired]
            assert sorted(claimed) == sorted([f"s{i}" for i in range(20)] + ["e"])
            again = await asyncio.gather(*(fire_due(s, grace=1e12) for s in stores))
            assert again == [[], [], []]
            history = await stores[1].schedules.history(limit=100)
            assert len(history) == 21
            assert {f.instance for f in history} <= {"i0", "i1", "i2"}
            row = await stores[2].schedules.get("e")
            assert row is not None and row.next_due is not None
            assert row.next_due > await stores[2].schedules.now()  # past now: no burst
        finally:
            for s in stores:
                await s.close()


async def test_put_keeps_the_due_time_when_told(store: SqlStore):
    row = schedule("file:x", When("every", "60.0"), 120.0, source="file")
    await store.schedules.put(row)
    store.schedules.clock = lambda: 130.0
    now, [seen] = await store.schedules.due()
    assert await store.schedules.claim(seen, now=now, next_due=180.0, missed=False)
    # an edit of the prompt, read before the claim moved next_due: it must not move it back
    from dataclasses import replace
    await store.schedules.put(replace(row, prompt="new words"), keep_due=True)
    got = await store.schedules.get("file:x")
    assert got is not None and (got.prompt, got.next_due) == ("new words", 180.0)


async def test_soonest_is_one_look(store: SqlStore):
    store.schedules.clock = lambda: 50.0
    assert await store.schedules.soonest(["telegram"]) == (50.0, None)
    await store.schedules.add(schedule("a", When("every", "60.0"), 70.0))
    await store.schedules.add(schedule("b", When("every", "60.0"), 65.0, provider="slack"))
    assert await store.schedules.soonest(["telegram"]) == (50.0, 70.0)
    assert await store.schedules.soonest(["telegram", "slack"]) == (50.0, 65.0)
    assert await store.schedules.soonest([]) == (50.0, None)
    store.schedules.clock = None
    now, soonest = await store.schedules.soonest(None)
    assert soonest == 65.0 and now > 1_700_000_000  # the database's clock


async def test_a_stranded_firing_is_adopted_once(store: SqlStore):
    clock = [100.0]
    store.schedules.clock = lambda: clock[0]
    await store.schedules.add(schedule("s1", When("at", "90.0"), 90.0))
    now, [seen] = await store.schedules.due()
    firing = await store.schedules.claim(seen, now=now, next_due=None, missed=False,
                                         instance="dead")
    assert firing is not None
    assert await store.schedules.stranded({"dead"}, 30.0) == []  # its instance lives
    assert await store.schedules.stranded({"me"}, 30.0) == []  # too recent
    clock[0] = 200.0
    [(found, sched)] = await store.schedules.stranded({"me"}, 30.0, ["telegram"])
    assert (found.id, sched.id) == (firing.id, "s1")
    assert await store.schedules.stranded({"me"}, 30.0, ["slack"]) == []
    wins = await asyncio.gather(*(store.schedules.adopt(found, i, now=200.0)
                                  for i in ("me", "you", "them")))
    assert sorted(wins) == [False, False, True]
    assert await store.schedules.stranded({"me"}, 30.0) == []  # (now a live one's)
    await store.schedules.fired(found.id, None, run_id="r1")
    assert await store.schedules.stranded(set(), 0.0) == []  # handed over
