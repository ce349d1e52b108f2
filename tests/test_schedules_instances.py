"""Schedules across instances and restarts: a ``+3s`` one-off with three gateways on one
PostgreSQL is answered by exactly one of them, once; a cron every minute across a restart
fires once a minute, none twice, and a gateway down past the grace records one ``missed``
firing instead of a burst."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from pluto.gateway.app import Gateway
from pluto.gateway.schedules.recurrence import When, parse_at
from pluto.gateway.schedules.scheduler import add_schedule
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig, StorageConfig
from pluto.storage.postgres import PostgresStore
from tests.helpers.gateway import RecordingProvider
from tests.helpers.pg import fresh_schema


async def until(check: Callable[[], object], timeout: float = 30) -> None:
    async def poll() -> None:
        while not await check():  # type: ignore[misc]
            await asyncio.sleep(0.02)
    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def three(config_dir: Path, tmp_path: Path
                ) -> AsyncIterator[list[tuple[Gateway, RecordingProvider]]]:
    with fresh_schema() as url:
        started: list[tuple[Gateway, RecordingProvider]] = []
        try:
            for i in range(3):
                cfg = PlutoConfig(data_dir=tmp_path / f"data{i}",
                                  storage=StorageConfig(lease_seconds=5))
                gw = Gateway(config_dir, config=cfg, model_factory=ScriptedModel(),
                             store=PostgresStore(url))
                await gw.start()
                provider = RecordingProvider("telegram")
                gw.add_provider(provider)
                await provider.running.wait()
                started.append((gw, provider))
            yield started
        finally:
            for gw, _ in started:
                await gw.stop()


@pytest.mark.postgres
async def test_a_one_off_on_three_instances_is_sent_exactly_once(three) -> None:
    (a, _), (b, _), (c, _) = three
    providers = [p for _, p in three]
    now = await b.store.schedules.now()  # the database's clock
    made = await add_schedule(b.store.schedules, source="admin", owner=None,
                              provider="telegram", chat_id="team", agent="default",
                              prompt="deploy check",
                              when=When("at", str(parse_at("+3s", "UTC", now))),
                              created_by="test")
    for gw, _ in three:
        gw.scheduler.wake()  # each sleeps until the due time, then all three reach for it

    async def sent() -> bool:
        return sum(len(p.finals("team")) for p in providers) >= 1
    await until(sent)
    history = b.store.schedules.history

    async def ran() -> bool:
        found = await history(made.id)
        return len(found) == 1 and found[0].outcome == "ran"
    await until(ran)
    for gw, _ in three:
        await gw.scheduler.tick()  # every instance looks again: nothing is due
        await gw.settled()
    assert sum(len(p.finals("team")) for p in providers) == 1
    assert [p.finals("team") for p in providers if p.finals("team")] == [["echo: deploy check"]]
    [firing] = await history(made.id)
    assert firing.instance in {a.instance, b.instance, c.instance}
    row = await a.store.schedules.get(made.id)
    assert row is not None and not row.active and row.next_due is None


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def test_every_minute_across_a_restart_once_a_minute_and_one_missed(
        config_dir: Path, data_dir: Path) -> None:
    (config_dir / "schedules.yaml").write_text(
        "settings:\n  misfire_grace: 2m\nschedules:\n  - name: tick\n    agent: default\n"
        "    to: test:ops\n    cron: '* * * * *'\n    prompt: minute check\n")
    clock = Clock(1_800_000_000.0)  # on a minute
    delivered: list[str] = []

    async def run_for(minutes: int, skip: float = 0.0) -> None:
        gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                     model_factory=ScriptedModel())
        gw.store.schedules.clock = clock
        clock.t += skip  # the time it was down
        await gw.start()
        p = RecordingProvider("test")
        gw.add_provider(p)
        await p.running.wait()
        try:
            gw.scheduler.wake()
            await gw.scheduler.tick()  # what is due at start (a missed one, after downtime)
            for _ in range(minutes):
                clock.t += 60
                before = len(p.finals("ops"))
                gw.scheduler.wake()
                await p.wait_finals(before + 1, chat="ops")
            await gw.settled()
            delivered.extend(p.finals("ops"))
        finally:
            await gw.stop()

    await run_for(3)
    await run_for(2)  # restarted at once: on with the next minute, none twice
    await run_for(2, skip=10 * 60)  # down for 10 minutes: one missed, then on time again
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir)) as gw:
        history = list(reversed(await gw.store.schedules.history("file:tick")))
    dues = [f.due for f in history]
    assert len(dues) == len(set(dues))  # none twice
    assert [f.outcome for f in history] == ["ran"] * 5 + ["missed"] + ["ran"] * 2
    assert len(delivered) == 7 and set(delivered) == {"echo: minute check"}
    start = 1_800_000_000.0
    assert dues[:5] == [start + 60 * i for i in range(1, 6)]
    assert all(d % 60 == 0 for d in dues)
