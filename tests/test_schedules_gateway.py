"""Schedules in a running gateway: /remind and /schedules through an in-process provider with
a scripted model, firings answered in their chat, heartbeats that stay quiet, the limits, and
schedules.yaml (a bad edit refused with file and line, the last good one kept). The clock is
handed to the store; the scheduler is woken instead of waited for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from pluto.errors import ConfigError
from pluto.gateway.app import Gateway
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from pluto.types import Capabilities, MARKDOWN
from tests.helpers.gateway import RecordingProvider

T = TypeVar("T")
START = 1_800_000_000.0  # 2027-01-15 08:00 UTC


async def until(check: Callable[[], T | None], timeout: float = 20) -> T:
    async def poll() -> T:
        while (found := check()) is None:
            await asyncio.sleep(0.01)
        return found
    return await asyncio.wait_for(poll(), timeout)


async def until_async(check: Callable[[], object], timeout: float = 20) -> object:
    async def poll() -> object:
        while not (found := await check()):  # type: ignore[misc]
            await asyncio.sleep(0.02)
        return found
    return await asyncio.wait_for(poll(), timeout)


class Clock:
    def __init__(self, t: float = START):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def start(config_dir: Path, data_dir: Path, clock: Clock,
                model: ScriptedModel | None = None) -> tuple[Gateway, RecordingProvider]:
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                 model_factory=model or ScriptedModel())
    gw.store.schedules.clock = clock
    await gw.start()
    p = RecordingProvider(capabilities=Capabilities(max_message_length=4000, markup=MARKDOWN))
    gw.add_provider(p)
    await p.running.wait()
    return gw, p


async def ask(p: RecordingProvider, text: str, **kw: object) -> str:
    before = len(p.sent)
    await p.say(text, **kw)
    return await until(lambda: next((m.text for m in p.sent[before:]
                                     if m.kind in ("reply", "error")), None))


async def advance(gw: Gateway, clock: Clock, seconds: float) -> None:
    clock.t += seconds
    gw.scheduler.wake()


async def test_remind_fires_once_in_its_chat(config_dir: Path, data_dir: Path, clock: Clock):
    gw, p = await start(config_dir, data_dir, clock)
    try:
        said = await ask(p, "/remind in 2h check the deploy", chat="c7", user="u1")
        assert said.startswith("Scheduled `") and "once at 2027-01-15 10:00 UTC" in said
        sid = said.split("`")[1]
        listed = await ask(p, "/schedules", chat="c7", user="u1")
        assert sid in listed and "check the deploy" in listed
        before = len(p.finals("c7"))
        await advance(gw, clock, 3600)  # not yet
        await advance(gw, clock, 3601)
        answers = await p.wait_finals(before + 1, chat="c7")
        assert answers[-1] == "echo: check the deploy"
        history = await gw.store.schedules.history(sid)
        await until_async(lambda: _outcome(gw, sid, "ran"))
        assert len(history) == 1 and history[0].run_id is not None
        # the firing's model calls are in the usage ledger, marked as a schedule's
        fired = history[0].run_id
        calls = await until_async(lambda: gw.store.usage.calls(run_id=fired))
        assert [c.origin for c in calls] == ["schedule"]  # type: ignore[attr-defined]
        await advance(gw, clock, 86400)
        await gw.scheduler.tick()
        await gw.settled()
        assert len(p.finals("c7")) == before + 1  # once, never again
        assert (await ask(p, "/schedules", chat="c7", user="u1")).startswith(
            "You have no schedules")
        await p.say("hello", chat="c7", user="u1")  # a person's message: marked so
        await p.wait_finals(before + 2, chat="c7")
        await gw.settled()
        await until_async(lambda: _origins(gw, ["message", "schedule"]))
    finally:
        await gw.stop()


async def _origins(gw: Gateway, want: list[str]) -> bool:
    return sorted(c.origin for c in await gw.store.usage.calls()) == want


async def _outcome(gw: Gateway, sid: str, outcome: str) -> bool:
    found = await gw.store.schedules.history(sid)
    return bool(found) and found[0].outcome == outcome


async def test_a_heartbeat_with_nothing_to_report_sends_nothing(config_dir: Path,
                                                                data_dir: Path, clock: Clock):
    model = ScriptedModel(Scripted(text="Nothing to report."), Scripted(text="Disk is 95% full"))
    gw, p = await start(config_dir, data_dir, clock, model)
    try:
        said = await ask(p, "/remind every 30m read HEARTBEAT.md", chat="ops")
        sid = said.split("`")[1]
        sent = len(p.sent)
        await advance(gw, clock, 1800)
        await until_async(lambda: _outcome(gw, sid, "quiet"))
        await gw.settled()
        assert len(p.sent) == sent  # nothing at all: no preview, no answer
        await advance(gw, clock, 1800)
        assert (await p.wait_finals(2, chat="ops"))[-1] == "Disk is 95% full"
        await until_async(lambda: _outcome(gw, sid, "ran"))
        assert [f.outcome for f in await gw.store.schedules.history(sid)] == ["ran", "quiet"]
    finally:
        await gw.stop()


async def test_people_see_and_cancel_only_their_own(config_dir: Path, data_dir: Path,
                                                    clock: Clock):
    gw, p = await start(config_dir, data_dir, clock)
    try:
        sid = (await ask(p, "/remind every day 9:00 standup", user="u1")).split("`")[1]
        other = await ask(p, f"/schedules cancel {sid}", user="u2")
        assert other == f"You have no active schedule `{sid}`; /schedules lists yours."
        assert (await ask(p, "/schedules", user="u2")).startswith("You have no schedules")
        assert await ask(p, f"/schedules cancel {sid}", user="u1") == f"Cancelled `{sid}`."
        row = await gw.store.schedules.get(sid)
        assert row is not None and row.chat_id == "c1" and not row.active
    finally:
        await gw.stop()


async def test_limits_and_bad_times_are_refused_in_one_sentence(config_dir: Path,
                                                                data_dir: Path, clock: Clock):
    (config_dir / "schedules.yaml").write_text(
        "settings:\n  max_per_user: 2\n  min_interval: 1h\n")
    gw, p = await start(config_dir, data_dir, clock)
    try:
        too_often = await ask(p, "/remind every 10m drink water")
        assert too_often == ("Schedules here may repeat at most every 1h; every 10m is more "
                             "often.")
        assert "at most every 1h" in await ask(p, "/remind every */5 * * * * poll")
        for what in ("a", "b"):
            assert (await ask(p, f"/remind in 1h {what}")).startswith("Scheduled")
        assert await ask(p, "/remind in 1h c") == ("You have 2 schedules, the most allowed "
                                                   "here; cancel one first (/schedules lists "
                                                   "them).")
        assert (await ask(p, "/remind in 1h c", user="u9")).startswith("Scheduled")  # per user
        for bad, says in [("/remind at yesterday x", "is not a time I can read"),
                          ("/remind at 2020-01-01 09:00 x", "has already passed"),
                          ("/remind", "Say when and what"),
                          ("/remind soon x", "Say when first")]:
            reply = await ask(p, bad, user="u3")
            assert says in reply and "\n" not in reply and "Traceback" not in reply
        errors = [m for m in p.sent if m.kind == "error"]
        assert len(errors) == 7
    finally:
        await gw.stop()


SCHEDULES = """\
settings:
  misfire_grace: 1m
schedules:
  - name: sales
    agent: default
    to: test:team
    cron: "0 11 * * *"
    tz: Europe/Berlin
    prompt: sales summary
"""


async def test_schedules_yaml_fires_and_a_bad_edit_keeps_the_last_good(
        config_dir: Path, data_dir: Path, clock: Clock):
    (config_dir / "schedules.yaml").write_text(SCHEDULES)
    gw, p = await start(config_dir, data_dir, clock)
    try:
        row = await gw.store.schedules.get("file:sales")
        assert row is not None and row.next_due == START + 2 * 3600  # 11:00 Berlin = 10:00 UTC
        await until(lambda: gw.scheduler.next_firing)  # /readyz shows it
        assert gw.health_reports["schedules"]() == {"next_firing": START + 2 * 3600,
                                                    "file": "ok"}
        await advance(gw, clock, 2 * 3600)
        assert (await p.wait_finals(1, chat="team")) == ["echo: sales summary"]
        watcher = gw.scheduler.watcher
        assert watcher is not None
        (config_dir / "schedules.yaml").write_text(SCHEDULES.replace("0 11 * * *", "0 25 * * *"))
        assert not await watcher.check(force=True)
        [(file, line, field, problem)] = watcher.state.problems
        assert (file.endswith("schedules.yaml"), line, field) == (True, 7, "schedules[0].cron")
        assert gw.health_reports["schedules"]()["file"] == "refused"
        assert problem.startswith("'0 25 * * *' is not a cron expression I can use (bad hour)")
        kept = await gw.store.schedules.get("file:sales")
        assert kept is not None and kept.expr == "0 11 * * *" and kept.active
        (config_dir / "schedules.yaml").write_text("schedules: []\n")
        assert await watcher.check(force=True)
        gone = await gw.store.schedules.get("file:sales")
        assert gone is not None and not gone.active
    finally:
        await gw.stop()


async def test_a_bad_cron_stops_the_start_naming_file_and_line(config_dir: Path,
                                                               data_dir: Path, clock: Clock):
    (config_dir / "schedules.yaml").write_text(SCHEDULES.replace('"0 11 * * *"', "'61 9 * * *'"))
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                 model_factory=ScriptedModel())
    with pytest.raises(ConfigError) as e:
        await gw.start()
    text = str(e.value)
    assert text.count("\n") == 0
    assert "schedules.yaml:7: schedules[0].cron: '61 9 * * *' is not a cron expression" in text
    for bad, field in [("  - name: x\n    agent: nobody\n    to: test:c\n    every: 1h\n"
                        "    prompt: p\n", "schedules[0].agent: unknown agent 'nobody'"),
                       ("  - name: x\n    agent: default\n    to: test:c\n    every: 1h\n"
                        "    cron: '* * * * *'\n    prompt: p\n",
                        "schedules[0].every: give exactly one of at, cron or every"),
                       ("  - name: x\n    agent: default\n    to: test:c\n    at: +2h\n"
                        "    prompt: p\n", "schedules[0].at: a relative time"),
                       ("  - name: x\n    agent: default\n    to: test:c\n    every: 1h\n"
                        "    tz: Mars/Base\n    prompt: p\n", "schedules[0].tz: 'Mars/Base'")]:
        (config_dir / "schedules.yaml").write_text("schedules:\n" + bad)
        gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                     model_factory=ScriptedModel())
        with pytest.raises(ConfigError) as e:
            await gw.start()
        assert field in str(e.value)



async def test_stop_stops_a_firing_run(config_dir: Path, data_dir: Path, clock: Clock):
    """A firing's run is the chat's: /stop there stops it, and its history says so."""
    model = ScriptedModel(Scripted(text="a long report " * 50, chunk=5, delay=0.05))
    gw, p = await start(config_dir, data_dir, clock, model)
    try:
        sid = (await ask(p, "/remind in 1h the long report", chat="r1")).split("`")[1]
        await advance(gw, clock, 3600)
        await until(lambda: gw.pipeline.live or None)  # its run is going
        assert await ask(p, "/stop", chat="r1") == "Stopped."
        await until_async(lambda: _outcome(gw, sid, "stopped"))
        await gw.settled()
        assert not any("long report" in t for t in p.finals("r1"))
    finally:
        await gw.stop()


async def test_times_are_read_in_the_zone_of_where_they_are_written(
        config_dir: Path, data_dir: Path, clock: Clock):
    (config_dir / "schedules.yaml").write_text(
        "settings:\n  zones:\n    test:berlin: Europe/Berlin\n    test: America/New_York\n"
        "  user_zones:\n    test:traveller: Asia/Tokyo\n")
    gw, p = await start(config_dir, data_dir, clock)
    try:
        berlin = await ask(p, "/remind at 2027-01-15 12:00 lunch", chat="berlin")
        assert "once at 2027-01-15 12:00 Europe/Berlin" in berlin
        other = await ask(p, "/remind at 2027-01-15 12:00 lunch", chat="nyc")
        assert "once at 2027-01-15 12:00 America/New_York" in other
        # a person's own zone wins over the chat's
        tokyo = await ask(p, "/remind at 2027-01-16 12:00 lunch", chat="berlin",
                          user="traveller")
        assert "once at 2027-01-16 12:00 Asia/Tokyo" in tokyo
        dues = sorted(s.next_due for s in await gw.store.schedules.list())
        # 11:00 and 17:00 UTC, and 03:00 UTC the next day
        assert [d - START for d in dues] == [3 * 3600.0, 9 * 3600.0, 19 * 3600.0]
    finally:
        await gw.stop()
    (config_dir / "schedules.yaml").write_text(
        "settings:\n  zones:\n    test: Mars/Base\n")
    with pytest.raises(ConfigError, match=r"schedules.yaml:3: settings.zones.test: Value "
                                          r"error, 'Mars/Base' is not a time zone I know"):
        await start(config_dir, data_dir, clock)


async def test_a_firing_a_crash_left_claimed_runs_once_after_the_restart(
        config_dir: Path, data_dir: Path, clock: Clock):
    """The process died between claiming two firings and handing them over: after the
    restart the one still within the grace runs (once), the other is recorded missed."""
    from pluto.gateway.schedules.recurrence import When
    from pluto.storage.sqlite import SqliteStore
    from pluto.storage.sql.schedules import Schedule

    async with SqliteStore(data_dir / "pluto.db") as store:
        store.schedules.clock = clock
        for sid, due in (("fresh", START + 10), ("stale", START - 1000)):
            await store.schedules.add(Schedule(
                id=sid, source="admin", owner_provider=None, owner_user=None, provider="test",
                chat_id="crash", thread_id=None, is_direct=True, agent="default",
                prompt=f"{sid} check", kind="at", expr=str(due), tz="UTC", next_due=due,
                created_by="test", created_at=0.0, active=True))
        clock.t = START + 10
        now, due = await store.schedules.due()
        for s in due:  # claimed by a process that then died
            assert await store.schedules.claim(s, now=now, next_due=None, missed=False,
                                               instance="gone")
    clock.t = START + 70  # the restart, a minute later
    gw, p = await start(config_dir, data_dir, clock)
    try:
        gw.scheduler.wake()
        assert await p.wait_finals(1, chat="crash") == ["echo: fresh check"]
        await until_async(lambda: _outcome(gw, "fresh", "ran"))
        await until_async(lambda: _outcome(gw, "stale", "missed"))
        assert await gw.scheduler.recover() == 0  # nothing left
        await gw.settled()
        assert p.finals("crash") == ["echo: fresh check"]
        [fresh] = await gw.store.schedules.history("fresh")
        assert fresh.instance == gw.instance
    finally:
        await gw.stop()
