"""PostgreSQL, for several gateway instances sharing one database (``DATABASE_URL``).

``async with PostgresStore(url) as store:`` opens a connection pool, brings every table to its
newest schema and hands out the same parts as SQLite (``store.conversations``, ``store.outbox``,
...): each part is written once (:mod:`pluto.storage.sql`) and runs here on
:class:`~.engine.PostgresEngine`. Because other processes write the same tables, nothing is
cached across calls that another instance could change (``engine.shared``).
"""

from __future__ import annotations

from pluto.storage.postgres.blobs import PgBlobs
from pluto.storage.postgres.bus import PgBus
from pluto.storage.postgres.engine import PostgresEngine, redact
from pluto.storage.sql.store import SqlStore

__all__ = ["PostgresStore", "redact"]


class PostgresStore(SqlStore):
    def __init__(self, url: str, **pool: int):
        self.url = url
        engine = PostgresEngine(url, **pool)
        super().__init__(engine)
        self.bus = PgBus(engine)  # LISTEN/NOTIFY between instances
        self.blobs = PgBlobs(engine)  # files every instance can read

    async def close(self) -> None:
        await self.bus.close()
        await super().close()

    def describe(self) -> str:
        return f"PostgreSQL at {redact(self.url)}"
