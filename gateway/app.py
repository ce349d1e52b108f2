"""The gateway process: configuration, storage, providers, and the message pipeline.

Where a message enters: :meth:`Gateway.handle` (each provider calls it).
Where it is routed: :mod:`gateway.routing`. Where the model is called: :mod:`runtime.runner`.
Where the reply leaves: :mod:`gateway.delivery`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import aclosing
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pluto.agents.registry import AgentRegistry, UnknownAgent
from pluto.errors import ConfigError
from pluto.gateway.pipeline.access import Access
from pluto.gateway.http.admin import mount_admin
from pluto.gateway.pipeline.commands import Commands, Failed
from pluto.settings import PlutoConfig, load_pluto_config
from pluto.gateway.pipeline.data_commands import DataCommands, data_service
from pluto.gateway.pipeline.dedupe import InboundDedupe
from pluto.gateway.delivery.delivery import Delivery, reply_to
from pluto.gateway.http.server import HttpServer
from pluto.gateway.feed import EventHub
from pluto.gateway.pipeline.lanes import SessionLanes
from pluto.gateway.metrics import Metrics
from pluto.errors import ProviderError
from pluto.gateway.ports import Provider, ProviderContext
from pluto.gateway.provider_registry import build_provider, enabled
from pluto.gateway.reload import ConfigWatcher, load_routes
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.gateway.supervisor import TaskHealth, supervise
from pluto.types import IncomingMessage, Route, RunEnd, RunEvent
from pluto.runtime.model import Model, ModelSettings, model_for
from pluto.runtime.runner import INTERNAL_ERROR, Runner, RunRequest
from pluto.runtime.data_tools import DATA_TOOLS
from pluto.runtime.tools import BUILTIN_TOOLS
from pluto.storage.sqlite import SqliteStore

log = logging.getLogger(__name__)

# Called as each run starts, before its first event: (the message it answers, the run id).
RunListener = Callable[[IncomingMessage, str], Awaitable[None]]

BUSY = "I'm still working through your earlier messages; please wait a moment and try again."


@dataclass(frozen=True, slots=True)
class Job:
    msg: IncomingMessage
    route: Route
    provider: Provider
    received: float


class Gateway:
    """One process: start it, feed it messages through providers, stop it.

    ``async with Gateway(config_dir) as gw:`` loads and validates the configuration and opens
    storage; :meth:`add_provider` starts a provider under supervision. With ``serve=True`` it
    also starts the HTTP server and every provider enabled in ``pluto.yaml``.
    """

    def __init__(self, config_dir: Path, *, data_dir: Path | None = None,
                 model_factory: Callable[[ModelSettings], Model] = model_for,
                 config: PlutoConfig | None = None, serve: bool = False,
                 http_bind: tuple[str, int] | None = None):
        self.config_dir = config_dir
        self.config = config or load_pluto_config(config_dir)
        self.data_dir = data_dir or self.config.data_dir
        self.model_factory = model_factory
        self.store = SqliteStore(self.data_dir / "pluto.db")
        self.registry = AgentRegistry(config_dir / "agents", self.data_dir / "agents")
        self.routes = self._load_routes()
        self.providers: dict[str, Provider] = {}
        self.health: dict[str, TaskHealth] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.lanes: SessionLanes[Job] = SessionLanes(
            self._process, max_queued=self.config.gateway.max_queued_per_session)
        self.commands = Commands(self.registry, self.store, self.lanes)
        self.data = DataCommands(data_service(self.config, config_dir, self.data_dir),
                                 self.registry, self.store)  # /sql, /datasets, uploads
        self.data.register(self.commands)
        self.access = Access(self.store, lambda: self.config.access, self._notice,
                             is_command=self.commands.knows)
        self.watcher = ConfigWatcher(self)  # live reload of the config dir (serve only)
        self.runner = Runner(self.store, models=self._model_settings(),
                             tools={**BUILTIN_TOOLS, **DATA_TOOLS}, data_dir=self.data_dir,
                             services={"data": self.data.service}, model_factory=model_factory)
        self.hub = EventHub()
        self.dedupe = InboundDedupe(self.store)
        self.delivery = Delivery(  # the interval is read live: pluto.yaml reloads apply
            self.store, data_dir=self.data_dir,
            edit_interval=lambda: self.config.gateway.stream_edit_interval_seconds)
        self.metrics = Metrics()
        self.run_listeners: list[RunListener] = []  # watchers that want run ids (web, API)
        self.serve = serve
        bind = http_bind or (self.config.http.host, self.config.http.port)
        self.http = HttpServer(self, *bind) if serve else None
        self.started_at = time.time()
        self._stopping = False

    # configuration ------------------------------------------------------------------------

    def _load_routes(self) -> RoutingTable:
        return load_routes(self.config_dir, self.registry)  # and the agents it routes to

    def _model_settings(self) -> dict[str, ModelSettings]:
        return {name: ModelSettings(model=m.model, api_base=m.api_base, api_key_env=m.api_key_env,
                                    temperature=m.temperature,
                                    max_output_tokens=m.max_output_tokens, timeout=m.timeout,
                                    retries=m.retries)
                for name, m in self.config.models.items()}

    # lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        await self.dedupe.open()
        await self.delivery.open()
        await self.access.open()
        interrupted = await self.store.recover_interrupted()
        if interrupted:
            log.warning("%d run(s) were interrupted by the last shutdown; marked as such",
                        len(interrupted))
        if not self.serve:
            return
        self.data.prepare_soon()  # load registered datasets now rather than on first question
        configured = [build_provider(name, ProviderContext(self.config.providers[name],
                                                           self.data_dir, self.http))
                      for name in enabled(self.config.providers)]  # they mount their routes
        if self.http is not None:
            mount_admin(self.http.app, self)
            await self.http.start()
        for provider in configured:
            self.add_provider(provider)
        self.watcher.start()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def add_provider(self, provider: Provider, *, restart: bool = True) -> asyncio.Task[None]:
        """Start a provider as a supervised task (restarted with backoff when it crashes)."""
        self.providers[provider.name] = provider
        health = self.health[provider.name] = TaskHealth(provider.name)
        task = asyncio.create_task(
            supervise(health, lambda: self.delivery.attend(provider, provider.run(self.handle)),
                      max_restarts=None if restart else 0),
            name=f"provider:{provider.name}")
        self._tasks[provider.name] = task
        return task

    async def stop(self) -> None:
        """Graceful: stop receiving, let runs finish (or cancel them after the grace period),
        close the providers, then storage."""
        if self._stopping:
            return
        self._stopping = True
        await self.watcher.stop()
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.lanes.close(self.config.gateway.shutdown_grace_seconds)
        if self.http is not None:
            await self.http.stop()
        for provider in self.providers.values():
            try:
                await provider.close()
            except Exception:
                log.exception("closing %s failed", provider.name)
        await self.store.close()

    @property
    def ready(self) -> bool:
        return self.store.is_open and not self._stopping and all(
            h.state in ("running", "done") for h in self.health.values())

    # the pipeline -------------------------------------------------------------------------

    async def handle(self, msg: IncomingMessage) -> None:
        """Where every message enters: route, answer commands, queue the rest per session."""
        provider = self.providers.get(msg.provider)
        self.metrics.message_in(msg.provider)
        if provider is None:
            log.error("message from unknown provider %r dropped", msg.provider)
            return
        if not await self.dedupe.first_time(msg):
            return  # a redelivery of a message already handled
        route = await self.access.admit(msg, self.routes)  # rules, mention, pairing, limits
        if route is None:
            return
        reply = await self.commands.handle(msg, route)
        if reply is not None:
            self.metrics.message_out(provider.name, "command")
            await self.delivery.reply(provider, msg, reply,
                                      kind="error" if isinstance(reply, Failed) else "reply")
            return
        if not self.lanes.submit(route.session_key, Job(msg, route, provider, time.time())):
            await self.delivery.reply(provider, msg, BUSY, kind="notice")

    async def _notice(self, msg: IncomingMessage, text: str) -> None:
        """The gateway's own one-line notice (refusal, pairing code, rate limit)."""
        provider = self.providers.get(msg.provider)
        if provider is not None:
            await _quietly(self.delivery.reply(provider, msg, text, kind="notice"))

    async def _process(self, job: Job) -> None:
        msg, route, provider = job.msg, job.route, job.provider
        try:
            agent = self.registry.get(route.agent)
        except (ConfigError, UnknownAgent) as e:
            log.error("agent %s unavailable: %s", route.agent, e)
            await self.delivery.reply(
                provider, msg, f"The agent '{route.agent}' is not available right now.",
                kind="error")
            return
        session = await self.store.session(route.session_key, agent.name)
        text = await self.data.take_uploads(msg, route, session.id, lambda text, kind: (
            self.delivery.reply(provider, msg, text, kind=kind)))  # files sent become datasets
        if text is None:
            return  # only files were sent, or one could not be read: the user was told
        req = RunRequest(uuid.uuid4().hex, session, agent, text, route.tools)
        for listener in self.run_listeners:
            await _quietly(listener(msg, req.run_id))
        try:
            await self.delivery.run(provider, msg, self._published(
                req.run_id, provider.name, self.runner.run(req)))
        except ProviderError:
            self.metrics.error("delivery")  # already logged by delivery; the run is recorded
        except Exception:
            self.metrics.error("delivery")
            log.exception("delivering run %s failed", req.run_id)
            await _quietly(provider.send(reply_to(msg, INTERNAL_ERROR, kind="error")))


    async def _published(self, run_id: str, provider: str,
                         events: AsyncIterator[RunEvent]) -> AsyncIterator[RunEvent]:
        """Pass a run's events on, and to live watchers (SSE, web) and metrics on the way."""
        seen, last = 0, None
        try:
            async with aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    seen, last = seen + 1, event
                    self._announce(event, provider)
                    yield event
        finally:
            if not isinstance(last, RunEnd):
                await self._announce_unseen(run_id, provider, seen)

    async def _announce_unseen(self, run_id: str, provider: str, seen: int) -> None:
        """A stopped run records its end without yielding it: announce what was not seen."""
        last: RunEvent | None = None
        try:
            for _, event in await self.store.events(run_id, after=seen):
                last = event
                self._announce(event, provider)
        except Exception as e:
            log.debug("run %s: trailing events not announced: %s", run_id, e)
        if not isinstance(last, RunEnd):  # it failed before recording an end: end it for
            self._announce(RunEnd(run_id=run_id, outcome="error"), provider)  # watchers

    def _announce(self, event: RunEvent, provider: str) -> None:
        self.hub.publish(event)
        self.metrics.observe(event, provider)


async def _quietly(coro: object) -> None:
    try:
        await coro  # type: ignore[misc]
    except Exception as e:
        log.debug("ignored: %s", e)
