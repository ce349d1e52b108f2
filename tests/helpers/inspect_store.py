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
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore


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
            rows = [await store.conversations.run(run_id) for run_id in unfinished]
            raise AssertionError(
                f"after {timeout} s still {len(pending)} chunk(s) to send and "
                f"{len(unfinished)} run(s) unfinished: chunks "
                f"{[(c.reply_id, c.chunk, c.chat_id, c.attempts) for c in pending]}, runs "
                f"{[(r.id, r.status, r.source_id, r.started_at) for r in rows if r]}")
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


# the tables themselves, where no public method tells or does it (reading what only they hold;
# making rows old or broken as time or a fault would) ----------

# idempotency keys of the HTTP API (the IdempotencyStore has no reader: begin() claims) ------


async def idempotency_keys(store: SqlStore) -> list[tuple[Any, ...]]:
    """Every key kept: (scope, key, status, resource), oldest first."""
    rows = await store.engine.fetchall(
        "SELECT scope, key, status, resource FROM idempotency_keys ORDER BY created_at")
    return [tuple(r) for r in rows]


async def idempotency_key(store: SqlStore, key: str) -> tuple[Any, ...] | None:
    """The key kept under that name, whatever its scope: (scope, key, status, resource)."""
    row = await store.engine.fetchone(
        "SELECT scope, key, status, resource FROM idempotency_keys WHERE key = ?", (key,))
    return tuple(row) if row is not None else None


async def age_idempotency_keys(store: SqlStore, seconds: float, *, scope: str | None = None,
                               key: str | None = None) -> None:
    """Keys made ``seconds`` earlier than they were (those of a scope, or a key name)."""
    where, args = _where(scope=scope, key=key)
    await store.engine.write((f"UPDATE idempotency_keys SET created_at = created_at - ?{where}",
                              (seconds, *args)))


async def end_idempotency_holds(store: SqlStore, *, key: str | None = None,
                                by: float | None = None) -> None:
    """The holds of keys being answered run out: ``by`` seconds earlier, or all gone (as if
    the attempt holding them had died long ago)."""
    where, args = _where(key=key)
    if by is None:
        await store.engine.write((f"UPDATE idempotency_keys SET locked_until = 0{where}", args))
    else:
        await store.engine.write((f"UPDATE idempotency_keys SET locked_until = locked_until - ?"
                                  f"{where}", (by, *args)))


def _where(**equal: str | None) -> tuple[str, tuple[Any, ...]]:
    given = {column: value for column, value in equal.items() if value is not None}
    if not given:
        return "", ()
    return " WHERE " + " AND ".join(f"{c} = ?" for c in given), tuple(given.values())


# the outbox (OutboxStore reads a reply by id, or the pending chunks) -------------------------

async def outbox_rows(store: SqlStore, provider: str) -> list[tuple[Any, ...]]:
    """Every chunk recorded for a provider, whatever its state: (run_id, kind, text), in the
    order recorded."""
    rows = await store.engine.fetchall(
        "SELECT run_id, kind, text FROM outbox WHERE provider = ? ORDER BY id", (provider,))
    return [tuple(r) for r in rows]


async def outbox_claims(store: SqlStore) -> list[tuple[Any, ...]]:
    """The claims held on replies being sent (a sender's lease)."""
    return [tuple(r) for r in await store.engine.fetchall("SELECT * FROM outbox_claims")]


async def age_outbox(store: SqlStore, at: float, *, except_reply: str | None = None) -> None:
    """Every chunk (but those of ``except_reply``) recorded and last changed at ``at``."""
    where = " WHERE reply_id != ?" if except_reply is not None else ""
    args = (except_reply,) if except_reply is not None else ()
    await store.engine.write((f"UPDATE outbox SET updated_at = ?, created_at = ?{where}",
                              (at, at, *args)))


# the inbox of received message ids ----------------------------------------------------------

async def age_inbound(store: SqlStore) -> None:
    """Every received message id seen long ago (at the epoch)."""
    await store.engine.write(("UPDATE inbound_seen SET seen_at = 0", ()))


# faults --------------------------------------------------------------------------------------

async def break_usage_ledger(store: SqlStore) -> None:
    """The usage ledger's tables gone: every read and write of it fails."""
    await store.engine.write(("DROP TABLE usage_calls", ()), ("DROP TABLE usage_counters", ()))


async def platform_messages(store: SqlStore, provider: str) -> set[tuple[str, str]]:
    """(chat, platform message id) of every message a recorded reply made or edited: what the
    gateway knows it shows (a preview whose id was never recorded is not among them)."""
    rows = await store.engine.fetchall(
        "SELECT chat_id, platform_id, edit_of FROM outbox WHERE provider = ? AND status = 'sent'",
        (provider,))
    return {(str(chat), str(mid)) for chat, sent, edited in rows
            for mid in (sent, edited) if mid is not None}
