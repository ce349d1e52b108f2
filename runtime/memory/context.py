"""What memory adds to one run: the notes (in the system prompt, with their size), the session's
summary and the turns after it (compacting first when they are too long), and the tools.

The Runner asks :func:`prepare` once per run and uses what comes back; an agent without a
``memory:`` block gets :data:`NO_MEMORY` and runs exactly as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pluto.agents.spec import AgentSpec
from pluto.runtime.memory import Speaker, may_write, owner_for, prompt_block, writer_of
from pluto.runtime.memory.compaction import SUMMARY_HEAD, Summarizer, context_for
from pluto.runtime.memory.notes import NoteBook
from pluto.runtime.memory.tools import MEMORY_TOOLS, memory_tools, search_tool
from pluto.runtime.tools import Tool

if TYPE_CHECKING:
    from pluto.storage.ports import HistoryStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunMemory:
    history: list[dict[str, Any]] | None = None  # None: the agent's plain history window
    system: str = ""  # added to the system prompt: the notes, the summary
    tools: dict[str, Tool] = field(default_factory=dict)
    usage: dict[str, int] | None = None  # the summarizer's tokens (they count as the run's)
    notice: str | None = None  # one line for the chat: a compaction happened


NO_MEMORY = RunMemory()


async def prepare(agent: AgentSpec, *, session_id: str, session_key: str, run_id: str,
                  speaker: Speaker | None, book: NoteBook, history: HistoryStore | None,
                  summarizer: Callable[[], Summarizer | None],
                  narrowed: tuple[str, ...] | None = None,
                  notify: Callable[[str], Awaitable[Any]] | None = None) -> RunMemory:
    """Memory for one run of ``agent`` (``narrowed``: the route's tool list, if any)."""
    spec = agent.memory
    if spec.long_term is None and spec.short_term is None:
        return NO_MEMORY
    system: list[str] = []
    tools: dict[str, Tool] = {}
    owner = owner_for(agent, speaker)
    if spec.long_term is not None and owner is not None:
        notes = await book.read(owner)
        writer = writer_of(speaker)
        writable = not notes.problem and may_write(agent, owner, writer)
        system.append(prompt_block(notes, spec.long_term.max_chars, writable))
        if writable:  # each note records its writer; shared notes change only by theirs
            tools.update(memory_tools(book, owner, spec.long_term.max_chars,
                                      None if owner.scope == "user" else writer, writer))
    messages, usage, notice = None, None, None
    if history is not None:
        tools["search_history"] = search_tool(history, session_key)
        if spec.short_term is not None:
            context = await context_for(history, session_id, run_id, spec.short_term,
                                        summarizer())
            messages, usage = context.messages, context.usage
            if context.summary:
                system.append(f"{SUMMARY_HEAD}\n{context.summary}")
            if context.compaction is not None:
                c = context.compaction
                log.info("session %s compacted (%s): %d → %d tokens", session_id, c.method,
                         c.tokens_before, c.tokens_after)
                notice = spec.short_term.notice
                if notice and notify is not None:
                    try:
                        await notify(notice)
                    except Exception:  # the notice is informative; the run goes on
                        log.exception("sending the compaction notice of session %s failed",
                                      session_id)
    if narrowed is not None:
        tools = {n: t for n, t in tools.items()
                 if n in narrowed or (n in MEMORY_TOOLS and "memory" in narrowed)}
    return RunMemory(messages, "\n\n".join(system), tools, usage, notice)
