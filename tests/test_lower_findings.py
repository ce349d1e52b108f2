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


# URLs redacted wherever shown ---------------------------------------------------------------

PW1, PW2 = "userinfo-pw-5c1d", "query-pw-9e7a"
DB_URL = f"postgresql://pluto:{PW1}@127.0.0.1:1/pluto?connect_timeout=1&password={PW2}"


@pytest.mark.parametrize("text, shown", [
    (DB_URL, "postgresql://pluto:***@127.0.0.1:1/pluto?connect_timeout=1&password=***"),
    ("redis://:secretpw@cache:6379/0", "redis://:***@cache:6379/0"),
    ("host=db user=x password=hunter22 dbname=p", "host=db user=x password=*** dbname=p"),
    ("https://hooks.example/x?sig=abcdef&ok=1", "https://hooks.example/x?sig=***&ok=1"),
    ("https://example.com/a?b=1 and user@example.com", "https://example.com/a?b=1 and "
                                                        "user@example.com"),
])
def test_credentials_in_urls_are_masked(text, shown):
    from pluto.redaction import redact_urls
    assert redact_urls(text) == shown


def test_log_lines_never_carry_a_urls_password(caplog):
    from pluto.gateway.logs import MaskSecrets
    record = logging.LogRecord("pluto.x", logging.ERROR, __file__, 1,
                               "cannot open %s", (DB_URL,), None)
    MaskSecrets().filter(record)  # (setup_logging puts it on every handler)
    assert PW1 not in record.getMessage() and PW2 not in record.getMessage()
    assert "postgresql://pluto:***@127.0.0.1:1/pluto" in record.getMessage()


async def test_readyz_for_the_admin_shows_urls_without_passwords(config_dir, data_dir,
                                                                 monkeypatch):
    import aiohttp

    from tests.helpers.served import served, url
    monkeypatch.setenv("PLUTO_TEST_ADMIN_KEY", "admin-key-0123456789abcdef")
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", "k-0123456789abcdef")
    async with served(config_dir, data_dir,
                      admin={"api_key_env": "PLUTO_TEST_ADMIN_KEY"}) as gw:
        gw.health_reports["probe"] = lambda: {"error": f"cannot reach {DB_URL}",
                                              "urls": [DB_URL]}
        async with aiohttp.ClientSession() as http, http.get(url(gw, "/readyz"), headers={
                "Authorization": "Bearer admin-key-0123456789abcdef"}) as resp:
            text = await resp.text()
    assert "cannot reach postgresql://pluto:***@127.0.0.1:1/pluto" in text
    assert PW1 not in text and PW2 not in text


def test_a_start_up_error_never_shows_the_database_password(tmp_path):
    from tests.test_init_doctor import pluto
    assert pluto("init", "--model", "offline", cwd=tmp_path).returncode == 0
    out = pluto("serve", cwd=tmp_path, env={"DATABASE_URL": DB_URL}, timeout=60)
    assert out.returncode != 0 and "PostgreSQL" in out.stderr, out.stderr
    logs = "".join(p.read_text() for p in tmp_path.rglob("pluto.log"))
    for shown in (out.stdout, out.stderr, logs):
        assert PW1 not in shown and PW2 not in shown


# uploads refused for their size -------------------------------------------------------------

async def test_an_upload_refused_for_its_size_is_deleted_at_once(tmp_path):
    from pluto.runtime.data import DataError, DataService

    service = DataService(tmp_path, demo=False, max_upload_bytes=1000)
    sent = tmp_path / "uploads" / "web" / "chat1" / "big.csv"
    sent.parent.mkdir(parents=True)
    sent.write_text("a,b\n" + "1,2\n" * 1000)
    with pytest.raises(DataError, match="at most"):
        await service.add_upload(sent, "big.csv", "text/csv", "web:chat1")
    assert not sent.exists()
    elsewhere = tmp_path / "mine.csv"  # not an upload: refused, never deleted
    elsewhere.write_text("a,b\n" + "1,2\n" * 1000)
    with pytest.raises(DataError, match="at most"):
        await service.add_upload(elsewhere, "mine.csv", "text/csv", "x")
    assert elsewhere.exists()
