"""Live reload while the gateway serves: valid edits apply, broken ones are refused and the last
good configuration keeps serving, and no message is dropped on the way."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pluto.agents.registry import AgentRegistry
from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.gateway import RecordingProvider, write_agent

ROOT = Path(__file__).resolve().parent.parent
TO_ALPHA = "routes:\n  - {name: main, match: {provider: test}, agent: alpha}\n"
TO_BETA = "routes:\n  - {name: main, match: {provider: test}, agent: beta}\n"


def who_answers(messages: list[dict[str, Any]]) -> Scripted:
    system = messages[0]["content"] if messages[0]["role"] == "system" else "nobody"
    return Scripted(text=f"{system}: {messages[-1]['content']}")


async def until(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    async def poll() -> Any:
        while not (value := cond()):
            await asyncio.sleep(0.02)
        return value
    return await asyncio.wait_for(poll(), timeout)


def write(path: Path, text: str) -> None:
    """Like an editor: a new file renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def config(config_dir: Path) -> Path:
    write_agent(config_dir, "alpha", "description: first\ninstructions: instructions.md\n",
                "I am alpha")
    write_agent(config_dir, "beta", "description: second\ninstructions: instructions.md\n",
                "I am beta")
    (config_dir / "routes.yaml").write_text(TO_ALPHA)
    return config_dir


async def serving(config: Path, data_dir: Path, interval: float = 0.05,
                  **gateway: Any) -> tuple[Gateway, RecordingProvider]:
    cfg = PlutoConfig(data_dir=data_dir, gateway={"reload_interval_seconds": interval, **gateway})
    gw = Gateway(config, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                 model_factory=ScriptedModel(fallback=who_answers))
    await gw.start()
    p = RecordingProvider("test")
    gw.add_provider(p)
    await p.running.wait()
    return gw, p


@pytest.fixture
async def gw_p(config: Path, data_dir: Path):
    gw, p = await serving(config, data_dir)
    gw.registry.recheck_seconds = 0  # these tests edit files and ask at once
    yield gw, p
    await gw.stop()


async def ask(p: RecordingProvider, text: str, chat: str = "probe") -> str:
    before = len(p.finals(chat))
    await p.say(text, chat=chat)
    return (await p.wait_finals(before + 1, chat=chat))[-1]


async def test_an_edit_applies_live_and_no_message_is_dropped(config: Path, data_dir: Path):
    """The 'done when' of the issue, in-process with the default interval (0.25 s)."""
    gw, p = await serving(config, data_dir, interval=0.25)
    try:
        sent: list[str] = []

        async def keep_talking() -> None:
            for i in range(80):
                sent.append(f"m{i}")
                await p.say(f"m{i}", chat=f"c{i}")
                await asyncio.sleep(0.01)

        talker = asyncio.create_task(keep_talking())
        await until(lambda: p.finals("c0"))  # messages are being answered (the first by alpha)
        edited = time.monotonic()
        write(config / "routes.yaml", TO_BETA)
        await until(lambda: gw.routes.route(p.msg("x")).agent == "beta")  # type: ignore
        logging.getLogger(__name__).info("applied after %.2fs", time.monotonic() - edited)
        await talker
        await until(lambda: len(p.finals()) == len(sent))
        answers = {m.chat_id: m.text for m in p.sent if m.kind == "reply"}
        assert sorted(answers) == sorted(f"c{i}" for i in range(80))  # every message answered
        assert answers["c0"] == "I am alpha: m0" and answers["c79"] == "I am beta: m79"
        assert gw.watcher.status.ok and gw.watcher.status.generation == 2
    finally:
        await gw.stop()


BROKEN = [
    ("bad YAML", "routes:\n  - match: {provider: test\n    agent: beta\n", 3, "invalid YAML"),
    ("unknown agent", "routes:\n  - {match: {provider: test}, agent: ghost}\n", 2,
     "unknown agent 'ghost'"),
    ("bad regex", "routes:\n  - match: {text_regex: '(['}\n    agent: beta\n", 2,
     "not a valid regular expression"),
    ("half-written", TO_BETA[:30], 2, "invalid YAML"),
]


@pytest.mark.parametrize("kind, text, line, words", BROKEN, ids=[b[0] for b in BROKEN])
async def test_a_broken_edit_is_refused_and_the_old_table_serves(gw_p, config, caplog, kind,
                                                                 text, line, words):
    gw, p = gw_p
    write(config / "routes.yaml", text)
    status = await until(lambda: gw.watcher.status.refused.get("routes") and gw.watcher.status)
    file, got_line, field, message = status.refused["routes"][0]
    assert file == str(config / "routes.yaml") and got_line == line and words in message
    assert await ask(p, "still there?") == "I am alpha: still there?"
    assert f"refused the edit of {config / 'routes.yaml'}" in caplog.text
    assert f"routes.yaml:{line}:" in caplog.text
    write(config / "routes.yaml", TO_BETA)  # fixed
    await until(lambda: not gw.watcher.status.refused)
    assert await ask(p, "and now?") == "I am beta: and now?"


async def test_a_deleted_file_is_refused_until_it_is_back(gw_p, config):
    gw, p = gw_p
    (config / "routes.yaml").unlink()
    await until(lambda: "routes" in gw.watcher.status.refused)
    assert "the file is gone" in gw.watcher.status.refused["routes"][0][3]
    assert await ask(p, "hello") == "I am alpha: hello"
    write(config / "routes.yaml", TO_BETA)
    await until(lambda: not gw.watcher.status.refused)
    assert await ask(p, "hello") == "I am beta: hello"


async def test_many_rapid_edits_settle_on_the_last(gw_p, config):
    gw, p = gw_p
    talk = [p.say(f"r{i}", chat=f"r{i}") for i in range(40)]
    for i in range(40):
        (config / "routes.yaml").write_text(TO_BETA if i % 2 else TO_ALPHA)  # in place
        await talk[i]
        await asyncio.sleep(0.005)
    write(config / "routes.yaml", TO_BETA + "# the last edit\n")
    await until(lambda: gw.routes.path is not None and "last edit" in gw.routes.path.read_text()
                and gw.routes.route(p.msg("x")).agent == "beta")  # type: ignore[union-attr]
    await until(lambda: len(p.finals()) == 40)
    assert all(re.fullmatch(r"I am (alpha|beta): r\d+", t) for t in p.finals())
    assert gw.watcher.status.ok and await ask(p, "last") == "I am beta: last"


async def test_pluto_yaml_applies_live_where_safe(gw_p, config):
    gw, p = gw_p
    text = (config / "pluto.yaml").read_text()
    write(config / "pluto.yaml", text.replace("refusal: null", "refusal: Go away, politely.")
          .replace("port: ${PLUTO_HTTP_PORT:-8000}", "port: 8123")
          .replace("max_queued_per_session: 50", "max_queued_per_session: 7"))
    await until(lambda: gw.config.access.refusal == "Go away, politely.")
    assert gw.pipeline.lanes.max_queued == 7 and gw.watcher.status.restart_needed == ["http"]
    assert gw.config.http.port == 0 or gw.config.http.port != 8123  # needs a restart
    write(config / "pluto.yaml", "http: {port: lots}\n")
    write(config / "routes.yaml", TO_BETA)  # a broken pluto.yaml does not hold routes back
    await until(lambda: gw.routes.route(p.msg("x")).agent == "beta")  # type: ignore
    file, line, field, _ = gw.watcher.status.refused["pluto"][0]
    assert file.endswith("pluto.yaml") and (line, field) == (1, "http.port")
    assert gw.config.access.refusal == "Go away, politely."  # the last good version serves


async def test_agent_edits_reload_and_a_broken_one_keeps_the_last_good(gw_p, config):
    gw, p = gw_p
    assert await ask(p, "one") == "I am alpha: one"
    (config / "agents" / "alpha" / "instructions.md").write_text("I am alpha v2")
    assert await ask(p, "two") == "I am alpha v2: two"
    (config / "agents" / "alpha" / "agent.yaml").write_text(
        "instructions: instructions.md\nbudget: {max_seconds: -1}\n")
    await until(lambda: "alpha" in gw.watcher.status.agents)
    file, line, field, _ = gw.watcher.status.agents["alpha"][0]
    assert file.endswith("alpha/agent.yaml") and (line, field) == (2, "budget.max_seconds")
    assert await ask(p, "three") == "I am alpha v2: three"
    (config / "agents" / "alpha" / "agent.yaml").unlink()  # deleted mid-edit
    assert await ask(p, "four") == "I am alpha v2: four"
    (config / "agents" / "alpha" / "agent.yaml").write_text(
        "description: fixed\ninstructions: instructions.md\n")
    await until(lambda: not gw.watcher.status.agents)
    assert gw.registry.get("alpha").description == "fixed"


async def test_a_run_keeps_the_definition_it_started_with(gw_p, config):
    gw, p = gw_p
    model = gw.runner.model_factory
    model.turns.append(Scripted(text="slow answer from the old definition", chunk=4,  # type: ignore
                                delay=0.02))
    await p.say("long question", chat="slow")
    await until(lambda: model.calls)  # type: ignore[attr-defined]
    (config / "agents" / "alpha" / "instructions.md").write_text("I am alpha v2")
    assert await ask(p, "quick") == "I am alpha v2: quick"
    assert await p.wait_finals(1, chat="slow") == ["slow answer from the old definition"]
    assert model.calls[0][0]["content"] == "I am alpha"  # type: ignore[attr-defined]


async def test_routes_to_an_agent_that_appears_later(gw_p, config):
    gw, p = gw_p
    write(config / "routes.yaml", "routes:\n  - {match: {provider: test}, agent: gamma}\n")
    await until(lambda: "routes" in gw.watcher.status.refused)
    write_agent(config, "gamma", "instructions: instructions.md\n", "I am gamma")
    await until(lambda: not gw.watcher.status.refused)
    assert await ask(p, "hi") == "I am gamma: hi"


def test_ten_thousand_agents_start_fast_and_only_those_in_use_are_loaded(config_dir: Path,
                                                                        data_dir: Path):
    agents = config_dir / "agents"
    for i in range(10_000):
        d = agents / f"a{i:05d}"
        d.mkdir()
        (d / "agent.yaml").write_text(f"description: agent {i}\n")
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir))
    assert len(gw.registry.names()) == 10_002  # and default, cook
    assert len(gw.registry) == 1  # only 'default', the agent routes.yaml names, is in memory
    registry = AgentRegistry(agents, cache_size=50)
    for i in range(0, 10_000, 50):
        assert registry.get(f"a{i:05d}").description == f"agent {i}"
    assert len(registry) == 50


# the real thing: `pluto serve` in a subprocess, observed through the admin API ---------------

KEY = "admin-key-for-tests-0123456789"


def _call(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _wait(cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the gateway")


def test_pluto_serve_reloads_routes_live(config: Path, data_dir: Path) -> None:
    (config / "pluto.yaml").write_text("admin: {api_key_env: PLUTO_ADMIN_KEY}\n"
                                       "gateway: {reload_interval_seconds: 0.25}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env |= {"PLUTO_ADMIN_KEY": KEY, "PLUTO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pluto.gateway.cli", "serve", "--port", "0",
                             "--config", str(config)], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")),  # type: ignore
                              daemon=True)
    reader.start()
    try:
        url = _wait(lambda: next((m.group(1) for line in lines if (m := re.search(
            r"listening on (http://\S+)", line))), None))
        probe = {"provider": "test", "chat": "1", "user": "2"}

        def agent() -> str:
            return _call(f"{url}/admin/routes/explain", "POST", probe)[1]["agent"]

        assert agent() == "alpha"
        write(config / "routes.yaml", TO_BETA)
        _wait(lambda: agent() == "beta")
        write(config / "routes.yaml", "routes:\n  - {match: {provider: test}, agent: nobody}\n")
        status = _wait(lambda: (s := _call(f"{url}/admin/reload")[1])["status"] == "refused"
                       and s)
        assert status["problems"][0]["line"] == 2
        assert "unknown agent 'nobody'" in status["problems"][0]["message"]
        assert agent() == "beta"  # the last good table keeps serving
        _wait(lambda: any("refused the edit of" in line for line in lines))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=5)
    assert proc.returncode == 0
    log = "".join(lines)
    assert f"{config / 'routes.yaml'}:2: routes[0].agent" in log and "Traceback" not in log
