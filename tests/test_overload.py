"""Overload: run slots, the line for them, and the one-line busy notice (issue 19, item 4)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pluto.errors import ConfigError
from pluto.gateway.app import Gateway
from pluto.gateway.pipeline.overload import Load
from pluto.gateway.pipeline.pipeline import BUSY_GATEWAY
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import GatewayLimits, PlutoConfig, load_pluto_config
from pluto.types import Accepted, Answered, Dropped, IncomingMessage, Outcome
from tests.helpers.gateway import RecordingProvider
from tests.helpers.inspect_store import runs
from tests.helpers.served import served, url, wait_for


class GatedModel(ScriptedModel):
    """Echoes once ``gate`` is open: a run holds its slot until the test lets it go."""

    def __init__(self) -> None:
        super().__init__(fallback=lambda m: Scripted(text=f"re: {m[-1]['content']}"))
        self.gate = asyncio.Event()
        self.started: list[str] = []

    async def stream(self, messages, tools, settings):
        self.started.append(messages[-1]["content"])
        await self.gate.wait()
        async for item in super().stream(messages, tools, settings):
            yield item


async def gateway(config_dir: Path, data_dir: Path, model: ScriptedModel,
                  **limits: object) -> tuple[Gateway, RecordingProvider]:
    cfg = PlutoConfig(data_dir=data_dir, gateway=limits)
    gw = Gateway(config_dir, config=cfg, model_factory=model)
    await gw.start()
    p = RecordingProvider()
    gw.add_provider(p)
    await p.running.wait()
    return gw, p


async def send(p: RecordingProvider, text: str, chat: str) -> tuple[IncomingMessage, Outcome]:
    msg = p.msg(text, chat=chat, user=f"user-{chat}")
    assert p.intake is not None
    return msg, await (await p.intake.submit(msg)).outcome()


def sent_to(p: RecordingProvider, chat: str) -> list[tuple[str, str]]:
    return [(m.kind, m.text) for m in p.sent if m.chat_id == chat]


def samples(gw: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = gw.metrics.render()[0].decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_beyond_the_slots_and_the_line_a_message_gets_the_busy_notice(
        config_dir, data_dir, caplog):
    caplog.set_level(logging.WARNING)
    model = GatedModel()
    gw, p = await gateway(config_dir, data_dir, model, max_running=2, max_waiting=1,
                          busy_lag_seconds=0)
    try:
        sent = {c: await send(p, f"hello {c}", c) for c in "abcde"}
        assert [type(sent[c][1]) for c in "abcde"] == [Accepted, Accepted, Accepted, Dropped,
                                                      Dropped]
        for c in "de":  # at once, while the others still run: one line, nothing else
            assert sent[c][1] == Dropped("the gateway is overloaded", notice=BUSY_GATEWAY)
            await wait_for(lambda c=c: sent_to(p, c))
            assert sent_to(p, c) == [("notice", BUSY_GATEWAY)]
            handled = await gw.store.inbound.outcome("test", sent[c][0].message_id or "")
            assert handled == {"type": "dropped", "reason": "the gateway is overloaded",
                               "notice": BUSY_GATEWAY}
        await wait_for(lambda: len(model.started) == 2)
        assert model.started == ["hello a", "hello b"]
        assert (gw.load.running, gw.load.waiting) == (2, 1)
        m = samples(gw)
        assert m[("pluto_busy_refusals_total", (("reason", "waiting"),))] == 2
        assert (m[("pluto_load_running", ())], m[("pluto_load_waiting", ())]) == (2, 1)

        model.gate.set()
        for c in "abc":
            assert await p.wait_finals(1, chat=c) == [f"re: hello {c}"]
        assert model.started[2] == "hello c"  # it waited for a slot, then ran
        await gw.settled()
        assert (gw.load.running, gw.load.waiting) == (0, 0)
        assert sorted((r["input"], r["status"]) for r in await runs(gw.store)) == [
            ("hello a", "ok"), ("hello b", "ok"), ("hello c", "ok")]
        assert sent_to(p, "d") == sent_to(p, "e") == [("notice", BUSY_GATEWAY)]
        warnings = [r for r in caplog.records if r.name.endswith("overload")]
        assert len(warnings) == 1 and "busy notice" in warnings[0].getMessage()
    finally:
        model.gate.set()
        await gw.stop()


async def test_stop_of_a_waiting_run_frees_its_place(config_dir, data_dir):
    model = GatedModel()
    gw, p = await gateway(config_dir, data_dir, model, max_running=1, max_waiting=1,
                          busy_lag_seconds=0)
    try:
        assert isinstance((await send(p, "one", "a"))[1], Accepted)
        assert isinstance((await send(p, "two", "b"))[1], Accepted)  # waits for the slot
        assert isinstance((await send(p, "three", "c"))[1], Dropped)
        _, stopped = await send(p, "/stop", "b")  # a command is never refused
        assert stopped == Answered("Stopped and dropped 1 waiting message(s).")
        assert (gw.load.running, gw.load.waiting) == (1, 0)
        assert isinstance((await send(p, "four", "c"))[1], Accepted)  # the place is free
        assert isinstance((await send(p, "/help", "d"))[1], Answered)
        model.gate.set()
        assert await p.wait_finals(1, chat="a") == ["re: one"]
        assert await p.wait_finals(1, chat="c") == ["re: four"]
        await gw.settled()
        assert (gw.load.running, gw.load.waiting) == (0, 0)
        assert sorted((r["input"], r["status"], r["error"]) for r in await runs(gw.store)) == [
            ("four", "ok", None), ("one", "ok", None),
            ("two", "cancelled", "dropped by /stop before it ran")]
        assert model.started == ["one", "four"]
    finally:
        model.gate.set()
        await gw.stop()


async def test_shutdown_cancels_a_waiting_run_and_gives_its_place_back(config_dir, data_dir):
    model = GatedModel()
    gw, p = await gateway(config_dir, data_dir, model, max_running=1, max_waiting=5,
                          busy_lag_seconds=0)
    try:
        await send(p, "one", "a")
        await send(p, "two", "b")
        await wait_for(lambda: model.started)
        await gw.pipeline.close(0)  # no grace: the running run is stopped, the waiting dropped
        assert (gw.load.running, gw.load.waiting) == (0, 0)
        ended = [(r["input"], r["status"], r["error"]) for r in await runs(gw.store)]
        assert sorted(r[:2] for r in ended) == [("one", "cancelled"), ("two", "cancelled")]
        assert ("two", "cancelled", "the gateway stopped before it ran") in ended
    finally:
        await gw.stop()


async def test_slots_stay_counted_right_when_waits_are_cancelled():
    load = Load(lambda: GatewayLimits(max_running=1, max_waiting=2))
    held, first, second = load.take(), load.take(), load.take()
    assert held.done() and (load.running, load.waiting) == (1, 2)
    assert load.refusal() == "waiting"

    async def wait(slot: asyncio.Future[None]) -> None:
        try:
            await slot
        finally:
            load.give_back(slot)

    waiter = asyncio.create_task(wait(first))
    await asyncio.sleep(0)
    waiter.cancel()  # /stop or shutdown while it waits
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (load.running, load.waiting) == (1, 1) and load.refusal() is None
    load.give_back(held)  # the slot goes to the next in line
    assert second.done() and (load.running, load.waiting) == (1, 0)
    load.give_back(second)
    assert (load.running, load.waiting) == (0, 0)


async def test_a_one_off_stall_refuses_nothing_a_persistently_late_loop_with_a_line_does():
    limits = GatewayLimits(max_running=1, max_waiting=100, busy_lag_seconds=2)
    load = Load(lambda: limits, clock=lambda: 0.0)  # the lag is driven by hand, no monitor
    load.woke_late(7.5)  # one stall: a slow import, a GC pause — nothing waits
    assert load.lag == 7.5 and load.refusal() is None
    for _ in range(5):
        load.woke_late(0.0)
    assert load.refusal() is None

    held, waiting = load.take(), load.take()  # a run holds the only slot, one waits for it
    assert held.done() and not waiting.done() and load.waiting == 1
    load.woke_late(9.0)  # a one-off stall while a run waits: still not busy
    load.woke_late(0.01)
    assert load.lag == 9.0 and load.refusal() is None
    for late in (2.5, 3.0):
        load.woke_late(late)
        assert load.refusal() is None  # late twice in a row: not yet persistent
    load.woke_late(2.0)  # the third wake-up in a row at least 2 s late, and a run waits
    assert load.refusal() == "lag"
    load.woke_late(0.0)  # on time again
    assert load.refusal() is None

    for late in (4.0, 4.0, 4.0):
        load.woke_late(late)
    assert load.refusal() == "lag"
    load.give_back(held)  # the waiting run got the slot: nobody waits any more
    assert waiting.done() and load.waiting == 0 and load.refusal() is None
    load.give_back(waiting)
    limits = GatewayLimits(max_running=1, max_waiting=100, busy_lag_seconds=0)
    held, waiting = load.take(), load.take()
    assert load.refusal() is None  # 0: the lag never refuses
    load.give_back(waiting)
    load.give_back(held)


async def test_after_a_stall_a_message_is_answered_and_only_a_full_line_is_refused(
        config_dir, data_dir):
    model = GatedModel()
    gw, p = await gateway(config_dir, data_dir, model, max_running=1, max_waiting=1,
                          busy_lag_seconds=0.2)
    try:
        await gw.load.stop()  # the test drives the lag itself: no real stall, no sleep
        gw.load.woke_late(3.0)  # the loop was held 3 s once, with nothing waiting
        assert gw.load.lag >= 0.2
        _, taken = await send(p, "after the stall", "a")
        assert isinstance(taken, Accepted)  # the old rule said "very busy" here
        await wait_for(lambda: model.started == ["after the stall"])
        _, second = await send(p, "second", "b")  # waits for the slot: the line holds 1
        assert isinstance(second, Accepted) and gw.load.waiting == 1
        _, third = await send(p, "third", "c")  # the line is full: truly busy
        assert third == Dropped("the gateway is overloaded", notice=BUSY_GATEWAY)
        await wait_for(lambda: sent_to(p, "c"))
        assert sent_to(p, "c") == [("notice", BUSY_GATEWAY)]
        m = samples(gw)
        assert m[("pluto_busy_refusals_total", (("reason", "waiting"),))] == 1
        assert m.get(("pluto_busy_refusals_total", (("reason", "lag"),)), 0) == 0
        model.gate.set()
        assert await p.wait_finals(1, chat="a") == ["re: after the stall"]
        assert await p.wait_finals(1, chat="b") == ["re: second"]
    finally:
        model.gate.set()
        await gw.stop()


async def test_a_loop_late_persistently_with_runs_waiting_gets_the_busy_notice(
        config_dir, data_dir):
    model = GatedModel()
    gw, p = await gateway(config_dir, data_dir, model, max_running=1, max_waiting=100,
                          busy_lag_seconds=0.2)
    try:
        await gw.load.stop()
        assert isinstance((await send(p, "one", "a"))[1], Accepted)
        assert isinstance((await send(p, "two", "b"))[1], Accepted)
        await wait_for(lambda: gw.load.waiting == 1)
        for _ in range(3):
            gw.load.woke_late(0.5)  # late on every wake-up, while a run waits for a slot
        _, refused = await send(p, "three", "c")
        assert refused == Dropped("the gateway is overloaded", notice=BUSY_GATEWAY)
        assert samples(gw)[("pluto_busy_refusals_total", (("reason", "lag"),))] == 1
        gw.load.woke_late(0.0)  # on time again
        assert isinstance((await send(p, "four", "d"))[1], Accepted)
        model.gate.set()
        for chat, text in (("a", "one"), ("b", "two"), ("d", "four")):
            assert await p.wait_finals(1, chat=chat) == [f"re: {text}"]
    finally:
        model.gate.set()
        await gw.stop()


async def test_readyz_shows_the_load(config_dir, data_dir):
    model = GatedModel()
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        p = RecordingProvider()
        gw.add_provider(p)
        await p.running.wait()
        await send(p, "hold on", "a")
        await wait_for(lambda: model.started)
        async with http.get(url(gw, "/readyz")) as resp:
            body = await resp.json()
        assert resp.status == 200 and body["status"] == "ready"
        load = body["checks"]["load"]
        assert (load["running"], load["waiting"]) == (1, 0) and load["lag_ms"] >= 0
        model.gate.set()
        await p.wait_finals(1, chat="a")


@pytest.mark.parametrize("text, field, words", [
    ("gateway:\n  max_running: 0\n", "gateway.max_running", "greater than or equal to 1"),
    ("gateway:\n  max_waiting: -1\n", "gateway.max_waiting", "greater than or equal to 0"),
    ("gateway:\n  max_waiting: lots\n", "gateway.max_waiting", "valid integer"),
    ("gateway:\n  busy_lag_seconds: -0.5\n", "gateway.busy_lag_seconds",
     "greater than or equal to 0"),
    ("gateway:\n  busy_lag_seconds: soon\n", "gateway.busy_lag_seconds", "valid number"),
])
def test_bad_limits_are_refused_with_file_line_and_field(config_dir: Path, text: str,
                                                         field: str, words: str) -> None:
    (config_dir / "pluto.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_pluto_config(config_dir)
    file, line, got_field, message = exc.value.problems[0]
    assert file.endswith("pluto.yaml") and (line, got_field) == (2, field) and words in message
    assert str(exc.value).startswith(f"{file}:2:")
