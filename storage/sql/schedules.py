"""Schedules and their firings, on both engines: a durable wait is a row.

A schedule says who made it, where its answer goes (provider, chat, thread), which agent runs
with which prompt, and when: ``kind`` ``at`` (once), ``cron`` or ``every``, its ``expr`` and time
zone. ``next_due`` is the next firing in UTC seconds (NULL once a one-off has fired, or for a
schedule cancelled). The store does not read the expressions: the caller works out when a
schedule is due next (:mod:`pluto.gateway.schedules.recurrence`) and hands that in.

**A firing is claimed by one statement.** :meth:`SqlSchedules.claim` moves a schedule's
``next_due`` on, from exactly the value the caller saw, and records the firing in the same
transaction (on PostgreSQL the row is picked ``FOR UPDATE SKIP LOCKED``, so instances that race
for it do not even wait on each other). However many instances look at a due schedule, one
statement changes it: that instance fires it, the others find nothing. ``next_due`` always
moves past *now*, so a gateway that was down for a day fires once (or records ``missed``), never
a catch-up burst. Time is the database's clock (``engine.now_sql``) unless a test hands in one.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields
from typing import Any

from pluto.storage.sql import Engine

COMPONENT = "schedules"
MIGRATIONS: list[Any] = [
    """
    CREATE TABLE schedules (
        id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        owner_provider TEXT,
        owner_user TEXT,
        provider TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        thread_id TEXT,
        is_direct INTEGER NOT NULL DEFAULT 1,
        agent TEXT NOT NULL,
        prompt TEXT NOT NULL,
        kind TEXT NOT NULL,
        expr TEXT NOT NULL,
        tz TEXT NOT NULL,
        next_due REAL,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL,
        active INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX schedules_due ON schedules(next_due) WHERE active = 1;
    CREATE INDEX schedules_owner ON schedules(owner_provider, owner_user, active);
    CREATE TABLE schedule_firings (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        schedule_id TEXT NOT NULL,
        due REAL NOT NULL,
        fired_at REAL NOT NULL,
        outcome TEXT NOT NULL,
        run_id TEXT,
        instance TEXT,
        detail TEXT
    );
    CREATE INDEX schedule_firings_schedule ON schedule_firings(schedule_id, id);
    """,
]

# the outcomes a firing records: claimed (being fired), queued (in its chat's inbox: the chat's
# holder runs it in its turn), then ran, quiet (the agent had nothing to report: nothing sent),
# stopped (/stop, or the gateway stopped), failed; missed (too late: not run)
OUTCOMES = ("claimed", "queued", "ran", "quiet", "stopped", "failed", "missed")
PENDING = ("claimed", "queued")  # not over yet


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    source: str  # "user" (/remind), "admin" (the CLI), "file" (schedules.yaml)
    owner_provider: str | None
    owner_user: str | None
    provider: str
    chat_id: str
    thread_id: str | None
    is_direct: bool
    agent: str
    prompt: str
    kind: str  # at | cron | every
    expr: str
    tz: str
    next_due: float | None
    created_by: str
    created_at: float
    active: bool


@dataclass(frozen=True, slots=True)
class Firing:
    id: int
    schedule_id: str
    due: float
    fired_at: float
    outcome: str
    run_id: str | None = None
    instance: str | None = None
    detail: str | None = None


_COLUMNS = tuple(f.name for f in fields(Schedule))
_FIRING_COLUMNS = tuple(f.name for f in fields(Firing))


def _schedule(r: Any) -> Schedule:
    values = dict(zip(_COLUMNS, tuple(r)))
    values["is_direct"] = bool(values["is_direct"])
    values["active"] = bool(values["active"])
    return Schedule(**values)


def _firing(r: Any) -> Firing:
    return Firing(*tuple(r))


def _among(providers: Collection[str] | None) -> tuple[str, tuple[str, ...]]:
    if providers is None:
        return "", ()
    names = tuple(providers) or ("",)
    return f" AND provider IN ({', '.join('?' * len(names))})", names


_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM schedules"
_SELECT_FIRING = f"SELECT {', '.join(_FIRING_COLUMNS)} FROM schedule_firings"


class SqlSchedules:
    def __init__(self, engine: Engine):
        self.engine = engine
        # now, in seconds since the epoch: the database's clock (one clock for every instance)
        # unless a test hands in its own
        self.clock: Callable[[], float] | None = None

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def now(self) -> float:
        if self.clock is not None:
            return self.clock()
        row = await self.engine.fetchone(f"SELECT {self.engine.now_sql}")
        return float(row[0]) if row is not None else time.time()

    # schedules ---------------------------------------------------------------------------

    async def add(self, schedule: Schedule) -> Schedule:
        values = tuple(getattr(schedule, c) for c in _COLUMNS)
        values = tuple(int(v) if isinstance(v, bool) else v for v in values)
        await self.engine.write((
            f"INSERT INTO schedules ({', '.join(_COLUMNS)}) VALUES"
            f" ({', '.join('?' * len(_COLUMNS))})", values))
        return schedule

    async def put(self, schedule: Schedule, *, keep_due: bool = False) -> None:
        """Insert or replace a schedule by id (schedules.yaml's, kept in step with the file);
        its firings stay. ``keep_due``: an existing row keeps its ``next_due`` and ``active``
        (only what it says changed: another instance may be claiming it meanwhile)."""
        values = tuple(int(v) if isinstance(v, bool) else v
                       for v in (getattr(schedule, c) for c in _COLUMNS))
        kept = ("id", "created_at") + (("next_due", "active") if keep_due else ())
        updates = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS if c not in kept)
        await self.engine.write((
            f"INSERT INTO schedules ({', '.join(_COLUMNS)}) VALUES"
            f" ({', '.join('?' * len(_COLUMNS))}) ON CONFLICT(id) DO UPDATE SET {updates}",
            values))

    async def get(self, schedule_id: str) -> Schedule | None:
        row = await self.engine.fetchone(f"{_SELECT} WHERE id = ?", (schedule_id,))
        return _schedule(row) if row is not None else None

    async def list(self, *, owner: tuple[str, str] | None = None, source: str | None = None,
                   active: bool = True) -> list[Schedule]:
        """Schedules, soonest first (``owner``: (provider, user id) of the person who made
        them; ``active``: only those that will fire again)."""
        where, params = ["1 = 1"], []
        if owner is not None:
            where.append("owner_provider = ? AND owner_user = ?")
            params += list(owner)
        if source is not None:
            where.append("source = ?")
            params.append(source)
        if active:
            where.append("active = 1")
        rows = await self.engine.fetchall(
            f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY next_due IS NULL, next_due, id",
            tuple(params))
        return [_schedule(r) for r in rows]

    async def count(self, owner: tuple[str, str]) -> int:
        """The active schedules a person made."""
        row = await self.engine.fetchone(
            "SELECT COUNT(*) FROM schedules WHERE owner_provider = ? AND owner_user = ?"
            " AND active = 1", owner)
        return int(row[0]) if row is not None else 0

    async def cancel(self, schedule_id: str, *, owner: tuple[str, str] | None = None) -> bool:
        """Stop a schedule for good (``owner``: only when that person made it); whether one
        was active. It stays listed in the history."""
        sql = "UPDATE schedules SET active = 0, next_due = NULL WHERE id = ? AND active = 1"
        params: tuple[Any, ...] = (schedule_id,)
        if owner is not None:
            sql += " AND owner_provider = ? AND owner_user = ?"
            params += owner
        return await self.engine.write((sql, params)) > 0

    async def remove(self, schedule_id: str) -> bool:
        """Delete a schedule and its history (``pluto schedule rm``); whether it existed."""
        def remove(conn: Any) -> int:
            conn.execute("DELETE FROM schedule_firings WHERE schedule_id = ?", (schedule_id,))
            return conn.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,)).rowcount
        return await self.engine.transact(remove) > 0

    async def due_now(self, schedule_id: str) -> bool:
        """``run-now``: the schedule is due at once (the next look claims it; recurring ones
        go on from then); whether it exists."""
        now = await self.now()
        return await self.engine.write((
            "UPDATE schedules SET next_due = ?, active = 1 WHERE id = ?",
            (now, schedule_id))) > 0

    async def soonest(self, providers: Collection[str] | None = None
                      ) -> tuple[float, float | None]:
        """(now, the soonest due time of any active schedule into ``providers``), in one
        statement: what an idle scheduler asks."""
        params: tuple[Any, ...]
        if self.clock is not None:
            now_sql, params = "?", (self.clock(),)
        else:
            now_sql, params = self.engine.now_sql, ()
        among, names = _among(providers)
        row = await self.engine.fetchone(
            f"SELECT {now_sql}, MIN(next_due) FROM schedules WHERE active = 1"
            f" AND next_due IS NOT NULL{among}", (*params, *names))
        assert row is not None  # (an aggregate: always one row)
        return float(row[0]), (float(row[1]) if row[1] is not None else None)

    async def next_due(self, providers: Collection[str] | None = None) -> float | None:
        """The soonest due time of any active schedule (``providers``: into those only)."""
        among, params = _among(providers)
        row = await self.engine.fetchone(
            "SELECT MIN(next_due) FROM schedules WHERE active = 1 AND next_due IS NOT NULL"
            f"{among}", params)
        return float(row[0]) if row is not None and row[0] is not None else None

    # firings ------------------------------------------------------------------------------

    async def due(self, limit: int = 100, *, providers: Collection[str] | None = None
                  ) -> tuple[float, builtins.list[Schedule]]:
        """(now, the active schedules due by now, oldest first; ``providers``: only those
        that go to one of them — an instance fires only into the chats it can reach)."""
        params: tuple[Any, ...]
        if self.clock is not None:
            now_sql, params = "?", (self.clock(),)
        else:
            now_sql, params = self.engine.now_sql, ()
        among, names = _among(providers)
        rows = await self.engine.fetchall(
            f"SELECT {now_sql} AS now, {', '.join(_COLUMNS)} FROM schedules WHERE active = 1"
            f" AND next_due <= {now_sql}{among} ORDER BY next_due LIMIT ?",
            (*params, *params, *names, limit))
        if not rows:
            return (self.clock() if self.clock is not None else await self.now()), []
        return float(rows[0][0]), [_schedule(tuple(r)[1:]) for r in rows]

    async def claim(self, schedule: Schedule, *, now: float, next_due: float | None,
                    missed: bool, instance: str | None = None) -> Firing | None:
        """Claim the firing ``schedule.next_due``: move ``next_due`` on to ``next_due`` (None:
        the schedule is done) and record the firing (``missed``: recorded, not to be run), in
        one transaction; the firing, or None when another instance claimed it first."""
        due = schedule.next_due
        if due is None:
            return None
        pick = "SELECT id FROM schedules WHERE id = ? AND next_due = ? AND active = 1"
        if self.engine.dialect == "postgres":
            pick += " FOR UPDATE SKIP LOCKED"
        outcome = "missed" if missed else "claimed"

        def claim(conn: Any) -> Firing | None:
            moved = conn.execute(
                f"UPDATE schedules SET next_due = ?, active = ? WHERE id IN ({pick})",
                (next_due, int(next_due is not None), schedule.id, due)).rowcount
            if moved != 1:
                return None
            row = conn.execute(
                "INSERT INTO schedule_firings (schedule_id, due, fired_at, outcome, instance)"
                f" VALUES (?, ?, ?, ?, ?) RETURNING {', '.join(_FIRING_COLUMNS)}",
                (schedule.id, due, now, outcome, instance)).fetchone()
            return _firing(row)

        return await self.engine.transact(claim)

    async def fired(self, firing_id: int, outcome: str | None, *, run_id: str | None = None,
                    detail: str | None = None) -> None:
        """What became of a claimed firing (None: unchanged)."""
        await self.engine.write((
            "UPDATE schedule_firings SET outcome = COALESCE(?, outcome),"
            " run_id = COALESCE(?, run_id),"
            " detail = COALESCE(?, detail) WHERE id = ?", (outcome, run_id, detail, firing_id)))

    async def queued(self, firing_id: int) -> None:
        """The claimed firing is in its chat's inbox (an outcome recorded meanwhile stays)."""
        await self.engine.write((
            "UPDATE schedule_firings SET outcome = 'queued' WHERE id = ? AND outcome = 'claimed'",
            (firing_id,)))

    async def firing(self, firing_id: int) -> Firing | None:
        rows = await self.engine.fetchall(f"{_SELECT_FIRING} WHERE id = ?", (firing_id,))
        return _firing(rows[0]) if rows else None

    async def stranded(self, alive: Collection[str], older_than: float,
                       providers: Collection[str] | None = None
                       ) -> builtins.list[tuple[Firing, Schedule]]:
        """Firings claimed by an instance that is no longer alive (``alive``: the ids that
        are) and never handed over (no run), claimed more than ``older_than`` seconds ago:
        what a crash between the claim and the hand-over left."""
        params: tuple[Any, ...]
        if self.clock is not None:
            now_sql, params = "?", (self.clock(),)
        else:
            now_sql, params = self.engine.now_sql, ()
        live = tuple(alive) or ("",)
        among, names = _among(providers)
        rows = await self.engine.fetchall(
            f"SELECT {', '.join('f.' + c for c in _FIRING_COLUMNS)},"
            f" {', '.join('s.' + c for c in _COLUMNS)} FROM schedule_firings f JOIN schedules s"
            " ON s.id = f.schedule_id WHERE f.outcome = 'claimed' AND f.run_id IS NULL"
            f" AND f.fired_at < {now_sql} - ? AND COALESCE(f.instance, '') NOT IN"
            f" ({', '.join('?' * len(live))}){among.replace('provider', 's.provider')}"
            " ORDER BY f.id", (*params, older_than, *live, *names))
        n = len(_FIRING_COLUMNS)
        return [(_firing(tuple(r)[:n]), _schedule(tuple(r)[n:])) for r in rows]

    async def adopt(self, firing: Firing, instance: str, *, now: float) -> bool:
        """Take over a stranded firing (one statement: of several instances, one wins)."""
        return await self.engine.write((
            "UPDATE schedule_firings SET instance = ?, fired_at = ? WHERE id = ?"
            " AND outcome = 'claimed' AND run_id IS NULL AND COALESCE(instance, '') = ?",
            (instance, now, firing.id, firing.instance or ""))) > 0

    async def history(self, schedule_id: str | None = None,
                      limit: int = 50) -> builtins.list[Firing]:
        """The newest firings first (of one schedule, or of all)."""
        if schedule_id is None:
            rows = await self.engine.fetchall(f"{_SELECT_FIRING} ORDER BY id DESC LIMIT ?",
                                              (limit,))
        else:
            rows = await self.engine.fetchall(
                f"{_SELECT_FIRING} WHERE schedule_id = ? ORDER BY id DESC LIMIT ?",
                (schedule_id, limit))
        return [_firing(r) for r in rows]
