"""Visible compaction: when a session's history passes ``short_term.max_tokens``, its older
turns are summarized into a summary kept with the session, and the chat is told in one line.

The history a run reads is then "the summary" plus the turns after it. Each compaction folds
the previous summary and the turns since into a new one, so what was said at the first turn
survives any number of them. The summarizer (the agent's model, or a cheaper one) has a hard
time limit; when it is slow, fails, or there is no model, a deterministic truncation stands in
(the earlier summary, then the newest of the older turns, clipped) — never a hang, never a
silent drop. No message is deleted: the verbatim transcript stays searchable (search_history,
/history search).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pluto.agents.spec import ShortTermMemory
from pluto.runtime.model import Model, ModelSettings, ModelTurn
from pluto.storage.rows import MessageRow, estimate_tokens, sanitize_history
from pluto.storage.sql.memory import Compaction

if TYPE_CHECKING:
    from pluto.storage.ports import HistoryStore

log = logging.getLogger(__name__)

SUMMARY_HEAD = ("## Summary of the earlier conversation\nOlder turns were compacted into this "
                "summary; their full text can be searched (search_history).")
INSTRUCTIONS = (
    "You compact a conversation so that it can go on within a limited context. Write one "
    "summary that keeps every fact, name, number, date, preference, decision and open question "
    "from the earlier summary and from the new turns (the earlier summary's facts must all stay "
    "unless a new turn corrects them). Plain sentences or bullets, no preamble, at most "
    "{words} words.")
MAX_MESSAGE_CHARS = 2_000  # of one message, in the summarizer's input
MAX_INPUT_CHARS = 60_000  # of the whole transcript given to the summarizer (the newest kept)


@dataclass(frozen=True, slots=True)
class Context:
    """The history a run starts from."""

    messages: list[dict[str, Any]]
    summary: str | None  # the session's summary (for the system prompt), if any
    compaction: Compaction | None = None  # made for this run
    usage: dict[str, int] | None = None  # the summarizer's tokens, when a model wrote it


Summarizer = Callable[[str, list[MessageRow], int], Any]  # → awaitable (text, usage)


async def context_for(history: HistoryStore, session_id: str, run_id: str,
                      short_term: ShortTermMemory,
                      summarize: Summarizer | None) -> Context:
    """The session's summary and the turns after it; compacts first when they are too long."""
    last, rows = await history.since_summary(session_id)
    previous = last.summary if last else ""
    total = estimate_tokens(previous) + sum(r.tokens for _, r in rows)
    if total <= short_term.max_tokens:
        return Context(_as_messages(rows), previous or None)
    cut = _cut(rows, short_term.keep_tokens if short_term.keep_tokens is not None
               else short_term.max_tokens // 3)
    older, newer = rows[:cut], rows[cut:]
    budget = max(50, short_term.max_tokens // 3)  # the summary's size, in tokens
    text, usage, method = None, None, "truncation"
    if summarize is not None and older:
        try:
            async with asyncio.timeout(short_term.timeout_seconds):
                text, usage = await summarize(previous, [r for _, r in older], budget)
            text = _clip(text.strip(), budget * 4) if text and text.strip() else None
            method = "summary" if text else "truncation"
        except TimeoutError:
            log.warning("compaction of session %s: the summarizer took more than %gs; "
                        "truncating instead", session_id, short_term.timeout_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a model error, anything: the run goes on with truncation
            log.warning("compaction of session %s: the summarizer failed (%s); truncating "
                        "instead", session_id, type(e).__name__)
    if text is None:
        text, usage = truncate(previous, [r for _, r in older], budget * 4), None
    upto = older[-1][0] if older else (last.upto if last else 0)
    compaction = Compaction(
        session_id, run_id, upto, text, method, total,
        estimate_tokens(text) + sum(r.tokens for _, r in newer),
        sum(usage.values()) if usage else 0, time.time())
    await history.compacted(compaction)
    return Context(_as_messages(newer), text, compaction, usage)


def _cut(rows: list[tuple[int, MessageRow]], keep_tokens: int) -> int:
    """Where the kept (verbatim) turns start: the newest ``keep_tokens``, from a user turn."""
    kept = 0
    cut = len(rows)
    for i in range(len(rows) - 1, -1, -1):
        kept += rows[i][1].tokens
        if kept > keep_tokens:
            break
        cut = i
    while cut < len(rows) and rows[cut][1].role != "user":
        cut += 1
    return cut


def _as_messages(rows: list[tuple[int, MessageRow]]) -> list[dict[str, Any]]:
    return sanitize_history([r.as_model_message() for _, r in rows])


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1].rstrip() + "…"


def _line(row: MessageRow, chars: int) -> str:
    if row.role == "tool":
        return f"tool {row.name or ''}: {_clip(' '.join((row.content or '').split()), 300)}"
    text = " ".join((row.content or "").split())
    if not text and row.tool_calls:
        text = "(called " + ", ".join(c.get("function", {}).get("name", "?")
                                     for c in row.tool_calls) + ")"
    return f"{row.role}: {_clip(text, chars)}"


def transcript(rows: list[MessageRow]) -> str:
    """The turns as the summarizer reads them: one line each, clipped, newest kept."""
    lines = [_line(r, MAX_MESSAGE_CHARS) for r in rows]
    out: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line) + 1
        if size > MAX_INPUT_CHARS:
            out.append("(earlier turns left out)")
            break
        out.append(line)
    return "\n".join(reversed(out))


def truncate(previous: str, rows: list[MessageRow], chars: int) -> str:
    """The deterministic fallback: the earlier summary (its start, where the oldest facts are)
    in up to half of ``chars``, then as many of the newest older turns as fit, clipped."""
    head = _clip(previous, chars // 2) if previous else ""
    room = chars - len(head) - 30
    picked: list[str] = []
    for row in reversed([r for r in rows if r.role in ("user", "assistant") and r.content]):
        line = _line(row, 200)
        if len(line) + 1 > room:
            if not picked and room > 40:  # the newest older turn, at least its start
                picked.append(_clip(line, room - 1))
            break
        picked.append(line)
        room -= len(line) + 1
    parts = [head] if head else []
    if picked:
        parts.append("Earlier turns (clipped):\n" + "\n".join(reversed(picked)))
    return "\n\n".join(parts) or "(earlier turns were dropped from the context)"


def model_summarizer(model: Model, settings: ModelSettings) -> Summarizer:
    """Summarize with a model (through the same interface as runs, no tools)."""
    async def summarize(previous: str, rows: list[MessageRow],
                        budget: int) -> tuple[str, dict[str, int]]:
        messages = [
            {"role": "system", "content": INSTRUCTIONS.format(words=max(30, budget * 3 // 4))},
            {"role": "user", "content": (f"Earlier summary:\n{previous or '(none)'}\n\n"
                                         f"New turns:\n{transcript(rows)}")}]
        text, usage = "", {}
        stream = model.stream(messages, [], settings)
        try:
            async for item in stream:
                if isinstance(item, ModelTurn):
                    text, usage = item.text, dict(item.usage or {})
        finally:
            if (close := getattr(stream, "aclose", None)) is not None:
                await close()
        usage = {k: int(usage.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")}
        return text, usage

    return summarize
