"""Issue 38's lower findings, each with its test: MCP tools named like built-ins are refused
naming both; an empty or model-less agent.yaml is refused on reload with the last good kept;
URLs are redacted wherever shown; an upload refused for its size is deleted at once."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import yaml

from pluto.agents.spec import load_agent
from pluto.errors import ConfigError
from pluto.runtime.catalog import standard_tools
from pluto.runtime.mcp import McpHub

ROOT = Path(__file__).resolve().parent.parent


def clash_agent(tmp_path: Path, **server: object) -> Path:
    d = tmp_path / "agents" / "helper"
    d.mkdir(parents=True, exist_ok=True)
    entry = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.clash"],
             "cwd": str(ROOT), "prefix": "", **server}
    (d / "agent.yaml").write_text(yaml.safe_dump({"instructions": [], "mcp": {"db": entry}}))
    return d


# MCP tools named like built-ins -------------------------------------------------------------

@pytest.mark.parametrize("tool", ["run_sql", "memory_remember"])
def test_an_allowlisted_mcp_tool_named_like_a_builtin_is_a_load_error_naming_both(
        tmp_path, tool):
    with pytest.raises(ConfigError) as e:
        load_agent(clash_agent(tmp_path, tools=[tool]), (), standard_tools().keys())
    assert f"MCP server db's tool '{tool}'" in str(e.value)
    assert f"the built-in tool {tool}" in str(e.value)


async def test_a_served_mcp_tool_named_like_a_builtin_is_not_loaded_and_said(tmp_path, caplog):
    spec = load_agent(clash_agent(tmp_path), (), standard_tools().keys())
    async with McpHub() as hub:
        tools = await hub.tools_for(spec)
        assert sorted(tools) == ["lookup"]  # run_sql and memory_remember stay Pluto's own
        [health] = hub.health().values()
    assert health["tools_not_loaded"] == [
        "the MCP server db's tool 'memory_remember' would be called memory_remember, the name "
        "of the built-in tool memory_remember: give the server a prefix (prefix: db_)",
        "the MCP server db's tool 'run_sql' would be called run_sql, the name of the built-in "
        "tool run_sql: give the server a prefix (prefix: db_)"]
    assert sum("not loaded" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR) == 2


# agent files refused on reload --------------------------------------------------------------

@pytest.mark.parametrize("broken", ["", "# nothing but a comment\n", "model: ''\n",
                                    "model: '   '\ninstructions: [a.md]\n"])
def test_an_empty_or_model_less_agent_file_is_refused_on_reload_and_the_last_good_kept(
        tmp_path, broken):
    from pluto.agents.registry import AgentRegistry

    d = tmp_path / "agents" / "helper"
    d.mkdir(parents=True)
    (d / "a.md").write_text("Answer in French.")
    (d / "agent.yaml").write_text("model: default\ninstructions: [a.md]\n")
    registry = AgentRegistry(tmp_path / "agents")
    assert registry.get("helper").instructions == "Answer in French."
    (d / "agent.yaml").write_text(broken)
    registry.forget("helper")  # look at the files again now
    kept = registry.get("helper")
    assert kept.model == "default" and kept.instructions == "Answer in French."
    assert "helper" in registry.errors
    problem = str(registry.errors["helper"])
    assert "the file is empty" in problem or "model:" in problem
    with pytest.raises(ConfigError):  # and never loaded fresh
        registry.load_fresh("helper")
