"""Chat commands that work with any model (and with none): /help, /agents, /new, /stop.

They are answered by the gateway itself, at once, without a run: /stop must work while a
model is streaming, and /help must work before any model is configured.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError
from pluto.storage.ports import ConversationStore
from pluto.types import IncomingMessage, Route

_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]{0,31})(?:@\S+)?(?:\s+(.*))?$", re.S)


class Failed(str):
    """A command's answer that reports a failure (sent as an error: ``pluto run`` exits 1)."""


def parse_command(text: str) -> tuple[str, str] | None:
    """``/name@bot args`` → (name, args), lower-cased name; None when not a command."""
    m = _COMMAND.match(text.strip())
    return (m.group(1).lower(), (m.group(2) or "").strip()) if m else None


@dataclass(frozen=True, slots=True)
class CommandInfo:
    name: str
    summary: str


class Commands:
    """The built-in commands. Extensions register more with :meth:`add`."""

    def __init__(self, registry: AgentRegistry, conversations: ConversationStore,
                 stop: Callable[[str], Awaitable[tuple[bool, int]]],
                 answering: Callable[[Route], Awaitable[str]] | None = None):
        self.registry = registry
        self.conversations = conversations
        self.stop = stop  # stop a session's run and drop its waiting messages
        # the agent answering a route's session (the route's, or the one it was handed to)
        self.answering = answering
        self._handlers: dict[str, tuple[CommandInfo, Callable[..., Awaitable[str]]]] = {}
        self.add("help", "show what I can do", self._help)
        self.add("start", "say hello (same as /help)", self._help, listed=False)
        self.add("agents", "list the agents", self._agents)
        self.add("new", "start a fresh conversation (forget this one)", self._new)
        self.add("stop", "stop the answer in progress", self._stop)

    def add(self, name: str, summary: str,
            handler: Callable[[IncomingMessage, Route, str], Awaitable[str]], *,
            listed: bool = True) -> None:
        self._handlers[name] = (CommandInfo(name if listed else "", summary), handler)

    def is_urgent(self, text: str) -> bool:
        """``/stop`` acts on the answer in progress: it must not wait behind it."""
        parsed = parse_command(text)
        return parsed is not None and parsed[0] == "stop" and "stop" in self._handlers

    def knows(self, text: str) -> bool:
        parsed = parse_command(text)
        return parsed is not None and parsed[0] in self._handlers

    async def handle(self, msg: IncomingMessage, route: Route) -> str | None:
        """The reply to a command, or None when the text is not one of ours."""
        parsed = parse_command(msg.text)
        if parsed is None or parsed[0] not in self._handlers:
            return None
        name, args = parsed
        return await self._handlers[name][1](msg, route, args)

    async def _agent_of(self, route: Route) -> str:
        if self.answering is None:
            return route.agent
        try:
            return await self.answering(route)
        except (PlutoError, LookupError):  # (its files are broken: /help says so)
            return route.agent

    async def _help(self, msg: IncomingMessage, route: Route, args: str) -> str:
        name = await self._agent_of(route)
        try:
            agent = await self.registry.load(name)
            about = f"You are talking to **{agent.name}**" + (
                f": {agent.description}" if agent.description else ".")
        except PlutoError:
            about = f"You are talking to **{name}**."
        lines = [about, "", "Commands:"]
        lines += [f"- `/{info.name}` — {info.summary}"
                  for info, _ in self._handlers.values() if info.name]
        lines += ["", "Anything else you write goes to the agent."]
        return "\n".join(lines)

    async def _agents(self, msg: IncomingMessage, route: Route, args: str) -> str:
        lines = ["Agents:"]
        answering = await self._agent_of(route)
        for name in await self.registry.list_names():
            try:
                desc = (await self.registry.load(name)).description
            except PlutoError:
                desc = "(its configuration has an error)"
            here = " ← this chat" if name == answering else ""
            lines.append(f"- **{name}**" + (f" — {desc}" if desc else "") + here)
        return "\n".join(lines) if len(lines) > 1 else "No agents are configured."

    async def _new(self, msg: IncomingMessage, route: Route, args: str) -> str:
        await self.conversations.reset_session(route.session_key)
        return "Started a new conversation. Earlier messages are forgotten."

    async def _stop(self, msg: IncomingMessage, route: Route, args: str) -> str:
        running, dropped = await self.stop(route.session_key)
        if not running and not dropped:
            return "Nothing to stop."
        extra = f" and dropped {dropped} waiting message(s)" if dropped else ""
        return f"Stopped{extra}."
