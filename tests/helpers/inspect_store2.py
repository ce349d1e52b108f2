"""The schema, for tests that are not storage tests, where no public method of the store
(storage/ports.py) tells or does what they need: reading what only the tables hold, and
making rows old or broken as time or a fault would. One place knows the tables, so a schema
change is fixed once (the companion of tests/helpers/inspect_store.py)."""

from __future__ import annotations

from typing import Any

from pluto.storage.sqlite import SqlStore

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
