"""The usage ledger: one row per model call, written when the call ends, never derived later.

A row says who caused the call (run, session, agent, route, provider, user, chat), what it was
for (``purpose``: the answer, a turn of a tool loop, a compaction, a memory update), which
attempt of it (retries are rows of their own), what the model reported (input, output and
cached tokens; ``estimated`` when it reported none and the runner counted), what it cost (None:
the model's price is unknown), how long it took and how it ended (``ok``, ``retried``,
``error``, ``cancelled``). Time is the database's clock.

Budgets read running sums, not the ledger: each row also adds itself, in the same transaction,
to ``usage_counters`` — one row per agent, route, user and chat per day and month (UTC) — so a
budget check is one lookup however long the ledger grows. An admin's reset of a budget clears
its counters (spending before it no longer counts) and is remembered in ``usage_resets``.

Reservations: before a model call the runner takes its estimated maximum (prompt plus the
longest answer it may write, and that much money) from the counters of every budget that
applies — one conditional ``UPDATE`` per counter, atomic on SQLite and on PostgreSQL (the row
is locked and the condition re-read), so parallel calls from one instance or several never all
see the same room. The call's ledger row gives the reservation back in the same transaction
that adds the real usage (a failed call adds nothing and gives all of it back).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pluto.storage.sql import Engine, Statement, pipelined, run_statements

COMPONENT = "usage"
MIGRATIONS: list[Any] = [
    """
    CREATE TABLE usage_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        run_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        agent TEXT NOT NULL,
        route TEXT NOT NULL,
        provider TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        model TEXT NOT NULL,
        purpose TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL,
        estimated INTEGER NOT NULL,
        cost REAL,
        latency REAL NOT NULL,
        outcome TEXT NOT NULL
    );
    CREATE INDEX usage_calls_ts ON usage_calls(ts);
    CREATE INDEX usage_calls_run ON usage_calls(run_id);
    CREATE INDEX usage_calls_agent ON usage_calls(agent, ts);
    CREATE INDEX usage_calls_user ON usage_calls(provider, user_id, ts);
    CREATE INDEX usage_calls_chat ON usage_calls(provider, chat_id, ts);
    CREATE TABLE usage_resets (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (scope, key)
    );
    """,
    """
    CREATE TABLE usage_counters (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        period TEXT NOT NULL,
        start REAL NOT NULL,
        calls INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL,
        cost REAL NOT NULL,
        unpriced_calls INTEGER NOT NULL,
        PRIMARY KEY (scope, key, period, start)
    );
    CREATE INDEX usage_counters_start ON usage_counters(start);
    """,
    """
    ALTER TABLE usage_counters ADD COLUMN reserved_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage_counters ADD COLUMN reserved_cost REAL NOT NULL DEFAULT 0;
    """,
    # what started the run: a person's message, or a schedule's firing
    "ALTER TABLE usage_calls ADD COLUMN origin TEXT NOT NULL DEFAULT 'message'",
]

# what a ledger can be grouped or budgeted by: the SQL expression of its key (never user input)
KEYS: Mapping[str, str] = {
    "agent": "agent",
    "route": "route",
    "model": "model",
    "provider": "provider",
    "user": "provider || ':' || user_id",
    "chat": "provider || ':' || chat_id",
    "run": "run_id",
    "purpose": "purpose",
    "outcome": "outcome",
    "origin": "origin",
    "day": "day",  # the UTC date of the call, YYYY-MM-DD (each engine's own expression: DAY)
}
DAY: Mapping[str, str] = {
    "sqlite": "strftime('%Y-%m-%d', ts, 'unixepoch')",
    "postgres": "to_char(to_timestamp(ts) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}
# what a person may group the ledger by (the CLI's --by, the admin API's ?by=)
GROUPS = ("agent", "user", "chat", "model", "route", "provider", "origin", "day")
SCOPES = ("agent", "route", "user", "chat")  # what a budget limits (a counter each)
# Every statement that writes counters takes this turn first (Engine.turn_sql): a run's end
# writes eight rows, some shared with runs of other chats (the agent's, the route's); two
# transactions writing theirs in different orders (batches of run ends on two instances)
# deadlocked, a second's stall each (a test: tests/test_usage_turns.py)
COUNTERS_TURN = "pluto usage counters"


@dataclass(frozen=True, slots=True)
class UsageCall:
    """One model call, as the ledger keeps it."""

    run_id: str
    session_id: str
    agent: str
    model: str
    input_tokens: int
    output_tokens: int
    latency: float
    outcome: str  # ok | retried | error | cancelled
    route: str = ""
    provider: str = ""
    user_id: str = ""
    chat_id: str = ""
    purpose: str = "answer"  # answer | tool_loop | compaction | memory
    attempt: int = 0
    cached_tokens: int = 0
    estimated: bool = False
    cost: float | None = None
    origin: str = "message"  # message | schedule: what started the run
    ts: float = 0.0  # set by the database when recorded

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Claim:
    """One counter a reservation is taken from, with the budget's limits (None: no limit)."""

    scope: str
    key: str
    period: str
    start: float
    tokens: int | None = None
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a call took from the counters before it ran; given back when it is recorded."""

    claims: tuple[Claim, ...]
    tokens: int
    cost: float


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """The sums of one group of ledger rows."""

    key: str
    calls: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float
    unpriced_calls: int  # calls whose price is unknown (their cost is not in ``cost``)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "calls": self.calls, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "cached_tokens": self.cached_tokens,
                "total_tokens": self.total_tokens, "cost": round(self.cost, 8),
                "unpriced_calls": self.unpriced_calls}


_COLUMNS = ("run_id", "session_id", "agent", "route", "provider", "user_id", "chat_id", "model",
            "purpose", "attempt", "input_tokens", "output_tokens", "cached_tokens", "estimated",
            "cost", "latency", "outcome", "origin")
_SUMS = ("COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),"
         " COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(cost), 0),"
         " COALESCE(SUM(CASE WHEN cost IS NULL THEN 1 ELSE 0 END), 0)")


def _total(key: str, row: Any) -> UsageTotal:
    return UsageTotal(key, int(row[0]), int(row[1]), int(row[2]), int(row[3]), float(row[4]),
                      int(row[5]))


RIDE_SECONDS = 0.5  # (PostgreSQL) a ledger row held for its run's end goes alone after this


@dataclass(slots=True)
class HeldUsage:
    """(PostgreSQL) Ledger rows of one session's run held to be written in the statement that
    ends the run (:meth:`SqlUsage.take_held`), fenced as that statement is: one round trip
    fewer per answer."""

    engine: Engine
    calls: list[tuple[UsageCall, dict[str, float]]] = field(default_factory=list)
    futures: list[asyncio.Future[int]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None

    def statements(self, guard: str | None = None) -> list[Statement]:
        """The rows and their counters (summed: one statement may change a counter's row
        once), each changing nothing unless the CTE ``guard`` returned a row."""
        stmts = [_ledger_rows(self.engine, [call for call, _ in self.calls], guard)]
        counters: dict[tuple[Any, ...], list[Any]] = {}
        for call, periods in self.calls:
            for row in _counter_rows(call, periods):
                kept = counters.setdefault(row[:4], [0, 0, 0, 0, 0.0, 0])
                for i, v in enumerate((1, *row[4:])):
                    kept[i] += v
        if counters:
            stmts.append(_counters([(*k, *v) for k, v in counters.items()], guard,
                                   self.engine.turn_sql(COUNTERS_TURN)))
        return stmts

    def settle(self, outcome: int | BaseException) -> None:
        """Written (how many rows), refused (0) or failed (the error)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for future in self.futures:
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


class SqlUsage:
    def __init__(self, engine: Engine):
        self.engine = engine
        # (PostgreSQL) ledger rows held, by session, for the statement that ends its run
        self._held: dict[str, HeldUsage] = {}
        self._alone: set[asyncio.Task[None]] = set()

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def record(self, call: UsageCall, periods: Mapping[str, float] | None = None,
                     release: Reservation | None = None) -> None:
        """Add one call to the ledger and to the counters of ``periods`` (``{"day": start,
        "month": start}``), giving back ``release``, in one transaction (committed when this
        returns)."""
        await self.engine.write(*self._statements(call, periods), *self._released(release))

    def record_soon(self, call: UsageCall, periods: Mapping[str, float] | None = None,
                    release: Reservation | None = None) -> asyncio.Future[int]:
        """:meth:`record`, handed over without waiting and held to ride with the next commit
        (a run's answer, most often: one commit for both); the future settles once it is
        committed."""
        if self.engine.dialect == "postgres" and release is None:
            # held for the statement that ends the run (:meth:`take_held`), or alone soon
            # (a reservation given back changes the counters' rows again: a transaction)
            return self._hold(call, periods)
        statements = (*self._statements(call, periods), *self._released(release))
        return self.engine.queue(run_statements(statements), hold=True)

    def _hold(self, call: UsageCall, periods: Mapping[str, float] | None) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        held = self._held.get(call.session_id)
        if held is None:
            held = self._held[call.session_id] = HeldUsage(self.engine)
            held.timer = loop.call_later(RIDE_SECONDS, self._go_alone, call.session_id, held)
        held.calls.append((call, dict(periods or {})))
        held.futures.append(future)
        return future

    def take_held(self, session_id: str) -> HeldUsage | None:
        """(PostgreSQL) The ledger rows held for the run of ``session_id`` now ending: the
        caller writes :meth:`HeldUsage.statements` in its statement and settles them."""
        held = self._held.pop(session_id, None)
        if held is not None and held.timer is not None:
            held.timer.cancel()
            held.timer = None
        return held

    def _go_alone(self, session_id: str, held: HeldUsage) -> None:
        """No run's end took them in time (a tool call follows, the run failed): alone, in
        one statement (different rows)."""
        if self._held.get(session_id) is held:
            del self._held[session_id]
        held.timer = None

        async def write() -> None:
            try:
                await self.engine.write_together(*held.statements())
                held.settle(len(held.calls))
            except Exception as e:  # (the holders of the futures log it)
                held.settle(e)

        task = asyncio.get_running_loop().create_task(write())
        self._alone.add(task)
        task.add_done_callback(self._alone.discard)

    async def reserve(self, claims: tuple[Claim, ...], tokens: int, cost: float,
                      prompt: int) -> int | None:
        """Take ``tokens`` and ``cost`` from every claim's counter, or from none: the index of
        the first claim whose budget has no room (its spent and reserved tokens plus
        ``prompt`` over its limit, or its money spent), else None. Each counter is taken by
        one conditional statement, so concurrent reservations, from any instance, queue on
        the row and each sees the others'."""
        turn = self.engine.turn_sql(COUNTERS_TURN)
        # (the first statement takes the counters' turn: the rest of the change has it)
        made = ("INSERT INTO usage_counters (scope, key, period, start, calls, input_tokens,"
                " output_tokens, cached_tokens, cost, unpriced_calls) "
                + ("VALUES (?, ?, ?, ?, 0, 0, 0, 0, 0, 0)" if turn is None else
                   f"SELECT ?, ?, ?, CAST(? AS DOUBLE PRECISION), 0, 0, 0, 0, 0, 0 WHERE {turn}")
                + " ON CONFLICT(scope, key, period, start) DO NOTHING")

        def change(conn: Any) -> int | None:
            # every claim tried at once (PostgreSQL: one round trip, so the counters' rows
            # and their turn are held that much shorter); when one had no room, what the
            # others took is given back, in the same transaction
            with pipelined(conn):
                tried = [(conn.execute(made, (c.scope, c.key, c.period, c.start)),
                          conn.execute(*_taken(c, tokens, cost, prompt))) for c in claims]
            got = [taken.rowcount == 1 for _, taken in tried]
            if all(got):
                return None
            for sql, params in _released(Reservation(
                    tuple(c for c, ok in zip(claims, got) if ok), tokens, cost)):
                conn.execute(sql, params)
            return got.index(False)
        return await self.engine.transact(change)

    async def release(self, reservation: Reservation) -> None:
        """Give a reservation back without recording a call (its call was never made)."""
        if reservation.claims:
            await self.engine.write(*self._released(reservation))

    def _statements(self, call: UsageCall,
                    periods: Mapping[str, float] | None) -> list[Statement]:
        rows = _counter_rows(call, periods)
        return [_ledger_row(self.engine, call),
                *([_counters([(*r[:4], 1, *r[4:]) for r in rows], None,
                             self.engine.turn_sql(COUNTERS_TURN))] if rows else [])]

    def _released(self, reservation: Reservation | None) -> list[Statement]:
        return _released(reservation, self.engine.turn_sql(COUNTERS_TURN))

    async def calls(self, *, run_id: str | None = None, since: float | None = None,
                    limit: int = 1000) -> list[UsageCall]:
        """Ledger rows, oldest first: a run's, or those since a time."""
        where: list[str] = ["1 = 1"]
        params: list[Any] = []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if since is not None:
            where.append("ts >= ?")
            params.append(since)
        rows = await self.engine.fetchall(
            f"SELECT {', '.join(_COLUMNS)}, ts FROM usage_calls WHERE {' AND '.join(where)}"
            f" ORDER BY id LIMIT ?", (*params, limit))
        return [UsageCall(**{c: r[i] for i, c in enumerate(_COLUMNS)},
                          ts=float(r[len(_COLUMNS)])) for r in rows]

    async def totals(self, by: str, *, since: float | None = None,
                     until: float | None = None, limit: int = 500) -> list[UsageTotal]:
        """Sums grouped by ``by`` (a name in :data:`KEYS`), largest spend first; by ``day``
        (UTC dates), oldest day first."""
        if by not in KEYS:
            raise ValueError(f"cannot group usage by {by!r}; one of: {', '.join(KEYS)}")
        expr = DAY[self.engine.dialect] if by == "day" else KEYS[by]
        order = (f"{expr}" if by == "day" else f"COALESCE(SUM(cost), 0) DESC,"
                 f" SUM(input_tokens + output_tokens) DESC, {expr}")
        where, params = _period(since, until)
        rows = await self.engine.fetchall(
            f"SELECT {expr}, {_SUMS} FROM usage_calls WHERE {where} GROUP BY {expr}"
            f" ORDER BY {order} LIMIT ?", (*params, limit))
        return [_total(str(r[0]), r[1:]) for r in rows]

    async def spent(self, scope: str, key: str, period: str, start: float) -> UsageTotal:
        """What one agent, route, user (``provider:user``) or chat (``provider:chat``) spent
        in the ``period`` ("day", "month") that began at ``start``, since its last reset."""
        if scope not in SCOPES:
            raise ValueError(f"no budget by {scope!r}; one of: {', '.join(SCOPES)}")
        row = await self.engine.fetchone(
            "SELECT calls, input_tokens, output_tokens, cached_tokens, cost, unpriced_calls"
            " FROM usage_counters WHERE scope = ? AND key = ? AND period = ? AND start = ?",
            (scope, key, period, start))
        return _total(key, row if row is not None else (0, 0, 0, 0, 0.0, 0))

    async def counters(self, scope: str, period: str, start: float,
                       limit: int = 200) -> list[UsageTotal]:
        """Every key's counter of one period, the largest spenders first."""
        rows = await self.engine.fetchall(
            "SELECT key, calls, input_tokens, output_tokens, cached_tokens, cost, unpriced_calls"
            " FROM usage_counters WHERE scope = ? AND period = ? AND start = ?"
            " ORDER BY cost DESC, input_tokens + output_tokens DESC, key LIMIT ?",
            (scope, period, start, limit))
        return [_total(str(r[0]), r[1:]) for r in rows]

    async def reset(self, scope: str, key: str) -> None:
        """An admin's reset: what ``key`` spent until now no longer counts for its budgets."""
        turn = self.engine.turn_sql(COUNTERS_TURN)
        await self.engine.write(
            ("DELETE FROM usage_counters WHERE scope = ? AND key = ?"
             + _also(turn), (scope, key)),
            (f"INSERT INTO usage_resets (scope, key, at) VALUES (?, ?, {self.engine.now_sql})"
             f" ON CONFLICT(scope, key) DO UPDATE SET at = excluded.at", (scope, key)))

    async def resets(self) -> dict[tuple[str, str], float]:
        rows = await self.engine.fetchall("SELECT scope, key, at FROM usage_resets")
        return {(r[0], r[1]): float(r[2]) for r in rows}

    async def prune(self, older_than_seconds: float) -> int:
        """Forget calls (and counters of periods that began) longer ago than that."""
        turn = self.engine.turn_sql(COUNTERS_TURN)
        return await self.engine.write(
            (f"DELETE FROM usage_counters WHERE start < {self.engine.now_sql} - ?"
             + _also(turn), (older_than_seconds,)),
            (f"DELETE FROM usage_calls WHERE ts < {self.engine.now_sql} - ?",
             (older_than_seconds,)))


def scope_key(scope: str, call: UsageCall) -> str:
    """The key a call counts under for a budget per ``scope``."""
    match scope:
        case "agent":
            return call.agent
        case "route":
            return call.route
        case "user":
            return f"{call.provider}:{call.user_id}"
        case _:
            return f"{call.provider}:{call.chat_id}"


def _taken(claim: Claim, tokens: int, cost: float, prompt: int) -> Statement:
    """The one statement that takes a reservation from a claim's counter if it has room."""
    sql = ("UPDATE usage_counters SET reserved_tokens = reserved_tokens + ?,"
           " reserved_cost = reserved_cost + ?"
           " WHERE scope = ? AND key = ? AND period = ? AND start = ?")
    params: tuple[Any, ...] = (tokens, cost, claim.scope, claim.key, claim.period, claim.start)
    if claim.tokens is not None:
        sql += " AND input_tokens + output_tokens + reserved_tokens + ? <= ?"
        params += (prompt, claim.tokens)
    if claim.cost is not None:
        sql += " AND cost + reserved_cost < ?"
        params += (claim.cost,)
    return sql, params


def _values(call: UsageCall) -> tuple[Any, ...]:
    return tuple(int(v) if isinstance(v, bool) else v
                 for v in (getattr(call, c) for c in _COLUMNS))


def _ledger_row(engine: Engine, call: UsageCall) -> Statement:
    """The call's ledger row."""
    return _ledger_sql(engine.now_sql), _values(call)


@functools.lru_cache(maxsize=8)
def _ledger_sql(now_sql: str) -> str:
    return (f"INSERT INTO usage_calls (ts, {', '.join(_COLUMNS)}) VALUES"
            f" ({now_sql}, {', '.join('?' for _ in _COLUMNS)})")


def _ledger_rows(engine: Engine, calls: list[UsageCall], guard: str | None) -> Statement:
    """(PostgreSQL) The calls' ledger rows, in their order, in one statement (``guard``: only
    if that CTE returned a row). A cost not known is NULL: typed, as a row of a ``VALUES``
    list in a ``SELECT`` is not given the table's types."""
    marks = ", ".join(f"({', '.join('?' for _ in _COLUMNS)})" for _ in calls)
    picked = ", ".join("CAST(cost AS DOUBLE PRECISION)" if c == "cost" else c
                       for c in _COLUMNS)
    return (f"INSERT INTO usage_calls (ts, {', '.join(_COLUMNS)}) SELECT {engine.now_sql},"
            f" {picked} FROM (VALUES {marks}) AS v({', '.join(_COLUMNS)})"
            + (f" WHERE EXISTS (SELECT 1 FROM {guard})" if guard is not None else ""),
            tuple(v for call in calls for v in _values(call)))


def _counter_rows(call: UsageCall, periods: Mapping[str, float] | None
                  ) -> list[tuple[Any, ...]]:
    """(scope, key, period, start, input, output, cached, cost, unpriced) of each counter the
    call adds to, in one order (one lock order)."""
    sums = (call.input_tokens, call.output_tokens, call.cached_tokens, call.cost or 0.0,
            int(call.cost is None))
    return [(scope, scope_key(scope, call), period, start, *sums) for scope in SCOPES
            for period, start in sorted((periods or {}).items())]


def _counters(rows: list[tuple[Any, ...]], guard: str | None = None,
              turn: str | None = None) -> Statement:
    """Every counter in one statement (each statement is a trip to the engine): rows of
    (scope, key, period, start, calls, input, output, cached, cost, unpriced); ``guard``: only
    if that CTE returned a row; ``turn``: the counters' turn taken first."""
    return _counters_sql(len(rows), guard, turn), tuple(itertools.chain.from_iterable(rows))


@functools.lru_cache(maxsize=16)
def _counters_sql(count: int, guard: str | None, turn: str | None) -> str:
    """:func:`_counters`'s text for ``count`` rows (made once: every answer writes one; a
    batch of run ends on PostgreSQL, one for its count — a few shapes kept)."""
    values = ", ".join("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" for _ in range(count))
    head = ("INSERT INTO usage_counters (scope, key, period, start, calls, input_tokens,"
            " output_tokens, cached_tokens, cost, unpriced_calls) ")
    where = [w for w in (turn, guard and f"EXISTS (SELECT 1 FROM {guard})") if w]
    body = (f"SELECT * FROM (VALUES {values}) AS v WHERE {' AND '.join(where)}"
            if where else f"VALUES {values}")
    return (head + body + " ON CONFLICT(scope, key, period, start) DO"
            " UPDATE SET calls = usage_counters.calls + excluded.calls,"
            " input_tokens = usage_counters.input_tokens + excluded.input_tokens,"
            " output_tokens = usage_counters.output_tokens + excluded.output_tokens,"
            " cached_tokens = usage_counters.cached_tokens + excluded.cached_tokens,"
            " cost = usage_counters.cost + excluded.cost,"
            " unpriced_calls = usage_counters.unpriced_calls + excluded.unpriced_calls")


def _also(turn: str | None) -> str:
    """`` AND`` the counters' turn, for a statement's ``WHERE`` (nothing where none is taken)."""
    return f" AND {turn}" if turn else ""


def _released(reservation: Reservation | None, turn: str | None = None) -> list[Statement]:
    """The statements that give a reservation back (never below zero: an admin's reset may
    have cleared the counter meanwhile); ``turn``: the counters' turn taken first."""
    if reservation is None:
        return []
    t, c = reservation.tokens, reservation.cost
    return [("UPDATE usage_counters SET"
             " reserved_tokens = CASE WHEN reserved_tokens > ? THEN reserved_tokens - ? ELSE 0 END,"
             " reserved_cost = CASE WHEN reserved_cost > ? THEN reserved_cost - ? ELSE 0 END"
             " WHERE scope = ? AND key = ? AND period = ? AND start = ?"
             + _also(turn),
             (t, t, c, c, claim.scope, claim.key, claim.period, claim.start))
            for claim in reservation.claims]


def _period(since: float | None, until: float | None) -> tuple[str, tuple[Any, ...]]:
    where, params = ["1 = 1"], []
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("ts < ?")
        params.append(until)
    return " AND ".join(where), tuple(params)
