"""Who is connected: each visitor's chat may be open in several tabs, and every tab gets every
frame of that chat, in order, through its own queue (a slow tab never holds up the others)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSCloseCode, web

from pluto.providers.web.protocol import encode

log = logging.getLogger(__name__)

Frame = dict[str, Any]
MAX_QUEUED_FRAMES = 5000  # a tab this far behind is disconnected (it reloads the history)


@dataclass(frozen=True, slots=True)
class _Close:
    code: int
    reason: bytes


class Client:
    """One open socket. Frames pushed before :meth:`start` are held (while the history is read),
    then sent after it."""

    def __init__(self, ws: web.WebSocketResponse, chat_id: str):
        self.ws = ws
        self.chat_id = chat_id
        self.held: list[Frame] | None = []
        self._queue: asyncio.Queue[Frame | _Close] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    def push(self, frame: Frame) -> None:
        if self._closing:
            return
        if self.held is not None:
            self.held.append(frame)
        elif self._queue.qsize() >= MAX_QUEUED_FRAMES:
            log.warning("web: a tab of chat %s fell too far behind; disconnecting it", self.chat_id)
            self.stop(WSCloseCode.TRY_AGAIN_LATER, b"too far behind")
        else:
            self._queue.put_nowait(frame)

    def held_runs(self) -> set[str]:
        return {f["run_id"] for f in self.held or () if f.get("run_id")}

    def start(self, first: list[Frame]) -> None:
        """Send ``first`` (ready, history), then what was held, then everything pushed."""
        for f in first + (self.held or []):
            self._queue.put_nowait(f)
        self.held = None
        self._writer = asyncio.create_task(self._write(), name=f"web:{self.chat_id}")

    def stop(self, code: int = WSCloseCode.OK, reason: bytes = b"") -> None:
        """Send what is queued, then close the socket with ``code``."""
        if not self._closing:
            self._closing = True
            self._queue.put_nowait(_Close(code, reason))

    async def _write(self) -> None:
        while not isinstance(item := await self._queue.get(), _Close):
            try:
                await self.ws.send_str(encode(item))
            except (ConnectionError, RuntimeError) as e:  # closed under us
                log.debug("web: a tab of chat %s went away: %s", self.chat_id, e)
                break
        else:
            await self.ws.close(code=item.code, message=item.reason)
        if not self.ws.closed:
            await self.ws.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Let the writer send what it has (for ``timeout`` at most), then end it."""
        if self._writer is None:
            return
        self.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self._writer), timeout)
        except (TimeoutError, ConnectionError, RuntimeError):
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer


@dataclass(slots=True)
class _RunBuffer:
    chat_id: str
    frames: list[Frame] = field(default_factory=list)


class Rooms:
    """The open tabs of each chat, and the frames of each chat's runs in progress (so a tab
    that joins mid-answer sees the answer from its start)."""

    def __init__(self) -> None:
        self._clients: dict[str, set[Client]] = defaultdict(set)
        self._runs: dict[str, _RunBuffer] = {}

    def count(self, chat_id: str) -> int:
        return len(self._clients.get(chat_id, ()))

    def all(self) -> list[Client]:
        return [c for clients in self._clients.values() for c in clients]

    def join(self, client: Client) -> None:
        self._clients[client.chat_id].add(client)
        for run in self._runs.values():
            if run.chat_id == client.chat_id:
                for f in run.frames:
                    client.push(f)

    def leave(self, client: Client) -> None:
        clients = self._clients.get(client.chat_id)
        if clients is not None:
            clients.discard(client)
            if not clients:
                del self._clients[client.chat_id]

    def broadcast(self, chat_id: str, frame: Frame, *, skip: Client | None = None) -> int:
        clients = [c for c in self._clients.get(chat_id, ()) if c is not skip]
        for c in clients:
            c.push(frame)
        return len(clients)

    def run_started(self, chat_id: str, run_id: str) -> None:
        self._runs.setdefault(run_id, _RunBuffer(chat_id))

    def run_frame(self, run_id: str, frame: Frame) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            run.frames.append(frame)
            self.broadcast(run.chat_id, frame)

    def run_ended(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def following(self, run_id: str) -> bool:
        return run_id in self._runs
