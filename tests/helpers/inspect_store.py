"""What tests read back from a store — through its public methods (storage/ports.py), and in
the one place below that knows the schema where no public method tells.

Storage tests (test_storage*.py, test_store_engines.py, test_claims.py, test_fencing.py) query
the tables themselves; every other test asks here, so a schema change is fixed once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pluto.storage.postgres import PostgresStore
from pluto.storage.sqlite import SqliteStore, SqlStore


@asynccontextmanager
async def opened(where: Path | str) -> AsyncIterator[SqlStore]:
    """The store of a data dir's ``pluto.db`` (a Path) or of a PostgreSQL URL (a str), opened
    from outside the process that serves it (a small pool: the server is shared)."""
    store: SqlStore = (SqliteStore(where / "pluto.db") if isinstance(where, Path)
                       else PostgresStore(where, min_size=1, max_size=2))
    async with store:
        yield store


async def runs(store: SqlStore, limit: int = 1000) -> list[dict[str, Any]]:
    """Every run (id, status, error, input, ...), oldest first."""
    return list(reversed(await store.conversations.recent_runs(limit=limit)))


async def nothing_left_to_deliver(store: SqlStore) -> bool:
    """No run is queued or running and no reply chunk waits to be sent: from here on, nothing
    any instance holds would make the platform show more (what it shows now is final)."""
    return (not await store.outbox.pending_all()
            and not await store.conversations.unfinished_runs(time.time() + 3600))


async def until_nothing_left_to_deliver(store: SqlStore, timeout: float = 60) -> None:
    """Wait until :func:`nothing_left_to_deliver`; AssertionError naming what is left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await nothing_left_to_deliver(store):
        if loop.time() > deadline:
            pending = await store.outbox.pending_all()
            unfinished = await store.conversations.unfinished_runs(time.time() + 3600)
            raise AssertionError(f"after {timeout} s still {len(pending)} chunk(s) to send and "
                                 f"{len(unfinished)} run(s) unfinished")
        await asyncio.sleep(0.1)


# the schema: only where no public method tells ---------------------------------------------

async def reserved_tokens(store: SqlStore, scope: str, key: str, period: str,
                          start: float) -> int:
    """Tokens held by budget reservations of runs still calling the model (UsageStore.spent
    tells what was spent, not what is reserved)."""
    row = await store.engine.fetchone(
        "SELECT reserved_tokens FROM usage_counters"
        " WHERE scope = ? AND key = ? AND period = ? AND start = ?", (scope, key, period, start))
    return int(row[0]) if row else 0
