"""Inbound dedupe: the platform message ids already seen, per provider.

A platform may deliver the same message twice (Telegram after a restart, Slack retries, a
Discord resume); the first delivery records ``(provider, message_id)`` and later ones find it.
The table is bounded: rows older than ``max_age`` seconds go, and at most ``max_rows`` stay.
"""

from __future__ import annotations

import time

from pluto.storage.sqlite import SqliteStore

MIGRATIONS: list[str] = [
    """
    CREATE TABLE inbound_seen (
        provider TEXT NOT NULL,
        message_id TEXT NOT NULL,
        seen_at REAL NOT NULL,
        PRIMARY KEY (provider, message_id)
    );
    CREATE INDEX inbound_seen_at ON inbound_seen(seen_at);
    """,
]


class InboundStore:
    def __init__(self, store: SqliteStore, *, max_rows: int = 100_000,
                 max_age: float = 14 * 86400, prune_every: int = 1000):
        self.store = store
        self.max_rows = max_rows
        self.max_age = max_age
        self.prune_every = prune_every
        self._since_prune = 0

    async def open(self) -> None:
        await self.store.migrate_component("inbound", MIGRATIONS)
        await self.prune()

    async def first_time(self, provider: str, message_id: str) -> bool:
        """Record the message; False when it was recorded before (a redelivery)."""
        inserted = await self.store.write((
            "INSERT OR IGNORE INTO inbound_seen (provider, message_id, seen_at) VALUES (?,?,?)",
            (provider, message_id, time.time())))
        if inserted == 0:
            return False
        self._since_prune += 1
        if self._since_prune >= self.prune_every:
            await self.prune()
        return True

    async def prune(self) -> int:
        """Forget old ids: those past ``max_age``, then all but the newest ``max_rows``."""
        self._since_prune = 0
        db = self.store.db
        old = await db.execute("DELETE FROM inbound_seen WHERE seen_at < ?",
                               (time.time() - self.max_age,))
        extra = await db.execute(
            "DELETE FROM inbound_seen WHERE rowid IN (SELECT rowid FROM inbound_seen"
            " ORDER BY seen_at DESC LIMIT -1 OFFSET ?)", (self.max_rows,))
        await db.commit()
        return old.rowcount + extra.rowcount

    async def count(self) -> int:
        row = await (await self.store.db.execute("SELECT COUNT(*) FROM inbound_seen")).fetchone()
        return int(row[0]) if row else 0
