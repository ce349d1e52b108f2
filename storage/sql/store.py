"""Every part of the store over one engine: the parts are written once for both engines (the
modules of :mod:`pluto.storage.sql`); SQLite (:mod:`pluto.storage.sqlite`) and PostgreSQL
(:mod:`pluto.storage.postgres`) each give :class:`SqlStore` their engine."""

from __future__ import annotations

from typing import Any

from pluto.storage.blobs import LocalBlobs
from pluto.storage.sql import Engine
from pluto.storage.sql.approvals import SqlApprovals
from pluto.storage.sql.console import SqlConsole
from pluto.storage.sql.conversations import SqliteConversations
from pluto.storage.sql.flood import SqlFlood
from pluto.storage.sql.idempotency import SqlIdempotency
from pluto.storage.sql.inbound import SqliteInbound
from pluto.storage.sql.leases import SqlLeases
from pluto.storage.sql.memory import SqlHistory, SqlNotes
from pluto.storage.sql.outbox import SqliteOutbox
from pluto.storage.sql.pairing import SqlitePairing
from pluto.storage.sql.ratelimits import SqlRateBuckets
from pluto.storage.sql.schedules import SqlSchedules
from pluto.storage.sql.tasks import SqliteTasks
from pluto.storage.sql.usage import SqlUsage


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
        self.conversations.usage = self.usage  # (its rows held for a run ride with its end)
        self.idempotency = SqlIdempotency(self.engine)  # the HTTP API's Idempotency-Key
        self.schedules = SqlSchedules(self.engine)  # schedules and their firings
        self.approvals = SqlApprovals(self.engine)  # tool calls waiting for a person
        self.console = SqlConsole(self.engine)  # console accounts, sessions, keys, audit log
        self.blobs: Any = LocalBlobs()  # one instance: files stay in the data dir only

    @property
    def is_open(self) -> bool:
        return self.engine.is_open

    async def open(self) -> None:
        await self.engine.open()
        try:
            for part in (self.conversations, self.outbox, self.inbound, self.tasks,
                         self.pairing, self.leases, self.rates, self.flood, self.usage,
                         self.history, self.idempotency, self.schedules, self.approvals,
                         self.console, self.blobs):
                await part.migrate()
        except BaseException:
            await self.engine.close()
            raise

    async def close(self) -> None:
        await self.inbound.close()
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
