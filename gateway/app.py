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
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError, StartupError
from pluto.gateway.delivery.delivery import Delivery
from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.delivery.outbox import Outbox
from pluto.gateway.delivery.streaming import EditThrottle
from pluto.gateway.directory import Directory
from pluto.gateway.feed import LocalRunFeed
from pluto.gateway.http.admin import mount_admin
from pluto.gateway.http.server import HttpServer
from pluto.gateway.metrics import Metrics
from pluto.gateway.pipeline.access import Access
from pluto.gateway.pipeline.data_commands import DataCommands, data_service
from pluto.gateway.pipeline.intake import IntakeQueue
from pluto.gateway.pipeline.pipeline import Pipeline
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.gateway.ports import HttpMount, Provider, ProviderContext
from pluto.gateway.provider_registry import build_provider, enabled
from pluto.gateway.reload import ConfigWatcher, load_routes
from pluto.gateway.supervisor import TaskHealth, supervise
from pluto.runtime.data_tools import DATA_TOOLS
from pluto.runtime.model import Model, ModelSettings, warm_litellm
from pluto.runtime.openai_compat import close_sessions, model_for, uses_litellm
from pluto.runtime.runner import Runner
from pluto.runtime.tools import BUILTIN_TOOLS
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
                 http_bind: tuple[str, int] | None = None, store: Store | None = None):
        self.config_dir = config_dir
        self.config = config or load_pluto_config(config_dir)
        self.data_dir = (data_dir or self.config.data_dir).resolve()  # one absolute path
        self.instance = uuid.uuid4().hex[:12]
        self.store: Store = store or store_for(self.data_dir)
        self.registry = AgentRegistry(config_dir / "agents", self.data_dir / "agents",
                                      key_envs=self.config.agents.api_key_envs)
        self.routes: RoutingTable = load_routes(config_dir, self.registry)
        self.metrics = Metrics()
        self.feed = LocalRunFeed(self.store.conversations)
        self.providers: dict[str, Provider] = {}
        self.health: dict[str, TaskHealth] = {}
        self.intakes: dict[str, IntakeQueue] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        throttle = EditThrottle(lambda: self.config.gateway.stream_edit_interval_seconds)
        self.outbox = Outbox(self.store.outbox, self.providers, throttle=throttle,
                             owner=self.instance, flood=FloodControl(self.store.flood))
        self.delivery = Delivery(self.outbox, data_dir=self.data_dir, throttle=throttle)
        self.data = DataCommands(data_service(self.config, config_dir, self.data_dir),
                                 self.registry, self.store.conversations)
        self.runner = Runner(self.store.conversations, models=self._model_settings(),
                             tools={**BUILTIN_TOOLS, **DATA_TOOLS}, data_dir=self.data_dir,
                             services={"data": self.data.service}, model_factory=model_factory)
        self.access = Access(self.store.pairing, lambda: self.config.access)
        self.pipeline = Pipeline(
            conversations=self.store.conversations,
            inbox=self.store.inbound, access=self.access,
            registry=self.registry, routes=lambda: self.routes, data=self.data,
            runner=self.runner, delivery=self.delivery, providers=self.providers,
            metrics=self.metrics, publish=self.feed.publish,
            max_queued=self.config.gateway.max_queued_per_session)
        self.directory = Directory(lambda: self.routes, self.registry, self.store.conversations)
        self.watcher = ConfigWatcher(self)  # live reload of the config dir (serve only)
        self.serve = serve
        bind = http_bind or (self.config.http.host, self.config.http.port)
        self.http = HttpServer(self, *bind) if serve else None
        self.started_at = time.time()
        self._stack: AsyncExitStack | None = None
        self._stopping = False

    def _model_settings(self) -> dict[str, ModelSettings]:
        return {name: ModelSettings(model=m.model, api_base=m.api_base, api_key_env=m.api_key_env,
                                    temperature=m.temperature,
                                    max_output_tokens=m.max_output_tokens, timeout=m.timeout,
                                    retries=m.retries)
                for name, m in self.config.models.items()}

    # lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open everything, in order, each with its teardown; on failure close what was opened
        and raise (a :class:`ConfigError` or :class:`StartupError` that says what and why)."""
        stack = AsyncExitStack()
        try:
            configured = self._configured_providers()  # validated before anything is opened
            await self._open_storage(stack)
            stack.push_async_callback(close_sessions)  # the model connections, last
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
            stack.push_async_callback(self._drain)
            for provider in configured:
                self.add_provider(provider)
            if self.serve:
                self.watcher.start()
                stack.push_async_callback(self.watcher.stop)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

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
                                  tasks=self.store.tasks)
            built.append(build_provider(name, ctx))
        return built

    async def _open_storage(self, stack: AsyncExitStack) -> None:
        await self.store.open()
        stack.push_async_callback(self.store.close)
        interrupted = await self.store.conversations.recover_interrupted()
        if interrupted:
            log.warning("%d run(s) were interrupted by the last shutdown; marked as such",
                        len(interrupted))
        await self.outbox.open()

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
            queue = self.intakes[provider.name] = IntakeQueue(
                provider.name, self.pipeline.handle, self.store.inbound,
                capacity=INTAKE_CAPACITY)
        return queue

    def add_provider(self, provider: Provider, *, restart: bool = True) -> asyncio.Task[None]:
        """Start a provider as a supervised task (restarted with backoff when it crashes); the
        outbox first sends what it holds for it from before."""
        self.providers[provider.name] = provider
        health = self.health[provider.name] = TaskHealth(provider.name)
        intake = self.intake(provider)

        async def run() -> None:
            await intake.replay()  # what a dead process had received and not handled
            await self.outbox.flush(provider)  # and what it had not sent
            await provider.run(intake)

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
            h.state in ("running", "done") for h in self.health.values())

    # for the HTTP server and the admin API --------------------------------------------------
