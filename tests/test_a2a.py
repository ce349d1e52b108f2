"""A2A at the URL each agent card advertises: JSON-RPC message/send, message/stream (SSE),
tasks/get and tasks/cancel with the HTTP API's keys, through the same pipeline; the card is
not served for an agent its URL could not answer."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from tests.helpers.served import API_KEY, served, url

AUTH = {"Authorization": f"Bearer {API_KEY}"}
OTHER = {"Authorization": "Bearer other-key-abcdefghijklmnop"}
SQL = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 1"


def answer(messages: list[dict[str, Any]]) -> Scripted:
    asked = sum(m["role"] == "user" for m in messages)
    return Scripted(text=f"answer to: {messages[-1]['content']} ({asked} asked)")


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel(fallback=answer)


@pytest.fixture
async def gw(config_dir, data_dir, model, monkeypatch):
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"other-key-abcdefghijklmnop, {API_KEY}")
    async with served(config_dir, data_dir, model) as gateway:
        yield gateway


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def card_url(http: aiohttp.ClientSession, gw: Any, agent: str = "default") -> str:
    async with http.get(url(gw, f"/agents/{agent}/.well-known/agent-card.json")) as resp:
        assert resp.status == 200
        card = await resp.json()
    assert card["preferredTransport"] == "JSONRPC" and card["security"] == [{"bearer": []}]
    return card["url"]


async def rpc(http: aiohttp.ClientSession, target: str, method: str, params: Any, *,
              headers: dict[str, str] = AUTH, rid: Any = 1) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    async with http.post(target, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] == rid
    return answer


def message(text: str, **extra: Any) -> dict[str, Any]:
    return {"message": {"kind": "message", "messageId": "m-" + text[:8], "role": "user",
                        "parts": [{"kind": "text", "text": text}], **extra}}


async def test_message_send_answers_and_a_context_continues(gw, http) -> None:
    target = await card_url(http, gw)
    first = (await rpc(http, target, "message/send", message("first question")))["result"]
    assert first["kind"] == "task" and first["status"]["state"] == "completed"
    assert first["artifacts"][0]["parts"] == [{"kind": "text",
                                               "text": "answer to: first question (1 asked)"}]
    assert [m["role"] for m in first["history"]] == ["user", "agent"]
    second = (await rpc(http, target, "message/send",
                        message("second question", contextId=first["contextId"])))["result"]
    assert second["contextId"] == first["contextId"] and second["id"] != first["id"]
    assert second["artifacts"][0]["parts"][0]["text"] == "answer to: second question (2 asked)"
    got = (await rpc(http, target, "tasks/get", {"id": first["id"]}))["result"]
    assert got["id"] == first["id"] and got["status"]["state"] == "completed"
    # another key sees neither the task nor the context
    hidden = await rpc(http, target, "tasks/get", {"id": first["id"]}, headers=OTHER)
    assert hidden["error"]["code"] == -32001
    foreign = await rpc(http, target, "message/send",
                        message("hi", contextId=first["contextId"]), headers=OTHER)
    assert foreign["error"]["code"] == -32602
    ended = await rpc(http, target, "tasks/cancel", {"id": first["id"]})
    assert ended["error"]["code"] == -32002


async def test_a_chart_is_a_file_artifact_fetched_with_the_same_key(config_dir, data_dir,
                                                                    http, monkeypatch) -> None:
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    model = ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "make_chart", json.dumps(
        {"sql": SQL, "kind": "bar"}))]), Scripted(text="Here it is."))
    async with served(config_dir, data_dir, model) as gw:
        target = await card_url(http, gw)
        task = (await rpc(http, target, "message/send", message("chart it")))["result"]
        answer, chart = task["artifacts"]
        assert answer["parts"][0]["text"] == "Here it is."
        [part] = chart["parts"]
        assert part["kind"] == "file" and part["file"]["mimeType"] == "image/png"
        assert part["file"]["uri"].startswith(url(gw, f"/api/v1/agent/tasks/"
                                                      f"{task['contextId']}/artifacts/"))
        assert str(data_dir) not in json.dumps(task)
        async with http.get(part["file"]["uri"], headers=AUTH) as resp:
            assert resp.status == 200 and (await resp.read())[:4] == b"\x89PNG"
        # streamed: the chart is an artifact-update of its own, before the answer's
        model.turns.extend([Scripted(tool_calls=[ToolCall("c2", "make_chart", json.dumps(
            {"sql": SQL, "kind": "pie"}))]), Scripted(text="Again.")])
        body = {"jsonrpc": "2.0", "id": 9, "method": "message/stream",
                "params": message("once more", contextId=task["contextId"])}
        async with http.post(target, json=body, headers=AUTH) as resp:
            stream = (await resp.read()).decode()
        updates = [json.loads(line[6:])["result"] for line in stream.splitlines()
                   if line.startswith("data: ")]
        files = [u["artifact"]["parts"][0] for u in updates if u["kind"] == "artifact-update"]
        assert [f["kind"] for f in files] == ["file", "text"]
        assert files[0]["file"]["mimeType"] == "image/png" and str(data_dir) not in stream


async def test_message_stream_sends_the_task_then_updates_then_a_final_status(gw, http) -> None:
    target = await card_url(http, gw)
    body = {"jsonrpc": "2.0", "id": "s1", "method": "message/stream",
            "params": message("stream me")}
    async with http.post(target, json=body, headers=AUTH) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        text = (await resp.read()).decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert all(e["jsonrpc"] == "2.0" and e["id"] == "s1" for e in events)
    results = [e["result"] for e in events]
    assert results[0]["kind"] == "task"  # as it is when the stream starts (a quick run: done)
    [answer] = [r for r in results if r["kind"] == "artifact-update"]
    assert answer["artifact"]["parts"][0]["text"] == "answer to: stream me (1 asked)"
    last = results[-1]
    assert last["kind"] == "status-update" and last["final"] is True
    assert last["status"]["state"] == "completed" and last["taskId"] == results[0]["id"]


async def test_a_non_blocking_send_answers_at_once_and_tasks_get_follows(gw, http,
                                                                         model) -> None:
    model.turns.append(Scripted(text="slowly", delay=0.05))
    target = await card_url(http, gw)
    task = (await rpc(http, target, "message/send",
                      {**message("take your time"), "configuration": {"blocking": False}}))
    state = task["result"]["status"]["state"]
    assert state in ("submitted", "working", "completed")
    # polled until done (a client's loop; the run ends on its own)
    for _ in range(500):
        got = (await rpc(http, target, "tasks/get", {"id": task["result"]["id"]}))["result"]
        if got["status"]["state"] == "completed":
            break
    assert got["status"]["state"] == "completed"


@pytest.mark.parametrize(("raw", "code"), [
    (b"{not json", -32700),
    (b"[]", -32600),
    (json.dumps({"jsonrpc": "1.0", "id": 1, "method": "message/send"}).encode(), -32600),
    (json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tasks/list", "params": {}}).encode(),
     -32601),
    (json.dumps({"jsonrpc": "2.0", "id": 3, "method": "message/send",
                 "params": {"message": {"role": "user", "messageId": "x", "parts": [
                     {"kind": "file", "file": {"uri": "http://x/y"}}]}}}).encode(), -32005),
    (json.dumps({"jsonrpc": "2.0", "id": 4, "method": "message/send",
                 "params": {"message": {"role": "user", "messageId": "x",
                                        "parts": []}}}).encode(), -32602),
    (json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tasks/pushNotificationConfig/set",
                 "params": {}}).encode(), -32003),
    (json.dumps({"jsonrpc": "2.0", "id": 6, "method": "tasks/get",
                 "params": {"id": "nope"}}).encode(), -32001),
])
async def test_bad_requests_get_json_rpc_errors(gw, http, raw: bytes, code: int) -> None:
    target = await card_url(http, gw)
    async with http.post(target, data=raw, headers=AUTH) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert answer["error"]["code"] == code and answer["error"]["message"]


async def test_keys_and_agents_are_checked_over_http(gw, http) -> None:
    target = await card_url(http, gw)
    async with http.post(target, json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                                       "params": {"id": "x"}}) as resp:
        assert resp.status == 401
    async with http.post(url(gw, "/agents/ghost"), json={}, headers=AUTH) as resp:
        assert resp.status == 404
    async with http.get(target, headers=AUTH) as resp:
        assert resp.status == 405  # JSON-RPC is POSTed


async def test_without_the_api_no_card_advertises_a_dead_url(config_dir, data_dir,
                                                             http) -> None:
    cfg = PlutoConfig(data_dir=data_dir, providers={"web": {"enabled": True}})
    async with Gateway(config_dir, config=cfg, model_factory=ScriptedModel(), serve=True,
                       http_bind=("127.0.0.1", 0)) as gw:
        async with http.get(url(gw, "/agents/default/.well-known/agent.json")) as resp:
            assert resp.status == 404
            assert "does not serve A2A: enable providers.api" in (await resp.json())["error"]


async def test_tasks_cancel_stops_a_running_task(gw, http, model) -> None:
    model.turns.append(Scripted(text="a long answer " * 50, chunk=4, delay=0.05))
    target = await card_url(http, gw)
    task = (await rpc(http, target, "message/send",
                      {**message("go on and on"), "configuration": {"blocking": False}}))
    task_id = task["result"]["id"]
    for _ in range(500):  # until its run is under way
        got = (await rpc(http, target, "tasks/get", {"id": task_id}))["result"]
        if got["status"]["state"] == "working":
            break
    cancelled = await rpc(http, target, "tasks/cancel", {"id": task_id})
    assert cancelled["result"]["status"]["state"] == "canceled", cancelled
