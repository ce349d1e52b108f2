"""The long memory of a conversation: its compactions (the summary that stands in for older
turns, with the tokens before and after) and full-text search over its verbatim messages.

Compaction never deletes a message: a summary row says "messages up to id N are summarized
as …", and the history a run reads is that summary plus the messages after N. Every message
stays searchable — SQLite through an FTS5 index, PostgreSQL through a GIN index on
``to_tsvector('simple', content)`` — the one place the two engines speak differently
(``engine.dialect``).

SQLite's index is written once a commit, for every message the commit wrote
(:func:`index_new_messages`, in the commit's transaction: a message is searchable exactly when
it is committed), not by a trigger once a message: FTS5 writes its pending terms out at the end
of every statement that touches it, so a message indexed on its own cost 25-30 µs more than
its insert (a third of an instant answer's SQL, two messages an answer); twenty at once,
4 µs each. ``messages_fts_upto`` keeps the last message id indexed; a message deleted
leaves the index only if it was in it.

Only what search looks at is indexed, on both engines: people's and the agent's messages
(:data:`SEARCHED`), not the tools' results — a data tool's table can be thousands of words,
tokenized at every call on the loop, for an index no search reads.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from pluto.storage.rows import MessageRow
from pluto.storage.sql import Engine, online_index

COMPONENT = "memory"
MIGRATIONS: list[Any] = [
    {
        "sqlite": """
        CREATE TABLE compactions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            run_id TEXT,
            upto INTEGER NOT NULL,
            summary TEXT NOT NULL,
            method TEXT NOT NULL,
            tokens_before INTEGER NOT NULL,
            tokens_after INTEGER NOT NULL,
            usage_tokens INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        );
        CREATE INDEX compactions_session ON compactions(session_id, id);
        CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages',
                                                     content_rowid='id');
        CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
            WHEN new.content IS NOT NULL BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END;
        CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
            WHEN old.content IS NOT NULL BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content)
                VALUES ('delete', old.id, old.content);
        END;
        INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
        """,
        "postgres": """
        CREATE TABLE compactions (
            id BIGSERIAL PRIMARY KEY,
            session_id TEXT NOT NULL,
            run_id TEXT,
            upto BIGINT NOT NULL,
            summary TEXT NOT NULL,
            method TEXT NOT NULL,
            tokens_before INTEGER NOT NULL,
            tokens_after INTEGER NOT NULL,
            usage_tokens INTEGER NOT NULL DEFAULT 0,
            created_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX compactions_session ON compactions(session_id, id);
        CREATE INDEX messages_fts ON messages
            USING GIN (to_tsvector('simple', coalesce(content, '')));
        """,
    },
]
MIGRATIONS.append(  # long-term notes kept in the database (several instances share them)
    """
    CREATE TABLE memory_files (
        owner TEXT PRIMARY KEY,
        text TEXT NOT NULL,
        rev INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE memory_revisions (
        owner TEXT NOT NULL,
        rev INTEGER NOT NULL,
        at REAL NOT NULL,
        by_whom TEXT NOT NULL,
        op TEXT NOT NULL,
        why TEXT NOT NULL,
        diff TEXT NOT NULL,
        content TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        PRIMARY KEY (owner, rev)
    );
    """)
MIGRATIONS.append({  # SQLite: the index written once a commit (see the module's notes)
    "sqlite": """
    CREATE TABLE messages_fts_upto (id INTEGER NOT NULL);
    INSERT INTO messages_fts_upto (id) SELECT coalesce(max(id), 0) FROM messages;
    DROP TRIGGER messages_fts_insert;
    DROP TRIGGER messages_fts_delete;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
        WHEN old.content IS NOT NULL AND old.id <= (SELECT id FROM messages_fts_upto) BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
    END;
    """,
    "postgres": "SELECT 1"})
MIGRATIONS.append({  # only what search looks at is indexed: people's and the agent's words
    "sqlite": """
    INSERT INTO messages_fts (messages_fts, rowid, content)
        SELECT 'delete', id, content FROM messages WHERE content IS NOT NULL
        AND role NOT IN ('user', 'assistant') AND id <= (SELECT id FROM messages_fts_upto);
    DROP TRIGGER messages_fts_delete;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
        WHEN old.content IS NOT NULL AND old.role IN ('user', 'assistant')
        AND old.id <= (SELECT id FROM messages_fts_upto) BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
    END;
    """,
    # (built while messages keep being written: a rolling upgrade's older instances answer on)
    "postgres": online_index("messages_fts", "messages USING GIN (to_tsvector('simple',"
                             " coalesce(content, ''))) WHERE role IN ('user', 'assistant')")})
SEARCHED = "role IN ('user', 'assistant')"  # the messages search looks at (and the index holds)
MAX_UNSUMMARIZED = 2_000  # messages read after the last summary, at most (the newest)
MAX_QUERY_TERMS = 12


@dataclass(frozen=True, slots=True)
class Compaction:
    session_id: str
    run_id: str | None
    upto: int  # messages with an id up to this one are summarized
    summary: str
    method: str  # "summary" (a model wrote it) or "truncation" (the fallback)
    tokens_before: int
    tokens_after: int
    usage_tokens: int
    created_at: float


@dataclass(frozen=True, slots=True)
class HistoryHit:
    message_id: int
    session_id: str
    role: str
    content: str
    created_at: float

    def snippet(self, query: str, width: int = 160) -> str:
        """The part of the message around the first word of the query, on one line."""
        text = " ".join(self.content.split())
        terms = [t.casefold() for t in _terms(query)]
        at = min((i for t in terms if (i := text.casefold().find(t)) >= 0), default=0)
        start = max(0, at - width // 3)
        clip = text[start:start + width]
        return ("…" if start else "") + clip + ("…" if start + width < len(text) else "")


def _terms(query: str) -> list[str]:
    return re.findall(r"\w+", query)[:MAX_QUERY_TERMS]


def index_new_messages(conn: Any) -> None:
    """(SQLite, before each commit) Into the search index: the messages written since the
    last indexed one — by this commit, or by another process's that did not index them."""
    upto = conn.execute("SELECT id FROM messages_fts_upto").fetchone()[0]
    last = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
    if last is None or last <= upto:
        return
    conn.execute("INSERT INTO messages_fts (rowid, content) SELECT id, content FROM messages"
                 f" WHERE id > ? AND content IS NOT NULL AND {SEARCHED}", (upto,))
    conn.execute("UPDATE messages_fts_upto SET id = ?", (last,))


class SqlHistory:
    def __init__(self, engine: Engine):
        self.engine = engine

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)
        if self.engine.dialect == "sqlite":
            from pluto.storage.sqlite.engine import SqliteEngine
            assert isinstance(self.engine, SqliteEngine)
            self.engine.before_commit(index_new_messages)

    async def since_summary(self, session_id: str) -> tuple[Compaction | None,
                                                            list[tuple[int, MessageRow]]]:
        """The session's latest compaction and the messages after it (id, row), oldest first."""
        def read(conn: Any) -> tuple[Compaction | None, list[tuple[int, MessageRow]]]:
            row = conn.execute(
                "SELECT session_id, run_id, upto, summary, method, tokens_before, tokens_after,"
                " usage_tokens, created_at FROM compactions WHERE session_id = ?"
                " ORDER BY id DESC LIMIT 1", (session_id,)).fetchone()
            last = Compaction(*row) if row is not None else None
            rows = conn.execute(
                "SELECT id, role, content, tool_calls, tool_call_id, name, tokens, run_id,"
                " created_at FROM messages WHERE session_id = ? AND id > ?"
                " ORDER BY id DESC LIMIT ?",
                (session_id, last.upto if last else 0, MAX_UNSUMMARIZED)).fetchall()
            return last, [(int(r[0]), MessageRow(
                r[1], r[2], json.loads(r[3]) if r[3] else None, r[4], r[5], int(r[6]), r[7],
                float(r[8]))) for r in reversed(rows)]

        return await self.engine.read(read)

    async def compacted(self, c: Compaction) -> None:
        """Keep a compaction (the summary and its numbers) with the session."""
        await self.engine.write((
            "INSERT INTO compactions (session_id, run_id, upto, summary, method, tokens_before,"
            " tokens_after, usage_tokens, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (c.session_id, c.run_id, c.upto, c.summary, c.method, c.tokens_before,
             c.tokens_after, c.usage_tokens, c.created_at or time.time())))

    async def compactions(self, session_id: str) -> list[Compaction]:
        rows = await self.engine.fetchall(
            "SELECT session_id, run_id, upto, summary, method, tokens_before, tokens_after,"
            " usage_tokens, created_at FROM compactions WHERE session_id = ? ORDER BY id",
            (session_id,))
        return [Compaction(*tuple(r)) for r in rows]

    async def search(self, session_key: str, query: str, limit: int = 10) -> list[HistoryHit]:
        """Messages of people and the agent (not tools) in every session of ``session_key``
        (also those before a /new) that hold every word of ``query``; the newest first."""
        terms = _terms(query)
        if not terms:
            return []
        if self.engine.dialect == "postgres":
            match = ("to_tsvector('simple', coalesce(m.content, '')) @@"
                     " plainto_tsquery('simple', ?)")
            arg = " ".join(terms)
        else:
            match = "m.id IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?)"
            arg = " ".join('"' + t.replace('"', "") + '"' for t in terms)
        rows = await self.engine.fetchall(
            "SELECT m.id, m.session_id, m.role, m.content, m.created_at FROM messages m"
            " JOIN sessions s ON s.id = m.session_id WHERE s.key = ?"
            f" AND m.{SEARCHED} AND m.content IS NOT NULL AND " + match +
            " ORDER BY m.id DESC LIMIT ?", (session_key, arg, limit))
        return [HistoryHit(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]


class SqlNotes:
    """Long-term memory files kept in the database, for gateways that share one (PostgreSQL):
    each owner's Markdown text with its revision number, and every revision. A write is a
    compare-and-set on the revision number, so of two writes at once one retries (the caller,
    :class:`pluto.runtime.memory.SharedMemoryBook`) and both land."""

    def __init__(self, engine: Engine):
        self.engine = engine

    async def migrate(self) -> None:  # (the component's migrations are run by SqlHistory)
        return None

    async def read(self, owner: str) -> tuple[str, int] | None:
        row = await self.engine.fetchone(
            "SELECT text, rev FROM memory_files WHERE owner = ?", (owner,))
        return (row[0], int(row[1])) if row is not None else None

    async def write(self, owner: str, expected_rev: int, revision: dict[str, Any]) -> bool:
        """Store ``revision['content']`` as revision ``expected_rev + 1``; False (nothing
        written) when the owner's revision is no longer ``expected_rev``."""
        r = revision

        def change(conn: Any) -> bool:
            if expected_rev == 0:
                done = conn.execute(
                    "INSERT INTO memory_files (owner, text, rev, updated_at) VALUES (?,?,1,?)"
                    " ON CONFLICT(owner) DO NOTHING", (owner, r["content"], r["at"])).rowcount
            else:
                done = conn.execute(
                    "UPDATE memory_files SET text = ?, rev = rev + 1, updated_at = ?"
                    " WHERE owner = ? AND rev = ?",
                    (r["content"], r["at"], owner, expected_rev)).rowcount
            if not done:
                return False
            conn.execute(
                "INSERT INTO memory_revisions (owner, rev, at, by_whom, op, why, diff, content,"
                " sha256) VALUES (?,?,?,?,?,?,?,?,?)",
                (owner, expected_rev + 1, r["at"], r["by"], r["op"], r["why"], r["diff"],
                 r["content"], r["sha256"]))
            return True

        return await self.engine.transact(change)

    async def revisions(self, owner: str) -> list[dict[str, Any]]:
        rows = await self.engine.fetchall(
            "SELECT rev, at, by_whom, op, why, diff, content, sha256 FROM memory_revisions"
            " WHERE owner = ? ORDER BY rev", (owner,))
        return [{"rev": int(r[0]), "at": float(r[1]), "by": r[2], "op": r[3], "why": r[4],
                 "diff": r[5], "content": r[6], "sha256": r[7]} for r in rows]

    async def owners(self) -> list[str]:
        rows = await self.engine.fetchall("SELECT owner FROM memory_files ORDER BY owner")
        return [r[0] for r in rows]
