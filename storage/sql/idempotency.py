"""Idempotency keys of the HTTP API (the IETF httpapi ``Idempotency-Key`` header draft).

A client that sends ``POST`` with ``Idempotency-Key: "<key>"`` may send it again — after a
connection reset, a timeout — and the work is done once. Each key is kept per caller (the
``scope``: the API key's name) with the request's fingerprint (method, path and body), the
attempt that holds it (``token``), what that attempt made (``resource``, as soon as it exists)
and, once answered, the response (status and body). A key is kept ``ttl`` seconds (24 h) from
its first use, then forgotten (:meth:`SqlIdempotency.prune`; an expired key is also treated as
new on sight). Rows live in the database (both engines), so a retry reaching another instance,
or the same one after a restart, finds them. Time is the database's clock.

An attempt that dies without an answer (a crash) holds its key ``lock`` seconds; after that a
retry with the same request takes the key over — or, when the dead attempt had already made
its resource, is told about that resource instead of making a second one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pluto.storage.sql import Engine

COMPONENT = "idempotency"
MIGRATIONS: list[Any] = [
    """
    CREATE TABLE idempotency_keys (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        token TEXT NOT NULL,
        resource TEXT,
        status INTEGER,
        response TEXT,
        created_at REAL NOT NULL,
        locked_until REAL NOT NULL,
        PRIMARY KEY (scope, key)
    );
    CREATE INDEX idempotency_keys_created ON idempotency_keys(created_at);
    """,
]
TTL = 24 * 3600.0  # seconds a key is kept from its first use


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A key already in use: by the same request (``same``) or another one."""

    same: bool  # the same fingerprint: a retry of the request that first used the key
    status: int | None  # the answer's status; None while an attempt still holds the key
    response: str | None  # the answer's body
    resource: str | None  # what the holding attempt made so far (e.g. "task/step")
    abandoned: bool  # no answer, and its attempt's hold ran out (it died)


class SqlIdempotency:
    def __init__(self, engine: Engine, ttl: float = TTL):
        self.engine = engine
        self.ttl = ttl
        self._now = engine.now_sql

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def begin(self, scope: str, key: str, fingerprint: str, token: str, *,
                    lock: float) -> IdempotencyRecord | None:
        """Claim ``key`` for the attempt ``token``: None when it is this attempt's now (a new
        key, an expired one, or one whose attempt died before it made anything); else the
        record of the key as it is."""
        now, ttl = self._now, self.ttl

        def claim(conn: Any) -> IdempotencyRecord | None:
            if conn.execute(
                    f"INSERT INTO idempotency_keys (scope, key, fingerprint, token, created_at,"
                    f" locked_until) VALUES (?, ?, ?, ?, {now}, {now} + ?)"
                    f" ON CONFLICT (scope, key) DO NOTHING",
                    (scope, key, fingerprint, token, lock)).rowcount == 1:
                return None
            if conn.execute(
                    f"UPDATE idempotency_keys SET fingerprint = ?, token = ?, resource = NULL,"
                    f" status = NULL, response = NULL, created_at = {now},"
                    f" locked_until = {now} + ? WHERE scope = ? AND key = ? AND"
                    f" (created_at < {now} - ? OR (status IS NULL AND resource IS NULL AND"
                    f" locked_until < {now} AND fingerprint = ?))",
                    (fingerprint, token, lock, scope, key, ttl, fingerprint)).rowcount == 1:
                return None
            row = conn.execute(
                f"SELECT fingerprint, status, response, resource, locked_until < {now}"
                f" FROM idempotency_keys WHERE scope = ? AND key = ?", (scope, key)).fetchone()
            return IdempotencyRecord(row[0] == fingerprint, row[1], row[2], row[3],
                                     bool(row[4]) and row[1] is None)

        return await self.engine.transact(claim)

    async def made(self, scope: str, key: str, token: str, resource: str) -> None:
        """The attempt made ``resource``: a retry after its death is told about it."""
        await self.engine.write((
            "UPDATE idempotency_keys SET resource = ? WHERE scope = ? AND key = ? AND token = ?",
            (resource, scope, key, token)))

    async def answered(self, scope: str, key: str, token: str, status: int,
                       response: str) -> bool:
        """The answer the attempt gave; a retry gets the same. False when the key is no
        longer this attempt's."""
        return await self.engine.write((
            "UPDATE idempotency_keys SET status = ?, response = ? WHERE scope = ? AND key = ?"
            " AND token = ?", (status, response, scope, key, token))) > 0

    async def adopt(self, scope: str, key: str, token: str, *, lock: float) -> bool:
        """Take over a key whose attempt died after making its resource (the caller answers
        with that resource). False when another retry took it first."""
        return await self.engine.write((
            f"UPDATE idempotency_keys SET token = ?, locked_until = {self._now} + ? WHERE"
            f" scope = ? AND key = ? AND status IS NULL AND locked_until < {self._now}",
            (token, lock, scope, key))) > 0

    async def release(self, scope: str, key: str, token: str) -> None:
        """The attempt failed without an answer. Had it made nothing, the key is free for a
        retry; had it made its resource, a retry is told about that one at once."""
        await self.engine.write(
            ("DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND token = ? AND"
             " status IS NULL AND resource IS NULL", (scope, key, token)),
            (f"UPDATE idempotency_keys SET locked_until = {self._now} - 1 WHERE scope = ? AND"
             f" key = ? AND token = ? AND status IS NULL", (scope, key, token)))

    async def prune(self) -> int:
        """Forget keys older than the ttl; how many."""
        return await self.engine.write((
            f"DELETE FROM idempotency_keys WHERE created_at < {self._now} - ?", (self.ttl,)))
