"""Rate-limit buckets kept in the database, so a limit holds across instances.

Each bucket is a token bucket (``count`` messages refilled evenly over ``seconds``) keyed by a
string; :meth:`SqlRateBuckets.take` refills and takes one message from every bucket given, or
from none when one is empty, in one transaction on the database's clock (so two instances
taking from the same bucket at once are serialised by its row). Buckets idle for a day are
deleted now and then.
"""

from __future__ import annotations

from typing import Any

from pluto.storage.sql import Engine

COMPONENT = "rate_limits"
MIGRATIONS: list[Any] = [
    """
    CREATE TABLE rate_buckets (
        key TEXT PRIMARY KEY,
        tokens REAL NOT NULL,
        updated REAL NOT NULL,
        noticed INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX rate_buckets_updated ON rate_buckets(updated);
    """,
]


class SqlRateBuckets:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._takes = 0

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def take(self, buckets: list[tuple[str, int, float]]) -> tuple[int, float, bool] | None:
        """``buckets``: (key, count, seconds). None when a message was taken from each; else
        (index of the empty bucket, seconds until it has one, whether this is the first
        refusal of its streak)."""
        now_sql = self.engine.now_sql

        def take(conn: Any) -> tuple[int, float, bool] | None:
            now = float(conn.execute(f"SELECT {now_sql}").fetchone()[0])
            state = []
            for key, count, seconds in sorted(buckets):  # one lock order for everyone
                row = conn.execute(  # the upsert locks the row until we commit
                    "INSERT INTO rate_buckets (key, tokens, updated) VALUES (?, ?, ?)"
                    " ON CONFLICT(key) DO UPDATE SET key = excluded.key"
                    " RETURNING tokens, updated, noticed", (key, float(count), now)).fetchone()
                tokens = min(float(count), row[0] + max(0.0, now - row[1]) * count / seconds)
                state.append((key, count, seconds, tokens, bool(row[2])))
            by_key = {s[0]: s for s in state}
            for i, (key, count, seconds) in enumerate(buckets):
                _, _, _, tokens, noticed = by_key[key]
                if tokens < 1:
                    conn.execute("UPDATE rate_buckets SET tokens = ?, updated = ?, noticed = 1"
                                 " WHERE key = ?", (tokens, now, key))
                    return i, (1 - tokens) * seconds / count, not noticed
            for key, _, _, tokens, _ in state:
                conn.execute("UPDATE rate_buckets SET tokens = ?, updated = ?, noticed = 0"
                             " WHERE key = ?", (tokens - 1, now, key))
            return None

        result = await self.engine.transact(take)
        self._takes += 1
        if self._takes % 1000 == 0:
            await self.engine.write((f"DELETE FROM rate_buckets WHERE updated < {now_sql} - ?",
                                     (86400.0,)))
        return result
