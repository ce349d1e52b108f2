"""Prometheus metrics of one gateway, served at ``/metrics``.

Each :class:`Metrics` has its own ``CollectorRegistry`` (not the process-global one), so several
gateways in one process (tests, benchmarks) count apart. Labels are kept to small sets: provider
names, outcomes, tool names and error kinds, never agent names, chat ids or user ids (there can be
thousands of those) — save the usage counters, labelled by agent and model: the agents of a
deployment's configuration, a set its admin bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pluto.events import MessageFinal, RunEnd, RunError, RunEvent, RunStart, ToolEnd
from pluto.gateway.pipeline.overload import Load
from pluto.runtime.usage import Refusal, UsageCall, UsageMeter

# seconds; a run is one turn of an agent (model calls and tools), from a blink to minutes
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


class Metrics:
    """Counters of the message pipeline. :meth:`observe` reads a run's events as they pass."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages_in = Counter("pluto_messages_in", "Messages received, per provider.",
                                   ["provider"], registry=r)
        self.messages_out = Counter(
            "pluto_messages_out", "Messages sent: answers, errors and command replies.",
            ["provider", "kind"], registry=r)
        self.runs = Counter("pluto_runs", "Runs finished, by outcome.", ["outcome"], registry=r)
        self.runs_active = Gauge("pluto_runs_active", "Runs in progress.", registry=r)
        self.run_seconds = Histogram("pluto_run_duration_seconds",
                                     "Wall time of a run, from start to end.",
                                     buckets=RUN_BUCKETS, registry=r)
        self.tokens = Counter("pluto_model_tokens", "Model tokens used, prompt and completion.",
                              ["kind"], registry=r)
        self.tool_calls = Counter("pluto_tool_calls", "Tool calls, by tool and result.",
                                  ["tool", "outcome"], registry=r)
        self.errors = Counter("pluto_errors", "Errors: failed runs by kind, failed deliveries.",
                              ["kind"], registry=r)
        self.instance = Gauge("pluto_instance", "This gateway instance (always 1), by id and "
                              "whether it shares its database with others.",
                              ["instance", "shared"], registry=r)
        self.leases = Gauge("pluto_cluster_leases", "Leases this instance holds, by kind "
                            "(chat, session, provider, instance).", ["kind"], registry=r)
        # the usage ledger's sums (agents and models are the configured ones: a bounded set)
        self.usage_tokens = Counter("pluto_usage_tokens", "Model tokens per the usage ledger, "
                                    "by agent, model and kind (input, output, cached).",
                                    ["agent", "model", "kind"], registry=r)
        self.usage_cost = Counter("pluto_usage_cost_usd", "Model cost in USD per the usage "
                                  "ledger (calls of unknown price add nothing).",
                                  ["agent", "model"], registry=r)
        self.usage_calls = Counter("pluto_usage_model_calls", "Model calls, by agent, model "
                                   "and outcome.", ["agent", "model", "outcome"], registry=r)
        self.budget_refusals = Counter("pluto_usage_budget_refusals", "Model calls refused by "
                                       "a usage budget, by what it limits (agent, route, user, "
                                       "chat) and period.", ["per", "period"], registry=r)
        self.busy_refusals = Counter("pluto_busy_refusals", "Messages answered with the busy "
                                     "notice, by reason (waiting: too many runs wait for a "
                                     "slot; lag: the event loop runs late).", ["reason"],
                                     registry=r)
        self.provider_resets = Counter("pluto_provider_resets", "Clients rebuilt by the send "
                                       "watchdog (every send failed for a while), per provider.",
                                       ["provider"], registry=r)
        self.schedule_firings = Counter("pluto_schedule_firings", "Scheduled firings, by "
                                        "outcome (ran, quiet, failed, missed).", ["outcome"],
                                        registry=r)
        self._started: dict[str, float] = {}
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # (metric, labels) -> child

    def _of(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, found once per label set (every message counts several:
        looked up each time, they cost more than the counting). Not for a metric that is
        cleared (its children would be gone)."""
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[(metric, labels)] = metric.labels(*labels)
        return child

    def watch_load(self, load: Load) -> None:
        """Runs holding and waiting for a slot, and the loop's lag: read at each scrape."""
        r = self.registry
        Gauge("pluto_load_running", "Runs holding one of the gateway's run slots.",
              registry=r).set_function(lambda: load.running)
        Gauge("pluto_load_waiting", "Session lanes waiting in line for a run slot.",
              registry=r).set_function(lambda: load.waiting)
        Gauge("pluto_event_loop_lag_seconds", "How late the event loop woke, at worst, in "
              "about the last second.", registry=r).set_function(lambda: load.lag)

    def watch_storage(self, engine: object) -> None:
        """The database engine's own counts, read at each scrape (PostgreSQL keeps them: the
        deadlocks it met, statements sent together with others)."""
        if hasattr(engine, "deadlocks"):
            self.registry.register(_EngineCounts(engine))

    def provider_reset(self, provider: str) -> None:
        """The send watchdog rebuilt a provider's client (its sends all failed for a while)."""
        self._of(self.provider_resets, provider).inc()

    def busy_refusal(self, reason: str) -> None:
        self._of(self.busy_refusals, reason).inc()

    def schedule_firing(self, outcome: str) -> None:
        """A scheduled firing ended so (docs/schedules.md)."""
        self._of(self.schedule_firings, outcome).inc()

    def watch_usage(self, meter: UsageMeter) -> None:
        """Count what ``meter`` records and refuses."""
        meter.on_record.append(self.usage_call)
        meter.on_refusal.append(self.usage_refused)

    def usage_call(self, call: UsageCall) -> None:
        for kind, n in (("input", call.input_tokens), ("output", call.output_tokens),
                        ("cached", call.cached_tokens)):
            self._of(self.usage_tokens, call.agent, call.model, kind).inc(max(0, n))
        if call.cost:
            self._of(self.usage_cost, call.agent, call.model).inc(max(0.0, call.cost))
        self._of(self.usage_calls, call.agent, call.model, call.outcome).inc()

    def usage_refused(self, refusal: Refusal) -> None:
        self._of(self.budget_refusals, refusal.budget.per, refusal.budget.period).inc()

    def cluster(self, instance: str, shared: bool, held: list[str]) -> None:
        """Who this instance is and what it holds (read at each scrape)."""
        self.instance.clear()
        self.instance.labels(instance=instance, shared=str(shared).lower()).set(1)
        counts: dict[str, int] = {}
        for name in held:
            kind = name.partition(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
        self.leases.clear()
        for kind, n in counts.items():
            self.leases.labels(kind=kind).set(n)

    def message_in(self, provider: str) -> None:
        self._of(self.messages_in, provider).inc()

    def message_out(self, provider: str, kind: str) -> None:
        self._of(self.messages_out, provider, kind).inc()

    def error(self, kind: str) -> None:
        self._of(self.errors, kind).inc()

    def observe(self, event: RunEvent, provider: str) -> None:
        """Count one run event on its way from the runner to ``provider``."""
        match event:
            case RunStart(run_id=run_id, ts=ts):
                self._started[run_id] = ts
                self.runs_active.inc()
            case ToolEnd(name=name, is_error=is_error):
                self._of(self.tool_calls, name, "error" if is_error else "ok").inc()
            case MessageFinal():
                self.message_out(provider, "reply")
            case RunError(kind=kind):
                self.message_out(provider, "error")
                self.error(f"run_{kind}")
            case RunEnd(run_id=run_id, outcome=outcome, usage=usage, ts=ts):
                self._of(self.runs, outcome).inc()
                started = self._started.pop(run_id, None)
                if started is not None:
                    self.runs_active.dec()
                    self.run_seconds.observe(max(0.0, ts - started))
                for kind in ("prompt", "completion"):
                    self._of(self.tokens, kind).inc(max(0, int(usage.get(f"{kind}_tokens", 0))))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineCounts(Collector):
    """A PostgreSQL engine's counts as Prometheus counters (read, never reset, at each scrape)."""

    def __init__(self, engine: object):
        self.engine = engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "pluto_storage_deadlocks", "Deadlocks the database met and broke (each a second's "
            "stall; none are expected: docs/cluster.md).", value=getattr(self.engine, "deadlocks", 0))
        yield CounterMetricFamily(
            "pluto_storage_statements_joined", "Statements sent in one round trip with others "
            "of the same text.", value=getattr(self.engine, "batched", 0))
