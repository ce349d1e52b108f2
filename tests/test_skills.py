"""Skills by progressive disclosure (only descriptions in the prompt, the body and the files on
demand, nothing run), and the load-time checks of what an agent names: tools, MCP servers and
skills, each a ConfigError with file, line and field."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from pluto.agents.registry import AgentRegistry
from pluto.agents.spec import load_agent
from pluto.errors import ConfigError
from pluto.events import ToolEnd
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.skills import skill_tools
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import BUILTIN_TOOLS, ToolContext
from pluto.storage.sqlite import SqliteStore

SKILL = """---
name: report-style
description: How to write a weekly sales report (headings, tone, the chart to include).
---
# Weekly report

1. Start with the total.
2. Read reference/tone.md for the tone.
"""


def make_skill(root: Path, name: str = "report-style", text: str = SKILL,
               files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(text)
    for rel, body in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(body)
    return folder


def write_agent(config: Path, yaml_text: str, name: str = "writer") -> Path:
    d = config / "agents" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "instructions.md").write_text("You write reports.")
    (d / "agent.yaml").write_text(yaml_text)
    return d


def problem(agent_dir: Path, **kw) -> tuple:
    with pytest.raises(ConfigError) as e:
        load_agent(agent_dir, **kw)
    [p] = e.value.problems
    return p[1:]  # line, field, message


def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext("run", "s", "k", "writer", tmp_path)


# --- skills ------------------------------------------------------------------------------------

def test_only_the_description_enters_the_prompt(tmp_path):
    make_skill(tmp_path / "config" / "skills", files={"reference/tone.md": "Plain, warm."})
    d = write_agent(tmp_path / "config", "instructions: instructions.md\nskills: [report-style]\n")
    spec = load_agent(d)
    assert spec.instructions.startswith("You write reports.")
    assert "report-style: How to write a weekly sales report" in spec.instructions
    assert "Start with the total" not in spec.instructions  # the body waits for the tool
    [skill] = spec.skills
    assert skill.path == (tmp_path / "config" / "skills" / "report-style").resolve()


def test_an_agents_own_skill_comes_before_a_shared_one(tmp_path):
    make_skill(tmp_path / "config" / "skills", text=SKILL.replace("How to", "Shared: how to"))
    d = write_agent(tmp_path / "config", "skills: [report-style]\n")
    make_skill(d / "skills")
    assert "Shared" not in load_agent(d).skills[0].description


async def test_load_skill_reads_the_body_and_the_files_never_more(tmp_path):
    make_skill(tmp_path / "config" / "skills", files={"reference/tone.md": "Plain, warm.",
                                                      "scripts/run.sh": "rm -rf /",
                                                      "logo.png": ""})
    (tmp_path / "config" / "skills" / "report-style" / "logo.png").write_bytes(b"\x89PNG\xff")
    (tmp_path / "config" / "secret.txt").write_text("the gateway's secret")
    spec = load_agent(write_agent(tmp_path / "config", "skills: [report-style]\n"))
    load = skill_tools(spec)["load_skill"]
    body = await load(ctx(tmp_path), {"name": "report-style"})
    assert body.content.startswith("# Weekly report") and not body.is_error
    assert "- reference/tone.md" in body.content and "- scripts/run.sh" in body.content
    assert "scripts are not run" in body.content
    tone = await load(ctx(tmp_path), {"name": "report-style", "file": "reference/tone.md"})
    assert tone.content == "Plain, warm."
    script = await load(ctx(tmp_path), {"name": "report-style", "file": "scripts/run.sh"})
    assert script.content == "rm -rf /"  # read as text, never run
    for bad, expected in [({"name": "nope"}, "no skill named 'nope'"),
                          ({"name": "report-style", "file": "../../secret.txt"},
                           "is not a file of the skill"),
                          ({"name": "report-style", "file": "/etc/passwd"},
                           "is not a file of the skill"),
                          ({"name": "report-style", "file": "missing.md"}, "has no file"),
                          ({"name": "report-style", "file": "logo.png"}, "is not text"),
                          ({"name": "report-style", "file": "reference"}, "is not a regular")]:
        with pytest.raises(Exception) as e:
            await load(ctx(tmp_path), bad)
        assert expected in str(e.value), bad


async def test_the_model_reads_a_skill_through_the_runner(tmp_path):
    make_skill(tmp_path / "config" / "skills")
    spec = load_agent(write_agent(tmp_path / "config", "skills: [report-style]\n"))
    model = ScriptedModel(Scripted(tool_calls=[_call("load_skill", '{"name": "report-style"}')]),
                          Scripted(text="Total first."))
    async with SqliteStore(tmp_path / "p.db") as store:
        runner = Runner(store.conversations, models={}, tools=BUILTIN_TOOLS, data_dir=tmp_path,
                        model_factory=model)
        session = await store.conversations.session("k", spec.name)
        events = [e async for e in runner.run(RunRequest(uuid.uuid4().hex, session, spec,
                                                         "write the report"))]
    [end] = [e for e in events if isinstance(e, ToolEnd)]
    assert end.content.startswith("# Weekly report")
    assert "Start with the total" not in model.calls[0][0]["content"]
    assert "report-style" in model.calls[0][0]["content"]


def _call(name: str, arguments: str):
    from pluto.runtime.model import ToolCall
    return ToolCall("c1", name, arguments)


@pytest.mark.parametrize("text, expected", [
    ("# no front matter\n", "must start with YAML front matter"),
    ("---\nname: report-style\n---\nbody", "needs a description"),
    ("---\ndescription: [1, 2]\n---\nbody", "needs a description"),
    ("---\nname: other\ndescription: d\n---\nbody", "must be the folder's name"),
    ("---\ndescription: d: e: [\n---\nbody", "invalid front matter"),
    ("---\ndescription: " + "x" * 2000 + "\n---\n", "longer than 1024"),
])
def test_a_bad_skill_is_a_config_error_on_its_line(tmp_path, text, expected):
    make_skill(tmp_path / "config" / "skills", text=text)
    d = write_agent(tmp_path / "config", "model: default\nskills:\n  - report-style\n")
    line, field, message = problem(d)
    assert (line, field) == (3, "skills.0") and expected in message


def test_a_missing_skill_names_where_it_was_looked_for(tmp_path):
    d = write_agent(tmp_path / "config", "skills: [nowhere]\n")
    line, field, message = problem(d)
    assert (line, field) == (1, "skills.0") and "no skill 'nowhere'" in message
    assert str(d / "skills") in message


# --- what an agent names: tools, MCP servers ----------------------------------------------------

def test_an_unknown_tool_is_a_config_error_when_the_tools_are_known(tmp_path):
    d = write_agent(tmp_path / "config", "model: default\ntools:\n  - current_time\n"
                                         "  - run_sqll\n")
    line, field, message = problem(d, known_tools={"current_time", "run_sql"})
    assert (line, field) == (4, "tools.1") and "no tool is named 'run_sqll'" in message
    assert load_agent(d).tools == ("current_time", "run_sqll")  # unchecked without the list
    registry = AgentRegistry(tmp_path / "config" / "agents", known_tools={"current_time"})
    with pytest.raises(ConfigError, match="run_sqll"):
        registry.get("writer")


@pytest.mark.parametrize("server, key_envs, at, expected", [
    ({"command": "no-such-program-xyz"}, (), "mcp.s.command",
     "command not found: no-such-program-xyz"),
    ({"command": "./missing.sh"}, (), "mcp.s.command", "command not found"),
    ({"command": sys.executable, "cwd": "nowhere"}, (), "mcp.s.cwd", "not a directory"),
    ({"command": sys.executable, "env": {"TOKEN": "abc"}}, (), "mcp.s.env",
     "write <variable>_env"),
    ({"command": sys.executable, "env": {"TOKEN_env": "not a name"}}, (), "mcp.s.env",
     "must name an environment variable"),
    ({"command": sys.executable, "env": {"TOKEN_env": "PLUTO_TELEGRAM_TOKEN"}}, ("PLUTO_X",),
     "mcp.s.env.TOKEN_env", "PLUTO_TELEGRAM_TOKEN is not a variable agents may use"),
    ({"url": "https://x.example/mcp", "headers": {"Authorization": "Bearer 1"}}, (),
     "mcp.s.headers", "write <header>_env"),
    ({"url": "ftp://x.example/mcp"}, (), "mcp.s.url", "http:// or https://"),
    ({"command": sys.executable, "url": "https://x.example/mcp"}, (), "mcp.s",
     "either command"),
    ({}, (), "mcp.s", "either command"),
    ({"url": "https://x.example/mcp", "args": ["x"]}, (), "mcp.s", "for a stdio server"),
    ({"command": sys.executable, "call_timeout": 0}, (), "mcp.s.call_timeout", "greater than"),
    ({"command": sys.executable, "prefix": "bad prefix"}, (), "mcp.s.prefix", "letters"),
    ({"command": sys.executable, "tool": ["x"]}, (), "mcp.s.tool", "unknown field"),
])
def test_a_wrong_mcp_server_is_a_config_error_naming_the_field(tmp_path, server, key_envs, at,
                                                               expected):
    import yaml
    d = write_agent(tmp_path / "config", yaml.safe_dump({"model": "default",
                                                        "mcp": {"s": server}}))
    line, field, message = problem(d, key_envs=key_envs)
    assert field == at and expected in message and line is not None


def test_a_server_name_is_checked(tmp_path):
    d = write_agent(tmp_path / "config", "mcp:\n  Bad Name:\n    command: sh\n")
    line, field, message = problem(d)
    assert (line, field) == (2, "mcp.Bad Name") and "server names" in message


def test_a_good_server_loads_with_its_resolved_cwd(tmp_path):
    d = write_agent(tmp_path / "config", "mcp:\n  local:\n    command: ./serve.sh\n"
                                         "    env: {TOKEN_env: PLUTO_T}\n    tools: [a]\n")
    (d / "serve.sh").write_text("#!/bin/sh\n")
    os.chmod(d / "serve.sh", 0o755)
    [server] = load_agent(d, key_envs={"PLUTO_T"}).mcp
    assert server.cwd == d.resolve() and server.prefix == "local_"
    assert server.settings.env_vars() == {"TOKEN": "PLUTO_T"}
