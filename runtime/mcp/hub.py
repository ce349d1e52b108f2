"""The MCP servers of all agents, held in one place.

- **Per agent.** An agent's tools come from the servers its ``agent.yaml`` declares, and from
  no other: two agents with different servers never see each other's tools.
- **Started lazily**, when an agent that uses the server first runs; the servers of one agent
  start side by side, each bounded by its ``connect_timeout``.
- **Shared only when identical.** Agents whose server settings are the same (command, args,
  cwd, environment, URL, headers, timeouts) share one process or session; each applies its own
  allowlist and prefix.
- **Stopped when idle** (no call for ``idle_seconds``) and **bounded**: at most
  ``max_servers`` at once; past that the least recently used idle one is stopped, and when all
  are busy the new one is refused (its tools are unavailable, and the run goes on without).
- A server that will not start, crashes or hangs makes only its own tools fail (with a sentence
  the model reads); it is tried again later, with backoff.

The SDK takes a second or more to import: it is imported in a worker thread, the first time an
agent with MCP servers runs (or at :meth:`McpHub.warm`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.agents.spec import AgentSpec
from pluto.agents.toolspec import McpServerSpec
from pluto.runtime.tools import Tool
from pluto.yamldoc import paused_gc

if TYPE_CHECKING:
    from pluto.runtime.mcp.connection import McpConnection

log = logging.getLogger(__name__)


class McpHub:
    def __init__(self, *, max_servers: int = 32, idle_seconds: float = 600.0,
                 log_dir: Path | None = None, environ: dict[str, str] | None = None):
        self.max_servers = max_servers
        self.idle_seconds = idle_seconds
        self.log_dir = log_dir
        self.environ = environ
        self._conns: OrderedDict[str, McpConnection] = OrderedDict()  # least recent first
        self._refused: dict[str, str] = {}  # connection key: why it was refused
        self._reaper: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False
        self._modules: tuple[Any, Any] | None = None

    async def warm(self) -> None:
        """Import the SDK (in a worker thread) before the first agent needs it."""
        if self._modules is None:
            self._modules = await asyncio.to_thread(_import)

    async def tools_for(self, agent: AgentSpec,
                        narrowed: tuple[str, ...] | None = None) -> dict[str, Tool]:
        """The tools of the agent's MCP servers (started now if they are not running), by the
        names the model sees. A server that cannot be used adds the tools it had before, whose
        calls then say it is unavailable; one that never started adds none."""
        servers: tuple[McpServerSpec, ...] = getattr(agent, "mcp", ())
        if not servers or self._closed:
            return {}
        await self.warm()
        assert self._modules is not None
        _, results = self._modules
        self._start_reaper()
        conns = [self._connection(s) for s in servers]
        await asyncio.gather(*(c.ensure() for c in conns if c is not None))
        tools: dict[str, Tool] = {}
        for spec, conn in zip(servers, conns):
            if conn is None:
                continue
            for name, tool in results.tools_of(spec, conn, narrowed).items():
                if name in tools:
                    log.warning("agent %s: two MCP servers offer a tool named %s; the first "
                                "is used (set a prefix)", agent.name, name)
                    continue
                tools[name] = tool
        return tools

    def _connection(self, spec: McpServerSpec) -> McpConnection | None:
        key = spec.connection_key()
        conn = self._conns.get(key)
        if conn is not None:
            self._conns.move_to_end(key)
            conn.last_used = time.monotonic()
            return conn
        if len(self._conns) >= self.max_servers and not self._evict_one():
            if key not in self._refused:
                log.warning("mcp %s: not started: %d MCP servers are running and busy (the "
                            "most allowed)", spec.name, self.max_servers)
            self._refused[key] = f"too many MCP servers are running (at most {self.max_servers})"
            return None
        self._refused.pop(key, None)
        assert self._modules is not None
        connection, _ = self._modules
        conn = connection.McpConnection(spec, environ=self.environ, log_dir=self.log_dir)
        self._conns[key] = conn
        return conn

    def _evict_one(self) -> bool:
        for key, conn in self._conns.items():
            if conn.in_flight == 0 and conn.state != "starting":
                del self._conns[key]
                self._stop_later(conn)
                return True
        return False

    def _stop_later(self, conn: McpConnection) -> None:
        task = asyncio.create_task(conn.close(), name=f"mcp-stop:{conn.name}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    # idle servers ---------------------------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="mcp-idle")

    async def _reap(self) -> None:
        every = max(0.05, min(30.0, self.idle_seconds / 4))
        while True:
            await asyncio.sleep(every)
            self.stop_idle()

    def stop_idle(self, now: float | None = None) -> list[str]:
        """Stop the servers not used for ``idle_seconds``; returns their names."""
        now = time.monotonic() if now is None else now
        idle = [k for k, c in self._conns.items()
                if c.in_flight == 0 and c.state in ("ready", "down", "idle")
                and now - c.last_used >= self.idle_seconds]
        names = []
        for key in idle:
            conn = self._conns.pop(key)
            log.info("mcp %s: idle for %g s, stopped", conn.name, self.idle_seconds)
            self._stop_later(conn)
            names.append(conn.name)
        return names

    # health, shutdown -----------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Each running server's state, for ``/readyz`` (informative: a server that is down
        does not make the gateway unready; its agents answer without its tools)."""
        out: dict[str, Any] = {}
        for key, conn in self._conns.items():
            out[f"{conn.name}@{_short(key)}"] = conn.health()
        for key, why in self._refused.items():
            out[f"refused@{_short(key)}"] = {"state": "refused", "error": why}
        return out

    @property
    def running(self) -> int:
        return sum(1 for c in self._conns.values() if c.state in ("ready", "starting"))

    async def aclose(self) -> None:
        """Stop every server (the gateway stops)."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.close() for c in conns), *self._stopping,
                             return_exceptions=True)

    async def __aenter__(self) -> McpHub:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _short(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def _import() -> tuple[Any, Any]:
    from pluto.runtime.mcp import sandbox
    sandbox.usable()  # (bwrap tried once, here in a worker thread)
    with paused_gc():
        return (importlib.import_module("pluto.runtime.mcp.connection"),
                importlib.import_module("pluto.runtime.mcp.results"))
