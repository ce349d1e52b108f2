"""Property-based fuzz of routes.yaml and agent.yaml: whatever an admin (or a half-finished
save) puts in them, loading never crashes, and every error names the file it is about."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pluto.agents.registry import AgentRegistry
from pluto.errors import ConfigError
from pluto.gateway.pipeline.explain import explain, message_from
from pluto.gateway.reload import load_routes
from pluto.gateway.pipeline.routing import RoutingTable
from tests.helpers.gateway import write_agent

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
words = st.sampled_from([
    "default", "other", "ghost", "cli", "telegram", "5/minute", "0/s", "3/10s", "lots", "open",
    "pairing", "chat", "user", "thread", "shared", "current_time", "instructions.md",
    "../outside.md", "/etc/hostname", "", "(", "[a-", ".*", "a{99999999999}", "${HOME}",
    "${NOPE:-fallback}", "\x00", "~", "yes", "null", "1e309"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), text, words)
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.one_of(text, words), kids, max_size=4), max_leaves=12)


def field(names: list[str], good: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping of known (and a few unknown) field names to good or arbitrary values."""
    return st.dictionaries(st.sampled_from(names + ["bogus"]), st.one_of(good, values),
                           max_size=len(names))


match = field(["provider", "chat", "user", "guild", "thread", "direct", "mention",
               "text_prefix", "text_regex"], st.one_of(words, st.lists(words, max_size=3),
                                                       st.booleans()))
rate = field(["user", "chat"], words)
rule = field(["name", "match", "agent", "deny", "session", "tools", "rate_limit",
              "require_mention", "access"],
             st.one_of(match, rate, words, st.booleans(), st.lists(words, max_size=3)))
routes_doc = st.one_of(
    field(["routes", "default", "defaults"], st.one_of(st.lists(rule, max_size=5), words,
                                                       field(["rate_limit", "access",
                                                              "require_mention"],
                                                             st.one_of(rate, words)))),
    values)
agent_doc = st.one_of(
    field(["name", "description", "model", "api_base", "api_key_env", "temperature",
           "instructions", "tools", "datasets", "budget", "history"],
          st.one_of(words, st.lists(words, max_size=3), st.floats(-5, 5),
                    field(["max_seconds", "max_tokens", "max_tool_calls", "max_messages"],
                          st.integers(-3, 10**6)))),
    values)


def as_text(doc: Any, cut: float | None) -> str:
    dumped = yaml.safe_dump(doc, allow_unicode=True, default_flow_style=None)
    return dumped[:int(len(dumped) * cut)] if cut is not None else dumped  # a half-written save


cuts = st.one_of(st.none(), st.floats(0, 1))
raw = st.one_of(text, st.binary(max_size=60))


@pytest.fixture(scope="module")
def config() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp())
    write_agent(root, "default", "tools: [current_time]\n")
    write_agent(root, "other", "description: other\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


MESSAGES = [message_from("telegram", "1", "2"), message_from("cli", "t", "u", group=True,
                                                             mention=True, text="/sql x"),
            message_from("slack", "C", "U", thread="T", guild="G", text="hello world")]


def check_routes(config: Path, content: str | bytes) -> None:
    path = config / "routes.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    try:
        table = load_routes(config, AgentRegistry(config / "agents"))
    except ConfigError as e:
        assert e.problems and all(p[0] == str(path) for p in e.problems), e.problems
        assert all(str(ConfigError([p])).startswith(f"{path}") for p in e.problems)
        return
    for m in MESSAGES:  # a table that loads routes and explains any message
        decision = table.decide(m)
        assert explain(table, m).decision == decision
        explain(table, m).text()


@FUZZ
@given(doc=routes_doc, cut=cuts)
def test_routes_yaml_never_crashes_and_errors_name_the_file(config: Path, doc: Any,
                                                            cut: float | None) -> None:
    check_routes(config, as_text(doc, cut))


@FUZZ
@given(content=raw)
def test_routes_yaml_raw_bytes(config: Path, content: str | bytes) -> None:
    check_routes(config, content)


def check_agent(config: Path, content: str | bytes) -> None:
    agent_dir = config / "agents" / "fuzzed"
    agent_dir.mkdir(exist_ok=True)
    (agent_dir / "instructions.md").write_text("Be brief.")
    path = agent_dir / "agent.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    registry = AgentRegistry(config / "agents")
    try:
        spec = registry.get("fuzzed")
    except ConfigError as e:
        assert e.problems and all(p[0] == str(path) for p in e.problems), e.problems
        assert "fuzzed" in registry.errors
        return
    assert spec.name == "fuzzed" and spec.source == agent_dir
    RoutingTable.load(config / "nothing.yaml", set(registry.names()))


@FUZZ
@given(doc=agent_doc, cut=cuts)
def test_agent_yaml_never_crashes_and_errors_name_the_file(config: Path, doc: Any,
                                                           cut: float | None) -> None:
    check_agent(config, as_text(doc, cut))


@FUZZ
@given(content=raw)
def test_agent_yaml_raw_bytes(config: Path, content: str | bytes) -> None:
    assume(content not in (b"", ""))
    check_agent(config, content)


@pytest.mark.parametrize("content", [
    "[" * 3000 + "]" * 3000,  # nested too deeply for the parser
    "routes: &a [*a]\n",  # an alias that contains itself
    "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(  # aliases that multiply (a 'billion laughs')
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 10) + "]\n"
        for i in range(6)) + "routes: [*g]\n",
    "routes:\n  - match: {text_regex: 'a{99999999999}'}\n    agent: default\n",
    "\ufeffroutes: [{agent: default}]\n",  # a byte-order mark
    "routes:\n\t- agent: default\n",  # a tab
])
def test_known_nasty_routes_files(config: Path, content: str) -> None:
    check_routes(config, content)


@pytest.mark.parametrize("content", ["[" * 3000 + "]" * 3000, "tools: &a [*a]\n",
                                     "instructions: \"a\\0b\"\n", "instructions: /\n"])
def test_known_nasty_agent_files(config: Path, content: str) -> None:
    check_agent(config, content)
