"""SQLite storage (aiosqlite): sessions, messages, runs and their events.

One file under the data dir, WAL mode, schema versioned with ``PRAGMA user_version`` and
migrated in code. Every write commits before it returns, so whatever a user was shown is on
disk before the run continues.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import aiosqlite

from runtime.events import RunEnd, RunEvent, event_from_dict, event_to_dict
from storage.base import MessageRow, RunRow, SessionRow, estimate_tokens, sanitize_history

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


class SqliteStore:
    def __init__(self, path: Path):
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._seq: dict[str, int] = {}

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

    # sessions ---------------------------------------------------------------------------------

    async def session(self, key: str, agent: str) -> SessionRow:
        """The active session for ``key``, created when there is none."""
        row = await (await self.db.execute(
            "SELECT id, key, agent, created_at FROM sessions WHERE key = ? AND active = 1",
            (key,))).fetchone()
        if row is not None:
            return SessionRow(row["id"], row["key"], row["agent"], row["created_at"])
        now = time.time()
        sid = uuid.uuid4().hex
        await self.db.execute(
            "INSERT INTO sessions (id, key, agent, created_at, updated_at) VALUES (?,?,?,?,?)",
            (sid, key, agent, now, now))
        await self.db.commit()
        return SessionRow(sid, key, agent, now)

    async def reset_session(self, key: str) -> bool:
        """Start afresh: the active session for ``key`` is closed (kept, no longer used)."""
        cur = await self.db.execute(
            "UPDATE sessions SET active = 0, updated_at = ? WHERE key = ? AND active = 1",
            (time.time(), key))
        await self.db.commit()
        return cur.rowcount > 0

    # messages ---------------------------------------------------------------------------------

    async def add_message(self, session_id: str, role: str, content: str | None, *,
                          run_id: str | None = None, tool_calls: list[dict] | None = None,
                          tool_call_id: str | None = None, name: str | None = None) -> None:
        tokens = estimate_tokens(content or "") + estimate_tokens(json.dumps(tool_calls or ""))
        await self.db.execute(
            "INSERT INTO messages (session_id, run_id, role, content, tool_calls, tool_call_id,"
            " name, tokens, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (session_id, run_id, role, content, json.dumps(tool_calls) if tool_calls else None,
             tool_call_id, name, tokens, time.time()))
        await self.db.commit()

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

    async def start_run(self, run_id: str, session_id: str, agent: str, input_text: str) -> None:
        now = time.time()
        await self.db.execute(
            "INSERT INTO runs (id, session_id, agent, status, input, started_at)"
            " VALUES (?,?,?,?,?,?)", (run_id, session_id, agent, "running", input_text, now))
        await self.db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))
        await self.db.commit()
        self._seq[run_id] = 0

    async def add_event(self, event: RunEvent) -> None:
        seq = self._seq.get(event.run_id, 0) + 1
        self._seq[event.run_id] = seq
        await self.db.execute(
            "INSERT INTO run_events (run_id, seq, type, data) VALUES (?,?,?,?)",
            (event.run_id, seq, event.type, json.dumps(event_to_dict(event), default=str)))
        await self.db.commit()

    async def end_run(self, run_id: str, status: str, *, error: str | None = None,
                      usage: dict[str, int] | None = None) -> None:
        await self.db.execute(
            "UPDATE runs SET status = ?, error = ?, usage = ?, ended_at = ? WHERE id = ?",
            (status, error, json.dumps(usage or {}), time.time(), run_id))
        await self.db.commit()
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
            await self.add_event(RunEnd(run_id=run_id, outcome="interrupted"))
            await self.end_run(run_id, "interrupted", error="the gateway stopped during this run")
        return ids

    async def stats(self) -> dict[str, Any]:
        out = {}
        for table in ("sessions", "messages", "runs", "run_events"):
            (n,) = await (await self.db.execute(f"SELECT COUNT(*) FROM {table}")).fetchone()
            out[table] = n
        return out
