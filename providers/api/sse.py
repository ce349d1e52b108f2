"""A run's events as Server-Sent Events: ``id: <seq>``, ``event: <type>``, ``data: <json>``.

A late subscriber gets the stored events first, then the live ones, each once and in order
(the run feed); ``Last-Event-ID`` (or ``?after=``) resumes after a seq.
The stream ends after ``run.end``; a comment line every few seconds keeps proxies from closing
an idle stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from aiohttp import web

from pluto.events import RunEvent, ToolEnd, event_to_dict
from pluto.gateway.ports import RunFeed
from pluto.providers.api.artifacts import linked_details
from pluto.providers.kit.loops import follow

Linker = Callable[[str], str | None]

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
_DONE = None


def encode(event: RunEvent, link: Linker = lambda path: None) -> bytes:
    """One event for an API client: a tool's files as their artifacts' URLs (``link``), never
    server paths; a run.error without its operators' detail."""
    fields = event_to_dict(event)
    fields.pop("detail", None)  # a run.error's full cause is for the operators (admin API)
    if isinstance(event, ToolEnd):
        fields["details"] = linked_details(event.details, link)
    data = json.dumps(fields, default=str)
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


class EventStreams:
    """The open streams, so that shutting down ends them instead of waiting for them."""

    def __init__(self, feed: RunFeed):
        self.feed = feed
        self._open: set[asyncio.Queue[RunEvent | None]] = set()

    async def close_all(self, app: web.Application | None = None) -> None:
        for queue in list(self._open):
            queue.put_nowait(_DONE)

    async def stream(self, request: web.Request, run_id: str, after: int,
                     link: Linker = lambda path: None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        queue: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        self._open.add(queue)
        pump = asyncio.create_task(self._pump(run_id, after, queue), name=f"sse:{run_id}")
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                if item is _DONE:
                    break
                await resp.write(encode(item, link))
        except (ConnectionError, RuntimeError) as e:  # the client went away
            log.debug("sse: stream of run %s closed by the client: %s", run_id, e)
        finally:
            self._open.discard(queue)
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        with contextlib.suppress(ConnectionError, RuntimeError):
            await resp.write_eof()
        return resp

    async def _pump(self, run_id: str, after: int,
                    queue: asyncio.Queue[RunEvent | None]) -> None:
        try:
            await follow(self.feed.follow(run_id, after), queue.put_nowait,
                         what=f"sse: following run {run_id}", log=log)
        finally:
            queue.put_nowait(_DONE)
