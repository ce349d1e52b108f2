"""Memory in every chat, no model needed: ``/memory`` shows what the agent remembers about you,
``/memory forget …`` removes it, ``/history search …`` finds words in this conversation's full
transcript (also what compaction summarized, and conversations before a ``/new``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError
from pluto.gateway.pipeline.commands import Commands, Failed
from pluto.runtime.memory import MemoryRefused, NoteBook, Speaker, owner_for
from pluto.runtime.memory.notes import forget
from pluto.types import IncomingMessage, Route

if TYPE_CHECKING:
    from pluto.storage.ports import HistoryStore

SEARCH_HITS = 10


class MemoryCommands:
    def __init__(self, registry: AgentRegistry, book: NoteBook, history: HistoryStore):
        self.registry = registry
        self.book = book
        self.history = history

    def register(self, commands: Commands) -> None:
        commands.add("memory", "what I remember about you; /memory forget … to remove it",
                     self._memory)
        commands.add("history", "search this conversation: /history search words",
                     self._history)

    async def _memory(self, msg: IncomingMessage, route: Route, args: str) -> str:
        try:
            agent = await self.registry.load(route.agent)
        except (PlutoError, LookupError):
            return Failed(f"The agent '{route.agent}' is not available right now.")
        speaker = Speaker(msg.provider, msg.chat_id, msg.user_id, msg.is_direct)
        if agent.memory.long_term is None:
            return f"**{agent.name}** keeps no long-term memory."
        owner = owner_for(agent, speaker)
        if owner is None or (owner.scope == "user" and not msg.is_direct):
            return ("What I remember about you is not shown in a group chat; ask me in a "
                    "direct chat.")
        verb, _, rest = args.partition(" ")
        if verb.lower() == "forget":
            if not rest.strip():
                return Failed("Say what to forget: `/memory forget <words of the note>`, or "
                              "`/memory forget all`.")
            # shared notes (a chat's, the agent's): each person forgets only what they wrote
            mine = None if owner.scope == "user" else f"{msg.provider}:{msg.user_id}"
            try:
                memory = await self.book.edit(owner, lambda m: forget(m, rest, mine), op="forget",
                                              by=f"user {msg.provider}:{msg.user_id}",
                                              why="/memory forget in the chat")
            except MemoryRefused as e:
                return Failed(f"Nothing was forgotten: {e}.")
            return f"Forgotten. {len(memory.notes)} note(s) left."
        if args.strip():
            return Failed("Use `/memory` to see what I remember, `/memory forget …` to remove "
                          "a note.")
        memory = await self.book.read(owner)
        if memory.problem:
            return Failed(f"The memory file cannot be read ({memory.problem}); an admin can "
                          f"restore it with `pluto memory restore`.")
        whose = {"user": "about you", "chat": "in this chat",
                 "agent": "(shared by all conversations)"}[owner.scope]
        if not memory.notes:
            return f"I remember nothing {whose} yet."
        lines = [f"What I remember {whose} ({memory.chars:,} of "
                 f"{agent.memory.long_term.max_chars:,} characters):"]
        lines += [f"- {n}" for n in memory.notes]
        lines += ["", "`/memory forget <words>` removes a note."]
        return "\n".join(lines)

    async def _history(self, msg: IncomingMessage, route: Route, args: str) -> str:
        verb, _, query = args.partition(" ")
        if verb.lower() != "search" or not query.strip():
            return Failed("Use `/history search <words>` to find them in this conversation.")
        hits = await self.history.search(route.session_key, query, SEARCH_HITS)
        if not hits:
            return f"Nothing in this conversation contains: {query.strip()}"
        lines = [f"Found {len(hits)} message(s), newest first:"]
        for h in hits:
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(h.created_at))
            who = "you" if h.role == "user" else "agent"
            lines.append(f"- {when} {who}: {h.snippet(query)}")
        return "\n".join(lines)
