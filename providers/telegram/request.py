"""Telegram's HTTP requests, made so that a cancelled caller can never wedge the send path.

python-telegram-bot sends through httpx, whose pinned connection pool (httpcore 1.0.9) loses a
slot for good when a request that waits for a connection is cancelled — or times out waiting —
just after the pool handed it a new one (encode/httpcore#1093): under contention, cancelled
typing indicators used up every slot and each later send failed with "Pool timeout … Request
was *not* sent to Telegram" until the process restarted.

:class:`SendRequest` keeps httpx from ever queueing and from ever seeing a cancellation:

- admission is our own: at most ``connection_pool_size`` requests are inside httpx at once (an
  :class:`asyncio.Semaphore`, which forgets a cancelled or timed-out waiter cleanly); a request
  that finds no slot within the pool timeout fails with :class:`~telegram.error.TimedOut`
  ("Pool timeout …: not sent"), as before — but httpx itself never waits for a connection;
- an admitted request runs in a task of its own: a caller that is cancelled stops waiting at
  once, while the request completes (bounded by its read/write/connect timeouts) and gives its
  connection back to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, HTTPXRequest, RequestData

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0  # seconds in-flight requests may finish in when the client is closed


class SendRequest(HTTPXRequest):
    """:class:`HTTPXRequest` whose in-flight requests are never cancelled (see the module)."""

    __slots__ = ("_slots", "_size", "_pool_wait", "_inflight")

    def __init__(self, connection_pool_size: int = 8, *, pool_timeout: float | None = 1.0,
                 **options: Any):
        super().__init__(connection_pool_size=connection_pool_size, pool_timeout=pool_timeout,
                         **options)
        self._size = connection_pool_size
        self._slots = asyncio.Semaphore(connection_pool_size)
        self._pool_wait = pool_timeout
        self._inflight: set[asyncio.Task[tuple[int, bytes]]] = set()

    @property
    def in_flight(self) -> int:
        """Requests running now (their callers may have stopped waiting)."""
        return len(self._inflight)

    async def do_request(self, url: str, method: str, request_data: RequestData | None = None,
                         read_timeout: Any = BaseRequest.DEFAULT_NONE,
                         write_timeout: Any = BaseRequest.DEFAULT_NONE,
                         connect_timeout: Any = BaseRequest.DEFAULT_NONE,
                         pool_timeout: Any = BaseRequest.DEFAULT_NONE) -> tuple[int, bytes]:
        wait = self._pool_wait if isinstance(pool_timeout, type(BaseRequest.DEFAULT_NONE)) \
            else pool_timeout
        await self._admit(wait)
        try:
            task = asyncio.get_running_loop().create_task(super().do_request(
                url, method, request_data, read_timeout=read_timeout,
                write_timeout=write_timeout, connect_timeout=connect_timeout,
                pool_timeout=wait))
        except BaseException:
            self._slots.release()
            raise
        self._inflight.add(task)
        task.add_done_callback(self._finished)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                # the request was stopped by shutdown(), not our caller: an error, not a cancel
                raise NetworkError("the connection pool was closed while the request was "
                                   "in flight") from None
            raise  # our caller was cancelled: the request completes without it

    async def _admit(self, wait: float | None) -> None:
        try:
            async with asyncio.timeout(wait):
                await self._slots.acquire()
        except TimeoutError:
            raise TimedOut(f"Pool timeout: all {self._size} connections to Telegram stayed busy "
                           f"for {wait:g}s. Request was *not* sent to Telegram") from None

    def _finished(self, task: asyncio.Task[tuple[int, bytes]]) -> None:
        self._inflight.discard(task)
        self._slots.release()
        if not task.cancelled():
            task.exception()  # retrieved: a caller that stopped waiting never reads it

    async def shutdown(self) -> None:
        """Let in-flight requests finish for a moment, stop the rest, close the pool (a pool
        being thrown away cannot wedge anything that lives on)."""
        if self._inflight:
            _, pending = await asyncio.wait(set(self._inflight), timeout=SHUTDOWN_GRACE)
            for task in pending:
                task.cancel()
            if pending:
                with contextlib.suppress(Exception):
                    await asyncio.wait(pending, timeout=SHUTDOWN_GRACE)
        await super().shutdown()
