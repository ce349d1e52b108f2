"""Live run events for whoever watches (the SSE stream, the web widget): publish/subscribe by
run id. A late subscriber reads what storage already has, then the live events."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator

from pluto.events import RunEnd, RunEvent


class EventHub:
    def __init__(self) -> None:
        self._subs: dict[str, set[asyncio.Queue[RunEvent | None]]] = defaultdict(set)

    def publish(self, event: RunEvent) -> None:
        for q in self._subs.get(event.run_id, ()):
            q.put_nowait(event)
        if isinstance(event, RunEnd):
            for q in self._subs.pop(event.run_id, set()):
                q.put_nowait(None)

    async def subscribe(self, run_id: str) -> AsyncIterator[RunEvent]:
        """Live events of one run until its ``run.end`` (or until the caller stops)."""
        q: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        self._subs[run_id].add(q)
        try:
            while (event := await q.get()) is not None:
                yield event
        finally:
            subs = self._subs.get(run_id)
            if subs is not None:
                subs.discard(q)
                if not subs:
                    self._subs.pop(run_id, None)

    def watched(self, run_id: str) -> bool:
        return bool(self._subs.get(run_id))
