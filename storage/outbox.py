"""The outbox table: every chunk of every reply, recorded before it is sent.

A chunk is keyed by ``(reply_id, chunk)`` — the run (or gateway answer) it belongs to and its
position — so recording the same reply twice changes nothing. It carries everything needed to
reach the chat again after a restart (provider name, chat, thread, ...). Its ``status`` goes
``pending`` → ``sent`` (with the platform's message id) or ``failed`` (with the error).
Old rows are pruned: delivered or failed ones, and pending ones no provider took for as long.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from pluto.storage.sqlite import SqliteStore

MIGRATIONS: list[str] = [
    """
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        reply_id TEXT NOT NULL,
        chunk INTEGER NOT NULL,
        run_id TEXT,
        provider TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        thread_id TEXT,
        reply_to TEXT,
        edit_of TEXT,
        kind TEXT NOT NULL,
        markup TEXT NOT NULL,
        text TEXT NOT NULL,
        attachments TEXT NOT NULL DEFAULT '[]',
        status TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        platform_id TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        UNIQUE (reply_id, chunk)
    );
    CREATE INDEX outbox_by_status ON outbox(provider, status, id);
    """,
]

_COLUMNS = ("reply_id", "chunk", "run_id", "provider", "chat_id", "thread_id", "reply_to",
            "edit_of", "kind", "markup", "text", "attachments")


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow:
    """One chunk. ``attachments`` are plain dicts (filename, mime_type, size, path, url, kind)."""

    reply_id: str
    chunk: int
    provider: str
    chat_id: str
    text: str
    kind: str = "reply"
    markup: str = "plain"
    run_id: str | None = None  # the run the reply answers (None: a gateway answer)
    thread_id: str | None = None
    reply_to: str | None = None
    edit_of: str | None = None
    attachments: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None
    status: str = "pending"
    attempts: int = 0
    platform_id: str | None = None
    error: str | None = None


class OutboxStore:
    def __init__(self, store: SqliteStore):
        self.store = store

    async def open(self) -> None:
        await self.store.migrate_component("outbox", MIGRATIONS)

    async def record(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        """Record the chunks of one reply (those already recorded are kept as they are) and
        return every chunk of that reply, in order, as stored."""
        if not rows:
            return []
        now = time.time()
        values = [(*(_value(r, c) for c in _COLUMNS), now, now) for r in rows]
        marks = ",".join("?" * (len(_COLUMNS) + 2))
        await self.store.db.executemany(
            f"INSERT OR IGNORE INTO outbox ({','.join(_COLUMNS)}, created_at, updated_at)"
            f" VALUES ({marks})", values)
        await self.store.db.commit()
        return await self.reply(rows[0].reply_id)

    async def reply(self, reply_id: str) -> list[OutboxRow]:
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM outbox WHERE reply_id = ? ORDER BY chunk", (reply_id,))
        return [_row(r) for r in rows]

    async def pending(self, provider: str) -> list[OutboxRow]:
        """Unsent chunks for a provider, oldest reply first, each reply's chunks in order."""
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM outbox WHERE provider = ? AND status = 'pending'"
            " ORDER BY created_at, reply_id, chunk", (provider,))
        return [_row(r) for r in rows]

    async def attempted(self, row_id: int) -> None:
        """Counted before each platform call, whose failure then sets ``error``: a pending row
        with attempts and no error may have gone out just before a crash (the platform took
        it, the process died before ``sent`` was written)."""
        await self._update(row_id, "attempts = attempts + 1, error = NULL")

    async def sent(self, row_id: int, platform_id: str | None) -> None:
        await self._update(row_id, "status = 'sent', platform_id = ?, error = NULL", platform_id)

    async def failed(self, row_ids: list[int], error: str) -> None:
        for row_id in row_ids:
            await self._update(row_id, "status = 'failed', error = ?", error, commit=False)
        await self.store.db.commit()

    async def note_error(self, row_id: int, error: str) -> None:
        """A failed platform call: the chunk stays pending (retried, or sent at the next start)."""
        await self._update(row_id, "error = ?", error)

    async def prune(self, older_than_seconds: float) -> int:
        """Forget delivered and failed chunks older than that; pending ones that no provider
        took in all that time are recorded as expired (and forgotten one period later)."""
        cutoff = time.time() - older_than_seconds
        db = self.store.db
        await db.execute("UPDATE outbox SET status = 'failed', error = 'expired: never sent',"
                         " updated_at = ? WHERE status = 'pending' AND created_at < ?",
                         (time.time(), cutoff))
        cur = await db.execute(
            "DELETE FROM outbox WHERE status != 'pending' AND updated_at < ?", (cutoff,))
        await db.commit()
        return cur.rowcount

    async def _update(self, row_id: int, assignments: str, *args: Any, commit: bool = True) -> None:
        await self.store.db.execute(
            f"UPDATE outbox SET {assignments}, updated_at = ? WHERE id = ?",
            (*args, time.time(), row_id))
        if commit:
            await self.store.db.commit()


def _value(row: OutboxRow, column: str) -> Any:
    value = getattr(row, column)
    return json.dumps(value) if column == "attachments" else value


def _row(r: Any) -> OutboxRow:
    return OutboxRow(
        id=r["id"], reply_id=r["reply_id"], chunk=r["chunk"], run_id=r["run_id"],
        provider=r["provider"],
        chat_id=r["chat_id"], thread_id=r["thread_id"], reply_to=r["reply_to"],
        edit_of=r["edit_of"], kind=r["kind"], markup=r["markup"], text=r["text"],
        attachments=json.loads(r["attachments"] or "[]"), status=r["status"],
        attempts=r["attempts"], platform_id=r["platform_id"], error=r["error"])
