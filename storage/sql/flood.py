"""Flood control in SQL: per destination (provider, chat), the moment (seconds since the epoch)
before which nothing may be sent to it — a platform's retry-after — kept so that a gateway
restarted inside the window still waits it out.

Written in the SQL both engines speak (``?`` placeholders, ``INSERT … ON CONFLICT``): SQLite and
PostgreSQL run the same part over their own engine.
"""

from __future__ import annotations

import time
from typing import Any

COMPONENT = "flood"
MIGRATIONS: list[Any] = [
    """
    CREATE TABLE IF NOT EXISTS flood_holds (
        provider TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        hold_until REAL NOT NULL,
        PRIMARY KEY (provider, chat_id)
    );
    """,
]


class SqlFlood:
    """On a database several instances share, a hold is kept on the database's clock: the
    caller's times (its own clock) are turned into offsets from its ``now`` on the way in and
    back into its clock on the way out, so an instance whose clock is off holds a chat exactly
    as long as the platform asked, as every other instance sees it."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._db_clock = bool(getattr(engine, "shared", False))
        # (PostgreSQL, several instances) the channel a new hold is told on, by the statement
        # that keeps it: ``hold|<provider>|<chat>|<seconds left>`` (see FloodControl.heard)
        self.notify: str | None = None

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def hold(self, provider: str, chat_id: str, until: float) -> None:
        if self._db_clock:
            now = self.engine.now_sql
            keep = ("INSERT INTO flood_holds (provider, chat_id, hold_until) VALUES"
                    f" (?,?,{now} + ?) ON CONFLICT (provider, chat_id) DO UPDATE SET"
                    " hold_until = excluded.hold_until"
                    " WHERE excluded.hold_until > flood_holds.hold_until")
            params: tuple[Any, ...] = (provider, chat_id, until - time.time())
            if self.notify is not None:  # (a later hold kept already: nothing to tell)
                keep = (f"WITH h AS ({keep} RETURNING provider, chat_id, hold_until - {now}"
                        " AS left_s) SELECT pg_notify(?, 'hold|' || provider || '|' || chat_id"
                        " || '|' || left_s::text) FROM h")
                params = (*params, self.notify)
            await self.engine.write((keep, params))
            return
        await self.engine.write((
            "INSERT INTO flood_holds (provider, chat_id, hold_until) VALUES (?,?,?)"
            " ON CONFLICT (provider, chat_id) DO UPDATE SET hold_until = excluded.hold_until"
            " WHERE excluded.hold_until > flood_holds.hold_until", (provider, chat_id, until)))

    async def holds(self, now: float) -> list[tuple[str, str, float]]:
        if self._db_clock:  # (until, in the caller's clock: its now + what is left)
            rows = await self.engine.fetchall(
                f"SELECT provider, chat_id, hold_until - {self.engine.now_sql} + ? FROM"
                f" flood_holds WHERE hold_until > {self.engine.now_sql}", (now,))
            return [(r[0], r[1], float(r[2])) for r in rows]
        rows = await self.engine.fetchall(
            "SELECT provider, chat_id, hold_until FROM flood_holds WHERE hold_until > ?", (now,))
        return [(r[0], r[1], float(r[2])) for r in rows]

    async def current(self, now: float) -> list[tuple[str, str, float]]:
        """:meth:`prune`, then :meth:`holds` — in one statement on a shared database."""
        if not self._db_clock:
            await self.prune(now)
            return await self.holds(now)
        clock = self.engine.now_sql
        rows = await self.engine.read(lambda conn: conn.execute(
            f"WITH gone AS (DELETE FROM flood_holds WHERE hold_until <= {clock})"
            f" SELECT provider, chat_id, hold_until - {clock} + ? FROM flood_holds"
            f" WHERE hold_until > {clock}", (now,)).fetchall())
        return [(r[0], r[1], float(r[2])) for r in rows]

    async def prune(self, now: float) -> int:
        if self._db_clock:
            return await self.engine.write((
                f"DELETE FROM flood_holds WHERE hold_until <= {self.engine.now_sql}", ()))
        return await self.engine.write(("DELETE FROM flood_holds WHERE hold_until <= ?", (now,)))
