"""Memory that lasts: long-term notes (:mod:`.notes`), the tools the model keeps them with
(:mod:`.tools`), and compaction of a long session into a summary kept with it
(:mod:`.compaction`). An agent turns each on in its ``memory:`` block (pluto.agents.spec)."""

from __future__ import annotations

from dataclasses import dataclass

from pluto.agents.spec import AgentSpec
from pluto.runtime.memory.notes import (Memory, MemoryBook, MemoryRefused, NoteBook, Owner,
                                        SharedMemoryBook)

__all__ = ["Memory", "MemoryBook", "MemoryRefused", "NoteBook", "Owner", "SharedMemoryBook",
           "Speaker", "owner_for", "prompt_block"]


@dataclass(frozen=True, slots=True)
class Speaker:
    """Who wrote the message a run answers, and where (the pipeline knows; the runtime asks)."""

    provider: str
    chat_id: str
    user_id: str
    is_direct: bool = True
    groups: bool | None = None  # the route's memory_in_groups (None: the agent's setting)


def owner_for(agent: AgentSpec, speaker: Speaker | None) -> Owner | None:
    """Whose notes a run of ``agent`` for ``speaker`` reads and writes; None: no memory here.

    A user's notes enter only that user's direct chats — never a group, where others would
    read them — unless the route says they may (``memory_in_groups`` in routes.yaml) or,
    when the route does not say, the agent's ``long_term.groups``."""
    long_term = agent.memory.long_term
    if long_term is None:
        return None
    if long_term.scope == "agent":
        return Owner(agent.name, "agent")
    if speaker is None:
        return None
    if long_term.scope == "chat":
        return Owner(agent.name, "chat", speaker.provider, speaker.chat_id)
    in_groups = long_term.groups if speaker.groups is None else speaker.groups
    if not speaker.is_direct and not in_groups:
        return None
    return Owner(agent.name, "user", speaker.provider, speaker.user_id)


def prompt_block(memory: Memory, max_chars: int) -> str:
    """The notes as the model reads them, with their size; a problem is said, not hidden."""
    whose = {"user": "the person you are talking to", "chat": "this chat",
             "agent": "you, across all conversations"}[memory.owner.scope]
    if memory.problem:
        return (f"## Long-term memory (about {whose})\nUnavailable: {memory.problem}. Do not "
                f"claim to remember anything; an admin has to fix the file.")
    head = (f"## Long-term memory (about {whose}; {memory.chars:,} of {max_chars:,} characters)"
            "\nKeep it with the memory tools: memory_remember, memory_replace, memory_forget. "
            "Only say you saved something when the tool said so.")
    if not memory.notes:
        return head + "\n(nothing remembered yet)"
    return head + "\n" + "\n".join(f"- {n}" for n in memory.notes)
