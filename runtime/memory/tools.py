"""The tools a model keeps memory with — remember, replace, forget one note; never a whole-file
rewrite — and ``search_history`` over the verbatim transcript of its conversation.

Each is bound, per run, to whose notes it may touch (:func:`pluto.runtime.memory.owner_for`)
and which conversation it may search: the model cannot name another user's file or chat.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pluto.runtime.memory.notes import (MemoryRefused, NoteBook, Owner, forget, remember,
                                        replace)
from pluto.runtime.tools import Tool, ToolContext, ToolResult, tool

if TYPE_CHECKING:
    from pluto.storage.ports import HistoryStore

MEMORY_TOOLS = ("memory_remember", "memory_replace", "memory_forget")


def memory_tools(book: NoteBook, owner: Owner, max_chars: int, only: str | None = None,
                 writer: str | None = None) -> dict[str, Tool]:
    """The tools, writing as ``writer``; with ``only``, replace and forget touch only the
    notes that writer wrote (shared notes: a chat's, the agent's)."""
    whose = {"user": "the person you are talking to", "chat": "this chat",
             "agent": "all your conversations"}[owner.scope]

    async def edit(ctx: ToolContext, op: str, why: str, fn: Any) -> ToolResult:
        try:
            memory = await book.edit(owner, fn, op=op, by=f"run {ctx.run_id}", why=why)
        except MemoryRefused as e:
            return ToolResult(f"Not saved: {e}", is_error=True)
        return ToolResult(f"Saved. Memory now holds {len(memory.notes)} note(s), "
                          f"{memory.chars:,} of {max_chars:,} characters.",
                          details={"memory": {"op": op, "notes": len(memory.notes)}})

    @tool(name="memory_remember")
    async def memory_remember(ctx: ToolContext, note: str, why: str = "") -> ToolResult:
        """Keep one short fact in long-term memory (one line), to know it in later
        conversations too. Never secrets. Memory is about {whose}.

        Args:
            note: The fact, in one short sentence (e.g. "Prefers answers in French").
            why: Why it is worth keeping (kept with the revision).
        """
        return await edit(ctx, "remember", why, lambda m: remember(m, note, max_chars, writer))

    @tool(name="memory_replace")
    async def memory_replace(ctx: ToolContext, old: str, new: str, why: str = "") -> ToolResult:
        """Correct one note of long-term memory.

        Args:
            old: Words of the note to change, enough to name exactly one.
            new: The note as it should read now.
            why: Why it changed.
        """
        return await edit(ctx, "replace", why, lambda m: replace(m, old, new, max_chars, only))

    @tool(name="memory_forget")
    async def memory_forget(ctx: ToolContext, note: str, why: str = "") -> ToolResult:
        """Remove one note from long-term memory.

        Args:
            note: Words of the note to remove, enough to name exactly one.
            why: Why it goes.
        """
        return await edit(ctx, "forget", why, lambda m: forget(m, note, only))

    tools = (memory_remember, memory_replace, memory_forget)
    return {t.name: Tool(t.name, t.description.replace("{whose}", whose), t.parameters, t.fn)
            for t in tools}


def search_tool(history: HistoryStore, session_key: str) -> Tool:
    @tool(name="search_history")
    async def search_history(ctx: ToolContext, query: str, limit: int = 5) -> ToolResult:
        """Search the full, verbatim transcript of this conversation (including turns that
        were summarized away, and earlier conversations in this chat) for words.

        Args:
            query: The words to look for (all of them must occur).
            limit: How many messages to return, newest first (1 to 20).
        """
        hits = await history.search(session_key, query, max(1, min(20, limit)))
        if not hits:
            return ToolResult(f"No message of this conversation contains: {query}")
        lines = [f"[{time.strftime('%Y-%m-%d %H:%M', time.gmtime(h.created_at))} {h.role}] "
                 f"{h.snippet(query, 400)}" for h in hits]
        return ToolResult("\n".join(lines))

    return {"search_history": search_history}["search_history"]
