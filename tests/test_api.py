"""The HTTP API against a real gateway on loopback: auth, tasks and steps through the pipeline,
the live event stream, bad input, and schemathesis holding the handlers to the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate

from pluto.errors import ConfigError
from pluto.providers.api.auth import ApiSettings, load_keys
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.gateway import write_agent
from tests.helpers.served import API_KEY, served, url, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel(fallback=lambda m: Scripted(
        text=f"answer to: {m[-1]['content']} ({sum(x['role'] == 'user' for x in m)} asked)"))


@pytest.fixture
def keys(monkeypatch) -> None:
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"other-key-abcdefghijklmnop, {API_KEY}")


@pytest.fixture
async def gw(config_dir, data_dir, model, keys):
    async with served(config_dir, data_dir, model) as gateway:
        yield gateway


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def call(http: aiohttp.ClientSession, gw: Any, method: str, path: str, body: Any = None,
               *, headers: dict[str, str] | None = None, raw: bytes | None = None,
               ) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    async with http.request(method, url(gw, path), data=data,
                            headers=AUTH if headers is None else headers) as resp:
        text = await resp.text()
        assert resp.content_type == "application/json", text
        return resp.status, json.loads(text)


async def sse(http: aiohttp.ClientSession, gw: Any, run_id: str,
              headers: dict[str, str] | None = None, query: str = "") -> list[dict[str, Any]]:
    """Read a whole event stream: [{"id", "event", "data"}]."""
    events, current = [], {}
    async with http.get(url(gw, f"/api/v1/agent/{run_id}/events{query}"),
                        headers={**AUTH, **(headers or {})}) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        async for line in resp.content:
            text = line.decode().rstrip("\n")
            if not text:
                if current:
                    events.append(current)
                current = {}
            elif not text.startswith(":"):
                key, _, value = text.partition(": ")
                current[key] = json.loads(value) if key == "data" else value
    return events


async def test_every_route_needs_a_valid_key(gw, http):
    for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"},
                    {"Authorization": f"Basic {API_KEY}"}, {"Authorization": "Bearer "}):
        for method, path in (("GET", "/api/v1/agents"), ("POST", "/api/v1/agent/tasks"),
                             ("GET", "/api/v1/agent/tasks/" + "0" * 32),
                             ("GET", "/api/v1/agent/" + "0" * 32 + "/events")):
            async with http.request(method, url(gw, path), headers=headers,
                                    data=b'{"input": "x"}') as resp:
                assert resp.status == 401, (headers, path)
                assert (await resp.json())["code"] == "unauthorized"
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    status, doc = await call(http, gw, "GET", "/api/v1/openapi.json", headers={})
    assert status == 200 and doc["openapi"] == "3.1.0"
    validate(doc)


async def test_a_task_runs_through_the_pipeline_and_continues_in_steps(gw, http, model):
    status, task = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=10",
                              {"input": "first question", "additional_input": {"ref": 7}})
    assert status == 201 and task["agent"] == "default"
    step = task["last_step"]
    assert step["status"] == "completed" and step["outcome"] == "ok" and step["is_last"]
    assert step["output"] == "answer to: first question (1 asked)"
    assert step["events_url"] == f"/api/v1/agent/{step['run_id']}/events"
    assert step["additional_output"]["usage"]["total_tokens"] > 0
    status, second = await call(http, gw, "POST",
                                f"/api/v1/agent/tasks/{task['task_id']}/steps?wait=10",
                                {"input": "second question"})
    assert status == 201 and second["output"] == "answer to: second question (2 asked)"
    status, listed = await call(http, gw, "GET", f"/api/v1/agent/tasks/{task['task_id']}/steps")
    assert [s["input"] for s in listed["steps"]] == ["first question", "second question"]
    assert listed["pagination"] == {"total_items": 2, "total_pages": 1, "current_page": 1,
                                    "page_size": 20}
    status, again = await call(http, gw, "GET", f"/api/v1/agent/tasks/{task['task_id']}")
    assert again["last_step"]["step_id"] == second["step_id"]
    assert again["additional_input"] == {"ref": 7}
    status, one = await call(http, gw, "GET", f"/api/v1/agent/tasks/{task['task_id']}/steps/"
                             f"{step['step_id']}")
    assert status == 200 and one["output"] == step["output"]
    # the same storage as every chat: a session, runs and their events
    run = await gw.store.conversations.run(second["run_id"])
    assert run is not None and run.status == "ok"
    status, tasks = await call(http, gw, "GET", "/api/v1/agent/tasks?page_size=1")
    assert tasks["pagination"]["total_items"] == 1 and tasks["tasks"][0]["task_id"] == \
        task["task_id"]


async def test_commands_answer_a_step_without_a_run(gw, http, model):
    status, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "/help"})
    step = task["last_step"]
    assert status == 201 and step["run_id"] is None and step["status"] == "completed"
    assert "/new" in step["output"] and step["outcome"] == "ok" and model.calls == []


async def test_the_event_stream_replays_then_follows_without_gaps(config_dir, data_dir, keys,
                                                                  http):
    slow = ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "current_time", "{}")]),
                         Scripted(text="it is late, " * 10, chunk=4, delay=0.02))
    async with served(config_dir, data_dir, slow) as gw:
        status, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "time?"})
        step = task["last_step"]
        run_id = await wait_for(lambda: _run_id(gw, http, task["task_id"], step["step_id"]))
        await wait_for(lambda: _has_deltas(gw, run_id))
        live = await sse(http, gw, run_id)  # joins in the middle of the answer
        types = [e["event"] for e in live]
        assert types[:4] == ["run.start", "tool.start", "tool.end", "message.delta"]
        assert types[-2:] == ["message.final", "run.end"]
        assert [int(e["id"]) for e in live] == list(range(1, len(live) + 1))
        assert [e["data"]["seq"] for e in live] == list(range(1, len(live) + 1))
        text = "".join(e["data"]["text"] for e in live if e["event"] == "message.delta")
        assert text == live[-2]["data"]["text"] == "it is late, " * 10
        assert live[2]["data"]["details"]["text"]
        late = await sse(http, gw, run_id)  # after the end: the stored events, then it closes
        assert late == live
        resumed = await sse(http, gw, run_id, headers={"Last-Event-ID": "3"})
        assert resumed == live[3:]
        assert await sse(http, gw, run_id, query="?after=5") == live[5:]


async def _run_id(gw, http, task_id, step_id):
    status, step = await call(http, gw, "GET", f"/api/v1/agent/tasks/{task_id}/steps/{step_id}")
    return step["run_id"]


async def _has_deltas(gw, run_id):
    return any(e.type == "message.delta" for e in await gw.store.conversations.events(run_id))


async def test_stopping_a_task_cancels_its_run_and_keeps_the_partial_answer(
        config_dir, data_dir, keys, http):
    slow = ScriptedModel(Scripted(text="word " * 200, chunk=5, delay=0.02))
    async with served(config_dir, data_dir, slow) as gw:
        _, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "ramble"})
        run_id = await wait_for(lambda: _run_id(gw, http, task["task_id"],
                                                task["last_step"]["step_id"]))
        await wait_for(lambda: _has_deltas(gw, run_id))
        watching = asyncio.create_task(sse(http, gw, run_id))  # live when the run is stopped
        await wait_for(lambda: gw.feed.watched(run_id))
        status, stop = await call(http, gw, "POST",
                                  f"/api/v1/agent/tasks/{task['task_id']}/steps",
                                  {"input": "/stop"})
        assert status == 201 and stop["output"] == "Stopped." and stop["run_id"] is None
        events = await asyncio.wait_for(watching, 10)
        assert events[-1]["event"] == "run.end" and events[-1]["data"]["outcome"] == "cancelled"
        assert events == await sse(http, gw, run_id)
        _, first = await call(http, gw, "GET", f"/api/v1/agent/tasks/{task['task_id']}/steps/"
                              f"{task['last_step']['step_id']}")
        assert first["outcome"] == "cancelled" and first["output"].startswith("word")
        assert len(first["output"]) < len("word " * 200)


async def test_a_full_queue_answers_the_step_with_the_notice(config_dir, data_dir, keys, http):
    slow = ScriptedModel(fallback=lambda m: Scripted(text="slow " * 20, chunk=5, delay=0.02))
    async with served(config_dir, data_dir, slow, gateway={"max_queued_per_session": 1}) as gw:
        _, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "one"})
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        await wait_for(lambda: _run_id(gw, http, task["task_id"], task["last_step"]["step_id"]))
        _, queued = await call(http, gw, "POST", path, {"input": "two"})
        _, refused = await call(http, gw, "POST", path, {"input": "three"})
        assert queued["status"] == "created" and queued["run_id"]  # its run waits its turn
        assert refused["status"] == "completed" and refused["outcome"] == "error"
        assert "still working" in refused["error"]
        queued = await wait_for(lambda: _step_if_done(gw, http, f"{path}/{queued['step_id']}"))
        assert queued["outcome"] == "ok" and queued["output"].startswith("slow")
        _, done = await call(http, gw, "POST", path + "?wait=10", {"input": "four"})
        assert done["outcome"] == "ok"


async def _step_if_done(gw, http, path):
    _, step = await call(http, gw, "GET", path)
    return step if step["status"] == "completed" else None


async def test_steps_dropped_by_stop_say_so(config_dir, data_dir, keys, http):
    slow = ScriptedModel(fallback=lambda m: Scripted(text="slow " * 100, chunk=5, delay=0.02))
    async with served(config_dir, data_dir, slow) as gw:
        _, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "one"})
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        await wait_for(lambda: _run_id(gw, http, task["task_id"], task["last_step"]["step_id"]))
        _, queued = await call(http, gw, "POST", path, {"input": "two"})
        _, stop = await call(http, gw, "POST", path, {"input": "/stop"})
        assert stop["output"] == "Stopped and dropped 1 waiting message(s)."
        dropped = await wait_for(lambda: _step_if_done(gw, http, f"{path}/{queued['step_id']}"))
        assert dropped["outcome"] == "cancelled" and "dropped by /stop" in dropped["error"]
        assert dropped["run_id"] == queued["run_id"]  # known from the moment it was posted


@pytest.mark.parametrize(("raw", "message"), [
    (b"", "empty"), (b"{not json", "not valid JSON"), (b"[1]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"), (b"{}", "'input' must be a string"),
    (b'{"input": 42}', "'input' must be a string"), (b'{"input": " \\n "}', "'input' is empty"),
    (b'{"input": "\\ud800"}', "not valid Unicode"), (b'{"input": "x", "agnet": "a"}',
                                                      "Unknown field 'agnet'"),
    (b'{"input": "x", "agent": "../etc"}', "'agent' must be"),
    (b'{"input": "x", "additional_input": [1]}', "'additional_input' must be"),
    (b'{"input": "' + b"x" * 32_001 + b'"}', "too long"),
    (b'\xff\xfe', "not valid JSON"),
])
async def test_malformed_bodies_get_400_with_a_clear_error(gw, http, raw, message):
    status, body = await call(http, gw, "POST", "/api/v1/agent/tasks", raw=raw)
    assert status == 400 and message in body["error"] and body["code"] == "bad_request"


async def test_other_bad_requests(gw, http):
    status, body = await call(http, gw, "POST", "/api/v1/agent/tasks", raw=b"x" * 300_000)
    assert status == 413 and body["code"] == "too_large"
    for query in ("?page=0", "?page_size=101", "?page=abc"):
        status, body = await call(http, gw, "GET", "/api/v1/agent/tasks" + query)
        assert status == 400 and "whole number" in body["error"]
    status, body = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=99", {"input": "x"})
    assert status == 400
    status, body = await call(http, gw, "GET", "/api/v1/agent/tasks?pgae=2")
    assert status == 400 and "Unknown query parameter 'pgae'" in body["error"]
    status, body = await call(http, gw, "POST", "/api/v1/agent/tasks",
                              {"input": "x", "agent": "nobody"})
    assert status == 404 and "no agent 'nobody'" in body["error"]
    for path in ("/api/v1/agent/tasks/" + "a" * 32, "/api/v1/agent/tasks/nope/steps",
                 "/api/v1/agent/" + "b" * 32 + "/events"):
        status, body = await call(http, gw, "GET", path)
        assert status == 404 and body["code"] == "not_found", path
    _, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "/help"})
    status, _ = await call(http, gw, "GET",
                           f"/api/v1/agent/tasks/{task['task_id']}/steps/{'c' * 32}")
    assert status == 404


async def test_the_agent_is_a_routing_hint_the_routes_must_agree_with(config_dir, data_dir,
                                                                       keys, http, model):
    write_agent(config_dir, "sales", "description: Sells.\n")
    write_agent(config_dir, "hidden", "description: Not for the API.\n")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - match: {provider: api, guild: sales}\n    agent: sales\n"
        "  - match: {provider: api, text_prefix: forbidden}\n    deny: true\n"
        "default: default\n")
    async with served(config_dir, data_dir, model) as gw:
        _, agents = await call(http, gw, "GET", "/api/v1/agents")
        assert {a["name"]: a["reachable"] for a in agents["agents"]} == {
            "cook": False, "default": True, "hidden": False, "sales": True}
        status, task = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=10",
                                  {"input": "a deal?", "agent": "sales"})
        assert status == 201 and task["agent"] == "sales"
        assert task["last_step"]["output"].startswith("answer to: a deal?")
        _, step = await call(http, gw, "POST",
                             f"/api/v1/agent/tasks/{task['task_id']}/steps?wait=10",
                             {"input": "and another?"})
        assert step["output"] == "answer to: and another? (2 asked)"
        status, body = await call(http, gw, "POST", "/api/v1/agent/tasks",
                                  {"input": "hi", "agent": "hidden"})
        assert status == 403 and "guild: hidden" in body["error"]
        status, body = await call(http, gw, "POST", "/api/v1/agent/tasks",
                                  {"input": "forbidden words"})
        assert status == 403 and body["code"] == "not_routed"


async def test_rate_limits_count_per_key_and_every_step_gets_an_answer(
        config_dir, data_dir, keys, http, model):
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - match: {provider: api}\n    agent: default\n"
        "    rate_limit: {user: 1/minute}\ndefault: default\n")
    async with served(config_dir, data_dir, model) as gw:
        async def task(key: str) -> dict[str, Any]:
            status, body = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=10",
                                      {"input": "hi"}, headers={"Authorization": f"Bearer {key}"})
            assert status == 201
            return body["last_step"]
        assert (await task(API_KEY))["outcome"] == "ok"
        told = await task(API_KEY)
        assert told["outcome"] == "error" and "limit" in told["error"].lower()
        silent = await task(API_KEY)  # the limit speaks once; the step still gets an answer
        assert silent["status"] == "completed" and "did not take" in silent["error"]
        assert (await task("other-key-abcdefghijklmnop"))["outcome"] == "ok"


def test_api_keys_must_be_long_enough(monkeypatch):
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", "short")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_keys(ApiSettings(keys_env="PLUTO_TEST_API_KEYS"))
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", " , ")
    assert load_keys(ApiSettings(keys_env="PLUTO_TEST_API_KEYS")) == []


async def test_without_keys_the_api_refuses_everyone(config_dir, data_dir, http, monkeypatch):
    monkeypatch.delenv("PLUTO_TEST_API_KEYS", raising=False)
    async with served(config_dir, data_dir) as gw:
        status, body = await call(http, gw, "GET", "/api/v1/agents")
        assert status == 401 and "no keys" in body["error"]


# schemathesis: every operation, generated requests, every response checked against the document


class LiveGateway:
    """A served gateway on its own event loop in a thread, for synchronous clients."""

    def __init__(self, config_dir: Path, data_dir: Path):
        self.config_dir, self.data_dir = config_dir, data_dir
        self.base = ""
        self._up = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        model = ScriptedModel(fallback=lambda m: Scripted(text="fine | thanks\n---|---\n1 | 2"))
        async with served(self.config_dir, self.data_dir, model) as gw:
            self.base = url(gw)
            self._up.set()
            await self._stop.wait()

    def __enter__(self) -> LiveGateway:
        self._thread.start()
        if not self._up.wait(30):
            raise RuntimeError("the gateway did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveGateway]:
    import shutil
    root = tmp_path_factory.mktemp("live")
    shutil.copytree(ROOT / "config", root / "config")
    os.environ["PLUTO_TEST_API_KEYS"] = API_KEY
    try:
        with LiveGateway(root / "config", root / "data") as gateway:
            yield gateway
    finally:
        del os.environ["PLUTO_TEST_API_KEYS"]


@pytest.fixture
def api_schema(live: LiveGateway) -> Any:
    schema = schemathesis.openapi.from_url(f"{live.base}/api/v1/openapi.json")
    # schemathesis sends one generated Idempotency-Key with different bodies: 422 by design
    schema.config.checks.positive_data_acceptance.expected_statuses.append("422")
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_answers_as_its_openapi_document_says(case: Any, live: LiveGateway) -> None:
    case.call_and_validate(base_url=live.base, headers=AUTH)


async def test_a_step_posted_without_wait_has_its_run_id_at_once(config_dir, data_dir, keys,
                                                                 http):
    slow = ScriptedModel(fallback=lambda m: Scripted(text="slow " * 40, chunk=5, delay=0.02))
    async with served(config_dir, data_dir, slow) as gw:
        status, task = await call(http, gw, "POST", "/api/v1/agent/tasks", {"input": "one"})
        step = task["last_step"]
        assert status == 201 and step["run_id"] and step["status"] in ("created", "running")
        assert step["events_url"] == f"/api/v1/agent/{step['run_id']}/events"
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        _, queued = await call(http, gw, "POST", path, {"input": "two"})  # behind the first
        assert queued["run_id"] and queued["status"] == "created"
        events = await sse(http, gw, queued["run_id"])  # follow it before it even started
        assert [e["event"] for e in events][0] == "run.start"
        assert events[-1]["event"] == "run.end" and events[-1]["data"]["outcome"] == "ok"
        done = await _step_if_done(gw, http, f"{path}/{queued['step_id']}")
        assert done is not None and done["output"].startswith("slow")
