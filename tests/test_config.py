"""Configuration: typed, validated, and every error names its file, line and field."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pluto.agents.registry import AgentRegistry
from pluto.agents.spec import load_agent
from pluto.errors import ConfigError
from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig, load_pluto_config
from pluto.gateway.logs import setup_logging
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.types import IncomingMessage
from tests.helpers.gateway import write_agent


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[tuple]:
    return exc.value.problems


def test_example_config_loads(config_dir: Path) -> None:
    cfg = load_pluto_config(config_dir)
    assert cfg.models["default"].model == "offline"
    assert cfg.http.port == 8000
    assert AgentRegistry(config_dir / "agents").get("default").tools == (
        "current_time", "list_datasets", "describe_dataset", "run_sql", "make_chart")


def test_environment_interpolation(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUTO_MODEL", "openai/some-model")
    monkeypatch.setenv("PLUTO_API_BASE", "http://127.0.0.1:9/v1")
    m = load_pluto_config(config_dir).models["default"]
    assert (m.model, m.api_base, m.api_key_env) == ("openai/some-model", "http://127.0.0.1:9/v1",
                                                    "PLUTO_API_KEY")


@pytest.mark.parametrize("text, line, field, words", [
    ("http:\n  port: 80800\n", 2, "http.port", "less than or equal to 65535"),
    ("http:\n  host: x\n  prot: 1\n", 3, "http.prot", "unknown field"),
    ("models:\n  default:\n    model: ''\n", 3, "models.default.model", "must name a model"),
    ("models:\n  default:\n    api_key_env: 'sk-live-123'\n", 3, "models.default.api_key_env",
     "should match pattern"),
    ("log_level: LOUD\n", 1, "log_level", "should match pattern"),
    ("http: [1, 2\n", 2, "", "flow sequence started on line 1"),
    ("- just\n- a list\n", 1, "", "expected a mapping"),
])
def test_pluto_yaml_errors_name_file_line_field(config_dir: Path, text: str, line: int,
                                                field: str, words: str) -> None:
    (config_dir / "pluto.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_pluto_config(config_dir)
    file, got_line, got_field, message = problems(exc)[0]
    assert file.endswith("pluto.yaml") and got_line == line and got_field == field
    assert words in message
    assert str(exc.value).startswith(f"{file}:{line}:")


@pytest.mark.parametrize("text, line, field, words", [
    ("routes:\n  - match: {provider: cli}\n    agent: nobody\n", 3, "routes[0].agent",
     "unknown agent 'nobody'"),
    ("routes:\n  - match: {text_regex: '(['}\n    agent: default\n", 2,
     "routes[0].match.text_regex", "not a valid regular expression"),
    ("routes:\n  - match: {provider: cli}\n", 2, "routes[0]", "needs an 'agent'"),
    ("routes:\n  - match: {provder: cli}\n    agent: default\n", 2, "routes[0].match.provder",
     "unknown field"),
    ("routes:\n  - agent: default\n    session: forever\n", 3, "routes[0].session", "Input should be"),
    ("default: ghost\n", 1, "default", "unknown agent 'ghost'"),
])
def test_routes_errors(config_dir: Path, text: str, line: int, field: str, words: str) -> None:
    (config_dir / "routes.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        RoutingTable.load(config_dir / "routes.yaml", {"default"})
    file, got_line, got_field, message = problems(exc)[0]
    assert file.endswith("routes.yaml") and (got_line, got_field) == (line, field)
    assert words in message


@pytest.mark.parametrize("yaml_text, field, words", [
    ("budget:\n  max_seconds: -5\n", "budget.max_seconds", "greater than 0"),
    ("tools: current_time\n", "tools", "valid list"),
    ("instructions: [missing.md]\n", "instructions.0", "file not found: missing.md"),
    ("instructions: ../../pluto.yaml\n", "instructions.0", "inside the agent's directory"),
    ("name: other\n", "name", "must match the directory name"),
    ("modle: x\n", "modle", "unknown field"),
])
def test_agent_errors(config_dir: Path, yaml_text: str, field: str, words: str) -> None:
    d = write_agent(config_dir, "broken", yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_agent(d)
    file, line, got_field, message = problems(exc)[0]
    assert file.endswith("broken/agent.yaml") and got_field == field and words in message
    assert line is not None


def test_gateway_refuses_to_start_with_a_broken_agent(config_dir: Path, data_dir: Path) -> None:
    write_agent(config_dir, "broken", "budget: {max_tool_calls: many}\n")
    # startup loads the agents the table routes to (others load when first used)
    (config_dir / "routes.yaml").write_text("default: broken\n")
    with pytest.raises(ConfigError, match=r"broken/agent.yaml:1: budget.max_tool_calls"):
        Gateway(config_dir, config=PlutoConfig(data_dir=data_dir))


def test_routing_rules_first_match_wins(config_dir: Path) -> None:
    write_agent(config_dir, "support", "description: support\n")
    (config_dir / "routes.yaml").write_text(
        "routes:\n"
        "  - {name: vip, match: {user: [42, 43]}, agent: support, session: user}\n"
        "  - {name: sql, match: {text_prefix: 'SELECT'}, agent: support, session: shared}\n"
        "  - {match: {direct: false, mention: false}, deny: true}\n"
        "default: default\n")
    table = RoutingTable.load(config_dir / "routes.yaml", {"default", "support"})

    def msg(**kw: object) -> IncomingMessage:
        base = dict(provider="telegram", chat_id="9", user_id="1", text="hi")
        return IncomingMessage(**(base | kw))  # type: ignore[arg-type]

    vip = table.route(msg(user_id="42"))
    assert (vip.agent, vip.rule, vip.session_key) == ("support", "vip", "support/telegram/9/u/42")
    assert table.route(msg(text="SELECT 1")).session_key == "support/shared"
    assert table.route(msg(is_direct=False)) is None
    assert table.route(msg(is_direct=False, mentions_bot=True)).rule == "default"
    assert table.pinned("telegram", "support").route(msg()).agent == "support"


def test_secrets_never_reach_the_logs(config_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("PLUTO_API_KEY", "sk-very-secret-value")
    cfg = load_pluto_config(config_dir)
    assert "sk-very-secret-value" not in cfg.model_dump_json()
    setup_logging("INFO", secret_env_names=cfg.secret_names(), log_file=tmp_path / "x.log")
    logging.getLogger("t").error("calling with key %s", "sk-very-secret-value")
    try:
        raise ValueError("bad key sk-very-secret-value")
    except ValueError:
        logging.getLogger("t").exception("failed")
    logged = capsys.readouterr().err + (tmp_path / "x.log").read_text()
    assert "sk-very-secret-value" not in logged and logged.count("***") >= 2
    logging.getLogger().handlers.clear()
