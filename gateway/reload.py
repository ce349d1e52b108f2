"""Live reload: the gateway watches its config dir and applies a valid edit within a second.

Every ``gateway.reload_interval_seconds`` (default 0.25 s) it compares the modification stamps
of ``routes.yaml``, ``pluto.yaml`` and the agent directories with what it last read. A change
is read once it has held still for one interval (so a file being written is not read half-way),
validated like at start, and then swapped in at once — a message is routed by the old table or
the new one, never by none. An edit that does not validate (bad YAML, unknown agent, bad regex,
a deleted file) is refused: its problems are logged with file, line and reason, shown by the
admin API (``GET /admin/reload``), and the last good configuration keeps serving. Each file
stands alone: a broken ``pluto.yaml`` does not hold back a good ``routes.yaml``.

Agents reload themselves (see :mod:`agents.registry`); the watcher only re-checks the ones in
memory so that a broken edit is reported at once. In ``pluto.yaml`` the models, gateway limits,
access and admin settings, usage prices and budgets and the log level apply live; ``data_dir``,
``http``, ``providers``, ``tracing`` and ``log_format`` need a restart, which is logged and shown
in the status.

Looking (stat), reading, parsing and validating run in a worker thread; only the swap runs on
the event loop, so a big or slow file never stalls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.agents.registry import AgentRegistry, UnknownAgent
from pluto.errors import ConfigError
from pluto.settings import PlutoConfig, load_pluto_config
from pluto.yamldoc import YamlDoc
from pluto.gateway.logs import RedactSecrets
from pluto.gateway.budgets_file import load_budgets
from pluto.gateway.pipeline.routing import RoutingTable

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

Problem = tuple[str, int | None, str, str]
Stamp = tuple[int, int, int] | None
RESTART_ONLY = ("data_dir", "http", "providers", "tracing", "log_format")


def load_routes(config_dir: Path, registry: AgentRegistry) -> RoutingTable:
    """``routes.yaml`` validated against the agents, with every agent it names loaded."""
    table = RoutingTable.load(config_dir / "routes.yaml", set(registry.names()))
    problems: list[Problem] = []
    specs = {}
    for name in table.agents():
        try:
            specs[name] = registry.get(name)
        except ConfigError as e:
            problems += e.problems
        except UnknownAgent:  # removed between listing and loading
            problems.append((table.source, table.line_of(None), "", f"unknown agent '{name}'"))
    for i, rule in enumerate(table.spec.routes):
        spec = specs.get(rule.agent or "")
        if spec is None or rule.tools is None:
            continue
        extra = [t for t in rule.tools if t not in spec.tools and not any(  # or its MCP tools
            t == s.name or t.startswith(s.prefix) for s in spec.mcp)]
        if extra:
            has = ", ".join(spec.tools) or "none"
            problems.append((table.source, table.line_of(i), f"routes[{i}].tools",
                             f"agent '{spec.name}' has no tool {', '.join(map(repr, extra))} "
                             f"(its tools: {has}); 'tools' can only narrow the agent's list"))
    if problems:
        raise ConfigError(problems)
    return table


def _stat(path: Path) -> Stamp:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@dataclass(slots=True)
class ReloadStatus:
    generation: int = 1  # configurations applied, counting the one the gateway started with
    applied_at: float = field(default_factory=time.time)
    refused: dict[str, list[Problem]] = field(default_factory=dict)  # by file: pluto, routes
    agents: dict[str, list[Problem]] = field(default_factory=dict)  # broken agent edits
    restart_needed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused and not self.agents

    def problems(self) -> list[Problem]:
        out = [p for ps in self.refused.values() for p in ps]
        return out + [p for ps in self.agents.values() for p in ps]

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ok else "refused",
            "generation": self.generation,
            "applied_at": self.applied_at,
            "problems": [{"file": f, "line": ln, "field": fd, "message": m}
                         for f, ln, fd, m in self.problems()],
            "restart_needed": self.restart_needed,
        }


class ConfigWatcher:
    def __init__(self, gateway: Gateway):
        self.gw = gateway
        self.status = ReloadStatus()
        self._files = {"pluto": gateway.config_dir / "pluto.yaml",
                       "routes": gateway.config_dir / "routes.yaml",
                       "budgets": gateway.config_dir / "budgets.yaml"}
        self._seen = self._snapshot()  # what was last read, applied or refused
        self._settling: dict[str, Stamp] | None = None
        self._existed = {k: p.exists() for k, p in self._files.items()}
        self._started_with = self._file_config()  # for what needs a restart to change
        self._task: asyncio.Task[None] | None = None
        self._busy = asyncio.Lock()  # one look or reload at a time

    @property
    def interval(self) -> float:
        return self.gw.config.gateway.reload_interval_seconds

    def start(self) -> None:
        if self._task is None and self.interval > 0:
            self._task = asyncio.create_task(self._run(), name="config-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval or 1.0)
            try:
                await self.tick()
            except Exception:  # the watcher must outlive any surprise; the old config serves
                log.exception("config reload failed unexpectedly; keeping the configuration")

    def _snapshot(self) -> dict[str, Stamp]:
        snap = {key: _stat(path) for key, path in self._files.items()}
        for i, d in enumerate(self.gw.registry.dirs):
            snap[f"agents{i}"] = _stat(d)
        return snap

    def _look(self) -> tuple[dict[str, ConfigError], dict[str, Stamp]]:
        """(In a worker thread.) The agents in memory re-checked, and the files' stamps."""
        return self.gw.registry.refresh(), self._snapshot()

    async def tick(self) -> None:
        """One look at the config dir: apply what changed and has held still since the last."""
        async with self._busy:
            agents, snap = await asyncio.to_thread(self._look)
            self._note_agents(agents)
            if snap != self._seen:
                if snap != self._settling:
                    self._settling = snap  # changing now: read it once it holds still
                    return
                self._settling = None
                await self.reload(snap)
            elif self.status.refused:  # e.g. the agent a refused route names appears later
                await self.reload(snap, quiet=True)

    async def reload_now_async(self) -> ReloadStatus:
        """Read everything again now (``POST /admin/reload``, after an admin API change); the
        files are read in a worker thread."""
        async with self._busy:
            agents, snap = await asyncio.to_thread(self._look)
            self._note_agents(agents)
            await self.reload(snap, force=True)
        return self.status

    def reload_now(self) -> ReloadStatus:
        """:meth:`reload_now_async`, blocking: the files are read on the calling thread. For
        callers that are not async yet; from the event loop, await the async one."""
        agents, snap = self._look()
        self._note_agents(agents)
        pluto = self._pluto_due(snap, force=True)
        self._seen = snap
        self._apply(self._read(pluto), quiet=False)
        return self.status

    async def reload(self, snap: dict[str, Stamp], *, force: bool = False,
                     quiet: bool = False) -> None:
        pluto = self._pluto_due(snap, force)
        self._seen = snap
        self._apply(await asyncio.to_thread(self._read, pluto), quiet)

    def _pluto_due(self, snap: dict[str, Stamp], force: bool) -> bool:
        return force or snap["pluto"] != self._seen["pluto"] or "pluto" in self.status.refused

    def _read(self, pluto: bool) -> dict[str, Any]:
        """(In a worker thread.) Each file read, parsed and validated: its new value, or the
        ConfigError that refuses it. Nothing is applied here."""
        found: dict[str, Any] = {}
        if pluto:
            found["pluto"] = self._load("pluto", self._pluto_config)
        found["routes"] = self._load("routes",
                                     lambda: load_routes(self.gw.config_dir, self.gw.registry))
        found["budgets"] = self._load("budgets", lambda: load_budgets(self.gw.config_dir))
        return found

    def _pluto_config(self) -> PlutoConfig:
        """pluto.yaml as edited. A file that says nothing (empty, comments only: most likely
        being written) is refused rather than applied as "all defaults"."""
        path = self._files["pluto"]
        if self._existed["pluto"] and path.exists() and YamlDoc(path).data is None:
            raise ConfigError([(str(path), None, "", "the file is empty (or still being "
                                "written); keeping the last good version")])
        return load_pluto_config(self.gw.config_dir)

    def _load(self, key: str, load: Any) -> Any:
        path = self._files[key]
        try:
            if self._existed[key] and not path.exists():
                raise ConfigError([(str(path), None, "", "the file is gone (deleted, or being "
                                    "replaced); keeping the last good version")])
            return load()
        except ConfigError as e:
            return e

    def _apply(self, found: dict[str, Any], quiet: bool) -> None:
        """(On the loop.) Swap in what validated, record what was refused."""
        applied = False
        if "pluto" in found:
            applied |= self._try("pluto", found["pluto"], self._apply_pluto, quiet)
        applied |= self._try("routes", found["routes"], self._apply_routes, quiet)
        if "budgets" in found:
            applied |= self._try("budgets", found["budgets"], self._apply_budgets, quiet)
        if applied:
            self.status.generation += 1
            self.status.applied_at = time.time()

    def _try(self, key: str, found: Any, apply: Any, quiet: bool) -> bool:
        path = self._files[key]
        if isinstance(found, ConfigError):
            before = self.status.refused.get(key)
            self.status.refused[key] = found.problems
            if not quiet or before != found.problems:
                log.error("config: refused the edit of %s; the last good version keeps "
                          "serving:\n%s", path, found)
            return False
        changed = apply(found)
        if self.status.refused.pop(key, None) is not None:
            log.info("config: %s is valid again", path)
        return changed

    def _file_config(self) -> PlutoConfig | None:
        try:
            return load_pluto_config(self.gw.config_dir)
        except ConfigError:
            return None

    def _apply_pluto(self, new: PlutoConfig) -> bool:
        old, began = self.gw.config, self._started_with
        restart = [k for k in RESTART_ONLY if began and getattr(new, k) != getattr(began, k)]
        # what needs a restart stays as the process has it (command-line options included)
        live = new.model_copy(update={k: getattr(old, k) for k in RESTART_ONLY})
        if restart != self.status.restart_needed and restart:
            log.warning("config: %s changed in pluto.yaml; restart the gateway to apply",
                        ", ".join(restart))
        self.status.restart_needed = restart
        if live == old:
            return False
        self._apply_config(old, live)
        log.info("config: applied %s", self._files["pluto"])
        return True

    def _apply_config(self, old: PlutoConfig, new: PlutoConfig) -> None:
        gw = self.gw
        gw.config = new
        gw.runner.models = gw._model_settings()
        gw.pipeline.lanes.max_queued = new.gateway.max_queued_per_session
        gw.registry.allow_key_envs(new.agents.api_key_envs)
        root = logging.getLogger()
        if new.log_level != old.log_level:
            for h in root.handlers:
                if h.level == logging.getLevelName(old.log_level):
                    h.setLevel(new.log_level)
            root.setLevel(new.log_level)
        secrets = RedactSecrets(new.secret_names()).secrets
        for h in root.handlers:
            for f in h.filters:
                if isinstance(f, RedactSecrets):  # (its set of values: masked longest first)
                    f.add(*secrets)

    def _apply_routes(self, table: RoutingTable) -> bool:
        same = self.gw.routes.spec == table.spec
        self.gw.routes = table  # even when the same rules: their line numbers may have moved
        if same:
            return False
        log.info("config: applied %s (%d rules)", table.source, len(table.spec.routes))
        return True

    def _apply_budgets(self, budgets: list[Any]) -> bool:
        if budgets == self.gw.console_budgets:
            return False
        self.gw.console_budgets = budgets
        log.info("config: applied %s (%d budgets)", self._files["budgets"], len(budgets))
        return True

    def _note_agents(self, errors: dict[str, ConfigError]) -> None:
        self.status.agents = {name: e.problems for name, e in errors.items()}
