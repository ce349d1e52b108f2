"""The usage ledger, budgets and how they are read.

The ledger part runs on SQLite and on PostgreSQL (tests/helpers/pg.py: it fails, never skips,
when the server is not reachable)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.agents.spec import AgentSpec, HistoryWindow
from pluto.agents.spec import Budget as AgentBudget
from pluto.events import MessageDelta, MessageFinal, RunEnd, RunError, ToolEnd
from pluto.gateway.app import Gateway
from pluto.gateway.cli import main as cli_main
from pluto.runtime.model import ModelSettings, ModelTurn
from pluto.runtime.model import ToolCall as ModelToolCall
from pluto.runtime.openai_compat import close_sessions
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import BUILTIN_TOOLS
from pluto.runtime.usage import Attribution, Prices, UsageMeter
from pluto.settings import (AdminConfig, Budget, ModelConfig, ModelPrice, PlutoConfig,
                            StorageConfig)
from pluto.storage.postgres import PostgresStore
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore
from pluto.storage.sql.usage import UsageCall
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.openai_server import ToolCall as FakeCall
from tests.helpers.gateway import RecordingProvider
from tests.helpers.inspect_store import break_usage_ledger
from tests.helpers.pg import fresh_schema

ADMIN_KEY = "a-very-long-admin-key-for-usage"


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        async with SqliteStore(tmp_path / "pluto.db") as s:
            yield s
    else:
        with fresh_schema() as url:
            async with PostgresStore(url) as s:
                yield s


def call(run: str = "r1", *, agent: str = "a", user: str = "u1", chat: str = "c1",
         model: str = "m", i: int = 10, o: int = 5, cached: int = 0, cost: float | None = 0.5,
         outcome: str = "ok", attempt: int = 0) -> UsageCall:
    return UsageCall(run_id=run, session_id="s", agent=agent, model=model, input_tokens=i,
                     output_tokens=o, cached_tokens=cached, latency=0.25, outcome=outcome,
                     route="default", provider="telegram", user_id=user, chat_id=chat,
                     attempt=attempt, cost=cost)


# the ledger, on both engines ---------------------------------------------------------------

async def test_ledger_rows_sums_and_groups(store):
    usage = store.usage
    await usage.record(call("r1", i=100, o=20, cached=40, cost=0.01))
    await usage.record(call("r1", i=0, o=0, cost=None, outcome="retried", attempt=1,
                            model="local"))
    await usage.record(call("r2", agent="b", user="u2", i=7, o=3, cost=0.002))
    rows = await usage.calls(run_id="r1")
    assert [(r.input_tokens, r.output_tokens, r.cached_tokens, r.outcome, r.attempt)
            for r in rows] == [(100, 20, 40, "ok", 0), (0, 0, 0, "retried", 1)]
    assert rows[0].cost == pytest.approx(0.01) and rows[1].cost is None
    assert rows[0].ts > 0 and rows[0].estimated is False or rows[0].estimated == 0
    by_agent = {t.key: t for t in await usage.totals("agent")}
    assert (by_agent["a"].calls, by_agent["a"].total_tokens, by_agent["a"].cached_tokens,
            by_agent["a"].unpriced_calls) == (2, 120, 40, 1)
    assert by_agent["a"].cost == pytest.approx(0.01)
    assert by_agent["b"].total_tokens == 10
    assert [t.key for t in await usage.totals("user")] == ["telegram:u1", "telegram:u2"]
    assert [t.key for t in await usage.totals("chat")] == ["telegram:c1"]
    assert {t.key for t in await usage.totals("model")} == {"m", "local"}
    future = rows[0].ts + 3600
    assert await usage.totals("agent", since=future) == []
    with pytest.raises(ValueError, match="cannot group usage by"):
        await usage.totals("nonsense; DROP TABLE usage_calls")



async def test_the_ledger_per_utc_day_oldest_first(store):
    usage = store.usage
    # 2023-11-14 22:13:20 UTC, the same day's last second, and the next day's first
    days = {"r1": 1_700_000_000.0, "r2": 1_700_006_399.0, "r3": 1_700_006_400.0}
    for run in days:
        await usage.record(call(run, i=10 * len(run), o=1))
    for run, ts in days.items():
        await usage.engine.write(("UPDATE usage_calls SET ts = ? WHERE run_id = ?", (ts, run)))
    rows = await usage.totals("day")
    assert [(t.key, t.calls, t.total_tokens) for t in rows] == [
        ("2023-11-14", 2, 42), ("2023-11-15", 1, 21)]
    assert [t.key for t in await usage.totals("day", since=1_700_006_000.0)] == [
        "2023-11-14", "2023-11-15"]

DAY, MONTH = 1_700_000_000.0, 1_699_000_000.0  # period starts, as the meter gives them


async def test_budget_counters_per_period_and_an_admins_reset(store):
    usage = store.usage
    periods = {"day": DAY, "month": MONTH}
    await usage.record(call(user="u1", i=50, o=50, cost=1.0), periods)
    await usage.record(call(user="u2", i=5, o=5, cost=None), periods)
    await usage.record(call(user="u1", i=7, o=0), None)  # counts in the ledger only
    spent = await usage.spent("user", "telegram:u1", "day", DAY)
    assert (spent.total_tokens, spent.cost, spent.calls) == (100, pytest.approx(1.0), 1)
    assert (await usage.spent("agent", "a", "month", MONTH)).total_tokens == 110
    assert (await usage.spent("chat", "telegram:c1", "day", DAY)).unpriced_calls == 1
    assert (await usage.spent("route", "default", "day", DAY)).calls == 2
    assert (await usage.spent("user", "telegram:u1", "day", DAY + 86400)).calls == 0  # next day
    assert (await usage.spent("user", "telegram:u1", "month", DAY)).calls == 0  # another period
    assert [(t.key, t.total_tokens) for t in await usage.counters("user", "day", DAY)] == [
        ("telegram:u1", 100), ("telegram:u2", 10)]
    await usage.reset("user", "telegram:u1")
    assert [t.key for t in await usage.counters("user", "day", DAY)] == ["telegram:u2"]
    assert (await usage.spent("user", "telegram:u1", "day", DAY)).total_tokens == 0
    assert (await usage.spent("user", "telegram:u2", "day", DAY)).total_tokens == 10  # not reset
    assert (await usage.spent("agent", "a", "day", DAY)).total_tokens == 110  # nor the agent
    await usage.record(call(user="u1", i=1, o=2), periods)
    assert (await usage.spent("user", "telegram:u1", "day", DAY)).total_tokens == 3
    await usage.reset("user", "telegram:u1")  # again
    assert (await usage.spent("user", "telegram:u1", "day", DAY)).total_tokens == 0
    assert set(await usage.resets()) == {("user", "telegram:u1")}
    assert sum(t.total_tokens for t in await usage.totals("user")) == 120  # the ledger keeps all
    with pytest.raises(ValueError, match="no budget by"):
        await usage.spent("planet", "x", "day", DAY)


async def test_counters_add_up_under_concurrent_calls(store):
    periods = {"day": DAY, "month": MONTH}
    await asyncio.gather(*(store.usage.record(call(run=f"r{i}", i=i, o=1), periods)
                           for i in range(50)))
    spent = await store.usage.spent("agent", "a", "day", DAY)
    assert (spent.calls, spent.input_tokens, spent.output_tokens) == (50, sum(range(50)), 50)


# through a gateway, over the wire to a fake OpenAI-compatible model ------------------------

def gateway_config(data_dir: Path, fake: FakeOpenAI, **usage: object) -> PlutoConfig:
    model = ModelConfig(model="openai/gpt-4o-mini", api_base=fake.base_url, timeout=10,
                        retries=2)
    return PlutoConfig(data_dir=data_dir, models={"default": model}, usage=usage)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server
    await close_sessions()


async def _streamed(gw: Gateway) -> bool:
    """The latest run has shown some of its answer."""
    runs = await gw.store.conversations.recent_runs(limit=1)
    return bool(runs) and any(isinstance(e, MessageDelta)
                              for e in await gw.store.conversations.events(runs[0]["id"]))


async def started(gw: Gateway) -> RecordingProvider:
    p = RecordingProvider()
    gw.add_provider(p)
    await p.running.wait()
    return p


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> Any:
    """None: the gateway's own SQLite; else a PostgreSQL URL (a fresh schema)."""
    if request.param == "sqlite":
        yield None
    else:
        with fresh_schema() as url:
            yield url


async def test_the_ledger_matches_the_model_exactly_across_tools_retries_and_stop(
        config_dir, data_dir, fake, capsys, database, monkeypatch):
    fake.script(
        Reply(status=503),  # retried: a row with nothing reported
        Reply(tool_calls=[FakeCall("current_time", {})], usage=(120, 9)),
        Reply(text="It is noon.", usage=(160, 4), cached_tokens=100),
        Reply(text="x" * 400, chunk_size=1, chunk_delay=0.01, usage=(50, 400)),  # /stop
        Reply(text="Still here.", usage=(70, 3)))
    if database is not None:
        monkeypatch.setenv("PLUTO_TEST_USAGE_DB", database)
    config = gateway_config(data_dir, fake).model_copy(
        update={"storage": StorageConfig(url_env="PLUTO_TEST_USAGE_DB")})
    gw = Gateway(config_dir, config=config)
    gw.runner.retry_base_delay = 0.01
    async with gw:
        p = await started(gw)
        await p.say("what time is it?")
        assert await p.wait_finals(1) == ["It is noon."]
        await p.say("count to a thousand")
        await fake.wait_for_requests(4)
        async with asyncio.timeout(5):  # (bounded: a run that ended unseen fails, never hangs)
            while not gw.load.running:
                await asyncio.sleep(0.01)
            while not await _streamed(gw):  # some of it streamed
                await asyncio.sleep(0.01)
        await p.say("/stop")
        await p.wait_finals(2)
        await p.say("still there?")
        assert (await p.wait_finals(3))[-1] == "Still here."
        calls = await gw.store.usage.calls()
        metrics = gw.metrics.render()[0].decode()
    # one row per call, as the model reported it; the stopped stream reported nothing yet
    assert [(c.outcome, c.purpose, c.attempt, c.input_tokens, c.output_tokens,
             c.cached_tokens) for c in calls] == [
        ("retried", "answer", 0, 0, 0, 0), ("ok", "answer", 1, 120, 9, 0),
        ("ok", "tool_loop", 0, 160, 4, 100), ("cancelled", "answer", 0, 0, 0, 0),
        ("ok", "answer", 0, 70, 3, 0)]
    assert {(c.provider, c.user_id, c.chat_id, c.agent, c.model) for c in calls} == {
        ("test", "u1", "c1", "default", "openai/gpt-4o-mini")}
    assert all(c.latency >= 0 and c.route for c in calls)
    # litellm's price list: gpt-4o-mini, cached input at its own price
    price_in, price_out, price_cached = 0.15e-6, 0.6e-6, 0.075e-6
    expected = ((120 + 60 + 70) * price_in + 100 * price_cached + (9 + 4 + 3) * price_out)
    assert sum(c.cost or 0 for c in calls) == pytest.approx(expected)
    assert 'pluto_usage_tokens_total{agent="default",kind="input",model="openai/gpt-4o-mini"} ' \
           '350.0' in metrics
    assert 'pluto_usage_cost_usd_total{agent="default",model="openai/gpt-4o-mini"}' in metrics

    (config_dir / "pluto.yaml").write_text("storage: {url_env: PLUTO_TEST_USAGE_DB}\n")
    code = await asyncio.to_thread(cli_main, ["--config", str(config_dir), "--data-dir",
                                              str(data_dir), "usage", "--by", "agent"])
    out = capsys.readouterr().out
    assert code == 0
    [row] = [line.split() for line in out.splitlines() if line.startswith("default")]
    assert row[:6] == ["default", "5", "350", "16", "100", "366"]
    assert row[6] == f"${expected:,.6f}"
    # what started each call: here a person's messages (a schedule's firing says "schedule")
    assert {c.origin for c in calls} == {"message"}
    code = await asyncio.to_thread(cli_main, ["--config", str(config_dir), "--data-dir",
                                              str(data_dir), "usage", "--by", "origin"])
    out = capsys.readouterr().out
    assert code == 0
    [row] = [line.split() for line in out.splitlines() if line.startswith("message")]
    assert row[:3] == ["message", "5", "350"]


async def test_a_daily_user_budget_refuses_the_next_run_and_an_admin_resets_it(
        config_dir, data_dir, fake, monkeypatch, caplog):
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)
    fake.script(Reply(text="First answer.", usage=(1500, 500)),
                Reply(text="For the other one.", usage=(30, 5)),
                Reply(text="After the reset.", usage=(10, 2)))
    config = gateway_config(data_dir, fake, budgets=[{"per": "user", "period": "day",
                                                     "tokens": 2000}]).model_copy(
        update={"admin": AdminConfig(api_key_env="PLUTO_ADMIN_KEY")})
    gw = Gateway(config_dir, config=config, serve=True, http_bind=("127.0.0.1", 0))
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with gw, aiohttp.ClientSession(headers=auth) as http:
        p = await started(gw)
        await p.say("hello")
        assert await p.wait_finals(1) == ["First answer."]
        await p.say("and again")  # 2,000 of 2,000 tokens spent today
        sentence = (await p.wait_finals(2))[1]
        assert sentence == ("You have reached the daily usage limit of 2,000 tokens, so I can't "
                            "answer now; it renews at midnight UTC.")
        assert len(fake.requests) == 1  # the model was not called
        await p.say("hi", user="u2")  # another person has a budget of their own
        assert (await p.wait_finals(3))[2] == "For the other one."
        assert "usage budget reached: user test:u1" in caplog.text
        assert "pluto_usage_budget_refusals_total{per=\"user\",period=\"day\"} 1.0" in \
            gw.metrics.render()[0].decode()

        base = gw.http.url + "/admin/usage"  # type: ignore[union-attr]
        async with http.get(base + "?by=user&since=today") as r:
            body = await r.json()
        assert [(row["key"], row["total_tokens"]) for row in body["rows"]] == [
            ("test:u1", 2000), ("test:u2", 35)]
        assert body["total"]["calls"] == 2 and body["total"]["cost"] > 0
        async with http.get(base + "/budgets") as r:
            [budget] = (await r.json())["budgets"]
        assert {s["key"]: s["over"] for s in budget["spent"]} == {"test:u1": True,
                                                                  "test:u2": False}
        for bad in ({"scope": "planet", "key": "x"}, {"scope": "user"}, []):
            async with http.post(base + "/reset", json=bad) as r:
                assert r.status == 400, bad
                assert "'scope'" in (await r.json())["error"] or not isinstance(bad, dict)
        async with http.get(base + "?by=nonsense") as r:
            assert r.status == 400 and "'by' must be one of" in (await r.json())["error"]
        async with http.get(base + "?since=yesterday") as r:
            assert r.status == 400 and "is not a time" in (await r.json())["error"]
        async with http.post(base + "/reset", json={"scope": "user", "key": "test:u1"}) as r:
            assert r.status == 200
        await asyncio.sleep(0.01)  # the database's clock counts milliseconds
        await p.say("and now?")
        assert (await p.wait_finals(4))[3] == "After the reset."
        run_id = (await gw.store.usage.calls())[-1].run_id
        async with http.get(f"{base}/runs/{run_id}") as r:
            [row] = (await r.json())["calls"]
        assert (row["input_tokens"], row["output_tokens"], row["user_id"]) == (10, 2, "u1")
        async with http.get(base, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401


# the Runner with a meter: a tool loop crossing an agent's budget, a model that reports nothing

class Unreported:
    """Answers with a tool call first, then text; never reports its usage."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, settings: ModelSettings) -> Unreported:
        return self

    async def stream(self, messages, tools, settings):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 1:
            yield ModelTurn("", [ModelToolCall("c1", "current_time", "{}")], {})
        else:
            yield "Done."
            yield ModelTurn("Done.", [], {})


def spec(tmp_path: Path) -> AgentSpec:
    return AgentSpec(name="a", description="", model="scripted", api_base=None,
                     api_key_env=None, temperature=None, instructions="Be brief.",
                     tools=("current_time",), datasets=(), budget=AgentBudget(),
                     history=HistoryWindow(), source=tmp_path)


async def run_once(store: SqlStore, runner: Runner, tmp_path: Path, text: str = "hi") -> list:
    session = await store.conversations.session("k", "a")
    req = RunRequest(uuid.uuid4().hex, session, spec(tmp_path), text,
                     who=Attribution("test", "u1", "c1", "default"))
    return [e async for e in runner.run(req)]


async def test_a_tool_loop_is_stopped_at_the_next_call_once_an_agent_budget_is_spent(tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[ModelToolCall("c1", "current_time", "{}")],
                 usage={"prompt_tokens": 900, "completion_tokens": 200}),
        Scripted(text="never asked"))
    async with SqliteStore(tmp_path / "p.db") as store:
        meter = UsageMeter(store.usage, budgets=lambda: [
            Budget(per="agent", period="month", tokens=1000)])
        runner = Runner(store.conversations, models={}, tools=BUILTIN_TOOLS, data_dir=tmp_path,
                        model_factory=model, usage=meter)
        events = await run_once(store, runner, tmp_path)
        [error] = [e for e in events if isinstance(e, RunError)]
        assert error.kind == "budget" and error.message == (
            "This assistant has reached the monthly usage limit of 1,000 tokens, so I can't "
            "answer now; it renews on the 1st of next month (UTC).")
        assert isinstance(events[-1], RunEnd) and events[-1].outcome == "budget"
        assert [e.name for e in events if isinstance(e, ToolEnd)] == ["current_time"]
        calls = await store.usage.calls()
        assert [(c.input_tokens, c.output_tokens, c.outcome) for c in calls] == [
            (900, 200, "ok")]  # the second call was never made
        assert len(model.calls) == 1


async def test_a_model_that_reports_nothing_is_estimated_and_marked_so(tmp_path):
    model = Unreported()
    async with SqliteStore(tmp_path / "p.db") as store:
        runner = Runner(store.conversations, models={}, tools=BUILTIN_TOOLS, data_dir=tmp_path,
                        model_factory=model, usage=UsageMeter(store.usage))
        events = await run_once(store, runner, tmp_path)
        calls = await store.usage.calls()
        assert [(c.purpose, bool(c.estimated), c.cost) for c in calls] == [
            ("answer", True, None), ("tool_loop", True, None)]  # "scripted" has no price
        end = events[-1]
        assert isinstance(end, RunEnd) and end.usage["total_tokens"] == sum(
            c.total_tokens for c in calls) > 0  # the run's totals and the ledger agree


async def test_every_ledger_row_is_written_before_the_answer_is_shown(store, tmp_path):
    """On either engine: the rows of a tool loop's calls (each handed over to ride with the
    run's next commit) are in the ledger, in order, when the answer is shown."""
    meter = UsageMeter(store.usage)
    model = ScriptedModel(
        Scripted(tool_calls=[ModelToolCall("c1", "current_time", "{}")],
                 usage={"prompt_tokens": 30, "completion_tokens": 5}),
        Scripted(text="it is late", usage={"prompt_tokens": 40, "completion_tokens": 3}))
    runner = Runner(store.conversations, models={}, tools=BUILTIN_TOOLS, data_dir=tmp_path,
                    model_factory=model, usage=meter)
    session = await store.conversations.session("k", "a")
    req = RunRequest(uuid.uuid4().hex, session, spec(tmp_path), "time?",
                     who=Attribution("test", "u1", "c1", "default"))
    shown = None
    async for event in runner.run(req):
        if isinstance(event, MessageFinal):
            shown = [(c.input_tokens, c.output_tokens, c.purpose)
                     for c in await store.usage.calls(run_id=req.run_id)]
    assert shown == [(30, 5, "answer"), (40, 3, "tool_loop")]


async def test_an_answers_ledger_row_costs_no_commit_of_its_own(tmp_path, monkeypatch):
    """The ledger row of the answer's call rides with the answer's commit (one commit, not
    two, between the model's last word and the answer shown), and is in the ledger, with its
    observers told, by the time the answer is shown."""
    from pluto.storage.sqlite import engine as engine_module
    commits: list[list[str]] = []
    apply = engine_module._apply_batch

    def counted(conn: Any, changes: list, *hooks: Any) -> list:
        commits.append([getattr(c, "__qualname__", "?") for c in changes])
        return apply(conn, changes, *hooks)

    async with SqliteStore(tmp_path / "p.db") as store:
        meter = UsageMeter(store.usage)
        seen: list[UsageCall] = []
        meter.on_record.append(seen.append)
        runner = Runner(store.conversations, models={}, tools=BUILTIN_TOOLS, data_dir=tmp_path,
                        model_factory=ScriptedModel(Scripted(text="fine", delay=0.01)),
                        usage=meter)
        session = await store.conversations.session("k", "a")
        req = RunRequest(uuid.uuid4().hex, session, spec(tmp_path), "hi",
                         who=Attribution("test", "u1", "c1", "default"))
        monkeypatch.setattr(engine_module, "_apply_batch", counted)
        async for event in runner.run(req):
            if isinstance(event, MessageFinal):
                calls = await store.usage.calls(run_id=req.run_id)
                assert [(c.outcome, c.output_tokens > 0) for c in calls] == [("ok", True)]
                assert [c.run_id for c in seen] == [req.run_id]
        assert [n.split(".<")[0] for n in commits[-1]] == [
            "run_statements", "SqliteConversations.complete_run"], commits  # one commit for both


async def test_a_ledger_that_cannot_be_read_never_stops_an_answer(tmp_path, caplog):
    async with SqliteStore(tmp_path / "p.db") as store:
        meter = UsageMeter(store.usage, budgets=lambda: [Budget(per="user", tokens=10)])
        runner = Runner(store.conversations, models={}, tools=BUILTIN_TOOLS, data_dir=tmp_path,
                        model_factory=ScriptedModel(Scripted(text="fine")), usage=meter)
        await break_usage_ledger(store)
        events = await run_once(store, runner, tmp_path)
    assert isinstance(events[-2], MessageFinal) and events[-2].text == "fine"
    assert "could not be checked" in caplog.text and "not recorded" in caplog.text


def test_prices_from_pluto_yaml_first_then_litellms_list_else_unknown():
    from pluto.runtime.usage import _read_cost_map

    configured = {"openai/gpt-4o-mini": ModelPrice(input=1.0, output=2.0),
                  "local": ModelPrice(input=0.5, output=1.0, cached=0.25)}
    prices = Prices(lambda: configured)
    prices._map = _read_cost_map()  # (normally read in a thread by load())
    # pluto.yaml wins over litellm's list; per million tokens; cached input at its price
    assert prices.cost(["openai/gpt-4o-mini"], 1_000_000, 1_000_000) == pytest.approx(3.0)
    assert prices.cost(["local"], 1_000_000, 0, 400_000) == pytest.approx(0.6 * 0.5 + 0.1)
    # a name litellm lists without its provider prefix
    assert prices.cost(["openai/gpt-4o"], 1_000_000, 0) == pytest.approx(2.5)
    assert prices.cost(["nobody/knows-me", "also-unknown"], 10, 10) is None
    # another name of the same model (the pluto.yaml model name) is tried next
    assert prices.cost(["nobody/knows-me", "local"], 1_000_000, 0) == pytest.approx(0.5)
    configured["nobody/knows-me"] = ModelPrice(input=0, output=0)  # a live edit applies
    assert prices.cost(["nobody/knows-me"], 10, 10) == 0.0


async def test_pluto_usage_refuses_bad_options_in_one_sentence_and_resets(config_dir, data_dir,
                                                                          capsys):
    def pluto(*args: str) -> tuple[int, str, str]:
        code = cli_main(["--config", str(config_dir), "--data-dir", str(data_dir), "usage",
                         *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, _, err = await asyncio.to_thread(pluto, "--since", "last tuesday")
    assert code == 2 and err.strip() == (
        "pluto usage: --since 'last tuesday' is not a time: use 30m, 24h, 7d, today, month or "
        "a date like 2026-11-01")
    code, _, err = await asyncio.to_thread(pluto, "--reset", "planet:mars")
    assert code == 2 and "--reset takes SCOPE:KEY" in err and "Traceback" not in err
    code, out, _ = await asyncio.to_thread(pluto, "--since", "7d")
    assert code == 0 and out.strip() == "no model calls recorded (in this period)"
    code, out, _ = await asyncio.to_thread(pluto, "--reset", "user:web:42")
    assert code == 0 and out.startswith("reset the budgets of user web:42")
    code, out, _ = await asyncio.to_thread(pluto, "--budgets", "--json")
    assert code == 0 and out.strip() == "[]"
    code, out, _ = await asyncio.to_thread(pluto, "--json", "--by", "user")
    assert code == 0 and '"rows": []' in out
