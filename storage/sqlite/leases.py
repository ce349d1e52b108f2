"""Leases: a named thing held by one owner at a time, for a while, with a fencing token.

Several gateway instances share one database; a lease says which of them holds a chat's
intake, a session's runs, or a single-owner connection (a Telegram long poll, a Discord
gateway session, a Slack socket). The holder renews it before it runs out; when an instance
dies its leases run out and another takes them. Every takeover increases the lease's
``token``: a renewal or a release that carries an old token fails, so an instance that was
paused past its lease learns it lost it instead of acting as its holder (fencing). Time is
the database's clock, so instances' clocks need not agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pluto.storage.sql import Engine

COMPONENT = "leases"
MIGRATIONS: list[Any] = [
    """
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        token INTEGER NOT NULL,
        until REAL NOT NULL
    );
    CREATE INDEX leases_owner ON leases(owner);
    """,
]


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    owner: str
    token: int
    until: float


class SqlLeases:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._now = engine.now_sql

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        """Take the lease if it is free, ran out, or is already ``owner``'s; its token, or
        None when someone else holds it. Taking it from someone else increases the token."""
        now = self._now

        def take(conn: Any) -> int | None:
            row = conn.execute(
                f"INSERT INTO leases (name, owner, token, until) VALUES (?, ?, 1, {now} + ?)"
                f" ON CONFLICT(name) DO UPDATE SET"
                f" token = CASE WHEN leases.owner = excluded.owner THEN leases.token"
                f" ELSE leases.token + 1 END, owner = excluded.owner, until = excluded.until"
                f" WHERE leases.owner = excluded.owner OR leases.until < {now}"
                f" RETURNING token", (name, owner, ttl)).fetchone()
            return int(row[0]) if row is not None else None

        return await self.engine.transact(take)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        """Extend the lease; False when it is no longer this owner's with this token."""
        return await self.engine.write((
            f"UPDATE leases SET until = {self._now} + ? WHERE name = ? AND owner = ?"
            f" AND token = ?", (ttl, name, owner, token))) > 0

    async def renew_all(self, owner: str, tokens: dict[str, int], ttl: float) -> set[str]:
        """Renew many leases in one change; the names among them that are lost."""
        now = self._now

        def renew(conn: Any) -> set[str]:
            lost = set()
            for name, token in tokens.items():
                if conn.execute(f"UPDATE leases SET until = {now} + ? WHERE name = ? AND"
                                f" owner = ? AND token = ?", (ttl, name, owner, token)
                                ).rowcount == 0:
                    lost.add(name)
            return lost

        return await self.engine.transact(renew) if tokens else set()

    async def release(self, name: str, owner: str, token: int) -> bool:
        """Give the lease up (it is free at once); False when it was not held so."""
        return await self.engine.write((
            "DELETE FROM leases WHERE name = ? AND owner = ? AND token = ?",
            (name, owner, token))) > 0

    async def holder(self, name: str) -> Lease | None:
        """Who holds the lease now (None: nobody, or it ran out)."""
        row = await self.engine.fetchone(
            f"SELECT name, owner, token, until FROM leases WHERE name = ? AND until >= {self._now}",
            (name,))
        return Lease(row[0], row[1], int(row[2]), float(row[3])) if row is not None else None

    async def held(self, prefix: str = "") -> list[Lease]:
        """Every live lease whose name starts with ``prefix``."""
        rows = await self.engine.fetchall(
            f"SELECT name, owner, token, until FROM leases WHERE until >= {self._now}"
            f" AND substr(name, 1, ?) = ? ORDER BY name", (len(prefix), prefix))
        return [Lease(r[0], r[1], int(r[2]), float(r[3])) for r in rows]
