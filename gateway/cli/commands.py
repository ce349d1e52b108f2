"""What each ``pluto`` command does (imported only once a command runs)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from pluto.errors import ConfigError, PlutoError, StorageUnavailable
from pluto import __version__
from pluto.gateway import fdpolicy, gcpolicy
from pluto.gateway.app import Gateway
from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from pluto.gateway.cli.placeholders import refuse_off_loopback
from pluto.settings import PlutoConfig, data_dir_for, load_pluto_config
from pluto.types import IncomingMessage
from pluto.gateway.logs import setup_logging
from pluto.gateway.secrecy import protect as protect_secrets
from pluto.redaction import redact_urls
from pluto.gateway.ports import Provider, ProviderContext
from pluto.gateway.provider_registry import provider_class
from pluto.settings import ProviderConfig

log = logging.getLogger("pluto")
START_PATIENCE = 30.0  # seconds a start that storage refused is tried again (as its open)


def dispatch(args: argparse.Namespace) -> int:
    try:
        config = load_pluto_config(args.config)
    except ConfigError as e:
        return _config_failed(e)
    data_dir = data_dir_for(config, args.data_dir)  # absolute, decided once
    quiet = args.command in ("chat", "run", "agents", "routes", "pairing", "admin", "data",
                             "doctor",
                             "status", "logs", "usage", "memory", "schedule")
    setup_logging("DEBUG" if args.verbose else config.log_level,
                  secret_env_names=config.secret_names(),
                  log_file=None if args.command in ("status", "logs") else data_dir / "pluto.log",
                  stderr_level=None if args.verbose or not quiet else "CRITICAL",
                  fmt=config.log_format)
    match args.command:
        case "agents":
            return _agents(args, config, data_dir)
        case "chat":
            protect_secrets(config.secret_names())  # (docs/security.md)
            return _guarded(_chat(args, config, data_dir))
        case "run":
            return _guarded(_run(args, config, data_dir))
        case "serve":
            protect_secrets(config.secret_names())
            return _guarded(_serve(args, config, data_dir))
        case "routes":
            from pluto.gateway.cli.routes import routes_command
            return routes_command(args, config, data_dir)
        case "pairing":
            from pluto.gateway.cli.pairing import pairing_command
            return _guarded(pairing_command(args, config, data_dir))
        case "admin":
            from pluto.gateway.cli.admin import admin_command
            return _guarded(admin_command(args, config, data_dir))
        case "data":
            from pluto.gateway.cli.data import data_command
            return data_command(args, config, args.config, data_dir)
        case "doctor":
            from pluto.gateway.cli.doctor import doctor_command
            return doctor_command(args, config, data_dir)
        case "status":
            from pluto.gateway.cli.status import status_command
            return status_command(args, config, data_dir)
        case "logs":
            from pluto.gateway.cli.status import logs_command
            return logs_command(args, data_dir)
        case "usage":
            from pluto.gateway.cli.usage import usage_command
            return _guarded(usage_command(args, config, data_dir))
        case "memory":
            from pluto.gateway.cli.memory import memory_command
            return _guarded(memory_command(args, config, data_dir))
        case "schedule":
            from pluto.gateway.cli.schedule import schedule_command
            return _guarded(schedule_command(args, config, data_dir))
    return EXIT_CONFIG


def _guarded(coro: object) -> int:
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except ConfigError as e:
        return _config_failed(e)
    except PlutoError as e:  # could not start: one sentence, and nothing was left open
        print(f"pluto: {redact_urls(str(e))}", file=sys.stderr)
        return EXIT_FAILED


def _config_failed(e: ConfigError) -> int:
    print("pluto: the configuration has errors:", file=sys.stderr)
    for line in redact_urls(str(e)).splitlines():
        print(f"  {line}", file=sys.stderr)
    return EXIT_CONFIG


def _gateway(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> Gateway:
    gw = Gateway(args.config, data_dir=data_dir, config=config)
    agent = getattr(args, "agent", None)
    if agent:
        if agent not in gw.registry:
            known = ", ".join(gw.registry.names()) or "none"
            raise ConfigError([(str(args.config / "agents"), None, "--agent",
                                f"unknown agent '{agent}' (known: {known})")])
        gw.registry.get(agent)  # a broken agent file: its ConfigError names file, line, field
        gw.routes = gw.routes.pinned("cli", agent)
    return gw


def _terminal(gw: Gateway, **options: str) -> Provider:
    """The terminal provider, found like any other (by its declared name)."""
    ctx = ProviderContext(name="cli", config=ProviderConfig(enabled=True, **options),
                          data_dir=gw.data_dir, feed=gw.feed)
    return provider_class("cli").from_context(ctx)


async def _chat(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    gw = _gateway(args, config, data_dir)
    async with gw:
        provider = _terminal(gw)
        route = gw.routes.route(IncomingMessage(provider="cli", chat_id="terminal",
                                                user_id="", text=""))
        agent = route.agent if route else "nobody (no route for the terminal)"
        print(f"Pluto {__version__} · agent: {agent} · /help for commands · "
              "Ctrl+C stops a reply · Ctrl+D quits", file=sys.stderr)
        task = gw.add_provider(provider, restart=False)
        _on_signals(lambda: task.cancel(), signal.SIGTERM)
        try:
            await task
        except asyncio.CancelledError:
            pass
    return EXIT_OK


async def _run(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    text = sys.stdin.read() if args.message == "-" else args.message
    if not text.strip():
        print("pluto run: the message is empty", file=sys.stderr)
        return EXIT_CONFIG
    gw = _gateway(args, config, data_dir)
    gw.scheduler.fires = False  # one turn: its output is that answer (schedules fire elsewhere)
    async with gw:
        chat = f"run:{args.session}" if args.session else f"run:{uuid.uuid4().hex[:12]}"
        provider = _terminal(gw, chat_id=chat, message=text.strip())
        task = gw.add_provider(provider, restart=False)
        _on_signals(lambda: task.cancel(), signal.SIGTERM, signal.SIGINT)
        try:
            await task
        except asyncio.CancelledError:
            return 130
    if getattr(provider, "interrupted", False):
        return 130
    return EXIT_FAILED if getattr(provider, "errors", 0) else EXIT_OK


async def _serve(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    bind = (args.host or config.http.host, config.http.port if args.port is None else args.port)
    refuse_off_loopback(config, bind[0])  # an example secret, reachable from elsewhere
    fdpolicy.prepare()  # thousands of sockets: the limit raised, the table grown while quiet
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            print("pluto: second signal, exiting now", file=sys.stderr)
            os._exit(EXIT_FAILED)
        log.info("stopping (send the signal again to force)")
        stop.set()

    _on_signals(on_signal, signal.SIGINT, signal.SIGTERM)
    async with started_gateway(lambda: Gateway(args.config, data_dir=data_dir, config=config,
                                               serve=True, http_bind=bind), stop) as gw:
        assert gw.http is not None
        pacer = gcpolicy.settle()  # what exists now lives as long as the process
        log.info("pluto %s serving on %s (config: %s, data: %s)", __version__, gw.http.url,
                 args.config.resolve(), data_dir)
        try:
            await stop.wait()
        finally:
            if pacer is not None:
                pacer.stop()
    # What settle() froze is never collected, so at exit native extensions would find their
    # objects alive and complain (DuckDB's nanobind: ~43 lines of "leaked" on every stop).
    gc.unfreeze()
    log.info("stopped")
    return EXIT_OK


@contextlib.asynccontextmanager
async def started_gateway(make: Callable[[], Gateway], stop: asyncio.Event, *,
                          patience: float = START_PATIENCE) -> AsyncIterator[Gateway]:
    """``make()`` started, and stopped at the end. A start that storage refused — a change
    that could not be saved: a database connection cut as the gateway joined the others, the
    disk full — closed what it had opened; a new gateway is made and started again, with
    backoff, for ``patience`` seconds (a supervisor would restart the process; none needs
    to). Past that, or once ``stop`` is set, the refusal is raised."""
    loop = asyncio.get_running_loop()
    until, delay = loop.time() + patience, 0.5
    while True:
        gw = make()
        try:
            await gw.start()
            break
        except StorageUnavailable as e:
            if stop.is_set() or loop.time() + delay > until:
                raise
            reason = e.reason
            log.warning("the gateway could not start (%s); starting again in %.1f s",
                        reason, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():  # (a signal meanwhile: it does not start)
            raise StorageUnavailable(reason)
        delay = min(5.0, delay * 2)
    try:
        yield gw
    finally:
        await gw.stop()


def _agents(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    from pluto.agents.registry import AgentRegistry
    from pluto.runtime.catalog import standard_tools

    registry = AgentRegistry(args.config / "agents", data_dir / "agents",
                             key_envs=config.agents.api_key_envs,
                             known_tools=standard_tools().keys())
    failed = False
    for name in registry.names():
        try:
            spec = registry.get(name)
        except ConfigError as e:
            failed = True
            print(f"{name}\tERROR\t{str(e).splitlines()[0]}")
            continue
        model = config.models[spec.model].model if spec.model in config.models else spec.model
        print(f"{name}\t{model}\t{spec.description}")
    if not registry.names():
        print("no agents found in", args.config / "agents", file=sys.stderr)
    return EXIT_CONFIG if failed else EXIT_OK


def _on_signals(handler: object, *signals: signal.Signals) -> None:
    loop = asyncio.get_running_loop()
    for sig in signals:
        try:
            loop.add_signal_handler(sig, handler)  # type: ignore[arg-type]
        except (NotImplementedError, RuntimeError):
            pass
