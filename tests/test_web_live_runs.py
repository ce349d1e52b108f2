"""Runs the gateway starts by itself in a front-end's chat (``Provider.run_started``): a
schedule's firing into a widget chat streams live in the open tab (its deltas while the model
is still writing, its final once); a request nobody decided in time moves the API step waiting
on it to the resumed run at once (its ``run_id`` and ``events_url`` while that run is still
going), then to its answer. Also: the web protocol's tool.start of an ``ask_<agent>`` call
names the child run, and a child run's frames are marked with their parent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from pluto.events import MessageDelta, ToolStart
from pluto.providers.web import protocol
from pluto.runtime.model import ModelSettings
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.served import Tab, served, wait_for
from tests.test_api_approvals import Deleter, call, gateway, scripted

SECRET = "a-widget-secret-for-live-runs-0123456789"


class Gated(ScriptedModel):
    """A ScriptedModel whose call number ``on`` (from 0) writes its first delta, then waits
    for ``gate`` before the rest: the run is surely still going while a watcher sees it."""

    def __init__(self, *turns: Scripted, on: int, **kw: Any):
        super().__init__(*turns, **kw)
        self.on = on
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[Any]:
        number, said = len(self.calls), 0
        async for part in super().stream(messages, tools, settings):
            if number == self.on and isinstance(part, str) and said == 1:
                self.waiting.set()
                await self.gate.wait()
            said += isinstance(part, str)
            yield part


async def test_a_firing_into_a_widget_chat_streams_live_in_the_open_tab(config_dir, data_dir,
                                                                         monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    model = Gated(on=0, fallback=lambda m: Scripted(text=f"Reminder: {m[-1]['content']}"))
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        clock = [await gw.store.schedules.now()]
        gw.store.schedules.clock = lambda: clock[0]
        tab = await Tab.open(http, gw)
        said = await tab.ask("/remind in 2h check the oven")
        assert said["text"].startswith("Scheduled `"), said
        clock[0] += 2 * 3600 + 1
        gw.scheduler.wake()
        start = await tab.until("run.start")
        run_id = start["run_id"]
        first = await tab.until("message.delta", lambda f: f["run_id"] == run_id)
        await model.waiting.wait()  # the model is still writing: this delta came live
        assert not [f for f in tab.of("message.final") if f["run_id"] == run_id]
        assert gw.providers["web"].following() == {run_id: False}  # heard from the feed
        model.gate.set()
        final = await tab.until("message.final", lambda f: f["run_id"] == run_id)
        await tab.until("run.end", lambda f: f["run_id"] == run_id)
        assert final["text"].startswith("Reminder:") and "check the oven" in final["text"]
        frames = [f for f in tab.frames if f.get("run_id") == run_id]
        deltas = "".join(f["text"] for f in frames if f["type"] == "message.delta")
        assert first["text"] and deltas == final["text"]
        ids = [f["id"] for f in frames]
        assert len(ids) == len(set(ids))  # each frame once
        assert [f["type"] for f in frames].count("message.final") == 1
        await wait_for(lambda: not gw.providers["web"].following())


@pytest.mark.slow
async def test_an_expired_request_moves_its_api_step_to_the_resumed_run_at_once(
        config_dir, data_dir, monkeypatch):
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", "test-api-key-0123456789")
    deleter = Deleter()
    base_model = scripted("Nobody approved, so I did nothing.")
    model = Gated(*base_model.turns, on=1)
    async with gateway(config_dir, data_dir, model, deleter, timeout=1) as gw, \
            aiohttp.ClientSession() as http:
        gw.approval_sweep.every = 0.05  # (looks by itself; quickly here)
        status, task = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=10",
                                  {"input": "delete the old log"})
        assert status == 201, task
        step = task["last_step"]
        assert step["status"] == "awaiting_approval"
        paused = step["run_id"]
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps/{step['step_id']}"

        async def moved() -> dict[str, Any] | None:
            _, now = await call(http, gw, "GET", path)
            return now if now["run_id"] != paused else None
        now = await wait_for(moved, timeout=15)
        assert model.gate.is_set() is False  # the resumed run is still writing its answer
        assert now["status"] == "running"
        assert now["events_url"] == f"/api/v1/agent/{now['run_id']}/events"
        model.gate.set()

        async def answered() -> bool:
            _, now = await call(http, gw, "GET", path)
            return now["status"] == "completed" and \
                now["output"] == "Nobody approved, so I did nothing."
        await wait_for(answered, timeout=15)
        assert deleter.calls == []


def test_an_ask_calls_tool_start_names_its_child_run() -> None:
    start = ToolStart(run_id="p1", seq=3, call_id="c1", name="ask_analyst",
                      arguments={"question": "x" * 1000}, child_run_id="k1")
    frame = protocol.run_frame(3, start, lambda p: None)
    assert frame is not None and frame["child_run_id"] == "k1"
    assert frame["question"] == "x" * protocol.MAX_QUESTION
    plain = protocol.run_frame(4, ToolStart(run_id="p1", seq=4, call_id="c2", name="sql",
                                            arguments={"question": "q"}), lambda p: None)
    assert plain is not None and "child_run_id" not in plain and "question" not in plain
    odd = protocol.run_frame(5, ToolStart(run_id="p1", seq=5, call_id="c3", name="ask_a",
                                          arguments={"question": {"no": 1}},
                                          child_run_id="k2"), lambda p: None)
    assert odd is not None and odd["question"] is None
    assert json.loads(protocol.encode(frame))["child_run_id"] == "k1"
    delta = protocol.run_frame(1, MessageDelta(run_id="k1", seq=1, text="hi"), lambda p: None)
    assert delta is not None and delta["run_id"] == "k1"


async def test_a_tab_joining_while_a_child_answers_gets_its_frames_nested(tmp_path):
    from tests.browser.test_widget_live_runs import ask_analyst, asking
    model = Gated(ask_analyst("What were sales in May?"), Scripted(text="May sales were 42."),
                  Scripted(text="The analyst says 42."), on=1)
    async with asking(tmp_path, model) as gw, aiohttp.ClientSession() as http:
        first = await Tab.open(http, gw)
        await first.send(type="message", text="how were sales?")
        await model.waiting.wait()  # the child has written its first words, and waits
        second = await Tab.open(http, gw, token=first.ready["token"])
        model.gate.set()
        for tab in (first, second):
            final = await tab.until("message.final", lambda f: "parent_run_id" not in f)
            assert final["text"] == "The analyst says 42."
            parent = final["run_id"]
            [ask] = [f for f in tab.of("tool.start") if f["run_id"] == parent]
            child = ask["child_run_id"]
            assert ask["question"] == "What were sales in May?" and child != parent
            nested = [f for f in tab.frames if f.get("run_id") == child]
            assert nested and all(f["parent_run_id"] == parent and
                                  f["parent_call_id"] == ask["call_id"] for f in nested)
            kinds = [f["type"] for f in nested]
            assert kinds[0] == "run.start" and kinds[-1] == "run.end", kinds
            text = "".join(f["text"] for f in nested if f["type"] == "message.delta")
            finals = [f["text"] for f in nested if f["type"] == "message.final"]
            assert finals == ["May sales were 42."] and finals[0].startswith(text)  # (deltas:
            # previews, batched by the runner)
            ids = [f["id"] for f in tab.frames if f.get("run_id") in (parent, child)]
            assert len(ids) == len(set(ids))  # each once
            assert tab.frames.index(ask) < tab.frames.index(nested[0])
        await wait_for(lambda: not gw.providers["web"].following())


def test_a_history_shows_an_answer_cut_off_as_its_message_waiting_for_the_next() -> None:
    """A run cut off (its instance stopped: ``interrupted``) is answered again by a run of
    its own: the history leaves out its end mark ("could not be finished") and its items, gives
    its message the id the tab gave it (the next run is drawn after it) and looks for that run
    (found by tests/test_cluster_chaos_web.py: such an answer stayed "unfinished" and the
    answer given in its place never reached the tab)."""
    from pluto.providers.web.socket import Connection

    looked: list[tuple[str, str]] = []
    conn = Connection.__new__(Connection)
    conn.client = type("C", (), {"chat_id": "v"})()  # type: ignore[assignment]
    conn.p = type("P", (), {"await_answer": lambda self, c, m: looked.append((c, m))})()  # type: ignore[assignment]
    items = [{"role": "user", "text": "hi", "run_id": "r1"},
             {"role": "assistant", "text": "Hello.", "run_id": "r1"},
             {"role": "user", "text": "more", "run_id": "r2"},
             {"role": "tool", "text": "", "run_id": "r2", "name": "t", "details": {}},
             {"role": "run.end", "run_id": "r2", "outcome": "interrupted", "text": "",
              "error": "This answer could not be finished.", "source_id": "v:m7"},
             {"role": "run.end", "run_id": "r3", "outcome": "error", "text": "", "error": "x"}]
    shown = conn._cut_off(items, "v:")
    assert shown == [{"role": "user", "text": "hi", "run_id": "r1"},
                     {"role": "assistant", "text": "Hello.", "run_id": "r1"},
                     {"role": "user", "text": "more", "run_id": "r2", "id": "m7"},
                     {"role": "run.end", "run_id": "r3", "outcome": "error", "text": "",
                      "error": "x"}]
    assert looked == [("v", "v:m7")]


async def test_a_tab_that_joins_sees_the_messages_queued_behind_the_running_one(
        config_dir, data_dir, monkeypatch) -> None:
    """Messages a tab sent while the chat's run goes on are taken up at once — queued behind
    it, their runs recorded (the inbox counts them handled) — yet in no transcript until their
    turn. A tab that (re)joins then shows them with the tab's ids, and each answer as it
    comes (found by tests/test_cluster_chaos_web.py: such a message vanished from a tab that
    reconnected, and its answer never reached it)."""
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    model = Gated(on=0, fallback=lambda m: Scripted(text=f"echo: {m[-1]['content']}"))
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        first = await Tab.open(http, gw)
        for i in range(3):
            await first.send(type="message", id=f"m{i}", text=f"message {i}")
        for i in range(3):
            await first.until("ack", lambda f, i=i: f["reply_to"] == f"m{i}")
        await asyncio.wait_for(model.waiting.wait(), 10)  # message 0 answered, 1 and 2 queued
        await first.ws.close()
        tab = await Tab.open(http, gw, token=first.ready["token"])
        users = [(m.get("id"), m["text"]) for m in tab.history if m["role"] == "user"]
        assert users == [("m0", "message 0"), ("m1", "message 1"), ("m2", "message 2")], \
            tab.history
        model.gate.set()
        finals = [await tab.until("message.final", timeout=30) for _ in range(3)]
        starts = {f["run_id"]: f.get("message_id") for f in tab.of("run.start")}
        assert {starts.get(f["run_id"]): f["text"] for f in finals} == {
            f"m{i}": f"echo: message {i}" for i in range(3)}, (starts, finals)
        await asyncio.sleep(0)
        assert len(tab.of("message.final")) == 3  # each once
