"""The outbox table in SQLite: every chunk of every reply, recorded before it is sent.

A chunk is keyed by ``(reply_id, chunk)``: the run (or gateway answer) it belongs to and its
position, so recording the same reply twice changes nothing. It carries everything needed to
reach the chat again after a restart. Its ``status`` goes ``pending`` → ``sent`` (with the
platform's message id) or ``failed`` (with the error). A reply being sent is claimed (an owner
and a lease) so that two senders never send it at once. Old rows are pruned.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from pluto.storage.rows import OutboxRow
from pluto.storage.sql import Engine, Statement, together

COMPONENT = "outbox"
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
    """
    ALTER TABLE outbox ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN answers TEXT;
    CREATE TABLE outbox_claims (
        reply_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        until REAL NOT NULL
    );
    """,
    """
    ALTER TABLE outbox ADD COLUMN buttons TEXT NOT NULL DEFAULT '[]';
    """,
]

_COLUMNS = ("reply_id", "chunk", "run_id", "seq", "provider", "chat_id", "thread_id", "reply_to",
            "answers", "edit_of", "kind", "markup", "text", "attachments", "buttons")


_CLAIM = ("INSERT INTO outbox_claims (reply_id, owner, until) VALUES (?,?,?)"
          " ON CONFLICT(reply_id) DO UPDATE SET owner = excluded.owner, until = excluded.until"
          " WHERE outbox_claims.until < ? OR outbox_claims.owner = excluded.owner")
# Several instances: a claim ends with its owner (an instance whose lease ran out died, or
# stalled: it then sends nothing more, see Outbox.forget_claims) or when it gives it up — never
# for its age alone: a reply recorded (and claimed) behind a slow one in its chat waits its turn
# on its instance however long the chat's flood hold lasts, and a claim taken from under it
# would send it twice, or before the one ahead of it. Its time is the database's clock (one
# clock for every instance): ``until`` is given as an offset from it (the lease's length).
_CLAIM_SHARED = (
    "INSERT INTO outbox_claims (reply_id, owner, until) VALUES (?,?,{now} + ?)"
    " ON CONFLICT(reply_id) DO UPDATE SET owner = excluded.owner, until = excluded.until"
    " WHERE outbox_claims.owner = excluded.owner"
    " OR NOT EXISTS (SELECT 1 FROM leases WHERE leases.name = 'instance:' ||"
    " outbox_claims.owner AND leases.until >= {now})")

# Pending replies in the order they were recorded — by row id, never by a clock (instances'
# clocks differ: a reply recorded later by one whose clock is behind would be taken up first by
# a sweep or a chat's taker) — each reply's chunks in order.
_RECORDED = "min(id) OVER (PARTITION BY reply_id), chunk"


def _value(row: OutboxRow, column: str) -> Any:
    value = getattr(row, column)
    return json.dumps(value) if column in ("attachments", "buttons") else value


def _row(r: Any) -> OutboxRow:
    return OutboxRow(
        id=r["id"], reply_id=r["reply_id"], chunk=r["chunk"], run_id=r["run_id"], seq=r["seq"],
        provider=r["provider"], chat_id=r["chat_id"], thread_id=r["thread_id"],
        reply_to=r["reply_to"], answers=r["answers"], edit_of=r["edit_of"], kind=r["kind"],
        markup=r["markup"], text=r["text"], attachments=json.loads(r["attachments"] or "[]"),
        buttons=json.loads(r["buttons"] or "[]"),
        status=r["status"], attempts=r["attempts"], platform_id=r["platform_id"],
        error=r["error"])


def _recorded(rows: list[OutboxRow], ids: list[int], tries: int) -> list[OutboxRow]:
    """A reply's chunks as just recorded: their ids, the first with its call counted."""
    return [replace(r, id=found, attempts=tries if i == 0 else 0)
            for i, (r, found) in enumerate(zip(rows, ids))]


class SqliteOutbox:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._claim = (_CLAIM_SHARED.format(now=engine.now_sql) if engine.shared else _CLAIM)
        self._now = engine.now_sql if engine.shared else "?"  # claims: the database's clock

    def _now_args(self, now: float) -> tuple[Any, ...]:
        return () if self.engine.shared else (now,)

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)
        if not self.engine.shared:
            # One gateway serves this database: claims left by a process that died are void
            # now. (A shared database keeps them: they expire with their lease.)
            await self.engine.write(("DELETE FROM outbox_claims", ()))

    async def record(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        if not rows:
            return []
        now = time.time()
        values = [(*(_value(r, c) for c in _COLUMNS), now, now) for r in rows]
        sql = (f"INSERT INTO outbox ({','.join(_COLUMNS)}, created_at, updated_at)"
               f" VALUES ({','.join('?' * (len(_COLUMNS) + 2))}) ON CONFLICT DO NOTHING")
        reply_id = rows[0].reply_id

        def record(conn: Any) -> list[OutboxRow]:
            conn.executemany(sql, values)
            return [_row(r) for r in conn.execute(
                "SELECT * FROM outbox WHERE reply_id = ? ORDER BY chunk", (reply_id,))]

        return await self.engine.transact(record)

    async def record_claimed(self, rows: list[OutboxRow], owner: str, lease_seconds: float,
                             *, count: bool = True) -> tuple[list[OutboxRow], bool]:
        if not rows:
            return [], False
        now = time.time()
        reply_id = rows[0].reply_id
        insert = (f"INSERT INTO outbox ({','.join(_COLUMNS)}, attempts, created_at,"
                  f" updated_at) VALUES ({','.join('?' * (len(_COLUMNS) + 3))})"
                  f" ON CONFLICT DO NOTHING RETURNING id")

        if self.engine.dialect == "postgres":  # (all new, most often: one statement)
            done = await self._record_claimed_at_once(rows, insert, owner, lease_seconds,
                                                      now, count)
            if done is not None:
                return done

        def record(conn: Any) -> tuple[list[OutboxRow], bool]:
            claimed = conn.execute(self._claim, self._claim_args(reply_id, owner, now,
                                                                  lease_seconds)).rowcount > 0
            # the sender's first call, counted with the record when it follows at once: the
            # first chunk's (each later one is counted when the one before it is marked sent;
            # a chunk counted and never called would be taken, after a crash, for one that
            # may have been delivered)
            tries = 1 if claimed and count else 0
            ids = [conn.execute(insert, (*(_value(r, c) for c in _COLUMNS),
                                         tries if i == 0 else 0, now, now)).fetchone()
                   for i, r in enumerate(rows)]
            if all(found is not None for found in ids):  # all new: no need to read them back
                return _recorded(rows, [found[0] for found in ids], tries), claimed
            if claimed and count:  # recorded before: count the call on its first pending
                conn.execute("UPDATE outbox SET attempts = attempts + 1, error = NULL,"
                             " updated_at = ? WHERE id = (SELECT id FROM outbox WHERE"
                             " reply_id = ? AND status = 'pending' ORDER BY chunk LIMIT 1)",
                             (now, reply_id))
            return [_row(r) for r in conn.execute(
                "SELECT * FROM outbox WHERE reply_id = ? ORDER BY chunk", (reply_id,))], claimed

        return await self.engine.transact(record)

    async def _record_claimed_at_once(self, rows: list[OutboxRow], insert: str, owner: str,
                                      lease_seconds: float, now: float, count: bool
                                      ) -> tuple[list[OutboxRow], bool] | None:
        """(PostgreSQL) :meth:`record_claimed` as one statement — the claim, then each chunk,
        the first counted with the sender's first call if the claim was had — when every chunk
        is new; None when one was recorded before (the transaction reads them back)."""
        head = insert.partition(" VALUES (")[0]
        marks = ",".join(["?"] * len(_COLUMNS))
        parts: list[tuple[str, Statement]] = [("c", (
            self._claim + " RETURNING 1", self._claim_args(rows[0].reply_id, owner, now,
                                                           lease_seconds)))]
        for i, r in enumerate(rows):
            parts.append((f"i{i}", (
                f"{head} SELECT {marks}, CASE WHEN EXISTS (SELECT 1 FROM c) THEN ? ELSE 0 END,"
                " ?, ? ON CONFLICT DO NOTHING RETURNING id",
                (*(_value(r, c) for c in _COLUMNS), 1 if count and i == 0 else 0, now, now))))
        result = ", ".join(["(SELECT count(*) FROM c)",
                            *(f"(SELECT id FROM i{i})" for i in range(len(rows)))])
        got = await self.engine.write_returning(together(parts, result))
        if got is None or any(found is None for found in tuple(got)[1:]):
            return None
        claimed = bool(got[0])
        tries = 1 if claimed and count else 0
        return _recorded(rows, list(tuple(got)[1:]), tries), claimed

    async def reply(self, reply_id: str) -> list[OutboxRow]:
        rows = await self.engine.fetchall(
            "SELECT * FROM outbox WHERE reply_id = ? ORDER BY chunk", (reply_id,))
        return [_row(r) for r in rows]

    async def pending(self, provider: str) -> list[OutboxRow]:
        rows = await self.engine.fetchall(
            "SELECT * FROM outbox WHERE provider = ? AND status = 'pending'"
            f" ORDER BY {_RECORDED}", (provider,))
        return [_row(r) for r in rows]

    async def pending_all(self) -> list[OutboxRow]:
        """:meth:`pending` of every provider, in one query."""
        rows = await self.engine.fetchall(
            f"SELECT * FROM outbox WHERE status = 'pending' ORDER BY {_RECORDED}")
        return [_row(r) for r in rows]

    async def claim(self, reply_id: str, owner: str, lease_seconds: float) -> bool:
        now = time.time()
        taken = await self.engine.write((self._claim, self._claim_args(reply_id, owner, now,
                                                                       lease_seconds)))
        return taken > 0

    def _claim_args(self, reply_id: str, owner: str, now: float,
                    lease_seconds: float) -> tuple[Any, ...]:
        if self.engine.shared:  # (the database's clock: an offset from it)
            return reply_id, owner, lease_seconds
        return reply_id, owner, now + lease_seconds, now

    @property
    def shared(self) -> bool:
        return self.engine.shared

    async def release(self, reply_id: str, owner: str) -> None:
        await self.engine.write(("DELETE FROM outbox_claims WHERE reply_id = ? AND owner = ?",
                                 (reply_id, owner)))

    async def attempted(self, row_id: int) -> None:
        await self._update(row_id, "attempts = attempts + 1, error = NULL")

    async def sent(self, row_id: int, platform_id: str | None, *,
                   release: tuple[str, str] | None = None, count: int | None = None) -> None:
        now = time.time()
        changes: list[tuple[str, tuple[Any, ...]]] = [(
            "UPDATE outbox SET status = 'sent', platform_id = ?, error = NULL,"
            " updated_at = ? WHERE id = ?", (platform_id, now, row_id))]
        if release is not None:
            changes.append(("DELETE FROM outbox_claims WHERE reply_id = ? AND owner = ?",
                            release))
        if count is not None:  # the next chunk's call, counted before it is made
            changes.append(("UPDATE outbox SET attempts = attempts + 1, error = NULL,"
                            " updated_at = ? WHERE id = ?", (now, count)))
        await self.engine.write_together(*changes)  # (different rows: one statement)

    async def failed(self, row_ids: list[int], error: str) -> None:
        now = time.time()
        await self.engine.write(*[(
            "UPDATE outbox SET status = 'failed', error = ?, updated_at = ? WHERE id = ?",
            (error, now, row_id)) for row_id in row_ids])

    async def note_error(self, row_id: int, error: str, *, unsent: bool = False) -> None:
        """The last call's error; ``unsent``: the platform certainly did not take it, so the
        attempt counted before it was not made (taken back: after a crash, a chunk with no
        attempt left is not taken for one that may have been delivered)."""
        if unsent:
            await self._update(row_id, "attempts = CASE WHEN attempts > 0 THEN attempts - 1"
                                       " ELSE 0 END, error = ?", error)
        else:
            await self._update(row_id, "error = ?", error)

    async def prune(self, older_than_seconds: float) -> int:
        """Forget delivered and failed chunks older than that; pending ones that nobody sent in
        all that time are recorded as expired (and forgotten one period later)."""
        now = time.time()
        cutoff = now - older_than_seconds
        return await self.engine.write(
            ("UPDATE outbox SET status = 'failed', error = 'expired: never sent', updated_at = ?"
             " WHERE status = 'pending' AND created_at < ?", (now, cutoff)),
            (f"DELETE FROM outbox_claims WHERE until < {self._now}", self._now_args(now)),
            ("DELETE FROM outbox WHERE status != 'pending' AND updated_at < ?", (cutoff,)))

    async def _update(self, row_id: int, assignments: str, *args: Any) -> None:
        await self.engine.write((f"UPDATE outbox SET {assignments}, updated_at = ? WHERE id = ?",
                                 (*args, time.time(), row_id)))
