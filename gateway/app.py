"""The gateway process: configuration, storage, providers, and the message pipeline, wired.

Where a message enters: a provider hands it to its intake (:mod:`.pipeline.intake`).
Where it is routed: :mod:`.pipeline.pipeline` (dedupe, access, commands, session lanes).
Where the model is called: :mod:`pluto.runtime.runner`.
Where the reply leaves: :mod:`.delivery.delivery` and the outbox.

``async with Gateway(config_dir) as gw:`` validates the configuration and every enabled
provider's settings, then opens storage, the outbox, the HTTP server (``serve=True``) and the
providers — each registered with its teardown, so a failed start closes everything it had opened
and raises one :class:`~pluto.errors.PlutoError` that says what went wrong.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Collection, Mapping
import contextlib
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError, StartupError
from pluto.gateway.cluster import Cluster, new_instance_id
from pluto.gateway.delivery.delivery import Delivery
from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.delivery.outbox import Outbox
from pluto.gateway.delivery.streaming import EditThrottle
from pluto.gateway.delivery.watchdog import SendWatchdog
from pluto.gateway.directory import Directory
from pluto.gateway.feed import CHANNEL as FEED_CHANNEL, LocalRunFeed, SharedRunFeed
from pluto.gateway.http.admin import mount_admin
from pluto.gateway.http.server import HttpServer
from pluto.gateway.metrics import Metrics
from pluto.gateway.budgets_file import load_budgets
from pluto.gateway.pipeline.approvals import ApprovalSweep
from pluto.gateway.pipeline.access import Access
from pluto.gateway.pipeline.data_commands import DataCommands, data_service, shared_files
from pluto.gateway.pipeline.memory_commands import MemoryCommands
from pluto.gateway.pipeline.intake import ChatSweep, IntakeQueue, Shared, message_from_dict
from pluto.gateway.pipeline.shared_uploads import UploadsFirst
from pluto.gateway.pipeline.overload import Load
from pluto.gateway.pipeline.ratelimit import SharedRateLimiter
from pluto.gateway.pipeline.pipeline import Pipeline
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.gateway.ports import HttpMount, Provider, ProviderContext
from pluto.gateway.provider_registry import build_provider, enabled
from pluto.gateway.recovery import Recovery
from pluto.events import RunEvent
from pluto.types import IncomingMessage
from pluto.gateway.reload import ConfigWatcher, load_routes
from pluto.gateway.schedules import wiring as schedules
from pluto.gateway.schedules.tool import SCHEDULE_TOOLS
from pluto.gateway.supervisor import TaskHealth, supervise
from pluto.runtime.tracing import Tracing
from pluto.runtime.usage import Prices, UsageMeter
from pluto.runtime.data_tools import DATA_TOOLS
from pluto.runtime.mcp import McpHub
from pluto.runtime.memory import MemoryBook, SharedMemoryBook
from pluto.runtime.model import Model, ModelSettings, warm_litellm
from pluto.runtime.openai_compat import close_sessions, model_for, uses_litellm
from pluto.runtime.runner import Runner
from pluto.runtime.tools import BUILTIN_TOOLS, Tool
from pluto.settings import PlutoConfig, load_pluto_config
from pluto.storage import Store, store_for

log = logging.getLogger(__name__)

INTAKE_CAPACITY = 1000  # messages per provider handed over and not yet handled


class Gateway:
    """One process: start it, feed it messages through providers, stop it.

    With ``serve=True`` it also starts the HTTP server and every provider enabled in
    ``pluto.yaml``; otherwise providers are added with :meth:`add_provider` (the terminal).
    """

    def __init__(self, config_dir: Path, *, data_dir: Path | None = None,
                 model_factory: Callable[[ModelSettings], Model] = model_for,
                 config: PlutoConfig | None = None, serve: bool = False,
                 http_bind: tuple[str, int] | None = None, store: Store | None = None,
                 tools: Mapping[str, Tool] | None = None):
        self.config_dir = config_dir
        # the tools agents may name: the built-in and data tools, and any the embedder adds
        self.tools: dict[str, Tool] = {**BUILTIN_TOOLS, **DATA_TOOLS, **SCHEDULE_TOOLS,
                                       **(tools or {})}
        self.config = config or load_pluto_config(config_dir)
        self.data_dir = (data_dir or self.config.data_dir).resolve()  # one absolute path
        self.instance = new_instance_id()
        self.store: Store = store or store_for(self.data_dir, self.config.storage.url())
        # several instances on one database (PostgreSQL): who holds which chat, session and
        # single-owner connection; on SQLite a formality
        self.shared = self.store.shared
        self.cluster = Cluster(self.store.leases if self.shared else None, self.instance,
                               ttl=self.config.storage.lease_seconds)
        self.store.conversations.owner = self.instance
        self.registry = AgentRegistry(config_dir / "agents", self.data_dir / "agents",
                                      key_envs=self.config.agents.api_key_envs,
                                      known_tools=self._tool_names)
        self.routes: RoutingTable = load_routes(config_dir, self.registry)
        self.metrics = Metrics()
        self.feed = (SharedRunFeed(self.store.conversations, self.store.bus, self.instance)
                     if self.shared and self.store.bus is not None
                     else LocalRunFeed(self.store.conversations))
        self.providers: dict[str, Provider] = {}
        self.health: dict[str, TaskHealth] = {}
        self.intakes: dict[str, IntakeQueue] = {}
        self._chat_sweep: ChatSweep | None = None  # several instances: one for every intake
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._delivery_path()
        self.runner = self._runtime(model_factory)
        # extra reports in /readyz: informative, they never make the gateway unready
        self.load = Load(lambda: self.config.gateway)  # run slots; busy notice when overloaded
        self.metrics.watch_load(self.load)
        self.metrics.watch_storage(getattr(self.store, "engine", None))
        self.health_reports: dict[str, Callable[[], object]] = {"mcp": self.mcp.health,
                                                                "load": self.load.report}
        self.pipeline = self._pipeline()
        self._recovery(serve)
        self.health_reports["cluster"] = self._cluster_report
        self._control_tasks: set[asyncio.Task[object]] = set()
        self.directory = Directory(lambda: self.routes, self.registry, self.store.conversations,
                                   self.store.inbound)
        self.watcher = ConfigWatcher(self)  # live reload of the config dir (serve only)
        self.scheduler = schedules.attach(self)  # schedules.yaml, /remind: agents speak first
        # approval requests nobody decided in time, handed to their chats (docs/approvals.md)
        self.approval_sweep = ApprovalSweep(self.store.approvals, self.intakes)
        self.runner.on_approval = self.approval_sweep.expect
        self.serve = serve
        bind = http_bind or (self.config.http.host, self.config.http.port)
        self.http = HttpServer(self, *bind) if serve else None
        self.started_at = time.time()
        self._stack: AsyncExitStack | None = None
        self._stopping = False

    def _delivery_path(self) -> None:
        """The outbox (every reply recorded, then sent in its chat's order) and delivery."""
        throttle = EditThrottle(lambda: self.config.gateway.stream_edit_interval_seconds)
        # a provider whose sends all fail for a while is named by /readyz and its client rebuilt
        self.watchdog = SendWatchdog(window=lambda: self.config.gateway.send_wedged_seconds,
                                     on_reset=self.metrics.provider_reset)
        self.outbox = Outbox(self.store.outbox, self.providers, throttle=throttle,
                             owner=self.instance, flood=FloodControl(self.store.flood),
                             watchdog=self.watchdog, may_send=self.cluster.fresh,
                             # several instances: a dead one's replies go out soon after
                             sweep_seconds=min(30.0, self.config.storage.lease_seconds)
                             if self.shared else 30.0)
        self.cluster.on_rejoin.append(self.outbox.forget_claims)  # others sent them meanwhile
        self.delivery = Delivery(self.outbox, data_dir=self.data_dir, throttle=throttle,
                                 keep_preview=lambda msg, pid: self.store.inbound.keep_preview(
                                     msg.provider, msg.message_id or "", pid),
                                 replace_left=self.shared)

    def _recovery(self, serve: bool) -> None:
        """Readiness (storage, the data dir's disk) and what becomes of a run storage cut
        short: swept and answered again here, or (several instances) handed back."""
        self.recovery = Recovery(self.store, self.data_dir, live=lambda: self.pipeline.live,
                                 intakes=self.intakes, publish=self.feed.publish,
                                 resend=self._resend, sweep=serve and not self.shared)
        self.pipeline.on_stranded = self.recovery.strand
        if self.shared:  # several instances: a run storage cut short is handed back
            self._stranded: dict[str, tuple[str, IncomingMessage]] = {}
            # chats with a run handed back since their worker last asked (_hand_back_chat)
            self._returned: set[tuple[str, str]] = set()
            self._handing_back: asyncio.Task[None] | None = None
            self.pipeline.on_stranded = self._strand_shared
            self.runner.hand_back = True

    def _pipeline(self) -> Pipeline:
        """Access, the pipeline (with its run slots) and the memory commands."""
        self.access = Access(self.store.pairing, lambda: self.config.access,
                             limiter=SharedRateLimiter(self.store.rates) if self.shared else None)
        pipeline = Pipeline(
            conversations=self.store.conversations,
            inbox=self.store.inbound, access=self.access,
            registry=self.registry, routes=lambda: self.routes, data=self.data,
            runner=self.runner, delivery=self.delivery, providers=self.providers,
            metrics=self.metrics, load=self.load, publish=self.feed.publish,
            max_queued=self.config.gateway.max_queued_per_session,
            session_guard=(lambda key: self.cluster.holding(f"session:{key}"))
            if self.shared else None, track_runs=self.shared,
            # a run's previews and typing stop once its chat may be another instance's
            fence=lambda msg: self.cluster.fence(f"chat:{msg.provider}:{msg.chat_id}"))
        MemoryCommands(self.registry, self.runner.services["memory"],  # /memory, /history
                       self.store.history).register(pipeline.commands)
        return pipeline

    def _runtime(self, model_factory: Callable[[ModelSettings], Model]) -> Runner:
        """What runs the agents: the services their tools use (data, MCP servers, memory,
        history), the usage ledger and tracing, and the Runner over them."""
        self.files = shared_files(self.config, self.data_dir, getattr(self.store, "blobs", None))
        self.outbox.files = self.files if self.files.shared else None  # replies made elsewhere
        self.data = DataCommands(data_service(self.config, self.config_dir, self.data_dir,
                                              files=self.files),
                                 self.registry, self.store.conversations,
                                 voice=lambda: self.config.voice_resolved())
        self.mcp = McpHub(max_servers=self.config.agents.mcp_max_servers,  # agents' MCP servers
                          idle_seconds=self.config.agents.mcp_idle_seconds,
                          log_dir=self.data_dir / "logs" / "mcp")
        # budgets.yaml (the console edits it) counts along with pluto.yaml's usage.budgets
        self.console_budgets: list[Any] = load_budgets(self.config_dir)
        self.usage = UsageMeter(self.store.usage, prices=Prices(lambda: self.config.usage.prices),
                                budgets=lambda: [*self.config.usage.budgets,
                                                 *self.console_budgets])  # the ledger
        self.metrics.watch_usage(self.usage)
        t = self.config.tracing  # spans over OTLP when configured (started in start())
        self.tracing = Tracing(t.otlp_endpoint, service_name=t.service_name, headers=t.headers())
        self.usage.on_record.append(self.tracing.model_call)
        return Runner(self.store.conversations, models=self._model_settings(),
                      tools=self.tools, data_dir=self.data_dir,
                      services={"data": self.data.service, "mcp": self.mcp,
                                "memory": SharedMemoryBook(self.store.notes)
                                if self.shared else MemoryBook(self.data_dir / "memory"),
                                "history": self.store.history},
                      model_factory=model_factory, usage=self.usage,
                      tracing=self.tracing, approvals=self.store.approvals)

    def _tool_names(self) -> Collection[str]:
        """The tools an agent may name in ``tools:`` (an unknown one is a ConfigError)."""
        runner = getattr(self, "runner", None)  # (routes are checked before it exists)
        return (runner.tools if runner is not None else self.tools).keys()

    def _model_settings(self) -> dict[str, ModelSettings]:
        return {name: ModelSettings(model=m.model, api_base=m.api_base, api_key_env=m.api_key_env,
                                    temperature=m.temperature,
                                    max_output_tokens=m.max_output_tokens, timeout=m.timeout,
                                    retries=m.retries, client=m.client, vision=m.vision,
                                    image_max_side=m.image_max_side,
                                    image_max_mb=m.image_max_mb,
                                    images_per_message=m.images_per_message,
                                    images_in_context=m.images_in_context)
                for name, m in self.config.models.items()}

    # lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open everything, in order, each with its teardown; on failure close what was opened
        and raise (a :class:`ConfigError` or :class:`StartupError` that says what and why)."""
        stack = AsyncExitStack()
        try:
            configured = self._configured_providers()  # validated before anything is opened
            await self._open_storage(stack)
            self.load.start()  # the lag monitor
            stack.push_async_callback(self.load.stop)
            self.recovery.start()
            stack.push_async_callback(self.recovery.stop)
            await self.tracing.start()  # (configured: the SDK is imported in a thread)
            await self.usage.prices.load()  # litellm's price list, read in a thread (~20 ms)
            stack.push_async_callback(self.tracing.shutdown)  # the last spans leave, last
            stack.push_async_callback(close_sessions)  # the model connections, last
            stack.push_async_callback(self.mcp.aclose)  # the MCP servers, once no run is left
            stack.push_async_callback(self._close_providers)  # after the HTTP server stops
            if self.serve:
                if self._uses_litellm():
                    await warm_litellm()  # imported in a thread now, not at the first question
                self.data.prepare_soon()  # registered datasets load now, not at the first question
                stack.push_async_callback(self.data.close)
                if self.http is not None:
                    mount_admin(self.http.app, self)
                    await self._listen(stack)
            stack.push_async_callback(self.outbox.close)
            self.outbox.start()
            watchdog = asyncio.create_task(self.watchdog.run(self.providers),
                                           name="send-watchdog")
            stack.push_async_callback(_cancel, watchdog)
            stack.push_async_callback(self._drain)
            for provider in configured:
                self.add_provider(provider)
            await schedules.start(self.scheduler, stack, watch=self.serve)
            self.approval_sweep.start()
            stack.push_async_callback(self.approval_sweep.stop)
            if self.serve:
                self.watcher.start()
                stack.push_async_callback(self.watcher.stop)
                warm = asyncio.create_task(self._warm_python(), name="python:warm")
                stack.push_async_callback(_cancel, warm)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

    async def _warm_python(self) -> None:
        """An agent the routes use lists ``run_python``: a sandbox started now, in the
        background, so the first code a model writes does not wait for a cold one (about a
        second and a half); it is stopped with the gateway."""
        try:
            for name in self.routes.agents():
                if "run_python" in (await self.registry.load(name)).tools:
                    break
            else:
                return
            from pluto.runtime.python.sandbox import pool, unavailable
            if await asyncio.to_thread(unavailable) is not None:
                return  # (pluto doctor says why; the tool says so when called)
            sandboxes = pool()
            await asyncio.to_thread(sandboxes.refill)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - an optimisation: the first run starts cold
            log.warning("python: no sandbox could be warmed at start: %s", e)
            return
        try:
            await asyncio.Event().wait()  # until the gateway stops
        finally:
            await asyncio.shield(asyncio.to_thread(sandboxes.close))

    def _uses_litellm(self) -> bool:
        """Whether a model this gateway is configured to call goes through litellm."""
        models = list(self._model_settings().values())
        for name in self.routes.agents():
            try:  # agents the table routes to are loaded already; they may name a model
                spec = self.registry.get(name)
            except (PlutoError, LookupError):
                continue
            models.append(self.runner.settings_for(spec))
        return any(uses_litellm(m) for m in models)

    def _configured_providers(self) -> list[Provider]:
        if not self.serve:
            return []
        mount = HttpMount(self.http.app.router, self.http.app.on_shutdown) if self.http else None
        built = []
        for name in enabled(self.config.providers):
            ctx = ProviderContext(name=name, config=self.config.providers[name],
                                  data_dir=self.data_dir, feed=self.feed, http=mount,
                                  chats=self.directory, runs=self.store.conversations,
                                  tasks=self.store.tasks,
                                  idempotency=self.store.idempotency, files=self.files,
                                  approvals=self.pipeline.approvals.check
                                  if self.pipeline.approvals is not None else None)
            built.append(build_provider(name, ctx))
        return built

    async def _open_storage(self, stack: AsyncExitStack) -> None:
        engine = getattr(self.store, "engine", None)
        if self.shared and hasattr(engine, "idle_in_transaction"):  # see storage/sql/fencing
            engine.idle_in_transaction = max(1.0, self.cluster.ttl / 2)  # type: ignore[union-attr]
        await self.store.open()
        stack.push_async_callback(self.store.close)
        log.info("storage: %s", self.store.describe())
        if self.shared:  # other instances may be running: take over only what is orphaned
            await self.cluster.start()
            stack.push_async_callback(self.cluster.stop)
            if isinstance(self.feed, SharedRunFeed) and self.store.bus is not None:
                # every write of run events tells the other instances in its own statement
                self.store.conversations.notify_channel = await self.store.bus.scoped(
                    FEED_CHANNEL)
                # runs executing on other instances, followed live; those accepted here,
                # heard as they are published
                self.feed.start(local=lambda run_id: run_id in self.pipeline.live)
            if self.store.bus is not None:  # /stop of a session running on another instance
                self.store.bus.subscribe(CONTROL, self._control)
                self.pipeline.stop_elsewhere = self._stop_elsewhere
                await self._listen_intake(self.store.bus)
                # a platform's retry-after kept by any instance holds the chat everywhere
                self.store.flood.notify = await self.store.bus.scoped(FLOOD)
                self.store.bus.subscribe(FLOOD, self.outbox.flood.heard)
                self.outbox.flood.followed = True
            self._sweep_chats().start()  # orphaned runs, messages nobody took: taken up
            stack.push_async_callback(self._sweep_chats().stop)
        else:
            # a gateway serving chats answers them again; a terminal command does not
            interrupted = await self.store.conversations.recover_interrupted(
                requeue=self.serve)
            if interrupted:
                log.warning("%d run(s) were interrupted by the last shutdown%s",
                            len(interrupted), "; their messages are answered again"
                            if self.serve else "")
        await self.outbox.open()

    async def _listen_intake(self, bus: Any) -> None:
        """Several instances: the notes between intakes (a message recorded, a chat let go,
        what became of a message) — sent by the statements that make the change."""
        channel = await bus.scoped(INTAKE)
        self.store.inbound.notify = channel
        self.store.leases.notify = channel
        bus.subscribe(INTAKE, self._intake_note)

    def _hearing(self) -> bool:
        """Whether the notes between instances are heard now (several instances)."""
        bus = self.store.bus
        return bus is not None and bool(bus.hearing)

    def _intake_note(self, payload: str | None) -> None:
        for intake in list(self.intakes.values()):
            intake.note(payload)

    def _strand_shared(self, run_id: str, provider: str, msg: IncomingMessage) -> None:
        """Several instances: a run of ours that storage cut short (an outage) could not even
        be ended; once storage works it is ended as interrupted and its message goes back to
        the inbox, answered again in its place in the chat (or, if its answer was saved, the
        answer is sent)."""
        self._stranded[run_id] = (provider, msg)
        if self._handing_back is None or self._handing_back.done():
            self._handing_back = asyncio.create_task(self._hand_back(),
                                                     name="cluster:hand-back")

    async def _hand_back(self) -> None:
        while self._stranded:
            await asyncio.sleep(1.0)
            for run_id, (provider, msg) in list(self._stranded.items()):
                if run_id in self.pipeline.live:
                    continue
                try:
                    await self._hand_back_one(run_id)
                except PlutoError as e:
                    log.info("cluster: run %s is handed back once storage works (%s)",
                             run_id, e)
                    break
                if (intake := self.intakes.get(provider)) is not None:
                    intake.kick(msg.chat_id)

    async def _hand_back_one(self, run_id: str) -> None:
        found = self._stranded.get(run_id)
        if found is None:
            return
        provider, msg = found
        target = self.providers.get(provider)
        answer = await self.store.conversations.undelivered_answer(run_id)
        # (what storage said failed may have been done all the same: the server committed,
        # the connection broke before it said so)
        row = await self.store.conversations.run(run_id) if answer is None else None
        going = answer is None and (row is None or row.status in ("queued", "running"))
        if going and self.shared and target is not None:
            # its message is answered again, maybe elsewhere: the preview it showed here goes
            # first (before the message is back in the inbox: no run here edits it meanwhile)
            self.delivery.withdraw_left(target, msg)
        ended = await self.store.conversations.recover_runs([run_id]) if going else []
        for end in ended:
            self.feed.publish(end)
        if going:  # its message is back in the inbox: a look at the chat made before is stale
            self._returned.add((provider, msg.chat_id))
        if answer is not None:
            await self._resend(provider, msg, answer)
        elif not ended and target is not None and row is not None and row.status == "ok":
            # it had ended answered (not taken over elsewhere), its reply recorded after all
            await self.outbox.flush_chat(target, msg.chat_id)  # (claimed here): sent now,
            # ahead of anything newer in the chat — left to the sweep, it came after them
        log.info("cluster: run %s of %s chat %s handed back: %s", run_id, provider,
                 msg.chat_id, "its saved answer is sent" if answer is not None else
                 "its message is answered again" if ended else
                 "it had ended answered; its reply is sent first" if row and row.status == "ok"
                 else "it had ended")
        self._stranded.pop(run_id, None)

    async def _handed_back(self, run_id: str) -> bool:
        """The chat's intake, before its next message: a run of its that storage cut short is
        handed back first (its message answered again before the next: order holds); whether
        it was."""
        if run_id not in self._stranded:
            return False
        while run_id in self._stranded:
            try:
                await self._hand_back_one(run_id)
            except PlutoError:
                await asyncio.sleep(1.0)  # (storage is away: the chat waits)
        return True

    async def _hand_back_chat(self, provider: str, chat: str) -> bool:
        """The chat's intake, as it takes the chat: its runs that storage cut short are handed
        back first — the worker that waited for one may have lost the chat to the same outage
        and take it again, fresh — so their messages are answered again in their place, before
        the chat's next; whether any was (its message is back in the inbox). A failure to
        record it goes to the caller: the chat waits for storage. Also true when one was
        handed back by the background task (:meth:`_hand_back`) since the chat's last ask:
        the worker's look at the inbox as it took the chat may have come just before."""
        returned = (provider, chat) in self._returned
        self._returned.discard((provider, chat))
        if not self._stranded:
            return returned
        runs = [run_id for run_id, (p, msg) in list(self._stranded.items())
                if p == provider and msg.chat_id == chat]
        for run_id in runs:
            await self.pipeline.finished(run_id)  # (its task is done with it first)
            await self._hand_back_one(run_id)
        self._returned.discard((provider, chat))  # (the caller reads the inbox again)
        return bool(runs) or returned

    def _sweep_chats(self) -> ChatSweep:
        """Several instances: the one sweep for every intake (see :meth:`_chats_to_take`)."""
        if self._chat_sweep is None:
            self._chat_sweep = ChatSweep(self._chats_to_take, max(1.0, self.cluster.ttl / 2))
        return self._chat_sweep

    async def _chats_to_take(self) -> list[tuple[str, str]]:
        """Every half lease, in one statement: chats with runs whose instance died (their
        messages are answered again, in order; found at most 1.5 leases after its last
        heartbeat) and chats whose messages waited a lease with nobody taking them (their
        receiver died). An idle instance's statements stay well under one a second."""
        in_feed = tuple(name for name, p in self.providers.items()
                        if p.capabilities.answers_from_feed)
        # (None: the instances alive are looked up by the same statement)
        return await self.store.conversations.orphaned_chats(
            None, answered_in_feed=in_feed, waiting_longer_than=max(2.0, self.cluster.ttl))

    async def _take_over_chat(self, provider: str, chat: str) -> None:
        target = self.providers.get(provider)
        if target is not None:  # its replies that instance recorded and never sent: first
            await self.outbox.flush_chat(target, chat)
        taken = await self.store.conversations.take_over_chat(provider, chat)
        for end in taken:
            self.feed.publish(end)
        # answered by an instance that died before its reply reached the outbox (a provider
        # that reads answers from the run feed has them there, with no outbox row)
        if target is not None and not target.capabilities.answers_from_feed:
            for payload, final in await self.store.conversations.undelivered_in_chat(provider,
                                                                                    chat):
                log.warning("cluster: delivering the answer of run %s in %s chat %s, which "
                            "its instance could not", final.run_id, provider, chat)
                await self.delivery.resend_final(target, message_from_dict(payload), final)
        if taken:
            log.warning("cluster: took over %d run(s) of %s chat %s from an instance that "
                        "stopped; answering again", len(taken), provider, chat)

    async def _send_undelivered(self, provider: Provider) -> None:
        """Answers the last process saved but died before handing to the outbox: sent now,
        each replacing the preview its run had shown (a provider that reads answers from the
        run feed has them there)."""
        if provider.capabilities.answers_from_feed:
            return
        found = await self.store.conversations.undelivered_in_chat(
            provider.name, None)
        for payload, final in found:
            log.warning("delivering the answer of run %s, saved before the last shutdown but "
                        "not yet sent", final.run_id)
            await self.delivery.resend_final(provider, message_from_dict(payload), final)

    async def _resend(self, provider: str, msg: IncomingMessage, answer: RunEvent) -> None:
        target = self.providers.get(provider)
        if target is not None and not target.capabilities.answers_from_feed:  # (else: there)
            await self.delivery.resend_final(target, msg, answer)

    def _claimed(self, source: tuple[str, str], claim: tuple[str, int] | None) -> None:
        """A message taken from the inbox under a chat claim: what its handling writes is
        fenced by it (its run's writes, and its outcome)."""
        self.store.conversations.claim(source, claim)
        self.store.inbound.claim(source, claim)

    async def _publish_intake(self, payload: str) -> None:
        assert self.store.bus is not None
        await self.store.bus.publish(INTAKE, [payload])

    async def _stop_elsewhere(self, session_key: str) -> bool:
        assert self.store.bus is not None
        await self.store.bus.publish(CONTROL, [f"stop|{self.instance}|{session_key}"])
        return await self.store.conversations.session_running(session_key)

    def _control(self, payload: str | None) -> None:
        if payload is None:
            return
        what, sender, key = (payload.split("|", 2) + ["", ""])[:3]
        if what == "stop" and sender != self.instance and key:
            task = asyncio.get_running_loop().create_task(
                self.pipeline.stop(key, everywhere=False))
            self._control_tasks.add(task)
            task.add_done_callback(self._control_tasks.discard)

    def _cluster_report(self) -> dict[str, object]:
        return {"instance": self.instance, "database": self.store.describe(),
                "shared": self.shared, "leases": self.cluster.held()}

    async def _listen(self, stack: AsyncExitStack) -> None:
        assert self.http is not None
        try:
            await self.http.start()
        except OSError as e:
            await self.http.stop()
            where = f"{self.http.host}:{self.http.port}"
            if e.errno == errno.EADDRINUSE:
                raise StartupError(f"cannot listen on {where}: the address is already in use "
                                   "(is another gateway running? pass --port to pick another)"
                                   ) from None
            raise StartupError(f"cannot listen on {where}: {e.strerror or e}") from None
        stack.push_async_callback(self.http.stop)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def intake(self, provider: Provider) -> IntakeQueue:
        """The provider's intake: its bounded queue in front of the pipeline."""
        queue = self.intakes.get(provider.name)
        if queue is None:
            shared = Shared(self.cluster, self._take_over_chat, self.pipeline.finished,
                            self.pipeline.urgent,  # a run's writes: fenced by its claim
                            claimed=self._claimed,
                            publish=self._publish_intake if self.store.bus is not None
                            else None, hearing=self._hearing,
                            delivered=self.outbox.chat_idle,
                            handed_back=self._handed_back,
                            stranded_in=self._hand_back_chat,
                            # (one look now and then: notes carry the news)
                            fallback=max(1.0, self.cluster.ttl / 2),
                            sweep=self._sweep_chats()) if self.shared else None
            queue = self.intakes[provider.name] = IntakeQueue(
                provider.name, self.pipeline.handle, self.store.inbound,
                capacity=INTAKE_CAPACITY, shared=shared)
        return queue

    def add_provider(self, provider: Provider, *, restart: bool = True) -> asyncio.Task[None]:
        """Start a provider as a supervised task (restarted with backoff when it crashes); the
        outbox first sends what it holds for it from before."""
        self.providers[provider.name] = provider
        health = self.health[provider.name] = TaskHealth(provider.name)
        intake = self.intake(provider)
        handed = UploadsFirst(intake, self.files) if self.files.shared else intake

        async def run() -> None:
            # what a dead process had not sent, queued in each chat before anything of the
            await self.outbox.flush(provider)  # runs of what it had received and not handled
            if self.serve and not self.shared:  # (several instances: the chat's taker does)
                await self._send_undelivered(provider)
            await intake.replay()
            if self.shared and provider.single_owner():  # one instance at a time holds it
                await self.cluster.exclusive(f"provider:{provider.name}",
                                             lambda: provider.run(handed))
            else:
                await provider.run(handed)

        task = asyncio.create_task(supervise(health, run, max_restarts=None if restart else 0),
                                   name=f"provider:{provider.name}")
        self._tasks[provider.name] = task
        return task

    async def stop(self) -> None:
        """Graceful: stop receiving, let runs finish (or cancel them after the grace period),
        send what the outbox holds, close the providers, then storage."""
        if self._stopping or self._stack is None:
            return
        self._stopping = True
        stack, self._stack = self._stack, None
        await stack.aclose()

    async def _drain(self) -> None:
        """Stop receiving, then let what was received be handled and answered."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        grace = self.config.gateway.shutdown_grace_seconds
        if self._chat_sweep is not None:
            await self._chat_sweep.stop()
        await asyncio.gather(*(q.close(grace) for q in self.intakes.values()))
        await self.pipeline.close(grace)

    async def _close_providers(self) -> None:
        for provider in self.providers.values():
            try:
                await provider.close()
            except Exception:
                log.exception("closing %s failed", provider.name)

    async def settled(self) -> None:
        """Wait until every message handed over has been handled, its runs have ended and
        every reply is sent (or left for a retry): for tests and tools, never on a hot path."""
        while True:
            await asyncio.gather(*(q.idle() for q in self.intakes.values()))
            await self.pipeline.lanes.idle()
            await self.outbox.idle()
            if not any(q.waiting for q in self.intakes.values()) and not len(
                    self.pipeline.lanes) and not self.outbox.busy:
                return

    @property
    def ready(self) -> bool:
        return self.store.is_open and not self._stopping and all(
            h.state in ("running", "done") for h in self.health.values()) and not self.problems()

    def problems(self) -> dict[str, dict[str, str]]:
        """What keeps the gateway from being ready although it runs: storage that cannot
        commit, a full disk, a provider whose sends all fail (its watchdog says so). Each:
        {"state": a word, "reason": one sentence} — public callers of /readyz see the word."""
        found = self.recovery.problems()
        for provider, reason in self.watchdog.wedged().items():
            found[f"sends:{provider}"] = {"state": "wedged",
                                          "reason": f"{provider} sends fail: {reason}"}
        if self.cluster.enabled and not self.cluster.fresh():  # it acts on nothing meanwhile
            found["cluster"] = {"state": "silent", "reason": "this instance could not renew "
                                "its leases on the database lately: it sends nothing and "
                                "takes no work until it does"}
        return found

    # for the HTTP server and the admin API --------------------------------------------------


CONTROL = "pluto_control"  # between instances: stop|<instance>|<session key>
INTAKE = "pluto_intake"  # between intakes: see IntakeQueue.note
FLOOD = "pluto_flood"  # a platform's retry-after kept: see FloodControl.heard


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
