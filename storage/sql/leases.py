"""Leases: a named thing held by one owner at a time, for a while, with a fencing token.

Several gateway instances share one database; a lease says which of them holds a chat's
intake, a session's runs, or a single-owner connection (a Telegram long poll, a Discord
gateway session, a Slack socket). The holder renews it before it runs out; when an instance
dies its leases run out and another takes them. Every takeover increases the lease's
``token``: a renewal or a release that carries an old token fails, so an instance that was
paused past its lease learns it lost it instead of acting as its holder (fencing). Time is
the database's clock, so instances' clocks need not agree.

A token only ever grows: on PostgreSQL every take (of any lease) draws the next number of one
sequence, so a lease released and taken again never hands out a token seen before — a write
fenced with an old token (``WHERE EXISTS (SELECT 1 FROM leases WHERE name = ? AND token = ?)``,
:func:`fenced`) is refused once anyone took the lease since, even after a release. (SQLite
serves one process, which holds every lease at once: there the next token is the largest
kept + 1.) All the leases of an owner are renewed by one statement, and a lease that ran out
can be taken from its holder only when the taker says so (``takeover``): an instance that
was itself cut off from the database waits a lease's length after it is back before it takes
anything over, so an outage every instance saw hands no live work around.

A take that finds the lease held marks it ``waiting`` (on the row it found, in the same
statement); only the release of a lease so marked notifies (``free|<name>``, PostgreSQL): a
release nobody waited for costs no notification to every instance.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pluto.storage.sql import Engine, Statement

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
    # tokens that only grow, across releases (see the module)
    {"sqlite": "SELECT 1",
     "postgres": "ALTER TABLE leases ALTER COLUMN token TYPE BIGINT;"
                 " CREATE SEQUENCE lease_tokens;"
                 " SELECT setval('lease_tokens', COALESCE((SELECT MAX(token) FROM leases), 0) + 1,"
                 " false)"},
    # whether the holder took it from another (that stopped renewing it) rather than free
    "ALTER TABLE leases ADD COLUMN taken INTEGER NOT NULL DEFAULT 0",
    # whether someone tried to take it while it was held (its release tells them: the only
    # release that notifies)
    "ALTER TABLE leases ADD COLUMN waiting INTEGER NOT NULL DEFAULT 0",
]
_NEXT_TOKEN = {"postgres": "nextval('lease_tokens')",
               "sqlite": "(SELECT COALESCE(MAX(token), 0) + 1 FROM leases)"}
# the names among a list given as one parameter (a list on PostgreSQL, JSON text on SQLite)
_NAMES_IN = {"postgres": "name = ANY(?)", "sqlite": "name IN (SELECT value FROM json_each(?))"}


def fenced(lease: str = "?", token: str = "?") -> str:
    """The condition a write fenced by a lease adds to its statement: the lease still carries
    the token it was taken with (nobody took it since). (A transaction left open past the
    lease, by a process paused before its COMMIT, is ended by the server:
    ``idle_in_transaction_session_timeout``, storage/postgres/engine.py.)"""
    return f"EXISTS (SELECT 1 FROM leases WHERE name = {lease} AND token = {token})"


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
        self._next = _NEXT_TOKEN.get(engine.dialect, _NEXT_TOKEN["sqlite"])
        self._names_in = _NAMES_IN.get(engine.dialect, _NAMES_IN["sqlite"])
        # several instances (PostgreSQL): the channel told of each lease released, in the
        # statement that releases it ("free|<name>": who waits for it tries again)
        self.notify: str | None = None

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def acquire(self, name: str, owner: str, ttl: float, *,
                      takeover: bool = True) -> int | None:
        """Take the lease if it is free, ran out (and ``takeover``), or is already ``owner``'s;
        its token, or None when someone else holds it. Taken anew, it gets a new token, larger
        than any before (kept when ``owner`` holds it already)."""
        took = await self.take(name, owner, ttl, takeover=takeover)
        return took[0] if took is not None else None

    async def take(self, name: str, owner: str, ttl: float, *,
                   takeover: bool = True) -> tuple[int, bool] | None:
        """:meth:`acquire`, and whether the lease was taken from another owner (whose lease
        ran out) rather than found free: (token, taken), or None."""
        rows = [r for r in await self._returning(*self._take(name, owner, ttl, takeover))
                if r[2] == owner]  # (a row of another owner: it holds it, now marked waiting)
        return (int(rows[0][0]), bool(rows[0][1])) if rows else None

    async def take_reading(self, name: str, owner: str, ttl: float, read: Statement, *,
                           takeover: bool = True) -> tuple[tuple[int, bool] | None, list[Any]]:
        """:meth:`take`, and the rows of ``read`` (a SELECT whose first column is never
        NULL; rows read by position) once it is taken — in one statement on PostgreSQL
        (``read`` sees the database as it was when the statement began: a message it finds
        unhandled that the last holder handled meanwhile is refused by the claim's fence,
        never run twice); two elsewhere. (None, []) when another holds the lease."""
        if self.engine.dialect != "postgres":
            took = await self.take(name, owner, ttl, takeover=takeover)
            return took, [] if took is None else await self.engine.fetchall(*read)
        sql, params = self._take(name, owner, ttl, takeover)
        rows = await self.engine.fetchall(
            f"WITH t AS ({sql}), l AS (SELECT token, taken FROM t WHERE owner = ?)"
            f" SELECT l.token AS lease_token, l.taken AS lease_taken, r.*"
            f" FROM l LEFT JOIN LATERAL ({read[0]}) r ON true", (*params, owner, *read[1]))
        if not rows:
            return None, []
        took = (int(rows[0][0]), bool(rows[0][1]))
        return took, [tuple(r)[2:] for r in rows if r[2] is not None]

    async def take_along(self, name: str, owner: str, ttl: float,
                         parts: list[tuple[str, Statement]], result: str, read: Statement, *,
                         only_if: str, takeover: bool = True,
                         after: Sequence[tuple[str, Statement]] = ()
                         ) -> tuple[Any, tuple[int, bool] | None, list[Any]] | None:
        """(PostgreSQL) :meth:`take_reading` in one statement with other changes: ``parts``,
        data-modifying CTEs (``name AS (statement)``, different rows) made first — the lease
        is taken only if the one named ``only_if`` returned a row — and ``result``, an SQL
        expression over them (a scalar subquery): (its value, the take, the rows of ``read``:
        none when it was not taken). ``after``: CTEs after the take, which may read ``l`` (a
        row when it was taken). ``read`` sees the database as it was before the statement,
        without what ``parts`` wrote. None on another engine (the caller makes them
        apart)."""
        if self.engine.dialect != "postgres":
            return None
        sql, params = self._take(name, owner, ttl, takeover)
        head, _, rest = sql.partition(" VALUES (")
        values, _, tail = rest.partition(") ON CONFLICT")
        sql = f"{head} SELECT {values} FROM {only_if} ON CONFLICT{tail}"
        rows = await self.engine.fetchall(
            "WITH " + ", ".join(f"{n} AS ({s})" for n, (s, _) in parts)
            + f", t AS ({sql}), l AS (SELECT token, taken FROM t WHERE owner = ?)"
            + "".join(f", {n} AS ({s})" for n, (s, _) in after)
            + f" SELECT {result} AS along, l.token AS lease_token,"
            f" l.taken AS lease_taken, r.* FROM (SELECT 1) AS one LEFT JOIN l ON true"
            f" LEFT JOIN LATERAL ({read[0]}) r ON l.token IS NOT NULL",
            (*(p for _, (_, ps) in parts for p in ps), *params, owner,
             *(p for _, (_, ps) in after for p in ps), *read[1]))
        first = tuple(rows[0])
        took = (int(first[1]), bool(first[2])) if first[1] is not None else None
        return first[0], took, [tuple(r)[3:] for r in rows if tuple(r)[3] is not None]

    def _take(self, name: str, owner: str, ttl: float, takeover: bool) -> Statement:
        """Take ``name`` if free, mine, or ran out (and ``takeover``); held by another, the
        row is only marked ``waiting``. Returns (token, taken, owner) of the row as it is
        after: the caller's own when taken."""
        now = self._now
        mine = "leases.owner = excluded.owner"
        free = f"leases.until < {now}" if takeover else "1 = 0"
        return (f"INSERT INTO leases (name, owner, token, until, taken, waiting) VALUES"
                f" (?, ?, {self._next}, {now} + ?, 0, 0)"
                f" ON CONFLICT(name) DO UPDATE SET"
                f" token = CASE WHEN {mine} OR NOT ({free}) THEN leases.token"
                f" ELSE excluded.token END,"
                f" taken = CASE WHEN {mine} THEN leases.taken WHEN {free} THEN 1"
                f" ELSE leases.taken END,"
                f" waiting = CASE WHEN {mine} THEN leases.waiting WHEN {free} THEN 0 ELSE 1 END,"
                f" until = CASE WHEN {mine} OR {free} THEN excluded.until ELSE leases.until END,"
                f" owner = CASE WHEN {mine} OR {free} THEN excluded.owner ELSE leases.owner END"
                f" RETURNING token, taken, owner", (name, owner, ttl))

    async def _returning(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """One change that returns rows, committed: alone on PostgreSQL (one statement is
        atomic by itself: no BEGIN and COMMIT around it), in a transaction on SQLite."""
        if self.engine.dialect == "postgres":  # (the path of every single statement)
            return await self.engine.write_returning_all((sql, params))
        return await self.engine.transact(lambda conn: conn.execute(sql, params).fetchall())

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        """Extend the lease; False when it is no longer this owner's with this token."""
        return await self.engine.write((
            f"UPDATE leases SET until = {self._now} + ? WHERE name = ? AND owner = ?"
            f" AND token = ?", (ttl, name, owner, token))) > 0

    async def renew_all(self, owner: str, tokens: dict[str, int], ttl: float) -> set[str]:
        """Renew many leases in one statement; the names among them that are lost."""
        if not tokens:
            return set()
        names: Any = list(tokens)
        if self.engine.dialect != "postgres":
            names = json.dumps(names)
        # (an instance's own heartbeat that ran out is not renewed: the others may have
        # acted on its death — sent its replies, taken its runs — so it joins again anew)
        rows = await self._returning(
            f"UPDATE leases SET until = {self._now} + ? WHERE owner = ? AND {self._names_in}"
            f" AND (until >= {self._now} OR substr(name, 1, 9) != 'instance:')"
            f" RETURNING name, token", (ttl, owner, names))
        kept = {r[0]: int(r[1]) for r in rows}
        return {name for name, token in tokens.items() if kept.get(name) != token}

    async def release(self, name: str, owner: str, token: int) -> bool:
        """Give the lease up (it is free at once); False when it was not held so."""
        delete: tuple[str, tuple[Any, ...]] = (
            "DELETE FROM leases WHERE name = ? AND owner = ? AND token = ?", (name, owner, token))
        if self.notify is not None:  # (told only if someone tried to take it meanwhile)
            delete = (f"WITH d AS ({delete[0]} RETURNING name, waiting), n AS (SELECT"
                      " pg_notify(?, 'free|' || name) FROM d WHERE waiting <> 0)"
                      " SELECT name FROM d WHERE 0 * (SELECT count(*) FROM n) = 0",
                      (*delete[1], self.notify))
        return await self.engine.write(delete) > 0

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
