"""Sessions, messages, runs and run events in SQLite.

A run's events are numbered 1, 2, 3, … (``seq``) as they are committed; the number is handed
back with the event. A run is recorded as ``queued`` when the gateway accepts its message, and
``running`` once it starts, with the user's message and its ``run.start`` in the same commit.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import replace
from typing import Any

from pluto.events import RunEnd, RunEvent, event_from_dict, event_to_dict
from pluto.storage.rows import (MessageRow, RunRow, SessionRow, estimate_tokens,
                                sanitize_history)
from pluto.storage.sqlite.engine import SqliteEngine, Statement

COMPONENT = "conversations"
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS sessions (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        agent TEXT NOT NULL,
        active INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX IF NOT EXISTS sessions_active_key ON sessions(key) WHERE active = 1;
    CREATE TABLE IF NOT EXISTS messages (
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
    CREATE INDEX IF NOT EXISTS messages_session ON messages(session_id, id);
    CREATE TABLE IF NOT EXISTS runs (
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
    CREATE INDEX IF NOT EXISTS runs_session ON runs(session_id, started_at);
    CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
    CREATE TABLE IF NOT EXISTS run_events (
        run_id TEXT NOT NULL REFERENCES runs(id),
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    """,
]
SESSION_CACHE = 10_000


def _message_stmt(session_id: str, role: str, content: str | None, run_id: str | None,
                  tool_calls: list[dict] | None, tool_call_id: str | None,
                  name: str | None) -> Statement:
    tokens = estimate_tokens(content or "") + estimate_tokens(json.dumps(tool_calls or ""))
    return ("INSERT INTO messages (session_id, run_id, role, content, tool_calls, tool_call_id,"
            " name, tokens, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (session_id, run_id, role, content, json.dumps(tool_calls) if tool_calls else None,
             tool_call_id, name, tokens, time.time()))


def _event_stmt(event: RunEvent) -> Statement:
    return ("INSERT INTO run_events (run_id, seq, type, data) VALUES (?,?,?,?)",
            (event.run_id, event.seq, event.type, json.dumps(event_to_dict(event), default=str)))


def _session(row: sqlite3.Row) -> SessionRow:
    return SessionRow(row["id"], row["key"], row["agent"], row["created_at"])


class SqliteConversations:
    def __init__(self, engine: SqliteEngine):
        self.engine = engine
        self._seq: dict[str, int] = {}  # the last seq of each run this process is writing
        self._sessions: dict[str, SessionRow] = {}  # active session by key (bounded cache)

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    # sessions and messages ----------------------------------------------------------------

    async def session(self, key: str, agent: str) -> SessionRow:
        if (cached := self._sessions.get(key)) is not None:
            return cached

        def find_or_create(conn: sqlite3.Connection) -> SessionRow:
            row = conn.execute("SELECT id, key, agent, created_at FROM sessions"
                               " WHERE key = ? AND active = 1", (key,)).fetchone()
            if row is not None:
                return _session(row)
            now = time.time()
            new = SessionRow(uuid.uuid4().hex, key, agent, now)
            conn.execute("INSERT INTO sessions (id, key, agent, created_at, updated_at)"
                         " VALUES (?,?,?,?,?)", (new.id, key, agent, now, now))
            return new

        session = await self.engine.transact(find_or_create)
        if len(self._sessions) >= SESSION_CACHE:
            self._sessions.clear()
        self._sessions[key] = session
        return session

    async def reset_session(self, key: str) -> bool:
        self._sessions.pop(key, None)
        changed = await self.engine.write((
            "UPDATE sessions SET active = 0, updated_at = ? WHERE key = ? AND active = 1",
            (time.time(), key)))
        self._sessions.pop(key, None)  # a lookup may have cached it while we wrote
        return changed > 0

    async def add_message(self, session_id: str, role: str, content: str | None, *,
                          run_id: str | None = None, tool_calls: list[dict] | None = None,
                          tool_call_id: str | None = None, name: str | None = None,
                          event: RunEvent | None = None) -> RunEvent | None:
        stmts = [_message_stmt(session_id, role, content, run_id, tool_calls, tool_call_id, name)]
        if event is not None:
            event = self._numbered(event)
            stmts.append(_event_stmt(event))
        await self.engine.write(*stmts)
        return event

    async def messages(self, session_id: str, limit: int = 1000) -> list[MessageRow]:
        rows = await self.engine.fetchall(
            "SELECT role, content, tool_calls, tool_call_id, name, tokens, run_id, created_at"
            " FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?", (session_id, limit))
        return [MessageRow(r["role"], r["content"],
                           json.loads(r["tool_calls"]) if r["tool_calls"] else None,
                           r["tool_call_id"], r["name"], r["tokens"], r["run_id"], r["created_at"])
                for r in reversed(rows)]

    async def history(self, session_id: str, max_messages: int,
                      max_tokens: int) -> list[dict[str, Any]]:
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

    # runs and events ----------------------------------------------------------------------

    def _numbered(self, event: RunEvent) -> RunEvent:
        seq = self._seq.get(event.run_id, 0) + 1
        self._seq[event.run_id] = seq
        return replace(event, seq=seq)

    async def queue_run(self, run_id: str, session_id: str, agent: str, input_text: str, *,
                        source: tuple[str, str] | None = None) -> None:
        stmts: list[Statement] = [(
            "INSERT INTO runs (id, session_id, agent, status, input, started_at)"
            " VALUES (?,?,?,'queued',?,?)", (run_id, session_id, agent, input_text, time.time()))]
        if source is not None:  # the inbox's message is handled with this very commit
            stmts.append(("UPDATE inbound_seen SET handled = 1, payload = NULL"
                          " WHERE provider = ? AND message_id = ?", source))
        await self.engine.write(*stmts)

    async def start_run(self, run_id: str, session_id: str, agent: str, input_text: str,
                        event: RunEvent) -> RunEvent:
        now = time.time()
        self._seq[run_id] = 0
        event = self._numbered(event)
        await self.engine.write(
            ("INSERT INTO runs (id, session_id, agent, status, input, started_at)"
             " VALUES (?,?,?,'running',?,?) ON CONFLICT(id) DO UPDATE SET status = 'running',"
             " session_id = excluded.session_id, agent = excluded.agent,"
             " input = excluded.input, started_at = excluded.started_at",
             (run_id, session_id, agent, input_text, now)),
            ("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id)),
            _message_stmt(session_id, "user", input_text, run_id, None, None, None),
            _event_stmt(event))
        return event

    async def append_event(self, event: RunEvent) -> RunEvent:
        event = self._numbered(event)
        await self.engine.write(_event_stmt(event))
        return event

    async def end_run(self, run_id: str, status: str, *, error: str | None = None,
                      usage: dict[str, int] | None = None,
                      event: RunEvent | None = None) -> RunEvent | None:
        if event is not None and run_id not in self._seq:  # e.g. a queued run that never ran
            self._seq[run_id] = await self._last_seq(run_id)
        stmts: list[Statement] = []
        if event is not None:
            event = self._numbered(event)
            stmts.append(_event_stmt(event))
        stmts.append(("UPDATE runs SET status = ?, error = ?, usage = ?, ended_at = ? WHERE id = ?",
                      (status, error, json.dumps(usage or {}), time.time(), run_id)))
        try:
            await self.engine.write(*stmts)
        finally:
            self._seq.pop(run_id, None)
        return event

    async def _last_seq(self, run_id: str) -> int:
        row = await self.engine.fetchone(
            "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = ?", (run_id,))
        return int(row[0]) if row else 0

    async def run(self, run_id: str) -> RunRow | None:
        r = await self.engine.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
        if r is None:
            return None
        return RunRow(r["id"], r["session_id"], r["agent"], r["status"], r["input"], r["error"],
                      json.loads(r["usage"]) if r["usage"] else {}, r["started_at"], r["ended_at"])

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        rows = await self.engine.fetchall(
            "SELECT seq, data FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq",
            (run_id, after))
        return [replace(event_from_dict(json.loads(r["data"])), seq=r["seq"]) for r in rows]

    async def recover_interrupted(self) -> list[RunEvent]:
        rows = await self.engine.fetchall(
            "SELECT id, status FROM runs WHERE status IN ('queued', 'running')")
        ended = []
        for r in rows:
            reason = ("the gateway stopped before this message was answered"
                      if r["status"] == "queued" else "the gateway stopped during this run")
            end = await self.end_run(r["id"], "interrupted", error=reason,
                                     event=RunEnd(run_id=r["id"], outcome="interrupted"))
            if end is not None:
                ended.append(end)
        return ended

    async def recent_runs(self, *, limit: int = 50, agent: str | None = None,
                          status: str | None = None) -> list[dict[str, Any]]:
        where, args = [], []
        if agent:
            where.append("r.agent = ?")
            args.append(agent)
        if status:
            where.append("r.status = ?")
            args.append(status)
        sql = ("SELECT r.id, r.agent, r.status, r.input, r.error, r.usage, r.started_at,"
               " r.ended_at, s.key AS session_key FROM runs r JOIN sessions s"
               " ON s.id = r.session_id" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY r.started_at DESC LIMIT ?")
        rows = await self.engine.fetchall(sql, (*args, limit))
        return [{"id": r["id"], "agent": r["agent"], "status": r["status"],
                 "session_key": r["session_key"], "input": _clip(r["input"]),
                 "error": r["error"], "usage": json.loads(r["usage"]) if r["usage"] else {},
                 "started_at": r["started_at"], "ended_at": r["ended_at"]} for r in rows]

    async def stats(self) -> dict[str, int]:
        def count(conn: sqlite3.Connection) -> dict[str, int]:
            return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                    for table in ("sessions", "messages", "runs", "run_events")}
        return await self.engine.read(count)


def _clip(text: str | None, limit: int = 300) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "…"
