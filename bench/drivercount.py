"""Count what ``pluto serve`` says to its database, at the driver: run as

    python -m bench.drivercount OUT.json serve --config DIR

it installs counters, then runs Pluto's own command line unchanged. Nothing here is imported by
Pluto; only the benchmark starts a server this way (a process of its own, measured apart from
the timed figures, since counting costs time).

- SQLite: every connection opened through ``sqlite3.connect`` (aiosqlite opens its connections
  that way, in its worker thread) is a subclass that counts each statement run through it
  (``BEGIN`` and ``COMMIT`` included; ``executemany``: once per row). (SQLite's trace callback
  cannot be used: Python reports each trigger it runs as the statement that fired it again.)
  A *commit* is a ``COMMIT``/``END`` of a transaction that wrote, or a write statement run
  outside any transaction (SQLite commits it alone); a transaction that only read is counted
  as a read transaction, not a commit.
- PostgreSQL (psycopg 3, sync or async): every query psycopg sends — a cursor's statement, a
  prepare, an internal command (``BEGIN``, ``COMMIT``, ``SAVEPOINT``...) — and every pipeline
  sync. Outside pipeline mode each is one round trip; inside, the syncs are. asyncpg (the
  single statements): every statement, and the prepare before a connection's first use of it.

``kill -USR1`` writes the totals so far to OUT.json (written whole, then renamed), with a
sequence number that grows by one per signal: the benchmark takes one snapshot before and one
after a batch of messages, and divides the difference.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import threading
from collections import Counter
from typing import Any

_WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE|UPSERT|CREATE|DROP|ALTER)\b", re.I)
_BEGIN = re.compile(r"\s*BEGIN\b", re.I)
_END = re.compile(r"\s*(COMMIT|END)\b", re.I)
_ROLLBACK = re.compile(r"\s*ROLLBACK\s*;?\s*$", re.I)  # (not ROLLBACK TO a savepoint)
_STRING = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])", re.I)
_BLOB = re.compile(r"\bX\?", re.I)  # x'…' once its string is gone
_PLACEHOLDER = re.compile(r"\$\d+(?:::\w+)?|%s|\?")
_LISTS = re.compile(r"\((?:\s*\?\s*,)+\s*\?\s*\)")
_ROWS = re.compile(r"(\(\?(?:, \?)*\))(?:\s*,\s*\1)+")
_SPACE = re.compile(r"\s+")
_TABLE = re.compile(r"\s*(?:(INSERT)\s+(?:OR\s+\w+\s+)?INTO|(UPDATE)|(DELETE)\s+FROM|(REPLACE)\s+INTO"
                    r"|(SELECT)\b.*?\bFROM)\s+([\w.\"]+)", re.I | re.S)
_VERB = {"INSERT": "ins", "UPDATE": "upd", "DELETE": "del", "REPLACE": "ins", "SELECT": "sel"}


def short(sql: str) -> str:
    """A statement in a word or two, for naming what a transaction holds: ``ins runs``."""
    m = _TABLE.match(sql)
    if m is None:
        words = re.findall(r"\w+", sql)
        if len(words) > 1 and words[0].upper() == "SELECT":
            return f"sel {words[1]}"  # SELECT pg_notify(...)
        return words[0].lower() if words else "?"
    verb = next(g for g in m.groups()[:5] if g)
    return f"{_VERB[verb.upper()]} {m.group(6).strip(chr(34))}"


def _held(parts: list[str]) -> str:
    """What one transaction held, in order, repeats folded: ``ins run_events x4, upd runs``."""
    out: list[list[Any]] = []
    for p in parts:
        if out and out[-1][0] == p:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return ", ".join(p if n == 1 else f"{p} x{n}" for p, n in out) or "(nothing)"


def normalize(sql: str) -> str:
    """One statement's shape: literals and placeholders as ``?``, lists as ``(?…)``."""
    s = _STRING.sub("?", sql)
    s = _PLACEHOLDER.sub("?", s)
    s = _NUMBER.sub("?", s)
    s = _BLOB.sub("?", s)
    s = _SPACE.sub(" ", s).strip().rstrip(";").strip()
    s = re.sub(r"\s*,\s*", ", ", s)
    s = _ROWS.sub(r"\1, …", s)
    s = _LISTS.sub("(?…)", s)
    return s


class _Tally:
    """One thread's counters (threads never share one: the totals are summed on a signal)."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()  # "engine|role|normalized sql"
        self.events: Counter[str] = Counter()  # "engine|commit", "pg|round trip", ...


_tallies: list[_Tally] = []
_local = threading.local()


def _tally() -> _Tally:
    t = getattr(_local, "tally", None)
    if t is None:
        t = _local.tally = _Tally()
        _tallies.append(t)  # (list.append is atomic)
    return t


# SQLite ---------------------------------------------------------------------------------------

def _sqlite_count(conn: Any, sql: str, times: int = 1) -> None:
    """``sql`` is about to run ``times`` times (executemany: once per row) on ``conn``."""
    t = _tally()
    shape = normalize(sql)
    if shape.upper().startswith("PRAGMA QUERY_ONLY"):
        conn.bench_role = "reader"  # the engine's reading connections say so when they open
    elif shape.upper().startswith("PRAGMA WAL_CHECKPOINT"):
        conn.bench_role = "checkpointer"  # (writes the WAL back: no statement of a message)
    role = getattr(conn, "bench_role", "writer")
    t.statements[f"sqlite|{role}|{shape}"] += times
    t.events[f"sqlite|statement|{role}"] += times
    if _BEGIN.match(sql):
        conn.bench_wrote, conn.bench_held = False, []
    elif _END.match(sql):
        wrote = getattr(conn, "bench_wrote", False)
        t.events["sqlite|commit" if wrote else "sqlite|read transaction"] += 1
        if wrote:
            t.events["sqlite|commit of|" + _held(getattr(conn, "bench_held", []))] += 1
    elif _ROLLBACK.match(sql):
        t.events["sqlite|rollback"] += 1
    else:
        if conn.in_transaction and role == "writer":
            conn.bench_held = getattr(conn, "bench_held", []) + [short(sql)] * times
        if _WRITE.match(sql):
            if conn.in_transaction:
                conn.bench_wrote = True
            else:
                t.events["sqlite|commit"] += times  # autocommit: each commits alone
                t.events["sqlite|autocommit write"] += times
                t.events["sqlite|commit of|" + short(sql) + " (autocommit)"] += times


def _script_count(conn: Any, script: str) -> None:
    for part in script.split(";"):  # (near enough: scripts are migrations, run once)
        if part.strip():
            _sqlite_count(conn, part)


class _Cursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Any:  # type: ignore[override]
        _sqlite_count(self.connection, sql)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, seq: Any, /) -> Any:  # type: ignore[override]
        rows = list(seq)
        _sqlite_count(self.connection, sql, len(rows))
        return super().executemany(sql, rows)

    def executescript(self, script: str, /) -> Any:  # type: ignore[override]
        _script_count(self.connection, script)
        return super().executescript(script)


class _Connection(sqlite3.Connection):
    """Counts what is run through it; triggers (the full-text index's) run inside the
    statement that fired them and are not statements of their own."""

    def cursor(self, factory: Any = _Cursor) -> Any:  # type: ignore[override]
        return super().cursor(factory)

    # (Connection.execute runs its cursor's statement in C, not through _Cursor.execute)
    def execute(self, sql: str, parameters: Any = (), /) -> Any:  # type: ignore[override]
        _sqlite_count(self, sql)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, seq: Any, /) -> Any:  # type: ignore[override]
        rows = list(seq)
        _sqlite_count(self, sql, len(rows))
        return super().executemany(sql, rows)

    def executescript(self, script: str, /) -> Any:  # type: ignore[override]
        _script_count(self, script)
        return super().executescript(script)


def _install_sqlite() -> None:
    connect = sqlite3.connect

    def counted_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", _Connection)
        return connect(*args, **kwargs)

    sqlite3.connect = counted_connect  # type: ignore[assignment]


# PostgreSQL -----------------------------------------------------------------------------------

_pg_held: dict[int, list[str]] = {}  # a connection (id) -> what its open transaction held


def _pg_count(sql: Any, kind: str, pipelined: bool, conn: Any = None) -> None:
    t = _tally()
    text = sql.decode("utf-8", "replace") if isinstance(sql, (bytes, bytearray)) else str(sql)
    if kind != "prepare":
        if _BEGIN.match(text):
            _pg_held[id(conn)] = []
        elif _END.match(text) or _ROLLBACK.match(text):
            held = _pg_held.pop(id(conn), None)
            if held is not None and _END.match(text):
                t.events["pg|transaction of|" + _held(held)] += 1
        elif id(conn) in _pg_held:
            _pg_held[id(conn)].append(short(text))
        else:
            t.events["pg|autocommit"] += 1  # a transaction of its own (the pool's autocommit)
    t.events[f"pg|{kind}"] += 1
    if kind != "prepare":  # (a prepare is a round trip of its own, not a statement run)
        t.statements[f"pg|sent|{normalize(text)}"] += 1
        t.events["pg|statement"] += 1
    if not pipelined:
        t.events["pg|round trip"] += 1
    if _END.match(text):
        t.events["pg|commit"] += 1
    elif _BEGIN.match(text):
        t.events["pg|begin"] += 1


def _query_text(query: Any) -> Any:
    return getattr(query, "query", query)


def _install_psycopg() -> None:
    try:
        from psycopg import _connection_base, _cursor_base, _pipeline_base, client_cursor
    except ImportError:  # no PostgreSQL driver here: nothing to count
        return

    def wrap_send(cls: type, name: str, kind: str) -> None:
        original = getattr(cls, name)

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            query = args[0] if name == "_execute_send" else args[1]
            _pg_count(_query_text(query), kind, self._conn._pipeline is not None, self._conn)
            return original(self, *args, **kwargs)

        setattr(cls, name, counted)

    wrap_send(_cursor_base.BaseCursor, "_execute_send", "unprepared")
    wrap_send(_cursor_base.BaseCursor, "_send_query_prepared", "prepared")
    wrap_send(_cursor_base.BaseCursor, "_send_prepare", "prepare")
    if "_execute_send" in vars(client_cursor.ClientCursorMixin):
        wrap_send(client_cursor.ClientCursorMixin, "_execute_send", "unprepared")

    command = _connection_base.BaseConnection._exec_command

    def counted_command(self: Any, cmd: Any, *args: Any, **kwargs: Any) -> Any:
        text = cmd
        if not isinstance(cmd, (bytes, str)):
            try:
                text = cmd.as_string(self)
            except Exception:  # noqa: BLE001 - a name for the count is enough
                text = repr(cmd)
        _pg_count(text, "command", self._pipeline is not None, self)
        return (yield from command(self, cmd, *args, **kwargs))

    _connection_base.BaseConnection._exec_command = counted_command  # type: ignore[method-assign]

    enqueue = _pipeline_base.BasePipeline._enqueue_sync

    def counted_sync(self: Any) -> None:
        t = _tally()
        t.events["pg|pipeline sync"] += 1
        t.events["pg|round trip"] += 1
        enqueue(self)

    _pipeline_base.BasePipeline._enqueue_sync = counted_sync  # type: ignore[method-assign]


def _install_asyncpg() -> None:
    """asyncpg (the single statements): each statement sent with its arguments (a prepare
    first when the connection has not prepared it yet: a round trip of its own), and each
    sent without (the simple protocol)."""
    try:
        from asyncpg import connection
    except ImportError:
        return
    cls = connection.Connection
    do_execute, execute = cls._do_execute, cls.execute

    async def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        key = (query, self._protocol.get_record_class(), kwargs.get("ignore_custom_codec", False))
        if self._stmt_cache.get(key) is None:
            _pg_count(query, "prepare", False, self)
        _pg_count(query, "prepared", False, self)
        return await do_execute(self, query, *args, **kwargs)

    async def counted_plain(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if not args:
            _pg_count(query, "unprepared", False, self)
        return await execute(self, query, *args, **kwargs)

    cls._do_execute = counted_execute  # type: ignore[method-assign]
    cls.execute = counted_plain  # type: ignore[method-assign]


# the snapshot ---------------------------------------------------------------------------------

def snapshot() -> dict[str, Any]:
    statements: Counter[str] = Counter()
    events: Counter[str] = Counter()
    for t in list(_tallies):
        statements.update(dict(t.statements))  # (a dict copy holds the GIL throughout)
        events.update(dict(t.events))
    return {"statements": dict(statements), "events": dict(events)}


def _dumper(path: str) -> Any:
    seq = [0]

    def dump(signum: int, frame: Any) -> None:
        seq[0] += 1
        data = snapshot() | {"seq": seq[0]}
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)

    return dump


def main() -> None:
    out = sys.argv[1]
    _install_sqlite()
    _install_psycopg()
    _install_asyncpg()
    signal.signal(signal.SIGUSR1, _dumper(out))
    sys.argv = ["pluto", *sys.argv[2:]]
    from pluto.gateway.cli import main as pluto_main

    raise SystemExit(pluto_main())


if __name__ == "__main__":
    main()
