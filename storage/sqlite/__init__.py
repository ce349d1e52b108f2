"""SQLite, the embedded default: one file under the data dir, every part of the store in it.

``async with SqliteStore(path) as store:`` opens the file, brings every table to its newest
schema and hands out the parts (``store.conversations``, ``store.outbox``, ...), which all share
one connection and one write path (:mod:`.engine`).

The parts are written once for both engines (:mod:`pluto.storage.sql`); :class:`SqlStore`
composes them over an engine, and PostgreSQL (:mod:`pluto.storage.postgres`) uses it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pluto.storage.blobs import LocalBlobs
from pluto.storage.sqlite.conversations import SqliteConversations
from pluto.storage.sqlite.engine import SqliteEngine
from pluto.storage.sqlite.flood import SqlFlood
from pluto.storage.sqlite.idempotency import SqlIdempotency
from pluto.storage.sqlite.inbound import SqliteInbound
from pluto.storage.sqlite.leases import SqlLeases
from pluto.storage.sqlite.memory import SqlHistory, SqlNotes
from pluto.storage.sqlite.outbox import SqliteOutbox
from pluto.storage.sqlite.pairing import SqlitePairing, approved_sync
from pluto.storage.sqlite.ratelimits import SqlRateBuckets
from pluto.storage.sqlite.schedules import SqlSchedules
from pluto.storage.sqlite.tasks import SqliteTasks
from pluto.storage.sqlite.usage import SqlUsage
from pluto.storage.sql import Engine

__all__ = ["SqlStore", "SqliteStore", "approved_sync"]


class SqlStore:
    """Every part of the store over one engine (see :mod:`pluto.storage.sql`)."""

    bus: Any = None  # notifications between instances (PostgreSQL only)

    def __init__(self, engine: Engine):
        self.engine = engine
        self.conversations = SqliteConversations(self.engine)
        self.outbox = SqliteOutbox(self.engine)
        self.inbound = SqliteInbound(self.engine)
        self.tasks = SqliteTasks(self.engine)
        self.pairing = SqlitePairing(self.engine)
        self.leases = SqlLeases(self.engine)
        self.rates = SqlRateBuckets(self.engine)
        self.flood = SqlFlood(self.engine)
        self.history = SqlHistory(self.engine)  # compactions and search (after messages)
        self.notes = SqlNotes(self.engine)  # long-term memory, when instances share it
        self.usage = SqlUsage(self.engine)
        self.idempotency = SqlIdempotency(self.engine)  # the HTTP API's Idempotency-Key
        self.schedules = SqlSchedules(self.engine)  # schedules and their firings
        self.blobs: Any = LocalBlobs()  # one instance: files stay in the data dir only

    @property
    def is_open(self) -> bool:
        return self.engine.is_open

    async def open(self) -> None:
        await self.engine.open()
        try:
            for part in (self.conversations, self.outbox, self.inbound, self.tasks,
                         self.pairing, self.leases, self.rates, self.flood, self.usage,
                         self.history, self.idempotency, self.schedules, self.blobs):
                await part.migrate()
        except BaseException:
            await self.engine.close()
            raise

    async def close(self) -> None:
        await self.engine.close()

    @property
    def shared(self) -> bool:
        return self.engine.shared

    def describe(self) -> str:
        return "SQL"

    async def __aenter__(self) -> SqlStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SqliteStore(SqlStore):
    def __init__(self, path: Path):
        self.path = path
        super().__init__(SqliteEngine(path))

    def describe(self) -> str:
        return f"SQLite at {self.path}"
