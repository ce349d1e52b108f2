"""The routing table: every rule kind, precedence, policies, errors, and explain."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pluto.agents.registry import AgentRegistry
from pluto.errors import ConfigError
from pluto.gateway.pipeline.explain import explain, message_from, unreachable
from pluto.gateway.reload import load_routes
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.types import IncomingMessage
from tests.helpers.gateway import write_agent

ROOT = Path(__file__).resolve().parent.parent
AGENTS = {"default", "support", "sql"}


def table(tmp_path: Path, text: str, agents: set[str] | None = AGENTS) -> RoutingTable:
    path = tmp_path / "routes.yaml"
    path.write_text(text)
    return RoutingTable.load(path, agents)


def msg(**kw: object) -> IncomingMessage:
    base: dict[str, object] = dict(provider="telegram", chat_id="9", user_id="1", text="hi")
    return IncomingMessage(**(base | kw))  # type: ignore[arg-type]


# every kind of condition: (match, a message it takes, one it does not, the reason given)
KINDS = [
    ("{provider: telegram}", {}, {"provider": "slack"}, "provider is 'slack', the rule wants "
                                                        "'telegram'"),
    ("{provider: [slack, telegram]}", {}, {"provider": "web"}, "'slack' or 'telegram'"),
    ("{chat: '-100'}", {"chat_id": "-100"}, {}, "chat is '9', the rule wants '-100'"),
    ("{user: [42, 43]}", {"user_id": "43"}, {}, "user is '1', the rule wants '42' or '43'"),
    ("{guild: G1}", {"guild_id": "G1"}, {}, "guild is not set, the rule wants 'G1'"),
    ("{thread: T1}", {"thread_id": "T1"}, {"thread_id": "T2"}, "thread is 'T2'"),
    ("{direct: true}", {}, {"is_direct": False}, "it is a group message, the rule wants direct"),
    ("{direct: false}", {"is_direct": False}, {}, "it is a direct message, the rule wants group"),
    ("{mention: true}", {"mentions_bot": True}, {}, "the bot is not mentioned"),
    ("{mention: false}", {}, {"mentions_bot": True}, "the bot is mentioned, the rule wants no"),
    ("{text_prefix: '/sql '}", {"text": "/sql select 1"}, {}, "does not start with '/sql '"),
    ("{text_prefix: ['!', '?']}", {"text": "?help"}, {}, "does not start with '!' or '?'"),
    ("{text_regex: '(?i)^select\\b'}", {"text": "SELECT 1"}, {"text": "selected"},
     "does not match /(?i)^select\\b/"),
]


@pytest.mark.parametrize("match, takes, refuses, reason", KINDS)
def test_every_rule_kind_matches_and_explains(tmp_path: Path, match: str, takes: dict,
                                              refuses: dict, reason: str) -> None:
    t = table(tmp_path, f"routes:\n  - name: r\n    match: {match}\n    agent: support\n"
                        "default: default\n")
    hit = t.route(msg(**takes))
    assert hit is not None and (hit.agent, hit.rule) == ("support", "r")
    miss = msg(**refuses)
    assert t.route(miss).agent == "default"  # type: ignore[union-attr]
    why = explain(t, miss)
    assert not why.steps[0].matched and reason in why.steps[0].reasons[0]
    rule = t.spec.routes[0].match  # the quick test and the reasons agree, both ways
    for m in (msg(**takes), miss):
        assert rule.matches(m) == (rule.failures(m) == [])
    assert why.decision.label == "default" and "default agent 'default' answers" in why.summary()


def test_all_conditions_must_hold_and_explain_lists_each_failure(tmp_path: Path) -> None:
    t = table(tmp_path, "routes:\n  - match: {provider: slack, user: 7, direct: false}\n"
                        "    agent: support\ndefault: null\n")
    assert t.route(msg(provider="slack", user_id="7", is_direct=False)) is not None
    assert t.route(msg(provider="slack", user_id="7")) is None
    why = explain(t, msg())
    assert len(why.steps[0].reasons) == 3 and why.decision.outcome == "unmatched"
    text = why.text()
    assert "routes[0] (line 2): no — provider is 'telegram'" in text
    assert "and user is '1'" in text and "no default agent" in text


def test_first_match_wins_and_deny_is_a_rule_like_any_other(tmp_path: Path) -> None:
    t = table(tmp_path, """
routes:
  - {name: blocked, match: {user: "13"}, deny: true}
  - {name: sql, match: {text_prefix: SELECT}, agent: sql, session: shared}
  - {name: vip, match: {user: ["42", "43"]}, agent: support, session: user}
  - {name: groups-off, match: {direct: false, mention: false}, deny: true}
default: default
""")
    assert t.route(msg(user_id="13", text="SELECT 1")) is None  # deny comes first
    assert t.decide(msg(user_id="13")).outcome == "deny"
    assert t.route(msg(user_id="42", text="SELECT 1")).rule == "sql"  # type: ignore[union-attr]
    vip = t.route(msg(user_id="42"))
    assert vip is not None and (vip.agent, vip.session_key) == ("support",
                                                                "support/telegram/9/u/42")
    assert t.route(msg(is_direct=False)) is None
    assert t.route(msg(is_direct=False, mentions_bot=True)).rule == "default"  # type: ignore
    why = explain(t, msg(user_id="13"))
    assert why.decision.label == "blocked" and "denies it" in why.summary()
    assert len(why.steps) == 1 and why.steps[0].matched


def test_session_scopes_and_tools(tmp_path: Path) -> None:
    t = table(tmp_path, """
routes:
  - {match: {provider: a}, agent: support, session: chat, tools: [current_time]}
  - {match: {provider: b}, agent: support, session: user}
  - {match: {provider: c}, agent: support, session: thread}
  - {match: {provider: d}, agent: support, session: shared, tools: []}
""")
    assert t.route(msg(provider="a")).session_key == "support/a/9"  # type: ignore[union-attr]
    assert t.route(msg(provider="a")).tools == ("current_time",)  # type: ignore[union-attr]
    assert t.route(msg(provider="b", user_id="5")).session_key == "support/b/9/u/5"  # type: ignore
    assert t.route(msg(provider="c", thread_id="T")).session_key == "support/c/9/t/T"  # type: ignore
    assert t.route(msg(provider="c")).session_key == "support/c/9"  # type: ignore[union-attr]
    shared = t.route(msg(provider="d"))
    assert shared is not None and (shared.session_key, shared.tools) == ("support/shared", ())
    assert t.route(msg(provider="z")).tools is None  # type: ignore[union-attr]


def test_require_mention_applies_to_groups_only(tmp_path: Path) -> None:
    t = table(tmp_path, "routes:\n  - {name: team, match: {chat: '9'}, agent: support,"
                        " require_mention: true}\n")
    assert t.route(msg()) is not None  # a direct message needs no mention
    quiet = t.decide(msg(is_direct=False))
    assert quiet.outcome == "needs_mention" and t.route(msg(is_direct=False)) is None
    assert t.route(msg(is_direct=False, mentions_bot=True)).rule == "team"  # type: ignore
    assert "only when the bot is mentioned" in explain(t, msg(is_direct=False)).summary()


def test_defaults_apply_unless_a_rule_says_otherwise(tmp_path: Path) -> None:
    t = table(tmp_path, """
defaults: {require_mention: true, access: pairing, rate_limit: {user: 5/minute}}
routes:
  - {name: open, match: {provider: web}, agent: support, access: open, require_mention: false,
     rate_limit: {chat: 100/hour}}
  - {name: plain, match: {provider: slack}, agent: support}
""")
    open_ = t.decide(msg(provider="web", is_direct=False)).policy
    assert (open_.access, open_.require_mention, str(open_.rate_limit)) == (
        "open", False, "100 per hour per chat")
    plain = t.decide(msg(provider="slack", is_direct=False, mentions_bot=True)).policy
    assert (plain.access, plain.require_mention, str(plain.rate_limit)) == (
        "pairing", True, "5 per minute per user")
    fallback = t.decide(msg(provider="x"))
    assert fallback.label == "default" and fallback.policy.access == "pairing"
    assert t.decide(msg(provider="x", is_direct=False)).outcome == "needs_mention"


def test_pinned_goes_first_and_is_open(tmp_path: Path) -> None:
    t = table(tmp_path, "defaults: {access: pairing, rate_limit: {user: 1/hour}}\n"
                        "routes:\n  - {match: {provider: cli}, deny: true}\n")
    pinned = t.pinned("cli", "support").pinned("cli", "sql")
    d = pinned.decide(msg(provider="cli"))
    assert (d.outcome, d.route.agent, d.policy.access) == ("route", "sql", "open")  # type: ignore
    assert d.policy.rate_limit is not None and not d.policy.rate_limit.rates()
    assert len(pinned.spec.routes) == 2


@pytest.mark.parametrize("text, line, field, words", [
    ("routes:\n  - {match: {}, agent: support, rate_limit: {user: lots}}\n", 2,
     "routes[0].rate_limit.user", "expected a rate like '5/minute'"),
    ("routes:\n  - {match: {}, agent: support, rate_limit: {user: 0/minute}}\n", 2,
     "routes[0].rate_limit.user", "at least 1 message"),
    ("routes:\n  - {match: {}, agent: support, rate_limit: {users: 1/minute}}\n", 2,
     "routes[0].rate_limit.users", "unknown field"),
    ("routes:\n  - {match: {}, agent: support, access: closed}\n", 2, "routes[0].access",
     "'open' or 'pairing'"),
    ("routes:\n  - match: {}\n    deny: true\n    agent: support\n", 2, "routes[0]",
     "remove 'agent' or 'deny'"),
    ("routes:\n  - {name: a, agent: support}\n  - {name: a, agent: sql}\n", 3,
     "routes[1].name", "already named 'a'"),
    ("routes:\n  - {match: {direct: maybe}, agent: support}\n", 2, "routes[0].match.direct",
     "valid boolean"),
    ("routes:\n  - {match: {provider: {a: 1}}, agent: support}\n", 2,
     "routes[0].match.provider", "valid list"),
    ("defaults: {require_mention: sometimes}\n", 1, "defaults.require_mention", "boolean"),
    ("routes: {a: 1}\n", 1, "routes", "valid list"),
    ("routes:\n  - {match: {user: []}, agent: support}\n", 2, "routes[0].match.user",
     "an empty list matches nothing"),
    ("- a\n- b\n", 1, "", "expected 'routes:'"),
])
def test_rule_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str,
                                              words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        table(tmp_path, text)
    file, got_line, got_field, message = exc.value.problems[0]
    assert file.endswith("routes.yaml") and (got_line, got_field) == (line, field)
    assert words in message


def test_load_routes_checks_agents_and_tool_narrowing(config_dir: Path) -> None:
    write_agent(config_dir, "support", "tools: [current_time]\n")
    write_agent(config_dir, "broken", "budget: {max_seconds: -1}\n")
    registry = AgentRegistry(config_dir / "agents")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - {match: {}, agent: support, tools: [current_time, rm_rf]}\n")
    with pytest.raises(ConfigError) as exc:
        load_routes(config_dir, registry)
    assert exc.value.problems[0][1:] == (2, "routes[0].tools", exc.value.problems[0][3])
    assert "has no tool 'rm_rf' (its tools: current_time)" in exc.value.problems[0][3]
    (config_dir / "routes.yaml").write_text("default: broken\n")
    with pytest.raises(ConfigError, match=r"broken/agent.yaml:1: budget.max_seconds"):
        load_routes(config_dir, registry)
    (config_dir / "routes.yaml").write_text("default: support\n")
    fresh = AgentRegistry(config_dir / "agents")
    assert load_routes(config_dir, fresh).agents() == ["support"]
    assert len(fresh) == 1  # only the agent in use was loaded, not 'broken' nor 'default'


def test_explain_reports_rate_limit_access_and_lines(tmp_path: Path) -> None:
    t = table(tmp_path, "# comment\nroutes:\n  - name: dm\n    match: {direct: true}\n"
                        "    agent: support\n    access: pairing\n"
                        "    rate_limit: {user: 3/10s}\ndefault: null\n")
    why = explain(t, message_from("telegram", "5", "42", text="hello"))
    assert why.line == 3 and why.answered
    d = why.as_dict()
    assert (d["agent"], d["session_key"], d["access"], d["rate_limit"]) == (
        "support", "support/telegram/5", "pairing", "3 per 10 seconds per user")
    assert "NOT approved" in why.text(approved=False)
    assert "this user is approved" in why.text(approved=True)
    group = explain(t, message_from("telegram", "5", "42", group=True))
    assert not group.answered and group.line is None and "a direct message gets" not in group.text()
    assert group.as_dict()["steps"][0]["failed"] == [
        "it is a group message, the rule wants direct messages"]


def test_unreachable_rules_are_found(tmp_path: Path) -> None:
    t = table(tmp_path, "routes:\n  - {agent: support}\n  - {name: late, agent: sql}\n")
    assert unreachable(t) == ["late can never match: routes[0] (line 2) matches every message"]


def _pluto(*args: str, config: Path, data: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    return subprocess.run([sys.executable, "-m", "pluto.gateway.cli", *args, "--config", str(config),
                           "--data-dir", str(data)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


def test_routes_check_and_explain_commands(config_dir: Path, data_dir: Path) -> None:
    write_agent(config_dir, "support", "description: support\n")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - {name: grp, match: {provider: telegram, direct: false}, agent: support,"
        " require_mention: true}\n  - {name: no-slack, match: {provider: slack}, deny: true}\n")
    ok = _pluto("routes", "check", config=config_dir, data=data_dir)
    assert ok.returncode == 0 and "2 rule(s), default agent 'default'; 3 agent(s)" in ok.stdout
    out = _pluto("routes", "explain", "--provider", "telegram", "--chat", "123", "--user", "42",
                 "--group", "--mention", "--text", "hi", config=config_dir, data=data_dir)
    assert out.returncode == 0, out.stderr
    assert "rule 'grp' matched" in out.stdout and "session key: support/telegram/123" in out.stdout
    quiet = _pluto("routes", "explain", "--provider", "telegram", "--chat", "123", "--user",
                   "42", "--group", config=config_dir, data=data_dir)
    assert quiet.returncode == 1 and "only when the bot is mentioned" in quiet.stdout
    denied = _pluto("routes", "explain", "--provider", "slack", "--chat", "C1", "--user", "U1",
                    config=config_dir, data=data_dir)
    assert denied.returncode == 1 and "grp (line 2): no — provider is 'slack'" in denied.stdout
    (config_dir / "routes.yaml").write_text("routes:\n  - match: {text_regex: '(['}\n"
                                            "    agent: support\n")
    bad = _pluto("routes", "check", config=config_dir, data=data_dir)
    assert bad.returncode == 2 and "routes.yaml:2: routes[0].match.text_regex" in bad.stderr
    assert "Traceback" not in bad.stderr
    write_agent(config_dir, "unused", "modle: typo\n")
    (config_dir / "routes.yaml").write_text("default: default\n")
    unused = _pluto("routes", "check", config=config_dir, data=data_dir)
    assert unused.returncode == 2 and "unused/agent.yaml:1: modle: unknown field" in unused.stderr
