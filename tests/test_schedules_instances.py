"""Schedules across instances and restarts: a ``+3s`` one-off with three gateways on one
PostgreSQL is answered by exactly one of them, once; a cron every minute across a restart
fires once a minute, none twice, and a gateway down past the grace records one ``missed``
firing instead of a burst."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pluto.gateway.app import Gateway
from pluto.gateway.schedules.recurrence import When, parse_at
from pluto.gateway.schedules.scheduler import add_schedule
from pluto.runtime.model import ModelTurn
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


class GatedModel:
    """Echoes; the message ``long question`` waits for ``gate``. Counts runs going on at once
    (the gateways share it: one process, two instances)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.asked: list[str] = []
        self.active = 0
        self.most = 0

    def __call__(self, settings: object) -> GatedModel:
        return self

    async def stream(self, messages: list[dict[str, Any]], tools: object,
                     settings: object) -> AsyncIterator[str | ModelTurn]:
        text = str(messages[-1]["content"])
        self.asked.append(text)
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            if text == "long question":
                self.started.set()
                await self.gate.wait()
            yield f"echo: {text}"
            yield ModelTurn(f"echo: {text}", [], {"prompt_tokens": 1, "completion_tokens": 1},
                            "stop")
        finally:
            self.active -= 1


@pytest.mark.postgres
async def test_a_firing_waits_for_the_run_a_person_started_in_its_chat_elsewhere(
        config_dir: Path, tmp_path: Path) -> None:
    """A person's message runs on A (A holds the chat); the firing into that chat is claimed on
    B: it waits in the chat's inbox and runs after the person's answer — never beside it."""
    model = GatedModel()
    with fresh_schema() as url:
        pair: list[tuple[Gateway, RecordingProvider]] = []
        try:
            for i in range(2):
                gw = Gateway(config_dir, config=PlutoConfig(
                    data_dir=tmp_path / f"data{i}", storage=StorageConfig(lease_seconds=5)),
                    model_factory=model, store=PostgresStore(url))
                await gw.start()
                provider = RecordingProvider("telegram")
                gw.add_provider(provider)
                await provider.running.wait()
                pair.append((gw, provider))
            (a, pa), (b, pb) = pair
            await a.scheduler.stop()  # (only B fires: the firing is claimed there)
            asking = asyncio.create_task(pa.say("long question", chat="team"))
            await asyncio.wait_for(model.started.wait(), 10)  # A holds the chat, running
            now = await b.store.schedules.now()
            made = await add_schedule(b.store.schedules, source="admin", owner=None,
                                      provider="telegram", chat_id="team", agent="default",
                                      prompt="deploy check",
                                      when=When("at", str(parse_at("+1s", "UTC", now))),
                                      created_by="test")
            b.scheduler.wake()

            async def handed_over() -> bool:
                found = await b.store.schedules.history(made.id)
                return bool(found) and found[0].outcome == "queued"
            await until(handed_over)
            assert b.intakes["telegram"].waiting == 1  # in the chat's queue, behind A's run
            assert model.asked == ["long question"]
            model.gate.set()

            async def both() -> bool:
                return len(pa.finals("team") + pb.finals("team")) >= 2
            await until(both)
            await asking

            async def ran() -> bool:
                found = await b.store.schedules.history(made.id)
                return found[0].outcome == "ran"
            await until(ran)
            assert model.asked == ["long question", "deploy check"]
            assert model.most == 1  # never two runs at once in the chat
            # (the chat's holder answered both, in order)
            assert pa.finals("team") + pb.finals("team") == ["echo: long question",
                                                             "echo: deploy check"]
            for gw, _ in pair:
                await gw.settled()
            assert len(pa.finals("team") + pb.finals("team")) == 2  # and nothing twice
        finally:
            for gw, _ in pair:
                await gw.stop()
