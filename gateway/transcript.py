"""What watchers read: a run's events as they happen, and a chat's conversation so far.

:func:`follow_run` is how the SSE stream and the web widget watch a run: the events storage
already has, then the live ones from the hub, each once, in order, numbered by their ``seq``.
:func:`chat_transcript` is what a chat shows people when they come back: the active session's
messages and the details (tables, charts) of its tool results.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from pluto.types import IncomingMessage, RunEnd, RunEvent, ToolEnd

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway
    from pluto.gateway.feed import EventHub
    from pluto.storage.sqlite import SqliteStore


def _key(event: RunEvent) -> str:
    """An event's identity: storage keeps ``json.dumps(asdict(event), default=str)`` and
    rebuilds an equal event, so the same text comes out of the live and the stored copy."""
    return json.dumps(dataclasses.asdict(event), default=str)


async def follow_run(store: SqliteStore, hub: EventHub, run_id: str,
                     after: int = 0) -> AsyncGenerator[tuple[int, RunEvent], None]:
    """``(seq, event)`` of one run after ``after``: stored ones, then live ones until ``run.end``.

    The hub subscription is registered before storage is read, so nothing falls between the
    two; live events that storage already returned are recognised and skipped. Every event is
    stored before it is published, and published in order, so the live ones are a contiguous
    tail of the run: the first one not in storage is number ``last stored + 1``.
    """
    live = cast(AsyncGenerator[RunEvent, None], hub.subscribe(run_id))
    pending: asyncio.Future[RunEvent] = asyncio.ensure_future(anext(live))
    try:
        # The task's first step (which registers the subscription) runs before we resume:
        # the loop runs ready callbacks in order. Only then is storage read.
        await asyncio.sleep(0)
        while not hub.watched(run_id) and not pending.done():
            await asyncio.sleep(0)
        stored = await store.events(run_id)
        seen = {_key(event): seq for seq, event in stored}
        last = 0
        for seq, event in stored:
            last = seq
            if seq > after:
                yield seq, event
            if isinstance(event, RunEnd):
                return
        while True:
            try:
                event = await pending
            except StopAsyncIteration:
                return
            seq = seen.get(_key(event), last + 1)
            if seq > last:
                last = seq
                if seq > after:
                    yield seq, event
            if isinstance(event, RunEnd):
                return
            pending = asyncio.ensure_future(anext(live))
    finally:
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        await live.aclose()


@dataclass(frozen=True, slots=True)
class TranscriptItem:
    """One thing a chat shows: a user's message, an answer, or a tool result's details."""

    role: Literal["user", "assistant", "tool"]
    text: str
    run_id: str | None
    ts: float
    name: str | None = None  # the tool, for role "tool"
    details: Any = None  # what the tool showed people (a table, a chart), for role "tool"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def chat_transcript(gw: Gateway, msg: IncomingMessage,
                          limit: int = 200) -> list[TranscriptItem]:
    """The active conversation of the chat ``msg`` comes from, as its people saw it.

    ``msg`` is a probe: the routing table decides which session the chat has (as it would for
    a real message from it). Empty when the chat has no route.
    """
    route = gw.routes.route(msg)
    if route is None:
        return []
    session = await gw.store.session(route.session_key, route.agent)
    rows = await gw.store.messages(session.id, limit=limit)
    details: dict[str, dict[str, ToolEnd]] = {}
    items: list[TranscriptItem] = []
    for row in rows:
        if row.role in ("user", "assistant") and row.content:
            items.append(TranscriptItem(row.role, row.content, row.run_id,  # type: ignore[arg-type]
                                        row.created_at))
        elif row.role == "tool" and row.run_id and row.tool_call_id:
            if row.run_id not in details:
                details[row.run_id] = {e.call_id: e for _, e in await gw.store.events(row.run_id)
                                       if isinstance(e, ToolEnd)}
            end = details[row.run_id].get(row.tool_call_id)
            if end is not None and end.details:
                items.append(TranscriptItem("tool", "", row.run_id, row.created_at,
                                            name=end.name, details=end.details))
    return items
