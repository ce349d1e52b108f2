"""Traces: OpenTelemetry spans for message → route → run → model call → tool call.

Off by default. With ``tracing.otlp_endpoint`` in pluto.yaml (an OTLP/HTTP collector, e.g.
``http://127.0.0.1:4318/v1/traces``) the gateway imports the OpenTelemetry SDK once, in a worker
thread, and spans leave in batches from the SDK's own thread: nothing here waits on the network.

A run's trace id is its run id (a run id of 32 hex digits is one already; any other is hashed
to one), so the id in the API's run view, in the run's log lines (``trace=…``) and in the
collector are one and the same. The spans are made from what the runner already reports —
its events (run start and end, tool start and end) and the usage ledger's rows (each model
call, with its tokens and latency) — with explicit parents, never through context variables
across the runner's generators.

Names and attributes follow the OpenTelemetry GenAI semantic conventions as the pinned
``opentelemetry-semantic-conventions`` 0.66b2 defines them (schema 1.44.0): ``invoke_agent
{agent}``, ``chat {model}``, ``execute_tool {tool}``; ``gen_ai.operation.name``,
``gen_ai.agent.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` /
``output_tokens`` / ``cache_read.input_tokens``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``gen_ai.conversation.id``.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pluto.events import (ApprovalDecision, ApprovalRequest, RunEnd, RunError, RunEvent,
                          RunStart, ToolEnd, ToolStart)

if TYPE_CHECKING:
    from pluto.runtime.runner import RunRequest
    from pluto.storage.sql.usage import UsageCall

log = logging.getLogger(__name__)

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
MAX_OPEN_RUNS = 10_000  # spans kept open at most (the oldest run's are ended past it)
# the trace id of the run whose task is logging (gateway/logs.py adds it to each line)
current_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("pluto_trace",
                                                                            default=None)


def trace_id_for(run_id: str) -> str:
    """The 32-hex-digit trace id of a run (its id, when it is one)."""
    if re.fullmatch(r"[0-9a-f]{32}", run_id) and int(run_id, 16):
        return run_id
    return hashlib.sha256(run_id.encode()).hexdigest()[:32]


@dataclass(slots=True)
class _Run:
    message: Any
    run: Any
    tools: dict[str, Any] = field(default_factory=dict)


class Tracing:
    """The gateway's tracer: a no-op until :meth:`start` with an endpoint."""

    def __init__(self, endpoint: str | None = None, *, service_name: str = "pluto",
                 headers: dict[str, str] | None = None):
        self.endpoint = endpoint
        self.service_name = service_name
        self.headers = headers or {}
        self._provider: Any = None
        self._tracer: Any = None
        self._ids: Any = None
        self._trace: Any = None  # the opentelemetry.trace module, once imported
        self._runs: dict[str, _Run] = {}

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    async def start(self) -> None:
        """Import the SDK and set up the exporter, in a worker thread (when configured)."""
        if self.endpoint and self._tracer is None:
            await asyncio.to_thread(self._set_up)
            log.info("tracing: spans are exported over OTLP/HTTP to %s", self.endpoint)

    def _set_up(self) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        class RunIds(RandomIdGenerator):
            """A run's spans share the trace id its run id gives (set just before a root)."""

            next_trace: int | None = None

            def generate_trace_id(self) -> int:
                return self.next_trace or super().generate_trace_id()

        self._ids = RunIds()
        provider = TracerProvider(resource=Resource.create({"service.name": self.service_name}),
                                  id_generator=self._ids)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=self.endpoint, headers=self.headers, timeout=10)))
        self._provider, self._trace = provider, trace
        self._tracer = provider.get_tracer("pluto", schema_url=SCHEMA_URL)

    async def shutdown(self) -> None:
        """End what is open and send what is left (in a worker thread)."""
        for run_id in list(self._runs):
            self._end_run(run_id, "cancelled", time.time_ns())
        if self._provider is not None:
            provider, self._provider, self._tracer = self._provider, None, None
            await asyncio.to_thread(provider.shutdown)

    # what the runner reports ---------------------------------------------------------------

    def follow(self, req: RunRequest,
               observe: Callable[[RunEvent], None]) -> Callable[[RunEvent], None]:
        """An observer of one run's events that makes its spans, then calls ``observe``.
        The run's task logs with its trace id from here on."""
        current_trace.set(trace_id_for(req.run_id))
        if not self.enabled:
            return observe

        def watch(event: RunEvent) -> None:
            try:
                self._event(req, event)
            except Exception:  # a trace never stops an answer
                log.exception("tracing: run %s", req.run_id)
            observe(event)

        return watch

    def _event(self, req: RunRequest, event: RunEvent) -> None:
        now = time.time_ns()
        match event:
            case RunStart():
                self._start_run(req, now)
            case ToolStart(call_id=call_id, name=name):
                if (run := self._runs.get(req.run_id)) is not None:
                    run.tools[call_id] = self._tracer.start_span(
                        f"execute_tool {name}", context=self._in(run.run), start_time=now,
                        attributes={"gen_ai.operation.name": "execute_tool",
                                    "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id})
            case ToolEnd(call_id=call_id, is_error=is_error):
                run = self._runs.get(req.run_id)
                span = run.tools.pop(call_id, None) if run is not None else None
                if span is not None:
                    if is_error:
                        span.set_status(self._status("ERROR"))
                        span.set_attribute("error.type", "tool_error")
                    span.end(end_time=now)
            case RunError(kind=kind):
                if (run := self._runs.get(req.run_id)) is not None:
                    run.run.set_attribute("error.type", kind)
            case ApprovalRequest(approval_id=approval_id, name=name):  # docs/approvals.md
                if (run := self._runs.get(req.run_id)) is not None:
                    run.run.add_event("pluto.approval.request", {
                        "pluto.approval.id": approval_id, "gen_ai.tool.name": name},
                        timestamp=now)
            case ApprovalDecision(approval_id=approval_id, name=name, verdict=verdict):
                if (run := self._runs.get(req.run_id)) is not None:
                    run.run.add_event("pluto.approval.decision", {
                        "pluto.approval.id": approval_id, "gen_ai.tool.name": name,
                        "pluto.approval.verdict": verdict}, timestamp=now)
            case RunEnd(outcome=outcome):
                self._end_run(req.run_id, outcome, now)

    def _start_run(self, req: RunRequest, now: int) -> None:
        who = req.who
        received = int(who.received * 1e9) if who.received else now
        self._ids.next_trace = int(trace_id_for(req.run_id), 16)
        try:
            message = self._tracer.start_span(
                "pluto.message", start_time=received, kind=self._kind("SERVER"),
                attributes={"pluto.provider": who.provider, "pluto.chat_id": who.chat_id,
                            "pluto.user_id": who.user_id, "pluto.run_id": req.run_id})
        finally:
            self._ids.next_trace = None
        route = self._tracer.start_span(
            "pluto.route", context=self._in(message), start_time=received,
            attributes={"pluto.route.rule": who.route, "gen_ai.agent.name": req.agent.name,
                        "pluto.session_key": req.session.key})
        route.end(end_time=max(received, now))  # routed and queued until the run started
        run = self._tracer.start_span(
            f"invoke_agent {req.agent.name}", context=self._in(message), start_time=now,
            attributes={"gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.name": req.agent.name,
                        "gen_ai.conversation.id": req.session.id, "pluto.run_id": req.run_id})
        self._runs[req.run_id] = _Run(message, run)
        if len(self._runs) > MAX_OPEN_RUNS:  # a run that never ended here (taken over by
            self._end_run(next(iter(self._runs)), "unknown", now)  # another instance)

    def _end_run(self, run_id: str, outcome: str, now: int) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        for span in run.tools.values():
            span.end(end_time=now)
        run.run.set_attribute("pluto.outcome", outcome)
        if outcome not in ("ok", "awaiting_approval"):  # (a pause is no failure)
            run.run.set_status(self._status("ERROR"), outcome)
        run.run.end(end_time=now)
        run.message.end(end_time=now)

    def model_call(self, call: UsageCall) -> None:
        """A usage-ledger row as a span of its run (a usage observer)."""
        run = self._runs.get(call.run_id) if self.enabled else None
        if run is None:
            return
        end = time.time_ns()
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": call.model,
            "gen_ai.provider.name": call.model.partition("/")[0] if "/" in call.model
            else call.model,
            "gen_ai.usage.input_tokens": call.input_tokens,
            "gen_ai.usage.output_tokens": call.output_tokens,
            "pluto.purpose": call.purpose, "pluto.attempt": call.attempt,
            "pluto.outcome": call.outcome}
        if call.cached_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = call.cached_tokens
        if call.cost is not None:
            attributes["pluto.cost_usd"] = call.cost
        span = self._tracer.start_span(f"chat {call.model}", context=self._in(run.run),
                                       kind=self._kind("CLIENT"), attributes=attributes,
                                       start_time=end - int(max(0.0, call.latency) * 1e9))
        if call.outcome != "ok":
            span.set_status(self._status("ERROR"), call.outcome)
            span.set_attribute("error.type", call.outcome)
        span.end(end_time=end)

    def _in(self, span: Any) -> Any:
        return self._trace.set_span_in_context(span)

    def _kind(self, name: str) -> Any:
        return getattr(self._trace.SpanKind, name)

    def _status(self, code: str) -> Any:
        return self._trace.StatusCode[code]
