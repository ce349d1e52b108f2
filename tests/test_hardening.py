"""Issue 18, hardening: secrets never leave, no input can freeze the gateway, nothing fails open.

Each test here failed before its fix: the secret on the A2A card, the agent key outside the
allowlist, names accepted with a trailing newline, the Slack ``!here`` and other link targets,
the regex bomb in routes.yaml (with ``/healthz`` answering meanwhile), the empty routes.yaml,
nested JSON on every endpoint, the chunked body over the limit, the Slack post without a
timestamp, and one API key reading another's tasks.
"""

from __future__ import annotations

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
    gw = await served(config_dir, data_dir)
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
            async with http.get(f"{url}/agents/put-leaky/.well-known/agent.json") as r:
                card = await r.text()
            assert SECRET not in card and "${SLACK_BOT_TOKEN}" in card
            async with http.get(f"{url}/readyz") as r:
                ready = await r.json()
            assert set(ready) == {"status", "instance", "checks"}
            assert set(ready["checks"]) <= {"config", "storage", "providers", "intake", "mcp"}
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
