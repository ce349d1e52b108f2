"""The admin API: its key, agents CRUD (validated, atomic, persisted), reload, routes, pairing,
runs, and the A2A Agent Card."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.gateway import RecordingProvider

KEY = "a-very-long-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def who_answers(messages: list[dict[str, Any]]) -> Scripted:
    system = messages[0]["content"] if messages[0]["role"] == "system" else "plain"
    return Scripted(text=f"{system}: {messages[-1]['content']}")


async def until(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    async def poll() -> Any:
        while not (value := cond()):
            await asyncio.sleep(0.02)
        return value
    return await asyncio.wait_for(poll(), timeout)


class Admin:
    def __init__(self, gw: Gateway, http: aiohttp.ClientSession, p: RecordingProvider):
        self.gw, self.http, self.p = gw, http, p
        self.url = gw.http.url  # type: ignore[union-attr]

    async def call(self, method: str, path: str, *, json: Any = None, data: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        async with self.http.request(method, self.url + path, json=json, data=data,
                                     headers=AUTH if headers is None else headers) as r:
            body = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body


async def make_admin(config_dir: Path, data_dir: Path, admin: dict[str, Any] | None = None):
    admin = {"api_key_env": "PLUTO_ADMIN_KEY"} if admin is None else admin
    cfg = PlutoConfig(data_dir=data_dir, admin=admin,
                      gateway={"reload_interval_seconds": 0},  # the API serves cards' URLs
                      providers={"api": {"enabled": True, "keys_env": "PLUTO_TEST_API_KEYS"}})
    gw = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                 model_factory=ScriptedModel(fallback=who_answers))
    await gw.start()
    p = RecordingProvider("test")
    gw.add_provider(p)
    await p.running.wait()
    return gw, p


@pytest.fixture
async def admin(config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PLUTO_ADMIN_KEY", KEY)
    gw, p = await make_admin(config_dir, data_dir)
    async with aiohttp.ClientSession() as http:
        yield Admin(gw, http, p)
    await gw.stop()


# the key ------------------------------------------------------------------------------------------

async def test_no_key_wrong_key_right_key(admin: Admin, caplog) -> None:
    status, body = await admin.call("GET", "/admin/agents", headers={})
    assert status == 401 and "valid admin key" in body["error"]
    for wrong in (f"Bearer {KEY}x", "Bearer ", f"Basic {KEY}", KEY, f"Bearer {KEY[:-1]}"):
        async with admin.http.get(admin.url + "/admin/agents",
                                  headers={"Authorization": wrong}) as r:
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    status, body = await admin.call("GET", "/admin/agents")
    assert status == 200 and [a["name"] for a in body["agents"]] == ["cook", "default"]
    status, body = await admin.call("GET", "/admin/")
    assert status == 200 and "/admin/agents/{name}" in body["endpoints"]
    assert KEY not in caplog.text


@pytest.mark.parametrize("admin_cfg, env, words", [
    ({}, None, "set admin.api_key_env in pluto.yaml"),
    ({"api_key_env": "PLUTO_ADMIN_KEY"}, None, "PLUTO_ADMIN_KEY is not set"),
    ({"api_key_env": "PLUTO_ADMIN_KEY"}, "short", "shorter than 16 characters"),
])
async def test_the_admin_api_is_off_without_a_key(config_dir, data_dir, monkeypatch, admin_cfg,
                                                  env, words) -> None:
    if env:
        monkeypatch.setenv("PLUTO_ADMIN_KEY", env)
    gw, _ = await make_admin(config_dir, data_dir, admin_cfg)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.http.url + "/admin/agents",  # type: ignore[union-attr]
                                headers={"Authorization": f"Bearer {env}"}) as r:
                assert r.status == 403 and words in (await r.json())["error"]
            async with http.get(gw.http.url + "/agents/default/.well-known/agent.json") as r:
                assert r.status == 200  # agent cards are public
    finally:
        await gw.stop()


# agents -------------------------------------------------------------------------------------------

SUPPORT = {"agent": {"description": "Answers support questions.", "instructions":
                     "instructions.md", "tools": ["current_time"]},
           "files": {"instructions.md": "I am support"}}


async def test_agents_crud_is_validated_persisted_and_live(admin: Admin, config_dir: Path,
                                                           data_dir: Path) -> None:
    status, body = await admin.call("PUT", "/admin/agents/support", json=SUPPORT)
    assert status == 201 and body["source"] == "api" and body["valid"]
    assert body["files"] == {"instructions.md": "I am support"}
    assert (data_dir / "agents" / "support" / "instructions.md").read_text() == "I am support"
    assert not (data_dir / "agents" / ".staging").exists() or not any(
        (data_dir / "agents" / ".staging").iterdir())
    status, body = await admin.call("GET", "/admin/agents/support")
    assert status == 200 and "Answers support questions." in body["agent_yaml"]
    # route to it, live
    (config_dir / "routes.yaml").write_text("default: support\n")
    status, body = await admin.call("POST", "/admin/reload")
    assert status == 200 and body["status"] == "ok"
    await admin.p.say("hello")
    assert await admin.p.wait_finals(1) == ["I am support: hello"]
    # a broken replacement is refused and changes nothing
    bad = {"agent": {"instructions": "instructions.md", "budget": {"max_seconds": -1}},
           "files": {"instructions.md": "I am broken"}}
    status, body = await admin.call("PUT", "/admin/agents/support", json=bad)
    assert status == 422 and body["error"] == "the agent definition has errors"
    [problem] = body["problems"]
    assert problem["file"] == str(data_dir / "agents" / "support" / "agent.yaml")
    assert (problem["line"], problem["field"]) == (3, "budget.max_seconds")  # as written
    await admin.p.say("still you?")
    assert (await admin.p.wait_finals(2))[-1] == "I am support: still you?"
    # a valid replacement applies to the next message
    status, _ = await admin.call("PUT", "/admin/agents/support", json={
        "agent_yaml": "instructions: instructions.md\n", "files": {"instructions.md": "v2"}})
    assert status == 200
    await admin.p.say("and now?")
    assert (await admin.p.wait_finals(3))[-1] == "v2: and now?"
    # it is in use: deleting it is refused until the routes change
    status, body = await admin.call("DELETE", "/admin/agents/support")
    assert status == 409 and "rules: default" in body["error"]
    (config_dir / "routes.yaml").write_text("default: default\n")
    assert (await admin.call("POST", "/admin/reload"))[0] == 200
    assert (await admin.call("DELETE", "/admin/agents/support"))[0] == 204
    assert (await admin.call("GET", "/admin/agents/support"))[0] == 404
    assert not (data_dir / "agents" / "support").exists()
    assert (await admin.call("DELETE", "/admin/agents/support"))[0] == 404


async def test_config_agents_are_listed_overridden_but_not_deleted(admin: Admin) -> None:
    status, body = await admin.call("DELETE", "/admin/agents/default")
    assert status == 409 and "remove it there" in body["error"]
    status, _ = await admin.call("PUT", "/admin/agents/default", json={
        "agent": {"description": "override", "instructions": "i.md"}, "files": {"i.md": "new"}})
    assert status == 201
    await admin.p.say("hi")
    assert await admin.p.wait_finals(1) == ["new: hi"]
    assert (await admin.call("DELETE", "/admin/agents/default"))[0] == 204  # the override only
    status, body = await admin.call("GET", "/admin/agents")
    assert body["agents"][0]["source"] == "config" and body["total"] == 2  # cook, default
    for name in ("a1", "a2", "a3"):
        await admin.call("PUT", f"/admin/agents/{name}", json={"agent": {}})
    status, body = await admin.call("GET", "/admin/agents?offset=1&limit=2")
    assert [a["name"] for a in body["agents"]] == ["a2", "a3"] and body["total"] == 5


@pytest.mark.parametrize("path, body, status, words", [
    ("/admin/agents/support", "not json", 400, "not valid JSON"),
    ("/admin/agents/support", [1, 2], 400, "must be a JSON object"),
    ("/admin/agents/support", {}, 400, "send either 'agent'"),
    ("/admin/agents/support", {"agent": {}, "agent_yaml": ""}, 400, "send either"),
    ("/admin/agents/support", {"agent": [], "x": 1}, 400, "unknown field(s) x"),
    ("/admin/agents/support", {"agent": "text"}, 400, "must be an object"),
    ("/admin/agents/support", {"agent": {}, "files": {"../evil.md": "x"}}, 400,
     "invalid file name"),
    ("/admin/agents/support", {"agent": {}, "files": {"agent.yaml": "x"}}, 400,
     "invalid file name"),
    ("/admin/agents/support", {"agent": {}, "files": {"a.md": 3}}, 400, "must be text"),
    ("/admin/agents/support", {"agent": {}, "files": {"a.md": "x" * 300_000}}, 400,
     "larger than"),
    ("/admin/agents/Bad%20Name", {"agent": {}}, 400, "agent names use"),
    ("/admin/agents/support", {"agent_yaml": "tools: [a\n"}, 422, "definition has errors"),
    ("/admin/agents/support", {"agent": {"modle": "x"}}, 422, "definition has errors"),
    ("/admin/agents/support", {"agent": {"instructions": "missing.md"}}, 422, "errors"),
])
async def test_bad_agent_requests_are_refused_clearly(admin: Admin, data_dir: Path, path, body,
                                                      status, words) -> None:
    kw = {"data": body} if isinstance(body, str) else {"json": body}
    got, answer = await admin.call("PUT", path, **kw)
    assert got == status and words in answer["error"]
    if status == 422:
        assert all(p["file"].startswith(str(data_dir / "agents" / "support"))
                   for p in answer["problems"])
    assert not (data_dir / "agents" / "support").exists()


# reload, routes, explain --------------------------------------------------------------------------

async def test_reload_status_and_refusal(admin: Admin, config_dir: Path) -> None:
    status, body = await admin.call("GET", "/admin/reload")
    assert status == 200 and body["status"] == "ok" and body["problems"] == []
    (config_dir / "routes.yaml").write_text("routes:\n  - {agent: ghost}\n")
    status, body = await admin.call("POST", "/admin/reload")
    assert status == 422 and body["status"] == "refused"
    assert body["problems"][0]["line"] == 2 and "unknown agent 'ghost'" in \
        body["problems"][0]["message"]
    assert (await admin.call("GET", "/admin/reload"))[1]["status"] == "refused"


async def test_routes_and_explain(admin: Admin, config_dir: Path) -> None:
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - {name: dm, match: {direct: true}, agent: default, access: pairing,"
        " rate_limit: {user: 5/minute}}\ndefault: null\n")
    await admin.call("POST", "/admin/reload")
    status, body = await admin.call("GET", "/admin/routes")
    assert status == 200 and body["routes"][0]["rule"] == "dm" and body["default"] is None
    assert body["routes"][0]["rate_limit"] == {"user": "5/minute"}
    status, body = await admin.call("POST", "/admin/routes/explain",
                                    json={"provider": "telegram", "chat": 1, "user": 2})
    assert status == 200 and (body["rule"], body["agent"], body["approved"]) == (
        "dm", "default", False)
    status, body = await admin.call("POST", "/admin/routes/explain",
                                    json={"provider": "telegram", "chat": 1, "user": 2,
                                          "group": True})
    assert body["outcome"] == "unmatched" and "it is a group message" in \
        body["steps"][0]["failed"][0]
    status, body = await admin.call("POST", "/admin/routes/explain", json={"provider": "x"})
    assert status == 400 and "chat, user" in body["error"]


# pairing and runs ---------------------------------------------------------------------------------

async def test_pairing_through_the_admin_api(admin: Admin, config_dir: Path) -> None:
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - {match: {provider: test}, agent: default, access: pairing}\n")
    await admin.call("POST", "/admin/reload")
    await admin.p.say("let me in", user="42", user_name="Ada")
    await until(lambda: admin.p.sent)
    status, body = await admin.call("GET", "/admin/pairing")
    [pending] = body["pending"]
    assert (pending["user_id"], pending["user_name"]) == ("42", "Ada") and body["approved"] == []
    assert (await admin.call("POST", "/admin/pairing/approve", json={"code": "NOPE"}))[0] == 404
    assert (await admin.call("POST", "/admin/pairing/approve", json={}))[0] == 400
    status, body = await admin.call("POST", "/admin/pairing/approve",
                                    json={"code": pending["code"]})
    assert status == 200 and body["approved"]["user_id"] == "42"
    await admin.p.say("thanks", user="42")
    await until(lambda: " ".join(admin.p.finals()).endswith(": thanks"))
    assert (await admin.call("DELETE", "/admin/pairing/test/42"))[0] == 204
    assert (await admin.call("DELETE", "/admin/pairing/test/42"))[0] == 404


async def test_recent_runs(admin: Admin) -> None:
    await admin.p.say("count me")
    await admin.p.wait_finals(1)
    await admin.gw.settled()
    status, body = await admin.call("GET", "/admin/runs?limit=5")
    [run] = body["runs"]
    assert status == 200 and (run["agent"], run["status"], run["input"]) == (
        "default", "ok", "count me")
    status, transcript = await admin.call("GET", f"/admin/conversations/{run['session_id']}")
    assert status == 200, transcript  # a run leads to its conversation (the console's link)
    assert (await admin.call("GET", "/admin/runs?agent=nobody"))[1]["runs"] == []
    status, body = await admin.call("GET", f"/admin/runs/{run['id']}")
    assert status == 200 and [e["type"] for e in body["events"]][0] == "run.start"
    assert body["events"][-1]["type"] == "run.end"
    assert (await admin.call("GET", "/admin/runs/nope"))[0] == 404
    status, body = await admin.call("GET", "/admin/runs?limit=lots")
    assert status == 400 and "whole number" in body["error"]
    assert (await admin.call("GET", "/admin/runs?limit=0"))[0] == 400


async def test_a_run_view_shows_its_approval_and_the_decision(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pluto.runtime.model import ToolCall

    agent = config_dir / "agents" / "default" / "agent.yaml"
    agent.write_text(agent.read_text() + "\napproval: {current_time: always}\n")
    monkeypatch.setenv("PLUTO_ADMIN_KEY", KEY)
    gw, p = await make_admin(config_dir, data_dir)
    gw.runner.model_factory = ScriptedModel(
        Scripted(tool_calls=[ToolCall("t1", "current_time", '{"timezone": "UTC"}')]),
        Scripted(text="It is noon."))
    async with aiohttp.ClientSession() as http:
        try:
            await _approval_view(Admin(gw, http, p))
        finally:
            await gw.stop()


async def _approval_view(admin: Admin) -> None:
    await admin.p.say("what time is it?")
    [ask] = await admin.p.wait_finals(1)
    approval_id = ask.split("`/approve ")[1].split("`")[0]
    await admin.p.say(f"/deny {approval_id} not now")
    await admin.p.wait_finals(2)
    await admin.gw.settled()
    _, body = await admin.call("GET", "/admin/runs?limit=5")
    paused = next(r for r in body["runs"] if r["status"] == "awaiting_approval")
    status, view = await admin.call("GET", f"/admin/runs/{paused['id']}")
    assert status == 200 and "approval.request" in [e["type"] for e in view["events"]]
    [approval] = view["approvals"]
    assert (approval["id"], approval["tool"], approval["status"], approval["reason"]) == (
        approval_id, "current_time", "denied", "not now")
    assert "turn" not in approval and approval["resumed_run"]
    _, resumed = await admin.call("GET", f"/admin/runs/{approval['resumed_run']}")
    decision = next(e for e in resumed["events"] if e["type"] == "approval.decision")
    assert (decision["verdict"], decision["reason"]) == ("denied", "not now")


# the A2A Agent Card -------------------------------------------------------------------------------

async def test_agent_card(admin: Admin, config_dir: Path) -> None:
    await admin.call("PUT", "/admin/agents/support", json=SUPPORT)
    async with admin.http.get(admin.url + "/agents/support/.well-known/agent.json") as r:
        assert r.status == 404  # the API's messages go to 'default': no card for a dead URL
        assert "add a route matching {provider: api, guild: support}" in (await r.json())[
            "error"]
    routes = config_dir / "routes.yaml"
    routes.write_text(routes.read_text().replace("routes:\n", "routes:\n  - match: {provider: "
                                                 "api, guild: support}\n    agent: support\n",
                                                 1))
    assert (await admin.call("POST", "/admin/reload"))[0] == 200
    async with admin.http.get(admin.url + "/agents/support/.well-known/agent.json") as r:
        assert r.status == 200
        card = await r.json()
    assert card["protocolVersion"] == "0.3.0" and card["name"] == "support"
    assert card["description"] == "Answers support questions."
    assert card["url"] == f"{admin.url}/agents/support"
    assert card["capabilities"]["streaming"] is True and card["preferredTransport"] == "JSONRPC"
    assert card["security"] == [{"bearer": []}] and card["securitySchemes"]["bearer"][
        "scheme"] == "bearer"
    assert card["defaultInputModes"] == ["text/plain"] and "text/plain" in card[
        "defaultOutputModes"]
    [skill] = card["skills"]
    assert {"id", "name", "description", "tags"} <= set(skill) and "current_time" in skill["tags"]
    first_version = card["version"]
    await admin.call("PUT", "/admin/agents/support", json=SUPPORT | {
        "files": {"instructions.md": "changed"}})
    async with admin.http.get(admin.url + "/agents/support/.well-known/agent-card.json") as r:
        assert (await r.json())["version"] != first_version
    async with admin.http.get(admin.url + "/agents/ghost/.well-known/agent.json") as r:
        assert r.status == 404 and "no agent named 'ghost'" in (await r.json())["error"]
