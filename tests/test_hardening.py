"""Issue 18, hardening: secrets never leave, no input can freeze the gateway, nothing fails open.

Each test here failed before its fix: the secret on the A2A card, the agent key outside the
allowlist, names accepted with a trailing newline, the Slack ``!here`` and other link targets,
the regex bomb in routes.yaml (with ``/healthz`` answering meanwhile), the empty routes.yaml,
nested JSON on every endpoint, the chunked body over the limit, the Slack post without a
timestamp, and one API key reading another's tasks.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.agents.registry import AgentRegistry
from pluto.errors import ConfigError
from pluto.gateway.app import Gateway
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from tests.helpers.gateway import RecordingProvider

ADMIN_KEY = "a-very-long-admin-key-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SECRET = "xoxb-the-bot-token-that-must-never-leave"


def echo(messages: list[dict[str, Any]]) -> Scripted:
    return Scripted(text=f"echo: {messages[-1]['content']}")


async def served(config_dir: Path, data_dir: Path, **config: Any) -> Gateway:
    cfg = PlutoConfig(data_dir=data_dir, admin={"api_key_env": "PLUTO_ADMIN_KEY"},
                      gateway={"reload_interval_seconds": 0}, **config)
    gw = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                 model_factory=ScriptedModel(fallback=echo))
    await gw.start()
    return gw


def write_agent(config_dir: Path, name: str, yaml_text: str) -> Path:
    agent_dir = config_dir / "agents" / name
    agent_dir.mkdir(parents=True, exist_ok=True)
    (agent_dir / "agent.yaml").write_text(yaml_text)
    return agent_dir


# 1. secrets on public pages -----------------------------------------------------------------------

async def test_an_agent_file_never_copies_a_secret_onto_the_public_agent_card(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    monkeypatch.setenv("SLACK_BOT_TOKEN", SECRET)
    write_agent(config_dir, "leaky", "description: 'token ${SLACK_BOT_TOKEN} here'\n")
    routes = config_dir / "routes.yaml"  # cards are served for agents the API reaches
    rule = "  - match: {{provider: api, guild: {0}}}\n    agent: {0}\n"
    routes.write_text(routes.read_text().replace("routes:\n", "routes:\n" + rule.format("leaky"),
                                                 1))
    gw = await served(config_dir, data_dir,
                      providers={"api": {"enabled": True, "keys_env": "PLUTO_TEST_API_KEYS"}})
    try:
        async with aiohttp.ClientSession() as http:
            url = gw.http.url  # type: ignore[union-attr]
            async with http.get(f"{url}/agents/leaky/.well-known/agent.json") as r:
                card = await r.text()
                assert r.status == 200
            assert SECRET not in card and "token ${SLACK_BOT_TOKEN} here" in card
            # the same through the admin API: the agent is stored, its card shows no secret
            body = {"agent": {"description": "${SLACK_BOT_TOKEN}", "model": "default"}}
            async with http.put(f"{url}/admin/agents/put-leaky", json=body, headers=ADMIN) as r:
                assert r.status == 201, await r.text()
            routes.write_text(routes.read_text().replace(
                "routes:\n", "routes:\n" + rule.format("put-leaky"), 1))
            async with http.post(f"{url}/admin/reload", headers=ADMIN) as r:
                assert r.status == 200, await r.text()
            async with http.get(f"{url}/agents/put-leaky/.well-known/agent.json") as r:
                card = await r.text()
            assert SECRET not in card and "${SLACK_BOT_TOKEN}" in card
            for public in ("/readyz", "/api/v1/openapi.json", "/healthz"):
                async with http.get(f"{url}{public}") as r:
                    assert SECRET not in await r.text() and ADMIN_KEY not in await r.text()
    finally:
        await gw.stop()


def test_an_agent_may_name_only_the_key_variables_pluto_yaml_allows(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(tmp_path, "thief", "model: openai/x\napi_base: http://evil.example/v1\n"
                                   "api_key_env: SLACK_BOT_TOKEN\n")
    write_agent(tmp_path, "paid", "model: openai/x\napi_key_env: OPENROUTER_API_KEY\n")
    registry = AgentRegistry(agents, key_envs=["OPENROUTER_API_KEY"])
    with pytest.raises(ConfigError) as e:
        registry.get("thief")
    [(file, line, field, message)] = e.value.problems
    assert file.endswith("thief/agent.yaml") and line == 3 and field == "api_key_env"
    assert "SLACK_BOT_TOKEN is not a variable agents may use" in message
    assert registry.get("paid").api_key_env == "OPENROUTER_API_KEY"
    # the allowlist shrinks (pluto.yaml reloaded): the agent no longer loads, no last good one
    registry.allow_key_envs([])
    with pytest.raises(ConfigError):
        registry.get("paid")


async def test_pluto_yaml_allows_agent_keys_and_the_admin_api_checks_them(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        PlutoConfig.model_validate({"agents": {"api_key_envs": ["not a name"]}})
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    gw = await served(config_dir, data_dir, agents={"api_key_envs": ["OPENROUTER_API_KEY"]})
    try:
        assert "OPENROUTER_API_KEY" in gw.config.secret_names()  # masked in logs
        async with aiohttp.ClientSession() as http:
            url = gw.http.url  # type: ignore[union-attr]
            answers = {}
            for env, status in (("SLACK_BOT_TOKEN", 422), ("OPENROUTER_API_KEY", 201)):
                body = {"agent": {"model": "openai/x", "api_base": "http://evil.example/v1",
                                  "api_key_env": env}}
                async with http.put(f"{url}/admin/agents/thief", json=body,
                                    headers=ADMIN) as r:
                    answers[env] = await r.json()
                    assert r.status == status, answers[env]
            [problem] = answers["SLACK_BOT_TOKEN"]["problems"]
            assert problem["field"] == "api_key_env" and "not a variable agents may use" in \
                problem["message"]
    finally:
        await gw.stop()


def test_names_with_a_trailing_newline_are_refused(tmp_path: Path) -> None:
    from pluto.agents.spec import load_agent
    from pluto.gateway.http.admin_agents import AgentFiles, BadRequest
    from pluto.providers.api.views import AGENT_NAME
    from pluto.providers.web import protocol

    evil = write_agent(tmp_path, "evil\n", "description: x\n")
    with pytest.raises(ConfigError):
        load_agent(evil)
    assert AgentRegistry(tmp_path / "agents").names() == []
    with pytest.raises(BadRequest):
        AgentFiles.from_body("evil\n", {"agent": {}})
    assert AGENT_NAME.fullmatch("evil\n") is None
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_frame('{"type": "hello", "agent": "evil\\n"}', 100)


# 5. JSON nested too deeply, bodies too large, posts without a timestamp ----------------------------

DEEP = "[" * 50_000 + "]" * 50_000  # Python's decoder: RecursionError
NESTED = json.loads("[" * 70 + "]" * 70)  # Python parses it; 70 deep


@pytest.mark.parametrize("kind", [str, bytes])
def test_nesting_is_measured_right_at_the_limit_and_for_documents_with_many_brackets(
        kind: type) -> None:
    """(Documents with at most 64 brackets in all are let through without measuring.)"""
    from pluto.jsonlimits import MAX_DEPTH, nesting_within

    def doc(text: str) -> str | bytes:
        return text if kind is str else text.encode()

    assert nesting_within(doc("[" * MAX_DEPTH + "]" * MAX_DEPTH))
    assert not nesting_within(doc("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)))
    assert not nesting_within(doc('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)))
    wide = json.dumps([[{"k": [i]} for i in range(200)]])  # 601 openers, 4 deep
    assert nesting_within(doc(wide))
    assert nesting_within(doc(json.dumps({"text": "[" * 500})))  # brackets inside a string
    assert nesting_within(doc('{"type": "message", "text": "hi"}'))


async def test_nested_json_gets_a_clean_400_on_every_endpoint(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.helpers.served import API_KEY, Tab, served, url

    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    api = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    admin = {**ADMIN, "Content-Type": "application/json"}
    async with served(config_dir, data_dir, ScriptedModel(fallback=echo),
                      admin={"api_key_env": "PLUTO_ADMIN_KEY"}) as gw, \
            aiohttp.ClientSession() as http:
        async with http.post(url(gw, "/api/v1/agent/tasks"), json={"input": "hi"},
                             headers=api) as r:
            task = (await r.json())["task_id"]
        posts = [("/api/v1/agent/tasks", api), (f"/api/v1/agent/tasks/{task}/steps", api),
                 ("/admin/routes/explain", admin), ("/admin/pairing/approve", admin)]
        for path, headers in posts:
            for body in (DEEP, '{"input": "x", "additional_input": %s}' % json.dumps(NESTED)):
                async with http.post(url(gw, path), data=body, headers=headers) as r:
                    answer = await r.json()
                    assert r.status == 400, (path, r.status, answer)
                    assert "Traceback" not in json.dumps(answer)
        async with http.put(url(gw, "/admin/agents/deep"), data=DEEP, headers=admin) as r:
            assert r.status == 400 and "nested" in (await r.json())["error"]
        tab = await Tab.open(http, gw)
        await tab.ws.send_str("[" * 3000 + "]" * 3000)  # under the frame cap, too deep
        error = await tab.until("error")
        assert error["code"] == "bad_json"
        await tab.send(type="message", text="still here")
        final = await tab.until("message.final")
        assert final["text"] == "echo: still here"  # the socket stayed open and serves
        await tab.ws.close()
        async with http.get(url(gw, "/healthz")) as r:
            assert r.status == 200
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_a_chunked_body_over_the_limit_is_a_413(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.served import API_KEY, served, url

    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)

    async def chunks(total: int):
        block = b"x" * (1024 * 1024)
        for _ in range(total):
            yield block

    async with served(config_dir, data_dir, ScriptedModel(fallback=echo)) as gw, \
            aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
        # more than aiohttp's client_max_size (32 MiB): before, the API answered 500
        async with http.post(url(gw, "/api/v1/agent/tasks"), data=chunks(40),
                             headers=headers) as r:
            assert r.status == 413 and (await r.json())["code"] == "too_large"


async def test_slack_posts_without_a_timestamp_or_nested_too_deeply_are_refused_cleanly(
        config_dir: Path, data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.conformance.slack_harness import SlackHttpHarness

    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        await h.start()
        url = h.fake.events_url
        assert url
        event = h.fake.event_callback({"type": "message", "channel": h.direct_chat, "text": "x",
                                       "user": h.fake.default_user, "ts": h.fake.next_ts()})
        for timestamp in ("", "soon", "1e9", "١٢٣"):  # before: int("") in the SDK, a 500
            status, _, text = await h.fake.post_signed(
                url, event, headers={"X-Slack-Request-Timestamp": timestamp})
            assert status == 401 and "Traceback" not in text, (timestamp, status, text)
        deep = '{"type": "event_callback", "event": ' + "[" * 3000 + "]" * 3000 + "}"
        nested = json.dumps({**event, "event": {**event["event"], "blocks": NESTED}})
        for body in (deep, nested):  # signed: it gets past the signature check
            status, _, text = await h.fake.post_signed(url, body)
            assert status == 400 and "Traceback" not in text, (status, text)
        assert h.received == [] and h.model.calls == []
    finally:
        await h.close()
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text


# 2. mentions and links from model text -------------------------------------------------------------

PINGS = ("Look: [everyone](!here), [all](!channel) [x](!everyone) [you](@U0PLUTOUSER) "
         "[there](#C0PLUTOTEAM) [me](tg://user?id=42) [js](javascript:alert(1)) and "
         "[docs](https://pluto.example/docs)")


async def test_model_text_never_pings_a_slack_channel(
        config_dir: Path, data_dir: Path) -> None:
    from tests.conformance.slack_harness import SlackHttpHarness

    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        await h.start(ScriptedModel(fallback=lambda m: Scripted(text=PINGS)))
        await h.user_says("summarise the dataset")
        await h.fake.wait_until(lambda: h.bot_messages(h.direct_chat), 10, "the answer")
        [raw] = [m["text"] for m in h.bot_messages(h.direct_chat)]
    finally:
        await h.close()
    for special in ("<!here", "<!channel", "<!everyone", "<@U", "<#C", "<tg:", "<javascript:"):
        assert special not in raw, raw
    assert "everyone" in raw and "<https://pluto.example/docs|docs>" in raw


@pytest.mark.parametrize("dialect", ["slack", "telegram", "discord"])
def test_links_carry_only_web_and_mail_targets(dialect: str) -> None:
    from pluto.gateway.delivery.render import render
    from pluto.providers.discord.markup import DISCORD
    from pluto.providers.slack.markup import SLACK_MRKDWN
    from pluto.providers.telegram.markup import TELEGRAM_HTML

    d = {"slack": SLACK_MRKDWN, "telegram": TELEGRAM_HTML, "discord": DISCORD}[dialect]
    out = render(PINGS + " <@123> <#456> <@&789> [m](mailto:a@pluto.example)", d)
    for target in ("!here", "!channel", "!everyone", "@U0PLUTOUSER", "#C0PLUTOTEAM", "tg://"):
        assert f"]({target}" not in out and f'"{target}' not in out and f"<{target}" not in out
    assert "<javascript" not in out and '"javascript' not in out  # (markdown-it: never a link)
    assert "https://pluto.example/docs" in out and "mailto:a@pluto.example" in out
    if dialect == "discord":  # shown as text, never a mention (and allowed_mentions pings none)
        assert "\\<@123>" in out and "\\<#456>" in out and "\\<@&789>" in out


# 3. a regular expression from routes.yaml cannot freeze the gateway --------------------------------

BOMB_ROUTES = """\
routes:
  - name: bomb
    match: {text_regex: '^(a|a)+$'}
    agent: default
  - name: classic-bomb
    match: {text_regex: '^(b+)+$'}
    agent: default
  - name: everyone-else
    match: {provider: api}
    agent: default
default: null
"""


class LoopLag:
    """A task that asks to wake every 5 ms. Between two wakes, the event loop's thread was busy
    running other callbacks for ``busy`` seconds of its own CPU time: that is how long the loop
    was blocked, whatever else the machine is doing (``late``, the wall-clock lateness, also
    counts the time the process waited for a CPU on a loaded machine)."""

    def __init__(self) -> None:
        self.busy = 0.0  # the worst, seconds
        self.late = 0.0
        self.samples = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(0.005)
            self.busy = max(self.busy, time.thread_time() - cpu)
            self.late = max(self.late, loop.time() - asked - 0.005)
            self.samples += 1


def test_a_catastrophic_text_regex_is_stopped_and_denies_the_message(tmp_path: Path) -> None:
    from pluto.gateway.pipeline.explain import explain, message_from
    from pluto.gateway.pipeline.routing import RoutingTable

    (tmp_path / "routes.yaml").write_text(BOMB_ROUTES)
    table = RoutingTable.load(tmp_path / "routes.yaml", {"default"})
    for text, rule in (("a" * 27 + "!", "bomb"), ("b" * 40 + "!", "classic-bomb")):
        m = message_from("api", "c", "u", text=text)
        decision = table.decide(m)  # before: 2**27 steps of backtracking, seconds of freeze
        assert (decision.outcome, decision.label) in (("deny", rule), ("route", "everyone-else"))
        assert decision.outcome == "deny" or rule == "classic-bomb"  # `regex` is quick on it
    m = message_from("api", "c", "u", text="a" * 27 + "!")
    assert "took longer than" in " ".join(explain(table, m).steps[0].reasons)
    assert table.decide(message_from("api", "c", "u", text="aaa")).label == "bomb"


async def test_healthz_answers_while_a_regex_bomb_is_sent(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.served import API_KEY, served, url

    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    (config_dir / "routes.yaml").write_text(BOMB_ROUTES)
    lag = LoopLag()
    async with served(config_dir, data_dir, ScriptedModel(fallback=echo)) as gw, \
            aiohttp.ClientSession() as http:
        probe = asyncio.create_task(lag.run())
        headers = {"Authorization": f"Bearer {API_KEY}"}
        healthz: list[int] = []
        try:
            for n in range(27, 47):  # each character more doubled the freeze (8.9 s at 27)
                async with http.post(url(gw, "/api/v1/agent/tasks"), headers=headers,
                                     json={"input": "a" * n + "!"}) as r:
                    assert r.status == 403 and (await r.json())["code"] == "not_routed"
                async with http.get(url(gw, "/healthz")) as r:
                    healthz.append(r.status)
        finally:
            probe.cancel()
        async with http.post(url(gw, "/api/v1/agent/tasks?wait=10"), headers=headers,
                             json={"input": "hello"}) as r:
            assert r.status == 201  # an ordinary message still gets its answer
    assert healthz == [200] * 20 and lag.samples > 10
    print(f"\nloop blocked at most {lag.busy * 1000:.1f} ms (woken up to {lag.late * 1000:.1f} "
          f"ms late) over {lag.samples} samples")
    assert lag.busy < 0.1, f"the event loop was blocked for {lag.busy * 1000:.0f} ms"


# 4. nothing fails open: an empty routes.yaml is a broken edit ---------------------------------------

GUARDED = """\
routes:
  - {name: blocked, match: {user: mallory}, deny: true}
  - {name: everyone, match: {provider: test}, agent: default}
"""


@pytest.mark.parametrize("text", ["", "   \n\n", "# halfway through a slow write\n",
                                  "defaults: {rate_limit: {user: 1/minute}}\n", "{}\n"])
def test_an_empty_or_keyless_routes_file_is_refused(tmp_path: Path, text: str) -> None:
    from pluto.gateway.pipeline.routing import RoutingTable

    (tmp_path / "routes.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        RoutingTable.load(tmp_path / "routes.yaml", {"default"})
    assert "neither 'routes:' nor 'default:'" in str(e.value)
    (tmp_path / "routes.yaml").write_text("routes: []\n")  # a table without rules, said so
    assert RoutingTable.load(tmp_path / "routes.yaml", {"default"}).spec.routes == []


async def test_an_emptied_routes_file_keeps_the_last_good_table_serving(
        config_dir: Path, data_dir: Path) -> None:
    (config_dir / "routes.yaml").write_text(GUARDED)
    cfg = PlutoConfig(data_dir=data_dir, gateway={"reload_interval_seconds": 0})
    async with Gateway(config_dir, config=cfg, model_factory=ScriptedModel(fallback=echo)) as gw:
        p = RecordingProvider("test")
        gw.add_provider(p)
        await p.running.wait()
        assert gw.routes.decide(p.msg("hi", user="mallory")).outcome == "deny"
        for text in ("", "# being written\n"):
            (config_dir / "routes.yaml").write_text(text)
            status = await gw.watcher.reload_now_async()
            assert not status.ok and "neither 'routes:' nor 'default:'" in str(status.as_dict())
            assert gw.routes.decide(p.msg("hi", user="mallory")).outcome == "deny"  # still
        with pytest.raises(ConfigError):  # and a gateway never starts with one
            Gateway(config_dir, config=cfg)


# 6. API keys: named, and scoped to their own tasks ---------------------------------------------------

ALICE, BOB, OPS = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef", "ops-key-0123456789abc"


async def test_a_key_never_reads_or_lists_another_keys_tasks(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.served import served, url

    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"alice:{ALICE}, bob:{BOB},ops:{OPS}")

    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async with served(config_dir, data_dir, ScriptedModel(fallback=echo),
                      api={"admin_keys": ["ops"]}) as gw, aiohttp.ClientSession() as http:
        async def get(path: str, key: str) -> tuple[int, Any]:
            async with http.get(url(gw, path), headers=auth(key)) as r:
                return r.status, (await r.json() if r.content_type == "application/json"
                                  else await r.text())

        async with http.post(url(gw, "/api/v1/agent/tasks?wait=10"), headers=auth(ALICE),
                             json={"input": "alice's secret plan"}) as r:
            task = await r.json()
            assert r.status == 201, task
        tid, step = task["task_id"], task["last_step"]
        own = [f"/api/v1/agent/tasks/{tid}", f"/api/v1/agent/tasks/{tid}/steps",
               f"/api/v1/agent/tasks/{tid}/steps/{step['step_id']}",
               f"/api/v1/agent/{step['run_id']}/events"]
        for path in own:  # before: any key read every task
            status, body = await get(path, BOB)
            assert status == 404 and "secret plan" not in json.dumps(body), (path, body)
            assert (await get(path, ALICE))[0] == 200 and (await get(path, OPS))[0] == 200
        async with http.post(url(gw, f"/api/v1/agent/tasks/{tid}/steps"), headers=auth(BOB),
                             json={"input": "me too"}) as r:
            assert r.status == 404
        listed = {key: (await get("/api/v1/agent/tasks", key))[1] for key in (ALICE, BOB, OPS)}
        assert [t["task_id"] for t in listed[ALICE]["tasks"]] == [tid]
        assert listed[BOB]["tasks"] == [] and listed[BOB]["pagination"]["total_items"] == 0
        assert [t["task_id"] for t in listed[OPS]["tasks"]] == [tid]
        # who made it is the key's name: routes and rate limits see "alice"
        assert gw.store is not None
        assert (await gw.store.tasks.task(tid)).owner == "alice"  # type: ignore[union-attr]


def test_api_keys_are_named_or_get_a_name_from_their_hash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pluto.providers.api.auth import ApiSettings, load_keys

    settings = ApiSettings(keys_env="PLUTO_TEST_API_KEYS")
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"ci:{ALICE},{BOB}")
    named, bare = load_keys(settings)
    assert named.name == "ci" and bare.name.startswith("key-") and len(bare.name) == 16
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"ci:{ALICE},ci:{BOB}")
    with pytest.raises(ConfigError, match="same name: ci"):
        load_keys(settings)
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", "ci:short")
    with pytest.raises(ConfigError, match="at least 16"):
        load_keys(settings)


def test_an_agents_api_base_never_gets_pluto_yamls_key(tmp_path: Path) -> None:
    from pluto.runtime.model import ModelSettings
    from pluto.runtime.runner import Runner

    write_agent(tmp_path, "elsewhere", "model: default\napi_base: http://evil.example/v1\n")
    write_agent(tmp_path, "same", "model: default\napi_base: http://models.example/v1\n")
    write_agent(tmp_path, "own", "model: default\napi_base: http://other.example/v1\n"
                                 "api_key_env: OPENROUTER_API_KEY\n")
    registry = AgentRegistry(tmp_path / "agents", key_envs=["OPENROUTER_API_KEY"])
    runner = Runner(None, models={"default": ModelSettings(  # type: ignore[arg-type]
        model="openai/x", api_base="http://models.example/v1", api_key_env="OPENAI_API_KEY")},
        tools={}, data_dir=tmp_path)
    assert runner.settings_for(registry.get("elsewhere")).api_key_env is None  # before: sent
    assert runner.settings_for(registry.get("same")).api_key_env == "OPENAI_API_KEY"
    assert runner.settings_for(registry.get("own")).api_key_env == "OPENROUTER_API_KEY"


async def test_an_emptied_pluto_yaml_is_refused_on_reload(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    (config_dir / "pluto.yaml").write_text(
        f"data_dir: {json.dumps(str(data_dir))}\nadmin: {{api_key_env: PLUTO_ADMIN_KEY}}\n"
        "access: {refusal: Not for you.}\n")
    async with Gateway(config_dir, model_factory=ScriptedModel(fallback=echo)) as gw:
        (config_dir / "pluto.yaml").write_text("# being rewritten\n")
        status = await gw.watcher.reload_now_async()
        assert not status.ok and "empty" in str(status.as_dict())
        assert gw.config.access.refusal == "Not for you."  # not reset to the defaults
        assert gw.config.admin.api_key_env == "PLUTO_ADMIN_KEY"


async def test_readyz_shows_states_and_counts_publicly_and_details_to_the_admin(
        config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    gw = await served(config_dir, data_dir)
    gw.health_reports["probe"] = lambda: {"state": "failed", "tools": 3, "ok": True,
                                          "error": "cannot reach http://10.0.0.7:9000/x",
                                          "database": f"SQLite at {data_dir}/pluto.db"}
    try:
        async with aiohttp.ClientSession() as http:
            url = gw.http.url  # type: ignore[union-attr]
            async with http.get(f"{url}/readyz") as r:
                public = await r.text()
            async with http.get(f"{url}/readyz", headers=ADMIN) as r:
                full = await r.text()
    finally:
        await gw.stop()
    assert str(data_dir) not in public and "10.0.0.7" not in public  # before: both shown
    assert json.loads(public)["checks"]["probe"] == {"state": "failed", "tools": 3, "ok": True}
    assert str(data_dir) in full and "10.0.0.7" in full


def test_pluto_yaml_never_expands_a_secret_into_a_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pluto.settings import load_pluto_config

    monkeypatch.setenv("PLUTO_MODEL_KEY", SECRET)
    monkeypatch.setenv("PLUTO_MODEL_HOST", "models.example")
    (tmp_path / "pluto.yaml").write_text(
        "models:\n  default:\n    model: openai/x\n    api_key_env: PLUTO_MODEL_KEY\n"
        "    api_base: https://${PLUTO_MODEL_HOST}/v1?key=${PLUTO_MODEL_KEY}\n")
    with pytest.raises(ConfigError) as e:
        load_pluto_config(tmp_path)
    [(_, line, field, message)] = e.value.problems
    assert (line, field) == (5, "models.default.api_base") and "expands a secret" in message
    assert SECRET not in str(e.value)
    (tmp_path / "pluto.yaml").write_text(
        "models:\n  default: {model: openai/x, api_key_env: PLUTO_MODEL_KEY,\n"
        "            api_base: 'https://${PLUTO_MODEL_HOST}/v1'}\n")
    assert load_pluto_config(tmp_path).models["default"].api_base == "https://models.example/v1"
