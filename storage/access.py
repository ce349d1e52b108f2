"""Who may talk to the agents: DM pairing requests and approvals (their own tables in
``pluto.db``), and the read-only queries the admin API makes over runs.

A pairing request is a short code given to an unknown user; an admin approves the code
(``pluto pairing approve CODE`` or the admin API) and the approval is kept until revoked. Codes
expire; a user asking again while a code is valid gets the same code.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pluto.storage.sqlite import SqliteStore

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

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: easy to read out and type
CODE_LENGTH = 8


class PairingError(LookupError):
    """No pending request has this code (never issued, already used, or expired)."""


@dataclass(frozen=True, slots=True)
class PairingRequest:
    code: str
    provider: str
    user_id: str
    chat_id: str
    user_name: str | None
    created_at: float
    expires_at: float
    new: bool = False  # issued by this call (not an earlier, still valid code)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("new")
        return d


@dataclass(frozen=True, slots=True)
class Approval:
    provider: str
    user_id: str
    user_name: str | None
    approved_at: float
    approved_by: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalize_code(code: str) -> str:
    """What an admin types: any case, with dashes or spaces (``abcd-2345``)."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def format_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}" if len(code) == CODE_LENGTH else code


class PairingStore:
    def __init__(self, store: SqliteStore, *, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock

    async def migrate(self) -> None:
        await self.store.migrate_component(COMPONENT, MIGRATIONS)

    async def is_approved(self, provider: str, user_id: str) -> bool:
        row = await (await self.store.db.execute(
            "SELECT 1 FROM pairing_approvals WHERE provider = ? AND user_id = ?",
            (provider, user_id))).fetchone()
        return row is not None

    async def request(self, provider: str, user_id: str, chat_id: str,
                      user_name: str | None, ttl: float) -> PairingRequest:
        """The user's valid code, or a new one."""
        db, now = self.store.db, self.clock()
        await db.execute("DELETE FROM pairing_requests WHERE expires_at <= ?", (now,))
        await db.commit()
        for _ in range(10):
            row = await (await db.execute(
                "SELECT * FROM pairing_requests WHERE provider = ? AND user_id = ?",
                (provider, user_id))).fetchone()
            if row is not None:
                return _request(row)
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
            try:
                await db.execute(
                    "INSERT INTO pairing_requests (code, provider, user_id, chat_id, user_name,"
                    " created_at, expires_at) VALUES (?,?,?,?,?,?,?)",
                    (code, provider, user_id, chat_id, user_name, now, now + ttl))
            except sqlite3.IntegrityError:
                continue  # a code taken by someone else, or this user asked twice at once
            await db.commit()
            return PairingRequest(code, provider, user_id, chat_id, user_name, now, now + ttl,
                                  new=True)
        raise RuntimeError("could not draw an unused pairing code")

    async def approve(self, code: str, *, by: str) -> Approval:
        db, now = self.store.db, self.clock()
        row = await (await db.execute(
            "SELECT * FROM pairing_requests WHERE code = ? AND expires_at > ?",
            (normalize_code(code), now))).fetchone()
        if row is None:
            raise PairingError(f"no pending pairing request has the code {code.strip()!r} "
                               "(codes expire; ask the user to write again for a new one)")
        approval = Approval(row["provider"], row["user_id"], row["user_name"], now, by)
        await db.execute(
            "INSERT INTO pairing_approvals (provider, user_id, user_name, approved_at,"
            " approved_by) VALUES (?,?,?,?,?) ON CONFLICT(provider, user_id) DO UPDATE SET"
            " user_name = excluded.user_name, approved_at = excluded.approved_at,"
            " approved_by = excluded.approved_by",
            (approval.provider, approval.user_id, approval.user_name, now, by))
        await db.execute("DELETE FROM pairing_requests WHERE code = ?", (row["code"],))
        await db.commit()
        return approval

    async def revoke(self, provider: str, user_id: str) -> bool:
        cur = await self.store.db.execute(
            "DELETE FROM pairing_approvals WHERE provider = ? AND user_id = ?",
            (provider, user_id))
        await self.store.db.commit()
        return cur.rowcount > 0

    async def pending(self) -> list[PairingRequest]:
        rows = await (await self.store.db.execute(
            "SELECT * FROM pairing_requests WHERE expires_at > ? ORDER BY created_at",
            (self.clock(),))).fetchall()
        return [_request(r) for r in rows]

    async def approved(self) -> list[Approval]:
        rows = await (await self.store.db.execute(
            "SELECT * FROM pairing_approvals ORDER BY approved_at")).fetchall()
        return [Approval(r["provider"], r["user_id"], r["user_name"], r["approved_at"],
                         r["approved_by"]) for r in rows]


def _request(row: Any) -> PairingRequest:
    return PairingRequest(row["code"], row["provider"], row["user_id"], row["chat_id"],
                          row["user_name"], row["created_at"], row["expires_at"])


# admin queries over runs ------------------------------------------------------------------------

async def recent_runs(store: SqliteStore, *, limit: int = 50, agent: str | None = None,
                      status: str | None = None) -> list[dict[str, Any]]:
    """The newest runs, newest first, with the session they belong to."""
    where, args = [], []
    if agent:
        where.append("r.agent = ?")
        args.append(agent)
    if status:
        where.append("r.status = ?")
        args.append(status)
    sql = ("SELECT r.id, r.agent, r.status, r.input, r.error, r.usage, r.started_at, r.ended_at,"
           " s.key AS session_key FROM runs r JOIN sessions s ON s.id = r.session_id"
           + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY r.started_at DESC LIMIT ?")
    rows = await (await store.db.execute(sql, (*args, limit))).fetchall()
    return [{"id": r["id"], "agent": r["agent"], "status": r["status"],
             "session_key": r["session_key"], "input": _clip(r["input"]), "error": r["error"],
             "usage": json.loads(r["usage"]) if r["usage"] else {},
             "started_at": r["started_at"], "ended_at": r["ended_at"]} for r in rows]


def _clip(text: str | None, limit: int = 300) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "…"


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
