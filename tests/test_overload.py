"""Overload: run slots, the line for them, and the one-line busy notice (issue 19, item 4)."""

from __future__ import annotations

import asyncio
import logging
import time
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
        runs = await gw.store.engine.fetchall("SELECT input, status FROM runs")
        assert sorted(tuple(r) for r in runs) == [("hello a", "ok"), ("hello b", "ok"),
                                                  ("hello c", "ok")]
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
        runs = await gw.store.engine.fetchall("SELECT input, status, error FROM runs")
        assert sorted(tuple(r) for r in runs) == [
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
        runs = await gw.store.engine.fetchall("SELECT input, status, error FROM runs")
        assert sorted(tuple(r)[:2] for r in runs) == [("one", "cancelled"),
                                                      ("two", "cancelled")]
        assert ("two", "cancelled", "the gateway stopped before it ran") in [
            tuple(r) for r in runs]
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


async def test_a_late_event_loop_gets_the_busy_notice_until_it_is_on_time(config_dir, data_dir):
    gw, p = await gateway(config_dir, data_dir, ScriptedModel(), busy_lag_seconds=0.2)
    try:
        await wait_for(lambda: gw.load.lag < 0.2)
        time.sleep(0.5)  # something holds the loop
        await wait_for(lambda: gw.load.lag >= 0.2)
        _, refused = await send(p, "now?", "a")
        assert refused == Dropped("the gateway is overloaded", notice=BUSY_GATEWAY)
        assert samples(gw)[("pluto_busy_refusals_total", (("reason", "lag"),))] == 1
        await wait_for(lambda: gw.load.lag < 0.2)  # on time again for about a second
        _, taken = await send(p, "and now?", "a")
        assert isinstance(taken, Accepted)
        assert await p.wait_finals(1, chat="a") == ["echo: and now?"]
    finally:
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
