"""Traces: the spans of one message reach an OTLP/HTTP collector started in the test (real
OpenTelemetry SDK and exporter, over the wire); the trace id is in the run's log lines; the JSON
log format."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

from pluto.gateway.app import Gateway
from pluto.gateway.logs import JsonFormatter, TextFormatter
from pluto.runtime.openai_compat import close_sessions
from pluto.runtime.tracing import current_trace, trace_id_for
from pluto.settings import ModelConfig, PlutoConfig, TracingConfig
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.openai_server import ToolCall as FakeCall
from tests.helpers.gateway import RecordingProvider


class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        body = ExportTraceServiceRequest.FromString(await request.read())
        for rs in body.resource_spans:
            self.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def __aenter__(self) -> Collector:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.int_value if v.HasField("int_value") else (
            v.double_value if v.HasField("double_value") else v.string_value)
    return out


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server
    await close_sessions()


async def test_one_message_is_traced_route_run_model_and_tool(config_dir: Path, data_dir: Path,
                                                                fake: FakeOpenAI, caplog):
    fake.script(Reply(status=503),  # retried: logged with the run's trace id
                Reply(tool_calls=[FakeCall("current_time", {})], usage=(120, 9)),
                Reply(text="It is noon.", usage=(160, 4), cached_tokens=100))
    caplog.handler.setFormatter(TextFormatter())
    caplog.set_level(logging.INFO)
    async with Collector() as collector:
        config = PlutoConfig(
            data_dir=data_dir, tracing=TracingConfig(otlp_endpoint=collector.url,
                                                     service_name="pluto-test"),
            models={"default": ModelConfig(model="openai/gpt-4o-mini",
                                           api_base=fake.base_url)})
        gw = Gateway(config_dir, config=config)
        gw.runner.retry_base_delay = 0.01
        async with gw:
            p = RecordingProvider()
            gw.add_provider(p)
            await p.running.wait()
            await p.say("what time is it?")
            assert await p.wait_finals(1) == ["It is noon."]
            run_id = (await gw.store.usage.calls())[0].run_id
        # stopping the gateway sent what was left
        spans = {s.name: s for s in collector.spans}
    assert sorted(spans) == ["chat openai/gpt-4o-mini", "execute_tool current_time",
                             "invoke_agent default", "pluto.message", "pluto.route"]
    assert collector.resources[0]["service.name"] == "pluto-test"
    trace_id = trace_id_for(run_id)
    assert trace_id == run_id
    assert {s.trace_id.hex() for s in collector.spans} == {trace_id}
    message, route = spans["pluto.message"], spans["pluto.route"]
    run, tool = spans["invoke_agent default"], spans["execute_tool current_time"]
    models = [s for s in collector.spans if s.name.startswith("chat ")]
    assert message.parent_span_id == b""
    assert route.parent_span_id == message.span_id and run.parent_span_id == message.span_id
    assert tool.parent_span_id == run.span_id
    assert all(m.parent_span_id == run.span_id for m in models)
    models.sort(key=lambda m: m.start_time_unix_nano)
    assert [(attrs(m)["pluto.outcome"], attrs(m)["gen_ai.usage.input_tokens"],
             attrs(m)["gen_ai.usage.output_tokens"]) for m in models] == [
        ("retried", 0, 0), ("ok", 120, 9), ("ok", 160, 4)]
    assert attrs(models[-1])["gen_ai.usage.cache_read.input_tokens"] == 100
    assert attrs(models[-1])["gen_ai.provider.name"] == "openai"
    assert models[0].status.code == 2  # STATUS_CODE_ERROR
    assert attrs(run)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(run)["pluto.outcome"] == "ok"
    assert attrs(tool)["gen_ai.tool.name"] == "current_time"
    assert attrs(route)["pluto.route.rule"]
    assert message.start_time_unix_nano <= run.start_time_unix_nano <= run.end_time_unix_nano
    # the run's log lines carry its trace id
    [retry] = [line for line in caplog.text.splitlines() if "retry 1" in line]
    assert retry.endswith(f"trace={trace_id}")


async def test_an_approval_and_its_decision_are_events_of_the_runs_spans(
        config_dir: Path, data_dir: Path, fake: FakeOpenAI):
    agent = config_dir / "agents" / "default" / "agent.yaml"
    agent.write_text(agent.read_text() + "\napproval: {current_time: always}\n")
    fake.script(Reply(tool_calls=[FakeCall("current_time", {})]), Reply(text="It is noon."))
    async with Collector() as collector:
        config = PlutoConfig(
            data_dir=data_dir, tracing=TracingConfig(otlp_endpoint=collector.url),
            models={"default": ModelConfig(model="openai/gpt-4o-mini",
                                           api_base=fake.base_url)})
        async with Gateway(config_dir, config=config) as gw:
            p = RecordingProvider()
            gw.add_provider(p)
            await p.running.wait()
            await p.say("what time is it?")
            await p.wait_finals(1)  # the request (no buttons here: the commands in its text)
            [approval] = [w for w in p.sent[0].text.split("`") if w.startswith("/approve ")]
            await p.say(approval)
            assert (await p.wait_finals(2))[-1] == "It is noon."
    runs = sorted((s for s in collector.spans if s.name == "invoke_agent default"),
                  key=lambda s: s.start_time_unix_nano)
    assert [attrs(r)["pluto.outcome"] for r in runs] == ["awaiting_approval", "ok"]
    assert runs[0].status.code != 2  # a pause is no error
    paused, resumed = ([(e.name, {a.key: a.value.string_value for a in e.attributes})
                        for e in r.events] for r in runs)
    approval_id = approval.split()[1]
    assert paused == [("pluto.approval.request", {"pluto.approval.id": approval_id,
                                                  "gen_ai.tool.name": "current_time"})]
    assert resumed == [("pluto.approval.decision", {
        "pluto.approval.id": approval_id, "gen_ai.tool.name": "current_time",
        "pluto.approval.verdict": "approved"})]


async def test_tracing_is_off_by_default_and_costs_nothing(config_dir: Path, data_dir: Path):
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir))
    async with gw:
        assert not gw.tracing.enabled


def test_a_bad_endpoint_is_refused_when_the_configuration_is_read():
    with pytest.raises(ValueError, match="otlp_endpoint"):
        PlutoConfig(tracing={"otlp_endpoint": "collector:4318"})
    with pytest.raises(ValueError, match="log_format"):
        PlutoConfig(log_format="xml")


def test_json_log_lines_carry_the_trace_id_and_the_exception():
    record = logging.LogRecord("pluto.x", logging.ERROR, __file__, 1, "failed %s", ("here",),
                               None)
    token = current_trace.set("ab" * 16)
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        current_trace.reset(token)
    assert line["message"] == "failed here" and line["level"] == "ERROR"
    assert line["trace_id"] == "ab" * 16 and line["logger"] == "pluto.x"
    try:
        raise RuntimeError("kaput")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert "RuntimeError: kaput" in line["exception"] and "trace_id" not in line
    asyncio.get_event_loop_policy()  # (no loop needed)


async def test_a_stopped_run_ends_its_spans_cancelled_and_json_logs_reach_the_file(tmp_path):
    from pluto.agents.spec import AgentSpec, Budget, HistoryWindow
    from pluto.events import MessageDelta
    from pluto.gateway.logs import setup_logging
    from pluto.runtime.runner import Runner, RunRequest
    from pluto.runtime.testing import Scripted, ScriptedModel
    from pluto.runtime.tracing import Tracing
    from pluto.runtime.usage import Attribution, UsageMeter
    from pluto.storage.sqlite import SqliteStore

    model = ScriptedModel(Scripted(text="x" * 500, chunk=1, delay=0.01))
    spec = AgentSpec(name="a", description="", model="scripted", api_base=None,
                     api_key_env=None, temperature=None, instructions="", tools=(),
                     datasets=(), budget=Budget(), history=HistoryWindow(), source=tmp_path)
    setup_logging("INFO", log_file=tmp_path / "pluto.log", stderr_level="CRITICAL", fmt="json")
    try:
        async with Collector() as collector, SqliteStore(tmp_path / "p.db") as store:
            tracing = Tracing(collector.url)
            await tracing.start()
            meter = UsageMeter(store.usage)
            meter.on_record.append(tracing.model_call)
            runner = Runner(store.conversations, models={}, tools={}, data_dir=tmp_path,
                            model_factory=model, usage=meter, tracing=tracing)
            session = await store.conversations.session("k", "a")
            req = RunRequest("f" * 32, session, spec, "go", who=Attribution("test", "u", "c"))
            seen = asyncio.Event()

            async def consume() -> None:
                async for event in runner.run(req):
                    if isinstance(event, MessageDelta) and not seen.is_set():
                        logging.getLogger("pluto.test").warning("streaming")  # in the run
                        seen.set()

            task = asyncio.create_task(consume())
            await seen.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            logging.getLogger("pluto.test").warning("after the stop")
            await tracing.shutdown()
        spans = {s.name: s for s in collector.spans}
    finally:
        setup_logging("INFO", stderr_level="CRITICAL")
    run, chat = spans["invoke_agent a"], spans["chat scripted"]
    assert attrs(run)["pluto.outcome"] == "cancelled" and run.status.code == 2
    assert attrs(chat)["pluto.outcome"] == "cancelled" and chat.parent_span_id == run.span_id
    assert {s.trace_id.hex() for s in collector.spans} == {"f" * 32}
    lines = [json.loads(line) for line in (tmp_path / "pluto.log").read_text().splitlines()]
    [during] = [line for line in lines if line["message"] == "streaming"]
    assert during["trace_id"] == "f" * 32 and during["level"] == "WARNING"
    [after] = [line for line in lines if line["message"] == "after the stop"]
    assert "trace_id" not in after  # another task's line: not the run's
