"""/metrics in Prometheus format: what the pipeline counts, per gateway."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pluto.gateway.metrics import Metrics
from pluto.runtime.errors import ModelError
from pluto.events import MessageFinal, RunEnd, RunError, RunStart, ToolEnd
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.served import Tab, served, url


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(http: aiohttp.ClientSession, gw) -> dict:
    async with http.get(url(gw, "/metrics")) as resp:
        assert resp.status == 200 and resp.content_type == "text/plain"
        return samples(await resp.text())


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def test_the_pipeline_is_counted(config_dir, data_dir, http):
    model = ScriptedModel(
        Scripted(tool_calls=[ToolCall("c1", "current_time", "{}")]), Scripted(text="It is noon."),
        Scripted(error=ModelError("The model is unavailable right now.")),
        Scripted(text="z" * 300, chunk=1, delay=0.01))
    async with served(config_dir, data_dir, model) as gw:
        tab = await Tab.open(http, gw)
        await tab.ask("what time is it?")
        await tab.until("run.end")
        await tab.send(type="message", text="again")
        await tab.until("run.end")
        await tab.ask("/help")
        await tab.send(type="message", text="a long one")
        await tab.until("message.delta")
        await tab.send(type="stop")
        assert (await tab.until("run.end", lambda f: f["outcome"] == "cancelled"))
        m = await scrape(http, gw)
    assert m[("pluto_messages_in_total", (("provider", "web"),))] == 5
    assert m[("pluto_messages_out_total", (("kind", "reply"), ("provider", "web")))] == 1
    assert m[("pluto_messages_out_total", (("kind", "error"), ("provider", "web")))] == 1
    assert m[("pluto_messages_out_total", (("kind", "command"), ("provider", "web")))] == 2
    assert m[("pluto_runs_total", (("outcome", "ok"),))] == 1
    assert m[("pluto_runs_total", (("outcome", "error"),))] == 1
    assert m[("pluto_runs_total", (("outcome", "cancelled"),))] == 1  # ended without yielding
    assert m[("pluto_runs_active", ())] == 0
    assert m[("pluto_run_duration_seconds_count", ())] == 3
    assert m[("pluto_tool_calls_total", (("outcome", "ok"), ("tool", "current_time")))] == 1
    assert m[("pluto_model_tokens_total", (("kind", "prompt"),))] >= 20
    assert m[("pluto_model_tokens_total", (("kind", "completion"),))] > 0
    assert m[("pluto_errors_total", (("kind", "run_error"),))] == 1


async def test_each_gateway_counts_on_its_own(config_dir, data_dir, tmp_path, http):
    async with served(config_dir, data_dir) as first, \
            served(config_dir, tmp_path / "other") as second:
        tab = await Tab.open(http, first)
        await tab.ask("/help")
        assert (await scrape(http, first))[("pluto_messages_in_total", (("provider", "web"),))] == 1
        assert ("pluto_messages_in_total", (("provider", "web"),)) not in await scrape(http, second)


def test_observe_reads_a_runs_events():
    metrics = Metrics()
    metrics.observe(RunStart(run_id="r", session_id="s", agent="a", ts=100.0), "web")
    assert metrics.runs_active._value.get() == 1
    metrics.observe(ToolEnd(run_id="r", call_id="c", name="sql", content="", is_error=True), "web")
    metrics.observe(MessageFinal(run_id="r", text="x"), "web")
    metrics.observe(RunError(run_id="r", message="m", kind="budget"), "web")
    metrics.observe(RunEnd(run_id="r", outcome="budget", ts=102.5,
                           usage={"prompt_tokens": 7, "completion_tokens": 3}), "web")
    metrics.observe(RunEnd(run_id="unseen", outcome="interrupted"), "web")  # no start: no latency
    m = samples(metrics.render()[0].decode())
    assert m[("pluto_tool_calls_total", (("outcome", "error"), ("tool", "sql")))] == 1
    assert m[("pluto_errors_total", (("kind", "run_budget"),))] == 1
    assert m[("pluto_run_duration_seconds_sum", ())] == 2.5
    assert m[("pluto_run_duration_seconds_count", ())] == 1
    assert m[("pluto_runs_total", (("outcome", "interrupted"),))] == 1
    assert m[("pluto_model_tokens_total", (("kind", "prompt"),))] == 7
    assert m[("pluto_runs_active", ())] == 0


def test_the_databases_own_counts_are_read_at_each_scrape(tmp_path):
    """PostgreSQL's engine counts the deadlocks it met (none expected: docs/cluster.md) and
    the statements it sent together; /metrics shows them as they are at the scrape. SQLite's
    engine has neither: nothing is shown."""
    from pluto.storage.postgres.engine import PostgresEngine
    from pluto.storage.sqlite.engine import SqliteEngine

    engine = PostgresEngine("postgresql://127.0.0.1/none")  # (never opened: counts only)
    metrics = Metrics()
    metrics.watch_storage(engine)
    seen = samples(metrics.render()[0].decode())
    assert seen[("pluto_storage_deadlocks_total", ())] == 0
    engine.deadlocks, engine.batched = 2, 40
    seen = samples(metrics.render()[0].decode())
    assert seen[("pluto_storage_deadlocks_total", ())] == 2
    assert seen[("pluto_storage_statements_joined_total", ())] == 40

    lone = Metrics()
    lone.watch_storage(SqliteEngine(tmp_path / "pluto.db"))
    assert not any(name.startswith("pluto_storage") for name, _ in
                   samples(lone.render()[0].decode()))
