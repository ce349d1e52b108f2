"""Memory that lasts: long-term notes (:mod:`.notes`), the tools the model keeps them with
(:mod:`.tools`), and compaction of a long session into a summary kept with it
(:mod:`.compaction`). An agent turns each on in its ``memory:`` block (pluto.agents.spec)."""

from __future__ import annotations

from dataclasses import dataclass

from pluto.agents.spec import AgentSpec
from pluto.runtime.memory.notes import (Memory, MemoryBook, MemoryRefused, NoteBook, Owner,
                                        SharedMemoryBook)

__all__ = ["Memory", "MemoryBook", "MemoryRefused", "NoteBook", "Owner", "SharedMemoryBook",
           "Speaker", "may_write", "owner_for", "prompt_block", "writer_of"]


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


def writer_of(speaker: Speaker | None) -> str | None:
    """Who a note written in this run is by: ``provider:user`` (None: no one known)."""
    return f"{speaker.provider}:{speaker.user_id}" if speaker and speaker.user_id else None


def may_write(agent: AgentSpec, owner: Owner, writer: str | None) -> bool:
    """Whether a run may change ``owner``'s notes: a user's own notes and a chat's (each
    person only their own there) yes; the agent-wide notes only when agent.yaml's
    ``long_term.writers`` names the writer (or ``"*"``) — else only admins, with
    ``pluto memory`` (docs/security.md)."""
    if owner.scope != "agent":
        return writer is not None or owner.scope == "user"
    writers = agent.memory.long_term.writers if agent.memory.long_term else []
    return "*" in writers or (writer is not None and writer in writers)


def prompt_block(memory: Memory, max_chars: int, writable: bool = True) -> str:
    """The notes as the model reads them, with their size; a problem is said, not hidden."""
    whose = {"user": "the person you are talking to", "chat": "this chat",
             "agent": "you, across all conversations"}[memory.owner.scope]
    if memory.problem:
        return (f"## Long-term memory (about {whose})\nUnavailable: {memory.problem}. Do not "
                f"claim to remember anything; an admin has to fix the file.")
    head = (f"## Long-term memory (about {whose}; {memory.chars:,} of {max_chars:,} characters)"
            + ("\nKeep it with the memory tools: memory_remember, memory_replace, "
               "memory_forget. Only say you saved something when the tool said so."
               if writable else "\nYou cannot change it from this conversation."))
    shown = visible_notes(memory)
    if not shown:
        return head + "\n(nothing remembered yet)"
    if memory.owner.scope == "user":
        return head + "\n" + "\n".join(f"- {n}" for n, _ in shown)
    # shared notes say who wrote them: a fact one person stated is not an order from another
    return head + "\n" + "\n".join(f"- {n} ({f'noted by {w}' if w else 'from an admin'})"
                                    for n, w in shown)


def visible_notes(memory: Memory) -> list[tuple[str, str]]:
    """The notes (with their writers) the model may read: not one that the filter refuses
    (a hand edit, an older note), nor two neighbours that it refuses joined (a split secret)."""
    from pluto.runtime.memory.notes import screen
    pairs = list(zip(memory.notes, memory.writers or ("",) * len(memory.notes)))
    hidden = {i for i, (n, _) in enumerate(pairs) if screen(n)}
    for i in range(len(pairs) - 1):
        a, b = pairs[i][0], pairs[i + 1][0]
        if screen(a + b) or screen(f"{a} {b}"):
            hidden |= {i, i + 1}
    return [pair for i, pair in enumerate(pairs) if i not in hidden]
