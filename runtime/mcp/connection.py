"""One MCP server, connected: started when first needed, its tool list kept (and refreshed when
the server says it changed), calls bounded by the server's timeouts, and a server that crashes,
hangs or will not start reported as unavailable and tried again later, with backoff.

This module imports the ``mcp`` SDK (a second or more): :mod:`pluto.runtime.mcp.hub` imports it
in a worker thread, never on the event loop.

A :class:`McpConnection` runs the SDK's ``Client`` in one task of its own (its ``owner``), which
enters and leaves the client's context; calls from runs go through the connected client. The
session's failures never reach a run as exceptions other than :class:`McpUnavailable` (the
server cannot be used now) and :class:`McpCallFailed` (this call failed): both are
:class:`~pluto.runtime.tools.ToolError`, so the model reads one sentence and no one sees a
traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError

import pluto
from pluto.agents.toolspec import McpServerSpec
from pluto.runtime.mcp import sandbox
from pluto.runtime.tools import Progress, ToolError

log = logging.getLogger(__name__)

State = Literal["idle", "starting", "ready", "down", "stopped"]

MAX_PAGES = 50  # tools/list pages read at most (a paginator that never ends cannot hang us)
MAX_TOOLS = 1000
MAX_BACKOFF = 60.0
STOP_SECONDS = 8.0  # the SDK closes stdin, waits, terminates, kills: each step bounded


class McpUnavailable(ToolError):
    """The server cannot be used now (not started, stopped, crashed, or too many running)."""


class McpCallFailed(ToolError):
    """This call failed (timed out, or the server refused it); the server itself may be fine."""


class McpConnection:
    def __init__(self, spec: McpServerSpec, *, environ: Mapping[str, str] | None = None,
                 log_dir: Path | None = None):
        self.spec = spec
        self.key = spec.connection_key()
        self.environ = os.environ if environ is None else environ
        self.log_dir = log_dir
        self.state: State = "idle"
        self.error: str | None = None  # the last failure, in plain words (never a secret)
        self.tools: list[types.Tool] = []  # the last known list, also while the server is down
        self.clashes: dict[str, str] = {}  # its tools not loaded: named like a built-in (why)
        self.version = 0  # incremented whenever the tool list changes
        self.failures = 0
        self.retry_at = 0.0
        self.in_flight = 0
        self.last_used = time.monotonic()
        self._client: Client | None = None
        self._owner: tuple[asyncio.Task[None], asyncio.Event] | None = None  # task, its stop
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # checks and reaping in the background

    @property
    def name(self) -> str:
        return self.spec.name

    # lifecycle ----------------------------------------------------------------------------

    async def ensure(self) -> bool:
        """Connected and ready, starting the server now if it is not running and a retry is
        due; False when it cannot be used now (``error`` says why)."""
        if self.state == "ready":
            return True
        async with self._lock:
            if self._ready():  # (started by another caller meanwhile)
                return True
            if self.state == "stopped" or time.monotonic() < self.retry_at:
                return False
            await self._start()
            return self._ready()

    def _ready(self) -> bool:
        """The state now (it changes while a caller waits: read, not narrowed)."""
        return self.state == "ready"

    async def _start(self) -> None:
        # what is left of an earlier connection goes away in the background
        self._keep(asyncio.create_task(self._reap(self._detach(), connected=True)))
        self.state = "starting"
        stop = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner = (asyncio.create_task(self._own(ready, stop), name=f"mcp:{self.name}"),
                       stop)
        timeout = self.spec.settings.connect_timeout
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(ready)
        except asyncio.CancelledError:  # the run that needed it was stopped: start afresh later
            ready.cancel()
            self.state = "idle"
            self._keep(asyncio.create_task(self._reap(self._detach(), connected=False)))
            raise
        except TimeoutError:
            ready.cancel()  # the owner sees it and leaves
            self._failed(f"it did not start within {timeout:g} s")
        except McpUnavailable as e:
            self._failed(str(e))
        except Exception as e:
            self._failed(_describe(e))
        if not self._ready():  # what is left of it goes away in the background
            self._keep(asyncio.create_task(self._reap(self._detach(), connected=False)))
        else:
            log.info("mcp %s: started, %d tools", self.name, len(self.tools))

    async def stop(self) -> None:
        """Stop the server (idle, or the gateway stops); a later :meth:`ensure` starts it again."""
        async with self._lock:
            await self._reap(self._detach(), connected=self.state == "ready")
            if self.state != "stopped":
                self.state = "idle"

    async def close(self) -> None:
        """Stop for good."""
        await self.stop()
        self.state = "stopped"
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _detach(self) -> tuple[asyncio.Task[None], asyncio.Event] | None:
        """Forget the current owner (at once, so no later start can be mixed up with it)."""
        owned, self._owner = self._owner, None
        if self._refresh is not None:
            self._refresh.cancel()
        self._client = None
        return owned

    async def _reap(self, owned: tuple[asyncio.Task[None], asyncio.Event] | None, *,
                    connected: bool) -> None:
        """Let a detached owner leave the client's context, which ends the server's process
        or session (bounded); one that never connected is cancelled at once."""
        if owned is None or owned[0].done():
            return
        owner, stop = owned
        stop.set()
        if not connected:
            owner.cancel()  # still connecting: it never looks at its stop event
        try:
            async with asyncio.timeout(STOP_SECONDS):
                await asyncio.shield(owner)
        except TimeoutError:
            owner.cancel()
            log.warning("mcp %s: did not stop in %g s; cancelled", self.name, STOP_SECONDS)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are cancelled, not (only) the owner
        except Exception:
            pass  # its failure is already recorded

    def _failed(self, why: str) -> None:
        self.failures += 1
        delay = 0.0 if self.failures == 1 else min(MAX_BACKOFF, 2.0 ** (self.failures - 2))
        self.retry_at = time.monotonic() + delay
        self.error = why
        self._client = None
        if self.state != "stopped":
            self.state = "down"
        log.warning("mcp %s: unavailable: %s (next try in %g s)", self.name, why, delay)

    async def _own(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        """The task that holds the client's context open until asked to stop."""
        client = None
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(self._new_client(stack))
                tools = await self._list_tools(client)
                if ready.done():  # timed out meanwhile
                    return
                self.tools, self.version = tools, self.version + 1
                self._client, self.state, self.error, self.failures = client, "ready", None, 0
                ready.set_result(None)
                listener = asyncio.create_task(self._listen(client))
                try:
                    await stop.wait()
                finally:
                    listener.cancel()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else McpUnavailable("stopped"))
            elif self._client is client is not None and \
                    not isinstance(e, asyncio.CancelledError):
                self._failed(_describe(e))  # the current connection broke
            if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
        finally:
            if client is not None and self._client is client:
                self._client = None

    def _new_client(self, stack: AsyncExitStack) -> Client:
        s = self.spec.settings
        common: dict[str, Any] = dict(
            read_timeout_seconds=s.connect_timeout, cache=None,
            message_handler=self._on_message,
            client_info=types.Implementation(name="pluto", version=pluto.__version__))
        if s.url is not None:
            headers = {h: self._env(var) for h, var in s.header_vars().items()}
            # the SDK's own client would wait 5 s for a response: ours waits as the server says
            http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(
                s.connect_timeout, read=max(s.call_timeout + 5, 300.0)))
            stack.push_async_callback(http.aclose)
            return Client(streamable_http_client(s.url, http_client=http), **common)
        assert s.command is not None
        env = {name: self._env(var) for name, var in s.env_vars().items()}
        command, args = s.executable() or s.command, list(s.args)  # python: Pluto's own
        if s.sandbox and sandbox.usable():  # out of the gateway's reach
            command, args = sandbox.sandboxed(command, args, self.spec.cwd)
        elif s.sandbox:
            sandbox.warn_unconfined(self.name)
        params = StdioServerParameters(command=command, args=args, env=env or None,
                                       cwd=self.spec.cwd)
        return Client(stdio_client(params, errlog=self._errlog(stack)), **common)

    def _env(self, var: str) -> str:
        value = self.environ.get(var)
        if not value:
            raise McpUnavailable(f"the environment variable {var} is not set")
        return value

    def _errlog(self, stack: AsyncExitStack) -> Any:
        """Where a stdio server's stderr goes: a log file of its own, when there is a log dir."""
        if self.log_dir is None:
            return sys.stderr
        self.log_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.log_dir / f"{self.name}.log", "a", encoding="utf-8")  # noqa: SIM115
        stack.callback(f.close)
        return f

    async def _list_tools(self, client: Client) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None or len(tools) >= MAX_TOOLS:
                break
        if len(tools) > MAX_TOOLS:
            log.warning("mcp %s: lists %d tools; only the first %d are used", self.name,
                        len(tools), MAX_TOOLS)
        return tools[:MAX_TOOLS]

    # tools/list_changed --------------------------------------------------------------------

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._refresh_soon()
        elif isinstance(message, Exception):
            log.debug("mcp %s: %s", self.name, _describe(message))

    async def _listen(self, client: Client) -> None:
        """Servers of the 2026 protocol announce changes on a subscription instead."""
        try:
            async with client.listen(tools_list_changed=True) as sub:
                async for _ in sub:
                    self._refresh_soon()
        except ListenNotSupportedError:
            return  # an older server: its notifications come to _on_message
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.debug("mcp %s: no change subscription: %s", self.name, _describe(e))

    def _refresh_soon(self) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._refresh_tools())

    async def _refresh_tools(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            async with asyncio.timeout(self.spec.settings.connect_timeout):
                tools = await self._list_tools(client)
        except Exception as e:
            log.warning("mcp %s: could not refresh its tools: %s", self.name, _describe(e))
            return
        self.tools, self.version = tools, self.version + 1
        log.info("mcp %s: tool list changed, %d tools", self.name, len(tools))

    # calls -----------------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any],
                   progress: Progress | None = None) -> types.CallToolResult:
        """Call one tool. Raises :class:`McpUnavailable` or :class:`McpCallFailed`."""
        client = self._client
        if client is None or self.state != "ready":
            raise McpUnavailable(self.unavailable_sentence())
        timeout = self.spec.settings.call_timeout
        self.in_flight += 1
        self.last_used = time.monotonic()
        try:
            async with asyncio.timeout(timeout + 5):  # in case the transport itself hangs
                return await client.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                              progress_callback=progress)
        except TimeoutError:
            self._check_alive_soon(client)
            raise McpCallFailed(_timed_out(tool, timeout)) from None
        except MCPError as e:
            if e.code == types.REQUEST_TIMEOUT:
                self._check_alive_soon(client)
                raise McpCallFailed(_timed_out(tool, timeout)) from None
            if e.code == types.CONNECTION_CLOSED:
                await self._lost(client, "it stopped during the call")
                raise McpUnavailable(self.unavailable_sentence()) from None
            raise McpCallFailed(f"The server refused the call: {e.message}") from None
        except (McpUnavailable, McpCallFailed):
            raise
        except Exception as e:  # the transport broke (a pipe, the HTTP connection)
            await self._lost(client, _describe(e))
            raise McpUnavailable(self.unavailable_sentence()) from None
        finally:
            self.in_flight -= 1
            self.last_used = time.monotonic()

    def unavailable_sentence(self, name: str | None = None) -> str:
        """``name``: the server's name in the agent that called (agents may share it)."""
        why = f" ({self.error})" if self.error else ""
        return (f"The tools of the '{name or self.name}' server are unavailable right now{why}. "
                "Answer without them, or say that this part cannot be done now.")

    async def _lost(self, client: Client, why: str) -> None:
        if self._client is client and self.state == "ready":
            self._failed(why)
            if self._owner is not None:
                self._owner[1].set()  # the owner leaves the client's context: the process ends

    def _check_alive_soon(self, client: Client) -> None:
        """After a call timed out: a server that no longer answers at all is restarted."""
        async def check() -> None:
            try:
                async with asyncio.timeout(min(5.0, self.spec.settings.connect_timeout)):
                    await client.list_tools()  # (ping is gone from the 2026 protocol)
            except asyncio.CancelledError:
                raise
            except Exception:
                await self._lost(client, "it stopped answering")

        self._keep(asyncio.create_task(check()))

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "tools": len(self.tools),
                               "calls": self.in_flight}
        if self.error and self.state != "ready":
            out["error"] = self.error
        if self.clashes:
            out["tools_not_loaded"] = sorted(self.clashes.values())
        return out


def _timed_out(tool: str, seconds: float) -> str:
    return (f"The tool {tool} did not answer within {seconds:g} s; it was abandoned. Try "
            "something simpler, or answer without it.")


def _describe(e: BaseException) -> str:
    """One line about a failure, without a traceback (and without the arguments of a call)."""
    if isinstance(e, BaseExceptionGroup):
        return _describe(e.exceptions[0])
    if isinstance(e, MCPError):
        return e.message
    if isinstance(e, FileNotFoundError):
        return f"the command was not found ({e.filename})"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
