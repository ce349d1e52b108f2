"""DM pairing in SQLite: codes given to unknown users, and the approvals of an admin.

A pairing request is a short code given to an unknown user; an admin approves the code
(``pluto pairing approve CODE`` or the admin API) and the approval is kept until revoked. Codes
expire; a user asking again while a code is valid gets the same code. Each operation is one
transaction (a code is drawn and stored, or an approval recorded and its request removed, as
one change).
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pluto.storage.rows import (ALPHABET, CODE_LENGTH, Approval, PairingError, PairingRequest,
                                normalize_code)
from pluto.storage.sql import Engine

COMPONENT = "access"
MIGRATIONS = [
    """
    CREATE TABLE pairing_requests (
        code TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        user_name TEXT,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX pairing_requests_user ON pairing_requests(provider, user_id);
    CREATE TABLE pairing_approvals (
        provider TEXT NOT NULL,
        user_id TEXT NOT NULL,
        user_name TEXT,
        approved_at REAL NOT NULL,
        approved_by TEXT NOT NULL,
        PRIMARY KEY (provider, user_id)
    );
    """,
]


def _request(row: Any) -> PairingRequest:
    return PairingRequest(row["code"], row["provider"], row["user_id"], row["chat_id"],
                          row["user_name"], row["created_at"], row["expires_at"])


def _approval(r: Any) -> Approval:
    return Approval(r["provider"], r["user_id"], r["user_name"], r["approved_at"],
                    r["approved_by"])


class SqlitePairing:
    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time):
        self.engine = engine
        self.clock = clock

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def is_approved(self, provider: str, user_id: str) -> bool:
        row = await self.engine.fetchone(
            "SELECT 1 FROM pairing_approvals WHERE provider = ? AND user_id = ?",
            (provider, user_id))
        return row is not None

    async def request(self, provider: str, user_id: str, chat_id: str, user_name: str | None,
                      ttl: float) -> PairingRequest:
        now = self.clock()

        def request(conn: Any) -> PairingRequest:
            conn.execute("DELETE FROM pairing_requests WHERE expires_at <= ?", (now,))
            row = conn.execute("SELECT * FROM pairing_requests WHERE provider = ? AND"
                               " user_id = ?", (provider, user_id)).fetchone()
            if row is not None:
                return _request(row)
            for _ in range(10):
                code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
                if not conn.execute(
                        "INSERT INTO pairing_requests (code, provider, user_id, chat_id,"
                        " user_name, created_at, expires_at) VALUES (?,?,?,?,?,?,?)"
                        " ON CONFLICT DO NOTHING",
                        (code, provider, user_id, chat_id, user_name, now, now + ttl)).rowcount:
                    mine = conn.execute("SELECT * FROM pairing_requests WHERE provider = ?"
                                        " AND user_id = ?", (provider, user_id)).fetchone()
                    if mine is not None:  # the same user asked at the same moment elsewhere
                        return _request(mine)
                    continue  # the code is someone else's: draw again
                return PairingRequest(code, provider, user_id, chat_id, user_name, now,
                                      now + ttl, new=True)
            raise RuntimeError("could not draw an unused pairing code")

        return await self.engine.transact(request)

    async def approve(self, code: str, *, by: str) -> Approval:
        now = self.clock()

        def approve(conn: Any) -> Approval:
            row = conn.execute("SELECT * FROM pairing_requests WHERE code = ? AND"
                               " expires_at > ?", (normalize_code(code), now)).fetchone()
            if row is None:
                raise PairingError(f"no pending pairing request has the code {code.strip()!r} "
                                   "(codes expire; ask the user to write again for a new one)")
            approval = Approval(row["provider"], row["user_id"], row["user_name"], now, by)
            conn.execute(
                "INSERT INTO pairing_approvals (provider, user_id, user_name, approved_at,"
                " approved_by) VALUES (?,?,?,?,?) ON CONFLICT(provider, user_id) DO UPDATE SET"
                " user_name = excluded.user_name, approved_at = excluded.approved_at,"
                " approved_by = excluded.approved_by",
                (approval.provider, approval.user_id, approval.user_name, now, by))
            conn.execute("DELETE FROM pairing_requests WHERE code = ?", (row["code"],))
            return approval

        return await self.engine.transact(approve)

    async def revoke(self, provider: str, user_id: str) -> bool:
        return await self.engine.write((
            "DELETE FROM pairing_approvals WHERE provider = ? AND user_id = ?",
            (provider, user_id))) > 0

    async def pending(self) -> list[PairingRequest]:
        rows = await self.engine.fetchall(
            "SELECT * FROM pairing_requests WHERE expires_at > ? ORDER BY created_at",
            (self.clock(),))
        return [_request(r) for r in rows]

    async def approved(self) -> list[Approval]:
        rows = await self.engine.fetchall(
            "SELECT * FROM pairing_approvals ORDER BY approved_at")
        return [_approval(r) for r in rows]


def approved_sync(db_path: Path, provider: str, user_id: str) -> bool | None:
    """Whether a user is approved, read without a running gateway (None: no data yet)."""
    if not db_path.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        row = con.execute("SELECT 1 FROM pairing_approvals WHERE provider = ? AND user_id = ?",
                          (provider, user_id)).fetchone()
        return row is not None
    except sqlite3.Error:  # no pairing table yet: nobody was ever approved
        return False
    finally:
        con.close()
