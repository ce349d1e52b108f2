"""What chat front-ends may look up (:class:`~pluto.gateway.ports.ChatDirectory`): where a
message would be routed, a chat's conversation as its people saw it, the agents.

The web widget shows the transcript when a tab (re)connects; the API lists the agents and
checks a task's route before it takes a message.
"""

from __future__ import annotations

from collections.abc import Callable

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError
from pluto.events import ToolEnd
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.gateway.ports import AgentInfo, TranscriptItem
from pluto.gateway.pipeline.intake import message_from_dict
from pluto.storage.ports import ConversationStore, InboundStore
from pluto.types import IncomingMessage, Outcome, Route, outcome_from_dict

WAITING_SHOWN = 100  # a chat's messages waiting for their turn, shown at most
CONSISTENT_TRIES = 3  # reads of a conversation while take-overs move it under them


class Directory:
    def __init__(self, routes: Callable[[], RoutingTable], registry: AgentRegistry,
                 conversations: ConversationStore, inbox: InboundStore | None = None):
        self.routes = routes  # the table in force (live reload swaps it)
        self.registry = registry
        self.conversations = conversations
        self.inbox = inbox

    def route(self, probe: IncomingMessage) -> Route | None:
        return self.routes().route(probe)

    async def transcript(self, probe: IncomingMessage,
                         limit: int = 200) -> list[TranscriptItem]:
        """The active conversation of the chat ``probe`` comes from: the routing table decides
        which session the chat has (as it would for a real message). Empty without a route."""
        route = self.route(probe)
        if route is None:
            return []
        session = await self.conversations.session(route.session_key, route.agent)
        rows = await self.conversations.messages(session.id, limit=limit)
        sources = await self.conversations.run_sources(session.id, limit) if any(
            row.role == "user" for row in rows) else {}
        details: dict[str, dict[str, ToolEnd]] = {}
        items: list[TranscriptItem] = []
        for row in rows:
            if row.role in ("user", "assistant") and row.content:
                items.append(TranscriptItem(
                    row.role, row.content, row.run_id, row.created_at,  # type: ignore[arg-type]
                    message_id=sources.get(row.run_id or "") if row.role == "user" else None))
            elif row.role == "tool" and row.run_id and row.tool_call_id:
                if row.run_id not in details:
                    details[row.run_id] = {
                        e.call_id: e for e in await self.conversations.events(row.run_id)
                        if isinstance(e, ToolEnd)}
                end = details[row.run_id].get(row.tool_call_id)
                if end is not None and end.details:
                    items.append(TranscriptItem("tool", "", row.run_id, row.created_at,
                                                name=end.name, details=end.details))
        return items

    async def conversation(self, probe: IncomingMessage, limit: int = 200
                           ) -> tuple[list[TranscriptItem], list[IncomingMessage]]:
        """The waiting messages are read first: one whose run begins between the two reads is
        in the transcript (in both: shown once). The other way — a run taken over between
        them, its message put back to wait and its messages deleted — would leave the message
        in neither: the reads are done again while the session's count of deletions moves
        under them (:data:`CONSISTENT_TRIES` at most; then what the last reads said)."""
        route = self.route(probe)
        session = None if route is None else await self.conversations.session(
            route.session_key, route.agent)
        for _ in range(CONSISTENT_TRIES):
            before = 0 if session is None else await self.conversations.deletions(session.id)
            waiting = await self.waiting(probe)
            items = await self.transcript(probe, limit)
            if session is None or await self.conversations.deletions(session.id) == before:
                break
        return items, waiting

    async def waiting(self, probe: IncomingMessage) -> list[IncomingMessage]:
        """The messages of the chat ``probe`` comes from that wait for their turn, oldest
        first, whoever received them: recorded and not yet taken up (waiting for the chat's
        runs before them, or for an instance to take the chat), or taken up by a run queued
        behind the session's running one. None is in the transcript yet."""
        if self.inbox is None:
            return []
        route = self.route(probe)
        session = None if route is None else await self.conversations.session(
            route.session_key, route.agent)
        return [message_from_dict(payload) for payload in await self.inbox.waiting_in_chat(
            probe.provider, probe.chat_id, session.id if session else None, WAITING_SHOWN)]

    async def outcome(self, provider: str, message_id: str) -> Outcome | None:
        """What became of a recorded message (the run answering it, once started — by any
        instance); None while it waits."""
        if self.inbox is None:
            return None
        found = await self.inbox.outcome(provider, message_id)
        return None if found is None else outcome_from_dict(found)

    async def agents(self) -> list[AgentInfo]:
        out = []
        for name in await self.registry.list_names():
            try:
                description, available = (await self.registry.load(name)).description, True
            except (PlutoError, LookupError):
                description, available = None, False
            out.append(AgentInfo(name, description or None, available))
        return out
