"""SQLite storage (aiosqlite): sessions, messages, runs and their events.

One file under the data dir, WAL mode, schema versioned with ``PRAGMA user_version`` and
migrated in code. Every write commits before it returns, so whatever a user was shown is on
disk before the run continues.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import aiosqlite

from pluto.events import RunEnd, RunEvent, event_from_dict, event_to_dict
from pluto.storage.base import MessageRow, RunRow, SessionRow, estimate_tokens, sanitize_history

log = logging.getLogger(__name__)

MIGRATIONS: list[str] = [
    # 1: the foundation
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        agent TEXT NOT NULL,
        active INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX sessions_active_key ON sessions(key) WHERE active = 1;
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        run_id TEXT,
        role TEXT NOT NULL,
        content TEXT,
        tool_calls TEXT,
        tool_call_id TEXT,
        name TEXT,
        tokens INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_session ON messages(session_id, id);
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        agent TEXT NOT NULL,
        status TEXT NOT NULL,
        input TEXT,
        error TEXT,
        usage TEXT,
        started_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE INDEX runs_session ON runs(session_id, started_at);
    CREATE INDEX runs_status ON runs(status);
    CREATE TABLE run_events (
        run_id TEXT NOT NULL REFERENCES runs(id),
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    """,
]


Statement = tuple[str, tuple[Any, ...]]


def _message_stmt(session_id: str, role: str, content: str | None, run_id: str | None,
                  tool_calls: list[dict] | None, tool_call_id: str | None,
                  name: str | None) -> Statement:
    tokens = estimate_tokens(content or "") + estimate_tokens(json.dumps(tool_calls or ""))
    return ("INSERT INTO messages (session_id, run_id, role, content, tool_calls, tool_call_id,"
            " name, tokens, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (session_id, run_id, role, content, json.dumps(tool_calls) if tool_calls else None,
             tool_call_id, name, tokens, time.time()))


def _apply_batch(conn: sqlite3.Connection,
                 batch: list[list[Statement]]) -> list[int | Exception]:
    """In the database thread: each group of statements in its own savepoint (so one failing
    write does not undo the others), then one commit for all. If the commit itself fails,
    everything is rolled back and the caller reports the error to every writer."""
    results: list[int | Exception] = []
    if not conn.in_transaction:
        conn.execute("BEGIN")
    try:
        for stmts in batch:
            results.append(_apply_group(conn, stmts))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return results


def _apply_group(conn: sqlite3.Connection, stmts: list[Statement]) -> int | Exception:
    conn.execute("SAVEPOINT w")
    try:
        count = 0
        for sql, params in stmts:
            count = conn.execute(sql, params).rowcount
    except sqlite3.Error as e:
        conn.execute("ROLLBACK TO w")
        conn.execute("RELEASE w")
        return e
    conn.execute("RELEASE w")
    return count


class SqliteStore:
    def __init__(self, path: Path):
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._seq: dict[str, int] = {}
        self._pending: list[tuple[list[Statement], asyncio.Future[int]]] = []
        self._sessions: dict[str, SessionRow] = {}  # active session by key (bounded cache)
        self._flusher: asyncio.Task[None] | None = None

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("storage is not open")
        return self._db

    @property
    def is_open(self) -> bool:
        return self._db is not None

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        self._db.row_factory = aiosqlite.Row
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute("PRAGMA synchronous=NORMAL")
        await self._db.execute("PRAGMA foreign_keys=ON")
        await self._db.execute("PRAGMA busy_timeout=5000")
        await self._migrate()

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.wait({self._flusher})
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _migrate(self) -> None:
        (version,) = await (await self.db.execute("PRAGMA user_version")).fetchone()
        if version > len(MIGRATIONS):
            raise RuntimeError(f"{self.path} was written by a newer Pluto (schema {version})")
        for i in range(version, len(MIGRATIONS)):
            await self.db.executescript(
                f"BEGIN; {MIGRATIONS[i]} PRAGMA user_version = {i + 1}; COMMIT;")
            log.info("storage: migrated %s to schema %d", self.path, i + 1)
        await self.db.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions (component TEXT PRIMARY KEY,"
            " version INTEGER NOT NULL)")
        await self.db.commit()

    async def migrate_component(self, component: str, migrations: list[str]) -> None:
        """Schema of a feature that keeps its own tables (the outbox, pairing, ...).

        Each component's migrations are versioned on their own, so features can evolve apart.
        """
        row = await (await self.db.execute(
            "SELECT version FROM schema_versions WHERE component = ?", (component,))).fetchone()
        version = row[0] if row else 0
        if version > len(migrations):
            raise RuntimeError(f"{component} tables were written by a newer Pluto")
        for i in range(version, len(migrations)):
            await self.db.executescript(
                f"BEGIN; {migrations[i]} INSERT INTO schema_versions (component, version) "
                f"VALUES ('{component}', {i + 1}) ON CONFLICT(component) DO UPDATE SET "
                f"version = excluded.version; COMMIT;")
            log.info("storage: migrated %s to %s schema %d", self.path, component, i + 1)

    # group commit -----------------------------------------------------------------------------

    async def write(self, *statements: Statement) -> int:
        """Run statements atomically and return once they are committed.

        Writes that arrive while a commit is in progress are committed together in the next
        one (group commit): one trip to the database thread and one commit for many runs,
        while each caller still continues only after its own write is durable. Returns the
        row count of the last statement.
        """
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((list(statements), fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await fut  # the row count of the last statement

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                # aiosqlite runs every call in its own thread; ``_execute`` runs one function
                # there, so the whole batch costs one hop (aiosqlite 0.22, pinned).
                results = await self.db._execute(_apply_batch, self.db._conn,
                                                 [stmts for stmts, _ in batch])
            except Exception as e:  # the commit itself failed: nobody's write is durable
                results = [e] * len(batch)
            for (_, fut), result in zip(batch, results):
                if fut.done():
                    continue
                if isinstance(result, Exception):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

    # sessions ---------------------------------------------------------------------------------

    async def session(self, key: str, agent: str) -> SessionRow:
        """The active session for ``key``, created when there is none."""
        if (cached := self._sessions.get(key)) is not None:
            return cached
        row = await (await self.db.execute(
            "SELECT id, key, agent, created_at FROM sessions WHERE key = ? AND active = 1",
            (key,))).fetchone()
        if row is not None:
            session = SessionRow(row["id"], row["key"], row["agent"], row["created_at"])
        else:
            session = SessionRow(uuid.uuid4().hex, key, agent, time.time())
            await self.write(("INSERT INTO sessions (id, key, agent, created_at, updated_at)"
                              " VALUES (?,?,?,?,?)", (session.id, key, agent, session.created_at,
                                                      session.created_at)))
        if len(self._sessions) >= 10_000:
            self._sessions.clear()
        self._sessions[key] = session
        return session

    async def reset_session(self, key: str) -> bool:
        """Start afresh: the active session for ``key`` is closed (kept, no longer used)."""
        self._sessions.pop(key, None)
        changed = await self.write((
            "UPDATE sessions SET active = 0, updated_at = ? WHERE key = ? AND active = 1",
            (time.time(), key)))
        return changed > 0

    # messages ---------------------------------------------------------------------------------

    async def add_message(self, session_id: str, role: str, content: str | None, *,
                          run_id: str | None = None, tool_calls: list[dict] | None = None,
                          tool_call_id: str | None = None, name: str | None = None,
                          event: RunEvent | None = None) -> None:
        """Append a message (and, atomically with it, the run event that shows it)."""
        stmts = [_message_stmt(session_id, role, content, run_id, tool_calls, tool_call_id, name)]
        if event is not None:
            stmts.append(self._event_stmt(event))
        await self.write(*stmts)

    async def messages(self, session_id: str, limit: int = 1000) -> list[MessageRow]:
        rows = await (await self.db.execute(
            "SELECT role, content, tool_calls, tool_call_id, name, tokens, run_id, created_at"
            " FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?",
            (session_id, limit))).fetchall()
        return [MessageRow(r["role"], r["content"],
                           json.loads(r["tool_calls"]) if r["tool_calls"] else None,
                           r["tool_call_id"], r["name"], r["tokens"], r["run_id"], r["created_at"])
                for r in reversed(rows)]

    async def history(self, session_id: str, max_messages: int, max_tokens: int) -> list[dict]:
        """The newest messages that fit the window, as model messages, always well-formed."""
        if max_messages <= 0:
            return []
        rows = await self.messages(session_id, limit=max_messages)
        kept: list[MessageRow] = []
        total = 0
        for row in reversed(rows):
            total += row.tokens
            if total > max_tokens and kept:
                break
            kept.append(row)
        return sanitize_history([r.as_model_message() for r in reversed(kept)])

    # runs and events --------------------------------------------------------------------------

    async def start_run(self, run_id: str, session_id: str, agent: str, input_text: str,
                        event: RunEvent | None = None) -> None:
        """Record a run and its user message (and its ``run.start``) in one commit."""
        now = time.time()
        self._seq[run_id] = 0
        stmts = [
            ("INSERT INTO runs (id, session_id, agent, status, input, started_at)"
             " VALUES (?,?,?,?,?,?)", (run_id, session_id, agent, "running", input_text, now)),
            ("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id)),
            _message_stmt(session_id, "user", input_text, run_id, None, None, None),
        ]
        if event is not None:
            stmts.append(self._event_stmt(event))
        await self.write(*stmts)

    def _event_stmt(self, event: RunEvent) -> Statement:
        seq = self._seq.get(event.run_id, 0) + 1
        self._seq[event.run_id] = seq
        return ("INSERT INTO run_events (run_id, seq, type, data) VALUES (?,?,?,?)",
                (event.run_id, seq, event.type, json.dumps(event_to_dict(event), default=str)))

    async def add_event(self, event: RunEvent) -> None:
        await self.write(self._event_stmt(event))

    async def end_run(self, run_id: str, status: str, *, error: str | None = None,
                      usage: dict[str, int] | None = None, event: RunEvent | None = None) -> None:
        """Close a run (and record its ``run.end``) in one commit."""
        stmts = [self._event_stmt(event)] if event is not None else []
        stmts.append(("UPDATE runs SET status = ?, error = ?, usage = ?, ended_at = ? WHERE id = ?",
                      (status, error, json.dumps(usage or {}), time.time(), run_id)))
        await self.write(*stmts)
        self._seq.pop(run_id, None)

    async def run(self, run_id: str) -> RunRow | None:
        r = await (await self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,))).fetchone()
        if r is None:
            return None
        return RunRow(r["id"], r["session_id"], r["agent"], r["status"], r["input"], r["error"],
                      json.loads(r["usage"]) if r["usage"] else {}, r["started_at"], r["ended_at"])

    async def events(self, run_id: str, after: int = 0) -> list[tuple[int, RunEvent]]:
        rows = await (await self.db.execute(
            "SELECT seq, data FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq",
            (run_id, after))).fetchall()
        return [(r["seq"], event_from_dict(json.loads(r["data"]))) for r in rows]

    async def recover_interrupted(self) -> list[str]:
        """Runs left 'running' by a process that died: mark them interrupted, say so in events."""
        rows = await (await self.db.execute(
            "SELECT id FROM runs WHERE status = 'running'")).fetchall()
        ids = [r["id"] for r in rows]
        for run_id in ids:
            (seq,) = await (await self.db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = ?",
                (run_id,))).fetchone()
            self._seq[run_id] = seq
            await self.end_run(run_id, "interrupted", error="the gateway stopped during this run",
                               event=RunEnd(run_id=run_id, outcome="interrupted"))
        return ids

    async def stats(self) -> dict[str, Any]:
        out = {}
        for table in ("sessions", "messages", "runs", "run_events"):
            (n,) = await (await self.db.execute(f"SELECT COUNT(*) FROM {table}")).fetchone()
            out[table] = n
        return out
