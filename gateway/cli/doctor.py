"""``pluto doctor``: is this installation healthy (``pluto status`` and ``pluto logs``, in
``status.py``, tell what the gateway here is doing and what it said).

``doctor`` checks, in order, the configuration, the data dir, the storage, each enabled
provider (its settings and secrets; a harmless call when the provider offers ``probe()``) and
each model (one tiny call). Each failure is one sentence with the fix; the exit code is 0 when
all is well, 1 otherwise (2 when the configuration itself is broken).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.errors import ConfigError, PlutoError
from pluto.gateway import fdpolicy
from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:  # `pluto --help` builds the parser from here: nothing heavy up front
    from pluto.settings import PlutoConfig

PROBE_TIMEOUT = 20.0  # seconds, per provider or model


def add_parsers(subs: Any) -> list[argparse.ArgumentParser]:
    doctor = subs.add_parser("doctor", help="check the configuration, data dir, storage, "
                             "providers and models (exit 1 when something is wrong)")
    doctor.add_argument("--offline", action="store_true",
                        help="skip the calls to providers and models")
    status = subs.add_parser("status", help="is a gateway running here: its providers, "
                             "sessions, runs in progress, last errors")
    status.add_argument("--json", action="store_true", help="print it as JSON")
    status.add_argument("--host", help="where the gateway listens (default: http.host in "
                        "pluto.yaml; 0.0.0.0 is asked at 127.0.0.1)")
    status.add_argument("--port", type=int, help="its HTTP port, as given to pluto serve "
                        "--port (default: http.port in pluto.yaml)")
    logs = subs.add_parser("logs", help="show pluto.log (in the data dir)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("-n", "--lines", type=int, default=50, metavar="N",
                      help="how many of the last lines (default: 50)")
    return [doctor, status, logs]


# ---- doctor ------------------------------------------------------------------------------


@dataclass(slots=True)
class Check:
    what: str
    ok: bool
    say: str  # what was found, or (failed) what is wrong and how to fix it

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.what}: {self.say}"


def doctor_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    checks = [_config(args.config, config)]
    if checks[0].ok:
        checks.append(_data_dir(data_dir))
        if (files := fdpolicy.describe()) is not None:
            checks.append(Check("open files", True, files))
        checks.append(asyncio.run(_storage(config, data_dir)))
        checks += _example_secrets(config)
        checks.append(_mcp_sandbox())
        checks.append(_python_sandbox(args, config))
        checks += asyncio.run(_mcp_servers(args, config))
        checks += asyncio.run(_providers(args, config, data_dir))
        checks += asyncio.run(_models(args, config))
    for check in checks:
        print(check.line())
    failed = [c for c in checks if not c.ok]
    if not failed:
        print("All good. Start with: pluto chat (or pluto serve).")
        return EXIT_OK
    print(f"{len(failed)} problem(s) found.", file=sys.stderr)
    return EXIT_CONFIG if not checks[0].ok else EXIT_FAILED


def _config(config_dir: Path, config: PlutoConfig) -> Check:
    from pluto.agents.registry import AgentRegistry
    from pluto.gateway.reload import load_routes
    from pluto.gateway.schedules.config import load_schedules
    from pluto.runtime.catalog import standard_tools

    try:
        registry = AgentRegistry(config_dir / "agents", config.data_dir / "agents",
                                 key_envs=config.agents.api_key_envs,
                                 known_tools=standard_tools().keys())
        table = load_routes(config_dir, registry)
        problems = [p for e in registry.check_all() for p in e.problems]
        try:  # schedules.yaml (schedules and their limits; docs/schedules.md)
            load_schedules(config_dir, set(registry.names()))
        except ConfigError as e:
            problems += e.problems
        if problems:
            raise ConfigError(problems)
    except ConfigError as e:
        first = str(e).splitlines()[0]
        return Check("config", False, f"{first} — fix it (pluto routes check shows every "
                     "problem).")
    return Check("config", True, f"{config_dir.resolve()}: {len(table.spec.routes)} route(s), "
                 f"{len(registry.names())} agent(s)")


def _data_dir(data_dir: Path) -> Check:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        probe = data_dir / f".doctor-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        return Check("data dir", False, f"{data_dir} cannot be written ({e.strerror or e}); "
                     "give this user write access or set data_dir in pluto.yaml "
                     "(or --data-dir).")
    free = _free_mb(data_dir)
    if free is not None and free < 200:
        return Check("data dir", False, f"{data_dir} has only {free:,} MB free; free some "
                     "space or move data_dir.")
    return Check("data dir", True, f"{data_dir} (writable{f', {free:,} MB free' if free else ''})")


def _example_secrets(config: PlutoConfig) -> list[Check]:
    """A secret still holding an example value: what ``pluto serve`` refuses off loopback."""
    from pluto.gateway.cli.placeholders import placeholder_secrets, refusal

    found = placeholder_secrets(config)
    if not found:
        return []
    why = refusal(config, config.http.host)
    if why is not None:
        return [Check("secrets", False, why + ".")]
    return [Check("secrets", True, f"{', '.join('$' + n for n in found)} holds an example value: "
                  "fine on 127.0.0.1, refused by pluto serve on any other address")]


def _mcp_sandbox() -> Check:
    """bubblewrap keeps stdio MCP servers out of the gateway's reach (docs/security.md);
    without it only prctl does, which root's servers ignore: a failure as root."""
    from pluto.runtime.mcp.sandbox import MISSING, UNUSABLE, bwrap_path, usable

    if usable():
        return Check("mcp sandbox", True, f"{bwrap_path()}: stdio MCP servers run in bubblewrap")
    return Check("mcp sandbox", os.geteuid() != 0,
                 (MISSING if bwrap_path() is None else UNUSABLE) + ".")


def _python_sandbox(args: argparse.Namespace, config: PlutoConfig) -> Check:
    """run_python needs bubblewrap (docs/python.md): without it the tool is off — a failure
    when an agent lists it, a remark otherwise."""
    from pluto.agents.registry import AgentRegistry
    from pluto.runtime.catalog import standard_tools
    from pluto.runtime.python.sandbox import unavailable

    why = unavailable()
    if why is None:
        return Check("python sandbox", True, "run_python runs code in bubblewrap")
    registry = AgentRegistry(args.config / "agents", config.data_dir / "agents",
                             key_envs=config.agents.api_key_envs,
                             known_tools=standard_tools().keys())
    users = []
    for name in registry.names():
        try:
            if "run_python" in registry.get(name).tools:
                users.append(name)
        except (PlutoError, LookupError):
            continue
    return Check("python sandbox", not users, why[0].upper() + why[1:] + (
        f" (agents with run_python: {', '.join(users)})." if users else "."))


async def _mcp_servers(args: argparse.Namespace, config: PlutoConfig) -> list[Check]:
    """Each MCP server the agents name, started once as a run would start it (and stopped):
    a server that cannot start is a failure here, not "Connection closed" for the model."""
    from pluto.agents.registry import AgentRegistry
    from pluto.runtime.catalog import standard_tools

    registry = AgentRegistry(args.config / "agents", config.data_dir / "agents",
                             key_envs=config.agents.api_key_envs,
                             known_tools=standard_tools().keys())
    checks, seen = [], set()
    for name in registry.names():
        try:
            servers = registry.get(name).mcp
        except (PlutoError, LookupError):
            continue  # the config check says what is wrong with the agent
        for server in servers:
            if server.connection_key() in seen:
                continue  # agents with identical settings share one server
            seen.add(server.connection_key())
            what = f"mcp {name}/{server.name}"
            if server.settings.url is not None and args.offline:
                checks.append(Check(what, True, f"{server.settings.url} (not called: --offline)"))
                continue
            checks.append(await _start_mcp(what, server))
    return checks


async def _start_mcp(what: str, server: Any) -> Check:
    import importlib
    import tempfile

    connection = await asyncio.to_thread(importlib.import_module,
                                         "pluto.runtime.mcp.connection")  # (the SDK: ~1 s)
    s = server.settings
    shown = s.url or " ".join([s.executable() or s.command, *s.args])
    with tempfile.TemporaryDirectory(prefix="pluto-doctor-") as logs:
        conn = connection.McpConnection(server, log_dir=Path(logs))
        try:
            async with asyncio.timeout(s.connect_timeout + PROBE_TIMEOUT):
                started = await conn.ensure()
        except TimeoutError:
            started, conn.error = False, f"it did not start within {s.connect_timeout:g} s"
        finally:
            await conn.close()
        said = _last_line(Path(logs) / f"{server.name}.log")
    if not started:
        why = conn.error or "it did not start"
        if said and said not in why:
            why += f"; it said: {said}"
        where = f" in {server.cwd}" if server.cwd else ""
        fix = ("check the URL and that the server is up" if s.url else
               f"run {shown}{where} yourself to see it fail")
        return Check(what, False, _short(f"{shown} could not be started ({why}); {fix}."))
    names = [t.name for t in conn.tools]
    if missing := [t for t in s.tools or () if t not in names]:
        return Check(what, False, _short(
            f"{shown} offers no tool named {', '.join(missing)} (it offers "
            f"{', '.join(names[:20]) or 'none'}); fix tools: in the agent's agent.yaml."))
    return Check(what, True, _short(f"{shown}: started, {len(names)} tool(s)"))


def _last_line(path: Path) -> str:
    """The last line a server wrote to its stderr (the exception it died of, mostly)."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    return lines[-1][:200] if lines else ""


def _free_mb(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize // 2**20


async def _storage(config: PlutoConfig, data_dir: Path) -> Check:
    from pluto.storage import store_for

    url = config.storage.url()
    where = f"PostgreSQL ({config.storage.url_env})" if url else f"SQLite {data_dir / 'pluto.db'}"
    try:
        store = store_for(data_dir, url)
        async with asyncio.timeout(PROBE_TIMEOUT), store:
            stats = await store.conversations.stats()
    except (PlutoError, OSError, TimeoutError) as e:
        fix = f"check {config.storage.url_env} and that the database is up" if url else \
            "check that the data dir is writable and not on a network share"
        return Check("storage", False, f"{where} could not be opened ({_short(e)}); {fix}.")
    except Exception as e:  # a driver's own error: still one sentence
        return Check("storage", False, f"{where} could not be opened ({_short(e)}).")
    return Check("storage", True, f"{where}: {stats.get('sessions', 0):,} session(s), "
                 f"{stats.get('runs', 0):,} run(s)")


async def _providers(args: argparse.Namespace, config: PlutoConfig,
                     data_dir: Path) -> list[Check]:
    from aiohttp import web

    from pluto.gateway.ports import HttpMount, ProviderContext
    from pluto.gateway.provider_registry import build_provider, enabled

    checks = []
    scratch = web.Application()  # what providers that serve HTTP mount on (never started)
    for name in enabled(config.providers):
        what = f"provider {name}"
        unused: Any = _Unused()  # built to check settings and secrets, never run
        ctx = ProviderContext(name=name, config=config.providers[name], data_dir=data_dir,
                              feed=unused, chats=unused, runs=unused, tasks=unused,
                              http=HttpMount(scratch.router, scratch.on_shutdown))
        try:
            with _warnings() as warned:  # what `pluto serve` would warn about at its start
                provider = build_provider(name, ctx)
        except (PlutoError, ValueError) as e:
            checks.append(Check(what, False, _sentence(e, f"fix providers.{name} in pluto.yaml "
                                                          "or set the variables it names")))
            continue
        try:
            check = await _probe(what, name, provider, args.offline)
            if warned and check.ok:  # the same words serve logs, not "in place"
                check.say = _short("; ".join(_unprefixed(w, name) for w in warned))
            checks.append(check)
        finally:
            try:
                await provider.close()
            except Exception:  # noqa: BLE001 - closing what doctor built, best effort
                pass
    return checks


async def _probe(what: str, name: str, provider: Any, offline: bool) -> Check:
    """The provider's harmless call (``probe()``), when it has one."""
    probe = getattr(provider, "probe", None)
    if probe is None or offline:
        return Check(what, True, "settings and secrets are in place")
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            said = await probe()
    except TimeoutError:
        return Check(what, False, f"no answer in {PROBE_TIMEOUT:g} s; check the network and "
                                  f"the base URL in providers.{name}.")
    except Exception as e:
        return Check(what, False, _sentence(e, f"check the token named in providers.{name}"))
    return Check(what, True, str(said or "the platform answered"))


async def _models(args: argparse.Namespace, config: PlutoConfig) -> list[Check]:
    from pluto.runtime.model import ModelSettings, uses_litellm
    from pluto.runtime.openai_compat import close_sessions, model_for, model_path

    checks = []
    for name, model in config.models.items():
        what = f"model {name}"
        if not uses_litellm(model.model):
            checks.append(Check(what, True, f"{model.model} (built in: nothing to call)"))
            continue
        settings = ModelSettings(model=model.model, api_base=model.api_base,
                                 api_key_env=model.api_key_env, max_output_tokens=5,
                                 timeout=PROBE_TIMEOUT, retries=0, client=model.client)
        path = ("direct OpenAI-compatible path" if model_path(settings) == "openai-compatible"
                else "through litellm")
        if args.offline:
            checks.append(Check(what, True, f"{model.model} ({path}; not called: --offline)"))
            continue
        try:
            async with asyncio.timeout(PROBE_TIMEOUT + 5):
                async for _ in model_for(settings).stream(
                        [{"role": "user", "content": "Reply with OK."}], [], settings):
                    pass
        except TimeoutError:
            checks.append(Check(what, False, f"{model.model} did not answer in "
                                             f"{PROBE_TIMEOUT:g} s; check api_base and the "
                                             "network."))
        except PlutoError as e:
            checks.append(Check(what, False, str(e)))
        else:
            checks.append(Check(what, True, f"{model.model} answered ({path})"))
    await close_sessions()
    return checks


@contextmanager
def _warnings() -> Iterator[list[str]]:
    """The warnings Pluto's loggers give meanwhile (a provider's start-up remarks)."""
    import logging

    warned: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("pluto")
    logger.addHandler(handler)
    try:
        yield warned
    finally:
        logger.removeHandler(handler)


def _unprefixed(text: str, name: str) -> str:
    return text.removeprefix(f"{name}: ")


class _Unused:
    """The gateway's services for a provider that doctor builds but never runs."""

    def __getattr__(self, name: str) -> Any:
        raise PlutoError("pluto doctor does not run providers")


def _sentence(e: BaseException, fix: str) -> str:
    text = _short(e).rstrip(".")
    return f"{text}; {fix}."


def _short(e: BaseException | object) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:299] + "…"
