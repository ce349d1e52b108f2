"""The admin console's accounts, sign-in sessions, API keys and audit log (gateway/console).

Passwords are kept as argon2 hashes (made and checked off the event loop by the console); a
session or an API key is kept as the SHA-256 of its secret, so the database never holds one
that works. Sessions live here, not in a process: with several instances, a person signed in
on one is signed in on all, and signing out (or an owner revoking a key) holds everywhere at
once. The audit log is append-only: who, when, what, and the change itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from pluto.storage.sql import Engine

COMPONENT = "console"
MIGRATIONS = [
    """
    CREATE TABLE console_accounts (
        username TEXT PRIMARY KEY,
        password_hash TEXT,
        role TEXT NOT NULL,
        source TEXT NOT NULL DEFAULT 'local',
        created_at REAL NOT NULL,
        disabled INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE console_sessions (
        id TEXT PRIMARY KEY,
        username TEXT NOT NULL,
        role TEXT NOT NULL,
        csrf TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE INDEX console_sessions_user ON console_sessions(username);
    CREATE TABLE console_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        role TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        diff TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_log_at ON audit_log(at);
    CREATE TABLE console_logins (
        id TEXT PRIMARY KEY,
        data TEXT NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
]


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Account:
    username: str
    password_hash: str | None
    role: str
    source: str  # local | oidc
    created_at: float
    disabled: bool


@dataclass(frozen=True, slots=True)
class SignIn:
    username: str
    role: str
    csrf: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    name: str
    role: str
    created_by: str
    created_at: float
    revoked_at: float | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: float
    actor: str
    role: str
    action: str
    target: str
    diff: str
    detail: dict[str, Any]


def _account(r: Any) -> Account:
    return Account(r["username"], r["password_hash"], r["role"], r["source"], r["created_at"],
                   bool(r["disabled"]))


def _key(r: Any) -> ApiKey:
    return ApiKey(r["id"], r["name"], r["role"], r["created_by"], r["created_at"],
                  r["revoked_at"])


class SqlConsole:
    def __init__(self, engine: Engine):
        self.engine = engine

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    # accounts ------------------------------------------------------------------------------

    async def account(self, username: str) -> Account | None:
        row = await self.engine.fetchone("SELECT * FROM console_accounts WHERE username = ?",
                                         (username,))
        return _account(row) if row is not None else None

    async def accounts(self) -> list[Account]:
        return [_account(r) for r in await self.engine.fetchall(
            "SELECT * FROM console_accounts ORDER BY username")]

    async def put_account(self, username: str, role: str, *, password_hash: str | None,
                          source: str = "local") -> None:
        """Create the account, or change its role (and its password, when one is given)."""
        await self.engine.write((
            "INSERT INTO console_accounts (username, password_hash, role, source, created_at)"
            " VALUES (?,?,?,?,?) ON CONFLICT(username) DO UPDATE SET role = excluded.role,"
            " password_hash = COALESCE(excluded.password_hash, console_accounts.password_hash),"
            " disabled = 0", (username, password_hash, role, source, time.time())))

    async def remove_account(self, username: str) -> bool:
        """The account and its sessions, gone."""
        return await self.engine.write(
            ("DELETE FROM console_sessions WHERE username = ?", (username,)),
            ("DELETE FROM console_accounts WHERE username = ?", (username,))) > 0

    async def owners(self) -> int:
        row = await self.engine.fetchone(
            "SELECT count(*) AS n FROM console_accounts WHERE role = 'owner' AND disabled = 0")
        return int(row["n"]) if row is not None else 0

    # sessions ------------------------------------------------------------------------------

    async def open_session(self, token: str, username: str, role: str, csrf: str,
                           ttl: float) -> SignIn:
        now = time.time()
        await self.engine.write(
            ("DELETE FROM console_sessions WHERE expires_at < ?", (now,)),
            ("INSERT INTO console_sessions (id, username, role, csrf, created_at, expires_at)"
             " VALUES (?,?,?,?,?,?)", (digest(token), username, role, csrf, now, now + ttl)))
        return SignIn(username, role, csrf, now + ttl)

    async def session(self, token: str) -> SignIn | None:
        """The sign-in a cookie's token stands for (None: unknown, expired, or its account
        was removed or disabled since); its role is the account's role now."""
        row = await self.engine.fetchone(
            "SELECT s.username, a.role, s.csrf, s.expires_at FROM console_sessions s JOIN"
            " console_accounts a ON a.username = s.username WHERE s.id = ? AND"
            " s.expires_at > ? AND a.disabled = 0", (digest(token), time.time()))
        return SignIn(row["username"], row["role"], row["csrf"], row["expires_at"]) \
            if row is not None else None

    async def close_session(self, token: str) -> None:
        await self.engine.write(("DELETE FROM console_sessions WHERE id = ?", (digest(token),)))

    # sign-ins through OpenID Connect under way (state -> nonce, PKCE verifier) -------------

    async def start_login(self, state: str, data: dict[str, Any], ttl: float) -> None:
        now = time.time()
        await self.engine.write(
            ("DELETE FROM console_logins WHERE expires_at < ?", (now,)),
            ("INSERT INTO console_logins (id, data, expires_at) VALUES (?,?,?)",
             (digest(state), json.dumps(data), now + ttl)))

    async def finish_login(self, state: str) -> dict[str, Any] | None:
        """The login ``state`` stands for, taken once (a replayed callback finds nothing)."""
        rows = await self.engine.transact(lambda conn: conn.execute(
            "DELETE FROM console_logins WHERE id = ? AND expires_at > ? RETURNING data",
            (digest(state), time.time())).fetchall())
        return json.loads(rows[0]["data"]) if rows else None

    # API keys ------------------------------------------------------------------------------

    async def add_key(self, key_id: str, name: str, role: str, secret: str,
                      created_by: str) -> ApiKey:
        now = time.time()
        await self.engine.write((
            "INSERT INTO console_keys (id, name, role, key_hash, created_by, created_at)"
            " VALUES (?,?,?,?,?,?)", (key_id, name, role, digest(secret), created_by, now)))
        return ApiKey(key_id, name, role, created_by, now, None)

    async def key(self, secret: str) -> ApiKey | None:
        row = await self.engine.fetchone(
            "SELECT * FROM console_keys WHERE key_hash = ? AND revoked_at IS NULL",
            (digest(secret),))
        return _key(row) if row is not None else None

    async def keys(self) -> list[ApiKey]:
        return [_key(r) for r in await self.engine.fetchall(
            "SELECT * FROM console_keys ORDER BY created_at")]

    async def revoke_key(self, key_id: str) -> bool:
        return await self.engine.write((
            "UPDATE console_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (time.time(), key_id))) > 0

    # the audit log -------------------------------------------------------------------------

    async def audit(self, actor: str, role: str, action: str, target: str, *, diff: str = "",
                    detail: dict[str, Any] | None = None) -> None:
        await self.engine.write((
            "INSERT INTO audit_log (at, actor, role, action, target, diff, detail)"
            " VALUES (?,?,?,?,?,?,?)",
            (time.time(), actor, role, action, target, diff, json.dumps(detail or {}))))

    async def audit_log(self, *, limit: int = 100, before: int | None = None,
                        actor: str | None = None) -> list[AuditEntry]:
        sql, params = "SELECT * FROM audit_log WHERE 1 = 1", list[Any]()
        if before is not None:
            sql += " AND id < ?"
            params.append(before)
        if actor is not None:
            sql += " AND actor = ?"
            params.append(actor)
        rows = await self.engine.fetchall(sql + " ORDER BY id DESC LIMIT ?",
                                          (*params, limit))
        return [AuditEntry(r["id"], r["at"], r["actor"], r["role"], r["action"], r["target"],
                           r["diff"], json.loads(r["detail"] or "{}")) for r in rows]
