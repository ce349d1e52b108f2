"""Per-agent MCP servers, against real servers built with the SDK (tests/mcp_servers/demo.py),
driven through the fake OpenAI-compatible model: a tool call whose result the answer uses; a
server killed mid-call (the model gets a tool error, the person a normal answer, the next
message works); a call hanging past its timeout; isError; a server that will not start; a
server with 200 tools; two agents that never see each other's tools; streamable HTTP with a
header from the environment; tools/list_changed; images; /stop; idle servers stopped; the
bound on servers."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path

import pytest

from pluto.agents.spec import AgentSpec, load_agent
from pluto.events import MessageFinal, RunEnd, ToolEnd
from pluto.runtime.mcp import McpHub
from pluto.runtime.model import ModelSettings
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.tools import BUILTIN_TOOLS
from pluto.storage.sqlite import SqliteStore
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-mcp-test"


def demo(*extra: str, **settings: object) -> dict:
    """A stdio server entry for agent.yaml running tests/mcp_servers/demo.py (inside bubblewrap,
    except when a test kills or watches it by its process id, which bwrap's own PID namespace
    would hide)."""
    if "--pid-file" in extra:
        settings = {"sandbox": False, **settings}
    return {"command": sys.executable, "args": ["-m", "tests.mcp_servers.demo", *extra],
            "cwd": str(ROOT), **settings}


def write_agent(root: Path, name: str, mcp: dict, **fields: object) -> Path:
    import yaml
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    body = {"model": "fake", "instructions": [], "tools": ["current_time"], "mcp": mcp, **fields}
    (d / "agent.yaml").write_text(yaml.safe_dump(body))
    return d


def agent(tmp_path: Path, mcp: dict, name: str = "helper", key_envs: tuple = (),
          **fields: object) -> AgentSpec:
    return load_agent(write_agent(tmp_path / "agents", name, mcp, **fields), key_envs)


@pytest.fixture
async def fake():
    from pluto.runtime.openai_compat import close_sessions
    async with FakeOpenAI(api_key=KEY) as server:
        yield server
    await close_sessions()  # the model's pooled connections


@pytest.fixture
async def hub():
    async with McpHub(idle_seconds=600) as h:
        yield h


@pytest.fixture
async def runner(fake, hub, tmp_path, monkeypatch):
    monkeypatch.setenv("PLUTO_TEST_KEY", KEY)
    models = {"fake": ModelSettings(model="openai/fake", api_base=fake.base_url,
                                    api_key_env="PLUTO_TEST_KEY", retries=0, timeout=20)}
    async with SqliteStore(tmp_path / "p.db") as store:
        yield Runner(store.conversations, models=models, tools=BUILTIN_TOOLS,
                     data_dir=tmp_path / "data", services={"mcp": hub})


async def ask(runner: Runner, spec: AgentSpec, text: str, key: str = "chat") -> list:
    session = await runner.store.session(key, spec.name)
    return [e async for e in runner.run(RunRequest(uuid.uuid4().hex, session, spec, text))]


def tool_ends(events: list) -> list[ToolEnd]:
    return [e for e in events if isinstance(e, ToolEnd)]


def final(events: list) -> str:
    return next(e.text for e in events if isinstance(e, MessageFinal))


def offered(request: dict) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", [])}


async def wait_for_file(path: Path, timeout: float = 20) -> str:
    async with asyncio.timeout(timeout):
        while not path.exists():
            await asyncio.sleep(0.02)
    return path.read_text()


# --- the done-when scenario --------------------------------------------------------------------

async def test_a_stdio_tool_answers_a_killed_server_is_a_tool_error_and_the_next_message_works(
        runner, fake, tmp_path):
    pid_file = tmp_path / "demo.pid"
    spec = agent(tmp_path, {"demo": demo("--pid-file", str(pid_file))})

    fake.script(Reply(tool_calls=[ToolCall("demo_weather", {"city": "Paris"})]),
                Reply(text="It rains in Paris: 14 °C."))
    events = await ask(runner, spec, "Weather in Paris?")
    [end] = tool_ends(events)
    assert not end.is_error and end.content == "Weather in Paris: light rain, 14 °C."
    assert {"demo_weather", "demo_hold", "current_time"} <= offered(fake.requests[0])
    schema = next(t for t in fake.requests[0]["tools"]
                  if t["function"]["name"] == "demo_weather")["function"]["parameters"]
    assert schema["properties"]["city"]["type"] == "string" and schema["required"] == ["city"]
    assert fake.requests[1]["messages"][-1]["content"] == end.content  # the model read it
    assert final(events) == "It rains in Paris: 14 °C."
    first_pid = int(pid_file.read_text())

    fake.script(Reply(tool_calls=[ToolCall("demo_hold", {"seconds": 30})]),
                Reply(text="The slow tool is unavailable; here is what I know anyway."))
    run = asyncio.create_task(ask(runner, spec, "Do the slow thing"))
    os.kill(int(await wait_for_file(Path(f"{pid_file}.busy"))), signal.SIGKILL)
    events = await asyncio.wait_for(run, 30)
    [end] = tool_ends(events)
    assert end.is_error and "'demo' server are unavailable right now" in end.content
    assert "it stopped during the call" in end.content and "Traceback" not in end.content
    assert fake.requests[3]["messages"][-1]["content"] == end.content
    assert final(events) == "The slow tool is unavailable; here is what I know anyway."
    assert events[-1].outcome == "ok"

    fake.script(Reply(tool_calls=[ToolCall("demo_weather", {"city": "Oslo"})]),
                Reply(text="Snow in Oslo."))
    events = await ask(runner, spec, "And Oslo?")
    [end] = tool_ends(events)
    assert not end.is_error and end.content == "Weather in Oslo: snow, -3 °C."
    assert final(events) == "Snow in Oslo."
    assert int(pid_file.read_text()) != first_pid  # a new process


# --- failures stay small -----------------------------------------------------------------------

async def test_is_error_goes_back_to_the_model_which_corrects_itself(runner, fake, tmp_path):
    spec = agent(tmp_path, {"demo": demo()})
    fake.script(Reply(tool_calls=[ToolCall("demo_weather", {"city": "Atlantis"})]),
                Reply(tool_calls=[ToolCall("demo_weather", {"city": "Lima"})]),
                Reply(text="Sunny in Lima."))
    events = await ask(runner, spec, "Weather?")
    bad, good = tool_ends(events)
    assert bad.is_error and bad.content.startswith("Error: ") and "no weather station" in \
        bad.content
    assert not good.is_error and "sunny" in good.content
    assert final(events) == "Sunny in Lima."


async def test_a_call_hanging_past_its_timeout_is_a_tool_error_and_the_server_goes_on(
        runner, fake, tmp_path):
    spec = agent(tmp_path, {"demo": demo(call_timeout=1)})
    fake.script(Reply(tool_calls=[ToolCall("demo_hold", {"seconds": 60})]),
                Reply(tool_calls=[ToolCall("demo_add", {"a": 2, "b": 3})]),
                Reply(text="2 + 3 = 5"))
    events = await ask(runner, spec, "hold, then add")
    hung, added = tool_ends(events)
    assert hung.is_error and "did not answer within 1 s" in hung.content
    assert not added.is_error and added.content == "5"
    assert final(events) == "2 + 3 = 5"


async def test_a_crash_mid_call_leaves_the_other_servers_and_tools_working(
        runner, fake, hub, tmp_path):
    spec = agent(tmp_path, {"demo": demo(), "calc": demo("--name", "calc")})
    fake.script(Reply(tool_calls=[ToolCall("demo_crash", {}), ToolCall("calc_add", {"a": 1,
                                                                                    "b": 1}),
                                  ToolCall("current_time", {})]),
                Reply(text="done"))
    events = await ask(runner, spec, "crash one")
    crashed, added, now = tool_ends(events)
    assert crashed.is_error and "unavailable right now" in crashed.content
    assert not added.is_error and added.content == "2"
    assert not now.is_error
    health = hub.health()
    assert sorted(h["state"] for h in health.values()) == ["down", "ready"]
    assert final(events) == "done"


async def test_a_server_that_will_not_start_leaves_the_agent_its_other_tools(
        runner, fake, hub, tmp_path):
    broken = {"command": sys.executable, "args": ["-c", "import sys; sys.exit(1)"],
              "connect_timeout": 10}
    spec = agent(tmp_path, {"broken": broken, "demo": demo(),
                            "listed": {**broken, "tools": ["search"], "connect_timeout": 9}})
    fake.script(Reply(tool_calls=[ToolCall("demo_add", {"a": 1, "b": 2}),
                                  ToolCall("listed_search", {}, id="c2")]), Reply(text="3"))
    events = await ask(runner, spec, "add")
    assert final(events) == "3" and events[-1].outcome == "ok"
    added, search = tool_ends(events)
    assert added.content == "3"
    assert search.is_error and "'listed' server are unavailable right now" in search.content
    tools = {t["function"]["name"]: t["function"] for t in fake.requests[0]["tools"]}
    assert "demo_add" in tools and not any(t.startswith("broken_") for t in tools)
    # a server with an allowlist: the model is told those tools are unavailable
    assert tools["listed_search"]["description"].startswith("Unavailable right now (")
    downs = [h for k, h in hub.health().items() if not k.startswith("demo@")]
    assert [h["state"] for h in downs] == ["down", "down"] and all(h["error"] for h in downs)


async def test_a_server_that_hangs_at_start_is_given_up_after_its_connect_timeout(
        runner, fake, hub, tmp_path):
    mute = {"command": sys.executable, "args": ["-c", "import time; time.sleep(120)"],
            "connect_timeout": 1}
    spec = agent(tmp_path, {"mute": mute})
    fake.script(Reply(text="Still here."))
    events = await ask(runner, spec, "hi")
    assert final(events) == "Still here." and events[-1].outcome == "ok"
    [health] = hub.health().values()
    assert health["state"] == "down" and health["error"] == "it did not start within 1 s"
    fake.script(Reply(text="Again."))  # the next message does not wait for it again at once
    assert final(await ask(runner, spec, "hi")) == "Again."


async def test_stop_cancels_the_call_and_the_server_stays_usable(runner, fake, hub, tmp_path):
    pid_file = tmp_path / "demo.pid"
    spec = agent(tmp_path, {"demo": demo("--pid-file", str(pid_file))})
    fake.script(Reply(tool_calls=[ToolCall("demo_hold", {"seconds": 60})]))
    run = asyncio.create_task(ask(runner, spec, "hold"))
    await wait_for_file(Path(f"{pid_file}.busy"))
    run.cancel()  # what /stop does to the run's task
    with pytest.raises(asyncio.CancelledError):
        await run
    fake.script(Reply(tool_calls=[ToolCall("demo_add", {"a": 4, "b": 4})]), Reply(text="8"))
    events = await ask(runner, spec, "add")
    assert tool_ends(events)[0].content == "8" and final(events) == "8"
    assert [h["state"] for h in hub.health().values()] == ["ready"]


# --- tools, per agent --------------------------------------------------------------------------

async def test_two_agents_with_different_servers_never_see_each_others_tools(
        hub, tmp_path):
    a = agent(tmp_path, {"weather": demo(tools=["weather"])}, name="a")
    b = agent(tmp_path, {"sums": demo("--name", "sums", tools=["add"])}, name="b")
    c = agent(tmp_path, {"maths": demo("--name", "sums", tools=["add"], prefix="m_")}, name="c")
    assert set(await hub.tools_for(a)) == {"weather_weather"}
    assert set(await hub.tools_for(b)) == {"sums_add"}
    assert set(await hub.tools_for(c)) == {"m_add"}  # same settings as b's: one process
    assert len(hub.health()) == 2


async def test_a_server_with_200_tools_and_an_allowlist(hub, tmp_path):
    everything = agent(tmp_path, {"big": demo("--many", "200")}, name="all")
    tools = await hub.tools_for(everything)
    assert len([n for n in tools if n.startswith("big_t")]) == 200
    assert tools["big_t199"].parameters["properties"]["x"]["type"] == "integer"
    few = agent(tmp_path, {"big": demo("--many", "200", tools=["t007", "add"])}, name="few")
    assert set(await hub.tools_for(few)) == {"big_t007", "big_add"}
    assert set(await hub.tools_for(few, ("big_add", "current_time"))) == {"big_add"}


async def test_the_tool_list_is_refreshed_when_the_server_says_it_changed(runner, fake, hub,
                                                                         tmp_path):
    spec = agent(tmp_path, {"demo": demo()})
    assert "demo_extra" not in await hub.tools_for(spec)
    fake.script(Reply(tool_calls=[ToolCall("demo_grow", {})]), Reply(text="grown"))
    await ask(runner, spec, "grow")
    async with asyncio.timeout(10):
        while "demo_extra" not in await hub.tools_for(spec):
            await asyncio.sleep(0.05)
    fake.script(Reply(tool_calls=[ToolCall("demo_extra", {})]), Reply(text="ok"))
    assert tool_ends(await ask(runner, spec, "use it"))[0].content == "extra here"


async def test_an_image_is_saved_as_an_artifact_for_the_chat(runner, fake, tmp_path):
    spec = agent(tmp_path, {"demo": demo()})
    fake.script(Reply(tool_calls=[ToolCall("demo_picture", {})]), Reply(text="A red dot."))
    events = await ask(runner, spec, "draw")
    [end] = tool_ends(events)
    assert "an image, sent to the user" in end.content
    image = Path(end.details["image"])
    assert image.is_relative_to(tmp_path / "data" / "artifacts") and image.suffix == ".png"
    assert image.read_bytes().startswith(b"\x89PNG")
    assert end.details["attachments"][0]["kind"] == "image"


async def test_a_stdio_server_gets_only_the_variables_named_by_env_keys(
        runner, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("PLUTO_DEMO_TOKEN", "tok-123")
    monkeypatch.setenv("PLUTO_OTHER_SECRET", "never-passed")
    spec = agent(tmp_path, {"demo": demo(env={"DEMO_TOKEN_env": "PLUTO_DEMO_TOKEN"})},
                 key_envs=("PLUTO_DEMO_TOKEN",))
    fake.script(Reply(tool_calls=[ToolCall("demo_secret", {"name": "DEMO_TOKEN"}),
                                  ToolCall("demo_secret", {"name": "PLUTO_OTHER_SECRET"},
                                           id="c2")]),
                Reply(text="ok"))
    given, other = tool_ends(await ask(runner, spec, "env"))
    assert given.content == "tok-123" and other.content == "<unset>"


async def test_a_missing_variable_makes_the_server_unavailable_not_the_agent(
        runner, fake, hub, tmp_path, monkeypatch):
    monkeypatch.delenv("PLUTO_DEMO_TOKEN", raising=False)
    spec = agent(tmp_path, {"demo": demo(env={"DEMO_TOKEN_env": "PLUTO_DEMO_TOKEN"})},
                 key_envs=("PLUTO_DEMO_TOKEN",))
    fake.script(Reply(text="hello"))
    assert final(await ask(runner, spec, "hi")) == "hello"
    [health] = hub.health().values()
    assert health == {"state": "down", "tools": 0, "calls": 0,
                      "error": "the environment variable PLUTO_DEMO_TOKEN is not set"}


# --- lifecycle ---------------------------------------------------------------------------------

async def test_idle_servers_stop_and_start_again_when_needed(tmp_path):
    pid_file = tmp_path / "demo.pid"
    spec = agent(tmp_path, {"demo": demo("--pid-file", str(pid_file))})
    async with McpHub(idle_seconds=3600) as hub:
        await hub.tools_for(spec)
        first = int(pid_file.read_text())
        assert hub.stop_idle() == []
        assert hub.stop_idle(now=asyncio.get_running_loop().time() + 7200) == ["demo"]
        await asyncio.gather(*hub._stopping)
        assert hub.health() == {}
        await _gone(first)
        assert "demo_add" in await hub.tools_for(spec)
        assert int(pid_file.read_text()) != first


async def test_the_number_of_servers_is_bounded(tmp_path):
    pid_file = tmp_path / "demo.pid"
    a = agent(tmp_path, {"one": demo("--pid-file", str(pid_file))}, name="a")
    b = agent(tmp_path, {"two": demo("--name", "two")}, name="b")
    async with McpHub(max_servers=1) as hub:
        tools = await hub.tools_for(a)
        call = asyncio.create_task(tools["one_hold"].fn(_ctx(tmp_path), {"seconds": 30}))
        await wait_for_file(Path(f"{pid_file}.busy"))
        assert await hub.tools_for(b) == {}  # the one running is busy: refused
        assert [h["state"] for h in hub.health().values()] == ["ready", "refused"]
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert set(await hub.tools_for(b)) >= {"two_add"}  # the idle one made way
        assert [h["state"] for h in hub.health().values()] == ["ready"]


async def test_closing_the_hub_stops_every_server(tmp_path):
    pid_file = tmp_path / "demo.pid"
    spec = agent(tmp_path, {"demo": demo("--pid-file", str(pid_file))})
    hub = McpHub()
    await hub.tools_for(spec)
    await hub.aclose()
    await _gone(int(pid_file.read_text()))
    assert await hub.tools_for(spec) == {}


def _ctx(tmp_path: Path):
    from pluto.runtime.tools import ToolContext
    return ToolContext("run", "s", "k", "a", tmp_path)


async def _gone(pid: int) -> None:
    async with asyncio.timeout(15):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.05)


# --- streamable HTTP ---------------------------------------------------------------------------

class HttpServer:
    """The demo server over streamable HTTP (uvicorn, its own thread), refusing requests
    without the expected Authorization header."""

    def __init__(self, token: str):
        import uvicorn
        from tests.mcp_servers.demo import http_app
        app = http_app(name="web")
        self.seen: list[str] = []

        async def guarded(scope, receive, send):
            if scope["type"] == "http":
                auth = dict(scope["headers"]).get(b"authorization", b"").decode()
                self.seen.append(auth)
                if auth != f"Bearer {token}":
                    await send({"type": "http.response.start", "status": 401, "headers": []})
                    await send({"type": "http.response.body", "body": b"no"})
                    return
            await app(scope, receive, send)

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # connections wait in the backlog until uvicorn serves (a client
        # connecting before its thread got that far was refused: the tools were not there)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(guarded, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> HttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


async def test_streamable_http_with_a_header_from_the_environment(runner, fake, hub, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_AUTH", "Bearer s3cret")
    with HttpServer("s3cret") as web:
        url = f"http://127.0.0.1:{web.port}/mcp"
        spec = agent(tmp_path, {"web": {"url": url, "headers": {
            "Authorization_env": "PLUTO_WEB_AUTH"}, "call_timeout": 1}},
            key_envs=("PLUTO_WEB_AUTH",))
        fake.script(Reply(tool_calls=[ToolCall("web_weather", {"city": "lima"}),
                                      ToolCall("web_hold", {"seconds": 30}, id="c2")]),
                    Reply(text="Sunny in Lima."))
        events = await ask(runner, spec, "Lima?")
        weather, hung = tool_ends(events)
        assert weather.content == "Weather in Lima: sunny, 22 °C."
        assert hung.is_error and "did not answer within 1 s" in hung.content
        assert final(events) == "Sunny in Lima."
        assert set(web.seen) == {"Bearer s3cret"}

        monkeypatch.setenv("PLUTO_WEB_AUTH", "Bearer wrong")
        other = agent(tmp_path, {"web": {"url": url, "headers": {
            "Authorization_env": "PLUTO_WEB_AUTH"}, "connect_timeout": 5}}, name="other",
            key_envs=("PLUTO_WEB_AUTH",))
        fake.script(Reply(text="Without the web tools."))
        events = await ask(runner, other, "hi", key="other")
        assert final(events) == "Without the web tools." and events[-1].outcome == "ok"
        assert "web_weather" not in offered(fake.requests[-1])
        assert any(h["state"] == "down" for h in hub.health().values())
        await hub.aclose()  # before the server's thread stops


# --- the example agent, through the gateway ----------------------------------------------------

async def test_the_example_agent_converts_through_the_gateway_and_readyz_shows_its_server(
        fake, config_dir, data_dir, monkeypatch):
    import aiohttp

    from pluto.gateway.app import Gateway
    from pluto.settings import PlutoConfig
    from pluto.types import MARKDOWN, Capabilities
    from tests.helpers.gateway import RecordingProvider

    monkeypatch.setenv("PLUTO_API_KEY", KEY)
    (config_dir / "routes.yaml").write_text("routes: []\ndefault: cook\n")
    cfg = PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": fake.base_url, "api_key_env": "PLUTO_API_KEY",
        "retries": 0, "timeout": 10}})
    fake.script(Reply(tool_calls=[ToolCall("load_skill", {"name": "recipe-card"}),
                                  ToolCall("kitchen_convert", {"value": 1, "from_unit": "cup",
                                                               "to_unit": "ml"}, id="c2")]),
                Reply(text="1 cup is about 237 ml."))
    async with Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0)) as gw:
        provider = RecordingProvider(capabilities=Capabilities(max_message_length=4000,
                                                               markup=MARKDOWN))
        gw.add_provider(provider)
        await provider.running.wait()
        await provider.say("How many ml in a cup?")
        assert await provider.wait_finals(1, timeout=30) == ["1 cup is about 237 ml."]
        tools = offered(fake.requests[0])
        assert {"kitchen_convert", "kitchen_scale", "load_skill", "current_time"} == tools
        assert "recipe-card: How to present a recipe" in \
            fake.requests[0]["messages"][0]["content"]
        skill, converted = fake.requests[1]["messages"][-2:]
        assert skill["content"].startswith("# Recipe card")
        assert converted["content"] == "1 cup = 237 ml"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{gw.http.url}/readyz") as r:
                body = await r.json()
        [kitchen] = [v for k, v in body["checks"]["mcp"].items() if k.startswith("kitchen@")]
        assert kitchen == {"state": "ready", "tools": 2, "calls": 0}


async def test_the_admin_api_refuses_stdio_servers_and_unknown_tools(config_dir, data_dir,
                                                                    monkeypatch):
    import aiohttp

    from tests.test_admin import KEY as ADMIN_KEY, Admin, make_admin

    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    gw, p = await make_admin(config_dir, data_dir)
    try:
        async with aiohttp.ClientSession() as http:
            admin = Admin(gw, http, p)
            status, body = await admin.call("PUT", "/admin/agents/local", json={
                "agent": {"mcp": {"sh": {"command": "sh", "args": ["-c", "id"]}}}})
            assert status == 422 and body["problems"][0]["field"] == "mcp.sh.command"
            assert "run programs on the gateway's host" in body["problems"][0]["message"]
            status, body = await admin.call("PUT", "/admin/agents/typo", json={
                "agent": {"tools": ["current_time", "run_sqll"]}})
            assert status == 422 and body["problems"][0]["field"] == "tools.1"
            status, _ = await admin.call("PUT", "/admin/agents/remote", json={
                "agent": {"tools": ["run_sql"], "mcp": {"wiki": {
                    "url": "https://wiki.example/mcp"}}}})
            assert status == 201
            assert not (data_dir / "agents" / "local").exists()
    finally:
        await gw.stop()


# --- results, mapped ---------------------------------------------------------------------------

async def test_every_kind_of_content_is_mapped(tmp_path):
    import base64

    import mcp_types as types

    from pluto.runtime.mcp.results import MAX_CONTENT, to_result
    from tests.mcp_servers.demo import PNG

    png = base64.b64encode(PNG).decode()
    result = types.CallToolResult(content=[
        types.TextContent(type="text", text="first"),
        types.ImageContent(type="image", data=png, mime_type="image/png"),
        types.AudioContent(type="audio", data=base64.b64encode(b"RIFF").decode(),
                           mime_type="audio/wav"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="file:///notes.txt", text="a note")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///data.bin", blob=base64.b64encode(b"\x00\x01").decode(),
            mime_type="application/octet-stream")),
        types.ResourceLink(type="resource_link", uri="https://x.example/doc", name="doc"),
        types.ImageContent(type="image", data="not base64!", mime_type="image/png"),
    ])
    out = await to_result(result, tmp_path / "run", "srv")
    assert not out.is_error
    assert out.content.splitlines()[0] == "first"
    assert "[file:///notes.txt]\na note" in out.content
    assert "[link: doc https://x.example/doc]" in out.content
    saved = out.details["attachments"]
    assert [a["kind"] for a in saved] == ["image", "file", "file"]  # the bad image dropped
    assert Path(out.details["image"]).read_bytes() == PNG
    assert all(Path(a["path"]).parent == tmp_path / "run" for a in saved)

    structured = await to_result(types.CallToolResult(content=[], structured_content={
        "total": 3}), tmp_path, "srv")
    assert structured.content == '{"total": 3}' and structured.details is None
    long = await to_result(types.CallToolResult(content=[types.TextContent(
        type="text", text="x" * (MAX_CONTENT + 10))]), tmp_path, "srv")
    assert long.content.endswith(f"[cut: the result had {MAX_CONTENT + 10:,} characters]")
    failed = await to_result(types.CallToolResult(content=[], is_error=True), tmp_path, "srv")
    assert failed.is_error and failed.content == "Error: failed"


async def test_progress_reaches_the_run_feed_as_tool_progress_events(runner, fake, tmp_path):
    from pluto.events import ToolProgress

    spec = agent(tmp_path, {"demo": demo()})
    fake.script(Reply(tool_calls=[ToolCall("demo_count", {"n": 3})]), Reply(text="counted"))
    session = await runner.store.session("chat", spec.name)
    observed: list = []
    events = [e async for e in runner.run(RunRequest(uuid.uuid4().hex, session, spec, "count"),
                                          observed.append)]
    progress = [e for e in observed if isinstance(e, ToolProgress)]
    assert progress and progress[-1].progress == 3 and progress[-1].total == 3
    assert progress[0].message == "step 1" and progress[0].name == "demo_count"
    assert tool_ends(events)[0].content == "counted to 3"
    stored = await runner.store.events(events[0].run_id)
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))  # numbered in between
    assert [e.type for e in stored].count("tool.progress") == len(progress)


async def test_a_route_narrows_mcp_tools_by_server_or_tool_name(config_dir, tmp_path):
    from pluto.agents.registry import AgentRegistry
    from pluto.errors import ConfigError
    from pluto.gateway.reload import load_routes

    registry = AgentRegistry(config_dir / "agents")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - {match: {provider: a}, agent: cook, tools: [kitchen]}\n"
        "  - {match: {provider: b}, agent: cook, tools: [kitchen_convert, current_time]}\n"
        "default: default\n")
    assert len(load_routes(config_dir, registry).spec.routes) == 2
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - {match: {provider: a}, agent: cook, tools: [pantry]}\ndefault: default\n")
    with pytest.raises(ConfigError, match="has no tool 'pantry'"):
        load_routes(config_dir, registry)
    cook = registry.get("cook")
    async with McpHub() as hub:
        assert set(await hub.tools_for(cook, ("kitchen",))) == {"kitchen_convert",
                                                               "kitchen_scale"}
        assert set(await hub.tools_for(cook, ("kitchen_convert",))) == {"kitchen_convert"}


async def test_a_run_stopped_while_its_server_starts_leaves_nothing_behind(tmp_path):
    pid_file = tmp_path / "mute.pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); " \
             "time.sleep(120)"
    spec = agent(tmp_path, {"mute": {"command": sys.executable, "args": ["-c", script],
                                     "connect_timeout": 60, "sandbox": False}})  # (by pid)
    async with McpHub() as hub:
        starting = asyncio.create_task(hub.tools_for(spec))
        pid = int(await wait_for_file(pid_file))
        starting.cancel()  # /stop while the server starts
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert [h["state"] for h in hub.health().values()] == ["idle"]
        await _gone(pid)


def test_the_web_widget_gets_progress_frames():
    from pluto.events import ToolProgress
    from pluto.providers.web.protocol import run_frame

    f = run_frame(7, ToolProgress(run_id="r", call_id="c", name="demo_count", progress=2,
                                  total=4, message="step 2"), lambda path: None)
    assert f is not None and f["type"] == "tool.progress" and f["seq"] == 7
    assert (f["name"], f["call_id"], f["progress"], f["total"], f["message"]) == (
        "demo_count", "c", 2, 4, "step 2")


@pytest.mark.parametrize("can_send_files", [True, False])
async def test_images_and_files_from_a_tool_are_sent_with_the_answer(
        fake, config_dir, data_dir, monkeypatch, can_send_files):
    import yaml

    from pluto.gateway.app import Gateway
    from pluto.settings import PlutoConfig
    from pluto.types import MARKDOWN, Capabilities
    from tests.helpers.gateway import RecordingProvider

    monkeypatch.setenv("PLUTO_API_KEY", KEY)
    d = config_dir / "agents" / "maker"
    d.mkdir()
    (d / "agent.yaml").write_text(yaml.safe_dump({"mcp": {"demo": demo()}}))
    (config_dir / "routes.yaml").write_text("routes: []\ndefault: maker\n")
    cfg = PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": fake.base_url, "api_key_env": "PLUTO_API_KEY",
        "retries": 0, "timeout": 10}})
    fake.script(Reply(tool_calls=[ToolCall("demo_picture", {}),
                                  ToolCall("demo_report", {}, id="c2")]),
                Reply(text="Here they are."))
    async with Gateway(config_dir, config=cfg) as gw:
        provider = RecordingProvider(capabilities=Capabilities(
            max_message_length=4000, markup=MARKDOWN, can_send_images=True,
            can_send_files=can_send_files))
        gw.add_provider(provider)
        await provider.running.wait()
        await provider.say("a picture and the report")
        assert await provider.wait_finals(1, timeout=30) == ["Here they are."]
        async with asyncio.timeout(10):  # the text, the image, the file (or its name)
            while len(provider.sent) < 3:
                await asyncio.sleep(0.02)
    text, image, last = provider.sent[:3]
    assert text.text == "Here they are." and image.attachments[0].kind == "image"
    assert image.attachments[0].path.read_bytes().startswith(b"\x89PNG")
    if can_send_files:
        [csv] = last.attachments
        assert csv.kind == "file" and csv.mime_type == "text/csv"
        assert csv.path.read_text() == "city,rain_mm\nParis,3\nOslo,0\n"
        assert csv.path.is_relative_to(data_dir.resolve() / "artifacts")
    else:
        assert not last.attachments and last.text.startswith("(file: demo-")
    reply = fake.requests[1]["messages"]
    assert "The report is attached.\n[file:///report.csv] [a file (text/csv)" in reply[-1][
        "content"]


def test_pluto_yaml_sets_the_bound_and_the_idle_time(config_dir, data_dir):
    from pluto.errors import ConfigError
    from pluto.gateway.app import Gateway
    from pluto.settings import load_pluto_config

    (config_dir / "pluto.yaml").write_text(
        "data_dir: data\nagents: {mcp_max_servers: 3, mcp_idle_seconds: 30}\n")
    gw = Gateway(config_dir, data_dir=data_dir)
    assert (gw.mcp.max_servers, gw.mcp.idle_seconds) == (3, 30)
    (config_dir / "pluto.yaml").write_text("agents:\n  mcp_max_servers: 0\n")
    with pytest.raises(ConfigError) as e:
        load_pluto_config(config_dir)
    assert e.value.problems[0][1:3] == (2, "agents.mcp_max_servers")
