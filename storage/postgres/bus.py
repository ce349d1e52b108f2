"""Notifications between instances: PostgreSQL's ``LISTEN``/``NOTIFY``.

:meth:`PgBus.publish` sends payloads on a channel (delivered to every listening connection
when the sending transaction commits, in order); :meth:`PgBus.subscribe` keeps one dedicated
connection listening and hands each payload to a callback, reconnecting with backoff when the
connection drops (a listener that missed notifications while away is told so by a ``None``
payload, so it can re-read what it follows). Payloads are small (ids), never data.

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

from pluto.storage.postgres.engine import PostgresEngine, redact

log = logging.getLogger(__name__)

CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,49}")  # (63 characters at most with the suffix)


class PgBus:
    def __init__(self, engine: PostgresEngine):
        self.engine = engine
        self._tasks: set[asyncio.Task[None]] = set()
        self._suffix: str | None = None  # the schema's, once known

    async def scoped(self, channel: str) -> str:
        """The database-wide name of ``channel`` for this deployment's schema."""
        if self._suffix is None:
            row = await self.engine.fetchone("SELECT current_schema() AS name")
            self._suffix = _schema_suffix(row["name"] if row is not None else None)
        return channel + self._suffix

    async def publish(self, channel: str, payloads: list[str]) -> None:
        if payloads:
            scoped = await self.scoped(channel)

            def send(conn) -> None:  # type: ignore[no-untyped-def]
                for payload in payloads:
                    conn.execute("SELECT pg_notify(?, ?)", (scoped, payload))
            await self.engine.transact(send)

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> None:
        if not CHANNEL.fullmatch(channel):
            raise ValueError(f"not a channel name: {channel!r}")
        task = asyncio.create_task(self._listen(channel, callback), name=f"bus:{channel}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _listen(self, channel: str, callback: Callable[[str | None], None]) -> None:
        psycopg = await asyncio.to_thread(importlib.import_module, "psycopg")
        delay = 0.2
        first = True
        while True:
            try:
                scoped = await self.scoped(channel)
                async with await psycopg.AsyncConnection.connect(
                        self.engine.url, autocommit=True,
                        connect_timeout=max(1, int(self.engine.connect_timeout))) as conn:
                    await conn.execute(f"LISTEN {scoped}")
                    if not first:
                        callback(None)  # back after a gap: whatever was missed, re-read
                    first, delay = False, 0.2
                    async for note in conn.notifies():
                        try:
                            callback(note.payload)
                        except Exception:
                            log.exception("bus: a %s listener failed", channel)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the database went away: come back
                log.warning("bus: listening on %s at %s failed (%s); again in %.1fs",
                            channel, redact(self.engine.url), str(e).splitlines()[0] if str(e)
                            else type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _schema_suffix(schema: str | None) -> str:
    """'' for the default schema (the channel keeps its plain name); else ``_`` and a short
    hash of the schema's name (any name, of any length, makes a valid channel name)."""
    if not schema or schema == "public":
        return ""
    return "_" + hashlib.sha256(schema.encode()).hexdigest()[:12]
