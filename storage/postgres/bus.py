"""Notifications between instances: PostgreSQL's ``LISTEN``/``NOTIFY``, heard through asyncpg
(its reader hands each note to a callback on the event loop: no task wakes per note).

:meth:`PgBus.publish` sends payloads on a channel (delivered to every listening connection
when the sending transaction commits, in order); :meth:`PgBus.subscribe` keeps one dedicated
connection listening and hands each payload to a callback, reconnecting with backoff when the
connection drops (a listener that missed notifications while away is told so by a ``None``
payload, so it can re-read what it follows; :attr:`PgBus.hearing` says whether notes are heard
now). The listening connection is asked to answer every :data:`PING_EVERY` seconds, so one cut
without a word (a partition, a NAT dropping an idle flow) is given up within seconds instead of
never. Payloads are small (ids), never data.

Channels are database-wide, while Pluto's tables live in a schema: deployments that share a
database in schemas of their own must not hear each other (a ``/stop`` for one must never stop
a run of the other). A channel is therefore scoped to the schema: its name as given in the
default ``public`` schema, with a suffix derived from the schema's name in any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
import re
from collections.abc import Callable
from typing import Any

from pluto.storage.postgres.engine import PostgresEngine, redact

log = logging.getLogger(__name__)

CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,49}")  # (63 characters at most with the suffix)
# The listening connection only receives: one cut without a word (a NAT or firewall dropping
# an idle flow, a partition) would leave it waiting forever while every note is lost. It is
# asked to answer this often (which also keeps such a flow from looking idle), and given up
# and opened again when it does not answer in PING_TIMEOUT.
PING_EVERY = 10.0  # seconds
PING_TIMEOUT = 5.0  # seconds


class PgBus:
    def __init__(self, engine: PostgresEngine):
        self.engine = engine
        self._tasks: set[asyncio.Task[None]] = set()
        self._suffix: str | None = None  # the schema's, once known
        self._callbacks: dict[str, list[Callable[[str | None], None]]] = {}
        self._listener: asyncio.Task[None] | None = None  # one connection for every channel
        self._hearing = False  # the listening connection is up, listening on every channel
        self.ping_every, self.ping_timeout = PING_EVERY, PING_TIMEOUT

    @property
    def hearing(self) -> bool:
        """Whether notifications are heard now: from the moment the listening connection
        listens on every channel until its loss is seen (a note sent meanwhile is lost)."""
        return self._hearing

    async def scoped(self, channel: str) -> str:
        """The database-wide name of ``channel`` for this deployment's schema."""
        if self._suffix is None:
            row = await self.engine.fetchone("SELECT current_schema() AS name")
            self._suffix = _schema_suffix(row["name"] if row is not None else None)
        return channel + self._suffix

    async def publish(self, channel: str, payloads: list[str]) -> None:
        """Send ``payloads`` in order, in one statement (no BEGIN and COMMIT around it)."""
        if payloads:
            scoped = await self.scoped(channel)
            params: tuple[Any, ...]
            if len(payloads) == 1:
                sql, params = "SELECT pg_notify(?, ?)", (scoped, payloads[0])
            else:
                sql = ("SELECT pg_notify(?, p) FROM unnest(?::text[]) WITH ORDINALITY AS"
                       " u(p, n) ORDER BY n")
                params = (scoped, list(payloads))
            await self.engine.read(lambda conn: conn.execute(sql, params).fetchall())

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> None:
        """Hand each payload sent on ``channel`` to ``callback`` (None: notifications may have
        been missed while the listening connection was away). Every channel of this bus is
        heard on one dedicated connection."""
        if not CHANNEL.fullmatch(channel):
            raise ValueError(f"not a channel name: {channel!r}")
        self._callbacks.setdefault(channel, []).append(callback)
        if self._listener is not None:  # (subscriptions come at start: listen to all anew)
            self._listener.cancel()
        self._listener = asyncio.create_task(self._listen(dict(self._callbacks)),
                                             name="bus:listen")
        self._tasks.add(self._listener)
        self._listener.add_done_callback(self._tasks.discard)

    async def _listen(self, channels: dict[str, list[Callable[[str | None], None]]]) -> None:
        asyncpg = await asyncio.to_thread(importlib.import_module, "asyncpg")
        loop = asyncio.get_running_loop()
        delay = 0.2
        while True:
            conn: Any = None
            try:
                by_name = {await self.scoped(c): fns for c, fns in channels.items()}
                conn = await asyncpg.connect(self.engine.url,
                                             timeout=max(1.0, self.engine.connect_timeout))
                gone: asyncio.Future[None] = loop.create_future()

                def closed(_conn: Any, gone: asyncio.Future[None] = gone) -> None:
                    self._hearing = False  # (at once: not when this task next runs)
                    if not gone.done():
                        gone.set_result(None)

                conn.add_termination_listener(closed)
                for scoped in by_name:  # (each note is handed on from asyncpg's own reader)
                    await conn.add_listener(
                        scoped, lambda _c, _pid, channel, payload:
                        _deliver(by_name, channel, payload))
                self._hearing = not gone.done()
                # whatever was missed before it listened (after a gap, or before the first
                # time: a look taken just before may have missed a note), re-read
                _deliver(by_name, None, None)
                delay = 0.2
                await self._until_gone(conn, gone)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the database went away: come back
                log.warning("bus: listening at %s failed (%s); again in %.1fs",
                            redact(self.engine.url), str(e).splitlines()[0] if str(e)
                            else type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
            finally:
                self._hearing = False
                if conn is not None:
                    conn.terminate()

    async def _until_gone(self, conn: Any, gone: asyncio.Future[None]) -> None:
        """Raises once the listening connection is closed, or once it leaves a question
        unanswered for ``ping_timeout`` (asked every ``ping_every`` seconds)."""
        while True:
            closed, _ = await asyncio.wait({gone}, timeout=self.ping_every)
            if closed:
                raise ConnectionError("the listening connection was closed")
            try:
                await asyncio.wait_for(conn.fetchval("SELECT 1"), self.ping_timeout)
            except TimeoutError:
                self._hearing = False
                raise ConnectionError(f"the listening connection did not answer in "
                                      f"{self.ping_timeout:g} s") from None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _deliver(by_name: dict[str, list[Callable[[str | None], None]]], channel: str | None,
             payload: str | None) -> None:
    """A payload to the callbacks of its channel (None: to every callback)."""
    for name, callbacks in by_name.items():
        if channel is not None and name != channel:
            continue
        for callback in callbacks:
            try:
                callback(payload)
            except Exception:
                log.exception("bus: a %s listener failed", name)


def _schema_suffix(schema: str | None) -> str:
    """'' for the default schema (the channel keeps its plain name); else ``_`` and a short
    hash of the schema's name (any name, of any length, makes a valid channel name)."""
    if not schema or schema == "public":
        return ""
    return "_" + hashlib.sha256(schema.encode()).hexdigest()[:12]
