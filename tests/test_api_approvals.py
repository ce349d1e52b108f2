"""Approvals on the HTTP API (issue 33, docs/approvals.md): a step whose run waits for a person
shows the request (status ``awaiting_approval``); ``POST …/approve`` / ``…/deny`` decide it as
the task's user and the step continues with the resumed run, to its answer (GET and SSE);
409 with nothing pending, 404 unknown, 403 for a key that did not ask; nobody deciding in time
resumes it too and the step shows that answer; the OpenAPI document says all of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from openapi_spec_validator import validate

from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import ToolContext, ToolResult, tool
from pluto.settings import PlutoConfig
from tests.helpers.served import API_KEY, url, wait_for

OTHER = "other-key-abcdefghijklmnop"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Deleter:
    def __init__(self) -> None:
        self.calls: list[str] = []

        @tool
        async def delete_file(ctx: ToolContext, path: str) -> ToolResult:
            """Delete a file.

            Args:
                path: The file.
            """
            self.calls.append(path)
            return ToolResult(f"deleted {path}")

        self.tool = delete_file


@asynccontextmanager
async def gateway(config_dir: Path, data_dir: Path, model: ScriptedModel, deleter: Deleter,
                  timeout: int = 300) -> AsyncIterator[Gateway]:
    agent = config_dir / "agents" / "default" / "agent.yaml"
    spec = yaml.safe_load(agent.read_text())
    agent.write_text(yaml.safe_dump({**spec, "tools": [*spec.get("tools", []), "delete_file"],
                                     "approval": {"delete_file": "always"},
                                     "approval_timeout": timeout}))
    cfg = PlutoConfig(data_dir=data_dir, providers={
        "api": {"enabled": True, "keys_env": "PLUTO_TEST_API_KEYS"}})
    gw = Gateway(config_dir, config=cfg, model_factory=model, serve=True,
                 http_bind=("127.0.0.1", 0), tools={"delete_file": deleter.tool})
    async with gw:
        await wait_for(lambda: gw.health["api"].state == "running")
        yield gw


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"{OTHER}, {API_KEY}")


def scripted(*answers: str) -> ScriptedModel:
    return ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "delete_file",
                                                       '{"path": "/srv/old.log"}')]),
                         *(Scripted(text=a) for a in answers))


async def call(http: aiohttp.ClientSession, gw: Gateway, method: str, path: str,
               body: Any = None, *, key: str = API_KEY, raw: bytes | None = None,
               ) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    async with http.request(method, url(gw, path), data=data,
                            headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.json()


async def sse(http: aiohttp.ClientSession, gw: Gateway, events_url: str) -> list[str]:
    """The event names of a whole stream."""
    names = []
    async with http.get(url(gw, events_url), headers=AUTH) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"event: "):
                names.append(line.decode().split(": ", 1)[1].strip())
    return names


async def waiting_task(http: aiohttp.ClientSession, gw: Gateway) -> dict[str, Any]:
    status, task = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=10",
                              {"input": "delete the old log"})
    assert status == 201, task
    return task


async def test_approve_continues_the_step_to_its_answer(config_dir, data_dir):
    deleter = Deleter()
    async with gateway(config_dir, data_dir, scripted("Deleted old.log."), deleter) as gw, \
            aiohttp.ClientSession() as http:
        task = await waiting_task(http, gw)
        step = task["last_step"]
        assert step["status"] == "awaiting_approval" and step["outcome"] == "awaiting_approval"
        assert not step["is_last"]
        approval = step["approval"]
        assert approval["tool"] == "delete_file" and "/srv/old.log" in approval["arguments"]
        assert approval["expires_at"] > 0 and approval["approvers"]
        base = f"/api/v1/agent/tasks/{task['task_id']}/steps/{step['step_id']}"
        assert approval["approve_url"] == f"{base}/approve"
        assert approval["commands"] == [f"/approve {approval['approval_id']}",
                                        f"/deny {approval['approval_id']}"]
        first_run = step["run_id"]
        assert (await sse(http, gw, step["events_url"]))[-2:] == ["approval.request", "run.end"]
        assert deleter.calls == []
        # another key's task is not this key's to decide (nor to see)
        status, body = await call(http, gw, "POST", f"{base}/approve", key=OTHER)
        assert status == 404, body
        status, body = await call(http, gw, "POST", f"{base}/approve")
        assert status == 200, body
        assert body["run_id"] != first_run and body["step_id"] == step["step_id"]
        events = await sse(http, gw, body["events_url"])  # the resumed run, to its answer
        assert events[:2] == ["run.start", "approval.decision"] and events[-1] == "run.end"
        assert "message.final" in events
        # the paused run's stream is still the task's to read
        assert (await sse(http, gw, step["events_url"]))[-1] == "run.end"
        status, done = await call(http, gw, "GET", base)
        assert done["status"] == "completed" and done["output"] == "Deleted old.log."
        assert done["approval"] is None and done["is_last"]
        assert deleter.calls == ["/srv/old.log"]
        # decided: nothing pending any more
        status, body = await call(http, gw, "POST", f"{base}/approve")
        assert status == 409 and body["code"] == "not_waiting", body
        assert deleter.calls == ["/srv/old.log"]


async def test_deny_with_a_reason_tells_the_model(config_dir, data_dir):
    deleter = Deleter()
    model = scripted("Understood, I left it.")
    async with gateway(config_dir, data_dir, model, deleter) as gw, \
            aiohttp.ClientSession() as http:
        task = await waiting_task(http, gw)
        base = f"/api/v1/agent/tasks/{task['task_id']}/steps/{task['last_step']['step_id']}"
        for raw, wanted in ((b"[1]", "JSON object"), (b'{"why": "x"}', "Unknown field"),
                            (b'{"reason": 5}', "'reason'"),
                            (json.dumps({"reason": "x" * 301}).encode(), "'reason'")):
            status, body = await call(http, gw, "POST", f"{base}/deny", raw=raw)
            assert status == 400 and wanted in body["error"], body
        status, body = await call(http, gw, "POST", f"{base}/deny",
                                  {"reason": "that file is\nstill needed"})
        assert status == 200, body
        await wait_for(lambda: _completed(http, gw, base))
        told = [str(m.get("content")) for m in model.calls[-1] if m["role"] == "tool"]
        assert any("denied" in t and "that file is still needed" in t for t in told), told
        assert deleter.calls == []


async def _completed(http: aiohttp.ClientSession, gw: Gateway, base: str) -> bool:
    status, step = await call(http, gw, "GET", base)
    return step["status"] == "completed" and step["output"] == "Understood, I left it."


async def test_nothing_pending_is_409_and_unknown_is_404(config_dir, data_dir):
    model = ScriptedModel(fallback=lambda m: Scripted(text="plain answer"))
    async with gateway(config_dir, data_dir, model, Deleter()) as gw, \
            aiohttp.ClientSession() as http:
        status, task = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=10",
                                  {"input": "hello"})
        assert task["last_step"]["status"] == "completed" and \
            task["last_step"]["approval"] is None
        base = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        status, body = await call(http, gw, "POST", f"{base}/{task['last_step']['step_id']}"
                                  "/approve")
        assert status == 409 and body["code"] == "not_waiting"
        status, body = await call(http, gw, "POST", f"{base}/{'0' * 32}/deny")
        assert status == 404
        status, body = await call(http, gw, "POST",
                                  f"/api/v1/agent/tasks/{'0' * 32}/steps/{'0' * 32}/approve")
        assert status == 404
        async with http.post(url(gw, f"{base}/{task['last_step']['step_id']}/approve")) as r:
            assert r.status == 401


@pytest.mark.slow
async def test_nobody_deciding_in_time_the_step_shows_the_resumed_answer(config_dir, data_dir):
    deleter = Deleter()
    model = scripted("Nobody approved, so I did nothing.")
    async with gateway(config_dir, data_dir, model, deleter, timeout=1) as gw, \
            aiohttp.ClientSession() as http:
        gw.approval_sweep.every = 0.05
        task = await waiting_task(http, gw)
        base = f"/api/v1/agent/tasks/{task['task_id']}/steps/{task['last_step']['step_id']}"

        async def answered() -> bool:
            await gw.approval_sweep.look()
            status, step = await call(http, gw, "GET", base)
            return step["status"] == "completed" and \
                step["output"] == "Nobody approved, so I did nothing."
        await wait_for(answered, timeout=15)
        status, body = await call(http, gw, "POST", f"{base}/approve")
        assert status == 409
        assert deleter.calls == []


async def test_the_openapi_document_describes_approvals(config_dir, data_dir):
    async with gateway(config_dir, data_dir, ScriptedModel(), Deleter()) as gw, \
            aiohttp.ClientSession() as http:
        async with http.get(url(gw, "/api/v1/openapi.json")) as resp:
            doc = await resp.json()
    validate(doc)
    schemas = doc["components"]["schemas"]
    assert "awaiting_approval" in schemas["Step"]["properties"]["status"]["enum"]
    assert "approval" in schemas["Step"]["required"]
    assert set(schemas["Approval"]["required"]) >= {"approval_id", "tool", "arguments",
                                                    "expires_at"}
    for verb in ("approve", "deny"):
        op = doc["paths"][f"/api/v1/agent/tasks/{{task_id}}/steps/{{step_id}}/{verb}"]["post"]
        assert {"200", "404", "409"} <= set(op["responses"])
