"""Sessions, messages, runs and run events in SQLite.

A run's events are numbered 1, 2, 3, … (``seq``) as they are committed; the number is handed
back with the event. A preview (streamed text) is numbered and shown before it is committed, but
never more than ``PREVIEWS_AHEAD`` numbers beyond what is committed of its run: whoever ends a
run that another process was writing (after a crash, or a take-over) numbers its end past that
window, so a number once shown is never given to another event — a crash skips numbers, never
reuses them. A run is recorded as ``queued`` when the gateway accepts its message, and
``running`` once it starts, with the user's message and its ``run.start`` in the same commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from pluto.errors import RunTakenOver, StorageError
from pluto.events import RunEnd, RunEvent, event_from_dict, event_to_dict
from pluto.ids import new_id
from pluto.storage.rows import (MessageRow, RunRow, SessionRow, estimate_tokens,
                                sanitize_history)
from pluto.storage.sql import (Engine, Migration, Statement, json_text, online_index,
                               run_statements, together)
from pluto.storage.sql.fencing import Claim, fence
from pluto.storage.sql.usage import SqlUsage

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPONENT = "conversations"
MIGRATIONS: list[Migration] = [
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
    # Several instances: which instance runs it (its owner) and the inbox's message it
    # answers, so that another instance can take a dead one's runs over.
    """
    ALTER TABLE runs ADD COLUMN owner TEXT;
    ALTER TABLE runs ADD COLUMN source_provider TEXT;
    ALTER TABLE runs ADD COLUMN source_id TEXT;
    CREATE INDEX runs_owner ON runs(owner, status);
    """,
    # several instances: the runs followed by an instance other than the one executing them
    # (only their writes notify: see _telling)
    """
    CREATE TABLE run_follows (
        run_id TEXT NOT NULL,
        instance TEXT NOT NULL,
        since REAL NOT NULL,
        PRIMARY KEY (run_id, instance)
    );
    """,
    # several instances: counts the times messages of the session were deleted (a taken-over
    # run's, before it is answered again): a copy of its history read before is whole no more
    """
    ALTER TABLE sessions ADD COLUMN trimmed INTEGER NOT NULL DEFAULT 0;
    """,
    # several instances: the cluster's sweep reads the runs answered in the last day by this
    # index, not every run ever answered (runs are kept: 200,000 of them took it 0.6 s, every
    # half lease, on each instance); one SQLite process never sweeps (no index to keep up)
    {"sqlite": "SELECT 1",
     "postgres": online_index("runs_answered", "runs(ended_at) WHERE status = 'ok'")},
    # PostgreSQL: no foreign keys on a message's way. Each row a key guards is checked by a
    # query of its own at the statement's end (a trigger, through SPI) that also locks the row
    # it finds (FOR KEY SHARE): six a message (three run events, two messages, the run), 15%
    # of the database's CPU a message. Nothing deletes a session or a run, and every writer
    # writes a run before its events; SQLite keeps the keys (there a check is one index
    # lookup), so the tests still catch a row written before its parent.
    {"sqlite": "SELECT 1",
     "postgres": "ALTER TABLE run_events DROP CONSTRAINT IF EXISTS run_events_run_id_fkey;"
                 " ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_session_id_fkey;"
                 " ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_session_id_fkey"},
]
FOLLOWS_KEPT = 86400.0  # seconds a follow left by an instance that died is kept
# the notes ``owner|run`` (owner, then the runs as one array) of the runs another instance follows
_FOLLOWED = ("SELECT DISTINCT ? || '|' || run_id AS p FROM run_follows"
             " WHERE run_id = ANY(?::text[])")
# An answered run whose reply never reached the outbox (its instance died in between), recent
UNDELIVERED_WINDOW = 86400.0
_UNDELIVERED = ("(r.status = 'ok' AND r.ended_at > ? AND NOT EXISTS (SELECT 1 FROM outbox o"
                " WHERE o.reply_id = r.id))")
SESSION_CACHE = 10_000
PREVIEWS_AHEAD = 64  # previews of a run numbered (and shown) beyond its last committed event
# previews wait this long for a write to ride with (the run's next event, its answer, another
# run's preview) before they are written by themselves: a streamed answer's batches (every
# 40 ms) cost a statement per ~0.1 s, and an answer that comes at once carries its preview
PREVIEWS_WAIT = 0.1
_FIND_SESSION = "SELECT id, key, agent, created_at FROM sessions WHERE key = ? AND active = 1"
_INSERT_SESSION = ("INSERT INTO sessions (id, key, agent, created_at, updated_at)"
                   " VALUES (?,?,?,?,?)")
HISTORY_SESSIONS = 1_000  # sessions whose recent messages are kept in memory
_MESSAGE_COLUMNS = "role, content, tool_calls, tool_call_id, name, tokens, run_id, created_at"
# (PostgreSQL, several instances) the active session with its newest messages, in one read:
# only those after message ``id`` (the newest of the copy kept here) when that copy is of this
# session and none of its messages were deleted since; else the newest (all parameters:
# session id, trimmed, after, how many, key)
_FIND_SESSION_AND_HISTORY = (
    "SELECT s.id, s.key, s.agent, s.created_at, m.role, m.content, m.tool_calls,"
    " m.tool_call_id, m.name, m.tokens, m.run_id, m.created_at AS said_at, m.id AS m_id,"
    " s.trimmed FROM sessions s"
    " LEFT JOIN LATERAL (SELECT id, " + _MESSAGE_COLUMNS + " FROM messages"
    " WHERE session_id = s.id AND id > CASE WHEN s.id = ? AND s.trimmed = ? THEN ? ELSE 0 END"
    " ORDER BY id DESC LIMIT ?) m ON true"
    " WHERE s.key = ? AND s.active = 1 ORDER BY m.id DESC")
PREFETCH_FOR = 2.0  # seconds a history read with its session serves the run that follows
PREFETCH_MESSAGES = 50  # how many (an agent's default history is 40 messages)
# (several instances) a session's copy is read whole again at least this often: a message
# committed out of id order (none is, while one run at a time writes a session) would be
# missed by the reads of what is newer for no longer than this
WINDOW_WHOLE_EVERY = 60.0
HISTORY_MESSAGES = 200  # of each, at most this many (a longer window reads the database)


_NO_CALLS = estimate_tokens('""')  # (what a message without tool calls always counted)


def _message(role: str, content: str | None, run_id: str | None,
             tool_calls: list[dict] | None = None, tool_call_id: str | None = None,
             name: str | None = None) -> MessageRow:
    tokens = estimate_tokens(content or "") + (estimate_tokens(json.dumps(tool_calls))
                                               if tool_calls else _NO_CALLS)
    return MessageRow(role, content, tool_calls, tool_call_id, name, tokens, run_id, time.time())


def _message_stmt(session_id: str, m: MessageRow) -> Statement:
    return ("INSERT INTO messages (session_id, run_id, role, content, tool_calls, tool_call_id,"
            " name, tokens, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (session_id, m.run_id, m.role, m.content,
             json.dumps(m.tool_calls) if m.tool_calls else None, m.tool_call_id, m.name,
             m.tokens, m.created_at))


_INSERT_EVENT = "INSERT INTO run_events (run_id, seq, type, data) VALUES (?,?,?,?)"
_EVENT_INTO = "INSERT INTO run_events "  # (fenced or not)


def _event_stmt(event: RunEvent) -> Statement:
    return (_INSERT_EVENT,
            (event.run_id, event.seq, event.type, json_text(event_to_dict(event))))


def _accepted(run_id: str) -> str:
    """The inbox's outcome of a message taken up by run ``run_id``."""
    return json.dumps({"type": "accepted", "run_id": run_id})


def _handled(source: tuple[str, str], run_id: str) -> Statement:
    """The inbox's message (provider, message id) is handled by run ``run_id``: it will not be
    replayed. Its payload stays (until the inbox is pruned): if the instance running it dies,
    another one answers it again from there."""
    outcome = _accepted(run_id)
    return ("UPDATE inbound_seen SET handled = 1, outcome = ? WHERE provider = ? AND"
            " message_id = ? AND (handled = 0 OR outcome = ?)", (outcome, *source, outcome))


def _claim_source(conn: Any, source: tuple[str, str] | None, run_id: str,
                  claim: Claim | None = None) -> None:
    """Mark the run's message handled by it — unless another instance's run has it already
    (it took the chat over meanwhile), or the chat's claim it was taken under moved on: then
    this run must not go on."""
    if source is not None and conn.execute(*fence(_handled(source, run_id),
                                                   claim)).rowcount == 0:
        raise RunTakenOver(f"message {source[1]} of {source[0]} is answered elsewhere, or its"
                           " chat was taken over")


def _after(stmt: Statement, guard: str) -> Statement:
    """(One statement of CTEs, PostgreSQL) ``stmt`` made to change nothing unless the CTE
    ``guard`` returned a row: ``INSERT … VALUES (…)`` becomes ``INSERT … SELECT … FROM guard``,
    ``UPDATE … WHERE …`` gets ``AND EXISTS (SELECT 1 FROM guard)``."""
    sql, params = stmt
    if sql.startswith("INSERT INTO "):
        head, sep, values = sql.partition(" VALUES (")
        if sep and values.endswith(")") and "?" in values:
            return f"{head} SELECT {values[:-1]} FROM {guard}", params
    elif sql.startswith("UPDATE ") and " WHERE " in sql:
        return f"{sql} AND EXISTS (SELECT 1 FROM {guard})", params
    raise ValueError(f"cannot guard {sql!r}")


def _runs(stmts: list[Statement]) -> set[str]:
    """The runs whose events ``stmts`` write."""
    return {params[0] for sql, params in stmts if sql.startswith(_EVENT_INTO)}


def _row_lock(engine: Engine) -> str:
    """(PostgreSQL) ``FOR UPDATE``: a run's row locked before its end is decided. Two
    instances ending one run at once (a hand-back here, the chat taken over there, a stop)
    would both read it running and its last seq, and write two ends or the same one twice;
    the second now waits for the first, then finds the run ended. (SQLite: writes are serial.)"""
    return " FOR UPDATE" if engine.dialect == "postgres" else ""


def _next_seq_elsewhere(committed: int) -> int:
    """The next seq of a run that another process was writing (it crashed, or lost the run):
    past every preview it may have shown but not committed. A run with nothing committed
    showed nothing (its start is committed before any preview)."""
    return committed + PREVIEWS_AHEAD + 1 if committed else 1


def _message_row(r: tuple[Any, ...]) -> MessageRow:
    """A message from the columns of ``_MESSAGE_COLUMNS``, in their order (a plain tuple:
    read by position, no lookup by name per column)."""
    role, content, tool_calls, tool_call_id, name, tokens, run_id, created_at = r
    return MessageRow(role, content, json.loads(tool_calls) if tool_calls else None,
                      tool_call_id, name, tokens, run_id, created_at)


def _session(row: Any) -> SessionRow:
    return SessionRow(row["id"], row["key"], row["agent"], row["created_at"])


class _Window:
    """(A shared database) a session's newest messages as last read here: ``last_id`` the
    newest one's id, ``trimmed`` the session's count of deletions then, ``whole_at`` when it
    was last read whole (monotonic)."""

    __slots__ = ("session_id", "trimmed", "whole_at", "last_id", "rows")

    def __init__(self, session_id: str, trimmed: int, whole_at: float):
        self.session_id = session_id
        self.trimmed = trimmed
        self.whole_at = whole_at
        self.last_id = 0
        self.rows: deque[MessageRow] = deque(maxlen=PREFETCH_MESSAGES)


class SqliteConversations:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._seq: dict[str, int] = {}  # the last seq of each run this process is writing
        self._kept: dict[str, int] = {}  # ... and the last of them known committed
        self._behind: list[Statement] = []  # preview events numbered, not yet handed over
        self._flusher: asyncio.Task[None] | None = None
        # several connections (PostgreSQL): the last write of each run's events not yet
        # committed; the next one waits for it, so a run's events become visible in seq order
        # (a watcher on another instance reading 11 before 9 would take 9 and 10 for skipped)
        self._tails: dict[str, asyncio.Future[None]] = {}
        self._sessions: dict[str, SessionRow] = {}  # active session by key (bounded cache)
        self._unwritten: dict[str, SessionRow] = {}  # new sessions whose row is being written
        # The newest messages of recently used sessions, appended to as they are committed:
        # a run reads its history from memory. Only when this process is the only writer of
        # the database (SQLite serves one gateway), so the copies cannot go stale; a shared
        # database (several instances) is always read.
        self._recent: OrderedDict[str, deque[MessageRow]] = OrderedDict()
        self._cache = not engine.shared
        # (a shared database) the history read with a session's lookup, for the run that
        # follows at once: dropped by any write of the session here, and after PREFETCH_FOR
        self._prefetched: OrderedDict[str, tuple[float, list[MessageRow]]] = OrderedDict()
        # (a shared database) each recently used session's newest messages as last read, by
        # session key: a lookup reads only what is newer (a message's rows are turned into
        # objects once, not at every message)
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self.owner = "local"  # the instance whose runs these are (set by the gateway)
        self.notify_channel: str | None = None  # (PostgreSQL, several instances)
        # several instances: the chat claim (lease, token) each run's writes are fenced by
        # (storage/sql/fencing.py), and the claims messages were taken under, until their
        # run starts
        self._claims: dict[str, Claim] = {}
        self._source_claims: dict[tuple[str, str], Claim] = {}
        # (PostgreSQL) the usage ledger, whose rows held for a run ride with its end
        self.usage: SqlUsage | None = None

    def claim(self, source: tuple[str, str], claim: Claim | None) -> None:
        """Several instances: the message ``source`` (provider, message id) was taken from the
        inbox under ``claim``; the writes of the run answering it are fenced by it (None: it
        is done with)."""
        if claim is None:
            self._source_claims.pop(source, None)
        else:
            self._source_claims[source] = claim

    def _claimed(self, run_id: str, source: tuple[str, str] | None) -> Claim | None:
        claim = self._source_claims.get(source) if source is not None else None
        if claim is None:  # (queued under it: the claim stays the run's)
            return self._claims.get(run_id)
        self._claims[run_id] = claim
        return claim

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    # sessions and messages ----------------------------------------------------------------

    async def session(self, key: str, agent: str) -> SessionRow:
        if not self._cache:
            return await self._find_or_create(key, agent)
        if (known := self._known(key)) is not None:
            return known
        row = await self.engine.fetchone(_FIND_SESSION, (key,), small=True)
        if (known := self._known(key)) is not None:  # created while we read
            return known
        if row is not None:
            session = _session(row)
        else:
            session = SessionRow(new_id(), key, agent, time.time())
            self._create(session)
            self._keep_recent(session.id, [])  # empty: its first run need not read it
        if len(self._sessions) >= SESSION_CACHE:
            self._sessions.clear()
        self._sessions[key] = session
        return session

    def _known(self, key: str) -> SessionRow | None:
        return self._sessions.get(key) or self._unwritten.get(key)

    def _create(self, session: SessionRow) -> None:
        """(This process the database's only writer.) A new session, its row written without
        waiting: whatever uses it next (the run's start, a queued run, an upload) is committed
        after it, in the same commit or a later one — a new chat's first word waits for one
        commit, not two. Until its row is committed, lookups find it here."""
        self._unwritten[session.key] = session
        insert = (_INSERT_SESSION, (session.id, session.key, session.agent, session.created_at,
                                    session.created_at))
        written = self.engine.queue(run_statements((insert,)))
        written.add_done_callback(lambda done: self._written(session, done))

    def _written(self, session: SessionRow, done: asyncio.Future[int]) -> None:
        if self._unwritten.get(session.key) is session:
            del self._unwritten[session.key]
        if done.cancelled() or done.exception() is None:
            return
        log.error("storage: a new session for %s was not saved: %s (its run fails with it)",
                  session.key, done.exception())
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        self._recent.pop(session.id, None)

    async def _find_or_create(self, key: str, agent: str) -> SessionRow:
        # (several instances) one plain read for a session that exists — every message but a
        # chat's first — with its history, and a transaction only to create one
        if self.engine.dialect == "postgres":
            if (session := await self._find_with_history(key)) is not None:
                return session
        elif (row := await self.engine.fetchone(_FIND_SESSION, (key,), small=True)) is not None:
            return _session(row)

        def find_or_create(conn: Any) -> SessionRow:
            row = conn.execute(_FIND_SESSION, (key,)).fetchone()
            if row is not None:
                return _session(row)
            now = time.time()
            new = SessionRow(new_id(), key, agent, now)
            conn.execute(_INSERT_SESSION, (new.id, key, agent, now, now))
            return new

        return await self.engine.transact(find_or_create)

    async def reset_session(self, key: str) -> bool:
        self._sessions.pop(key, None)
        self._unwritten.pop(key, None)  # (its row is written before this change)
        changed = await self.engine.write((
            "UPDATE sessions SET active = 0, updated_at = ? WHERE key = ? AND active = 1",
            (time.time(), key)))
        self._sessions.pop(key, None)  # a lookup may have cached it while we wrote
        return changed > 0

    async def add_message(self, session_id: str, role: str, content: str | None, *,
                          run_id: str | None = None, tool_calls: list[dict] | None = None,
                          tool_call_id: str | None = None, name: str | None = None,
                          event: RunEvent | None = None) -> RunEvent | None:
        message = _message(role, content, run_id, tool_calls, tool_call_id, name)
        claim = self._claims.get(run_id) if run_id is not None else None
        stmts = [fence(_message_stmt(session_id, message), claim)]
        if event is not None:
            event = self._numbered(event)
            stmts.append(fence(_event_stmt(event), claim))
        stmts = [*self._take_behind(), *stmts]
        if await self._in_order(_runs(stmts), lambda: self._write(stmts)) == 0 \
                and claim is not None:
            raise RunTakenOver(f"run {run_id} was taken over by another instance")
        self._committed(stmts)
        self._remember(session_id, message)
        return event

    async def messages(self, session_id: str, limit: int = 1000) -> list[MessageRow]:
        rows = await self.engine.fetchall(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? ORDER BY id DESC"
            " LIMIT ?", (session_id, limit), small=limit <= HISTORY_MESSAGES)
        return [_message_row(tuple(r)) for r in reversed(rows)]

    async def run_sources(self, session_id: str, limit: int) -> dict[str, str]:
        """The message each of the session's ``limit`` latest runs answers (its provider's
        id), for the runs that answer one: run id -> message id."""
        rows = await self.engine.fetchall(
            "SELECT id, source_id FROM runs WHERE session_id = ? AND source_id IS NOT NULL"
            " ORDER BY started_at DESC LIMIT ?", (session_id, limit))
        return {r[0]: r[1] for r in rows}

    async def deletions(self, session_id: str) -> int:
        if not self.engine.shared:  # (one process: a run is taken over only at its start)
            return 0
        row = await self.engine.fetchone("SELECT trimmed FROM sessions WHERE id = ?",
                                         (session_id,))
        return int(row[0]) if row is not None else 0

    async def newest_tool_result(self, session_id: str, name: str) -> str | None:
        """What the session's newest call of tool ``name`` returned (None: never called)."""
        row = await self.engine.fetchone(
            "SELECT content FROM messages WHERE session_id = ? AND role = 'tool' AND name = ?"
            " ORDER BY id DESC LIMIT 1", (session_id, name))
        return row[0] if row is not None else None

    async def _find_with_history(self, key: str) -> SessionRow | None:
        """(PostgreSQL) The active session of ``key`` with its newest messages, kept for the
        run that follows: one statement, which reads only the messages newer than the copy
        kept here when it is still whole (the same session, none of its messages deleted
        since, read whole within :data:`WINDOW_WHOLE_EVERY`)."""
        window = self._windows.get(key)
        now = time.monotonic()
        if window is not None and now - window.whole_at >= WINDOW_WHOLE_EVERY:
            window = None
        sid, trimmed, after = ((window.session_id, window.trimmed, window.last_id)
                               if window is not None else ("", 0, 0))
        rows = await self.engine.fetchall(_FIND_SESSION_AND_HISTORY,
                                          (sid, trimmed, after, PREFETCH_MESSAGES, key))
        if not rows:
            self._windows.pop(key, None)
            return None
        first = rows[0]
        session = _session(first)
        if window is None or window.session_id != session.id or window.trimmed != first[13]:
            window = _Window(session.id, first[13], now)  # (read whole: a copy of its own)
            self._windows[key] = window
            while len(self._windows) > HISTORY_SESSIONS:
                self._windows.popitem(last=False)
        elif self._windows.get(key) is window:  # what is newer than the copy
            self._windows.move_to_end(key)
        else:  # the copy was replaced or dropped while this read: the run reads its own
            return session
        # (newest first; a lookup of the same key at the same time may have added some)
        newer = [r for r in rows if r[4] is not None and r[12] > window.last_id]
        if newer:
            window.rows.extend(_message_row(tuple(r)[4:12]) for r in reversed(newer))
            window.last_id = newer[0][12]
        self._prefetch(session.id, list(window.rows))
        return session

    def _prefetch(self, session_id: str, rows: list[MessageRow]) -> None:
        self._prefetched[session_id] = (time.monotonic() + PREFETCH_FOR, rows)
        self._prefetched.move_to_end(session_id)
        while len(self._prefetched) > HISTORY_SESSIONS:
            self._prefetched.popitem(last=False)

    def _prefetched_rows(self, session_id: str, limit: int) -> list[MessageRow] | None:
        """The history read with the session moments ago, if nothing was written to it here
        since (once: the run that follows takes it)."""
        until, rows = self._prefetched.pop(session_id, (0.0, []))
        whole = len(rows) < PREFETCH_MESSAGES or limit <= len(rows)  # (all it asks for)
        return rows if time.monotonic() < until and whole else None

    async def history(self, session_id: str, max_messages: int,
                      max_tokens: int) -> list[dict[str, Any]]:
        if max_messages <= 0:
            return []
        recent = self._recent.get(session_id) if self._cache else None
        if recent is not None and max_messages <= HISTORY_MESSAGES:
            self._recent.move_to_end(session_id)
            rows = list(recent)[-max_messages:]
        elif (fetched := self._prefetched_rows(session_id, max_messages)) is not None:
            rows = fetched[-max_messages:]
        else:
            # (kept in memory: the whole window; a shared database: just what is asked for)
            rows = await self.messages(session_id, limit=max(max_messages, HISTORY_MESSAGES)
                                       if self._cache else max_messages)
            if self._cache and session_id not in self._recent:
                self._keep_recent(session_id, rows)
            rows = rows[-max_messages:]
        kept: list[MessageRow] = []
        total = 0
        for row in reversed(rows):
            total += row.tokens
            if total > max_tokens and kept:
                break
            kept.append(row)
        return sanitize_history([r.as_model_message() for r in reversed(kept)])

    def _keep_recent(self, session_id: str, rows: list[MessageRow]) -> None:
        self._recent[session_id] = deque(rows[-HISTORY_MESSAGES:], maxlen=HISTORY_MESSAGES)
        while len(self._recent) > HISTORY_SESSIONS:
            self._recent.popitem(last=False)

    def _remember(self, session_id: str, *messages: MessageRow) -> None:
        """Messages just committed join the session's copy in memory, if it has one."""
        self._prefetched.pop(session_id, None)
        recent = self._recent.get(session_id)
        if recent is not None:
            recent.extend(messages)

    # runs and events ----------------------------------------------------------------------

    def _numbered(self, event: RunEvent) -> RunEvent:
        seq = self._seq.get(event.run_id, 0) + 1
        self._seq[event.run_id] = seq
        return replace(event, seq=seq)

    def _committed(self, stmts: list[Statement]) -> None:
        """The events among ``stmts`` are committed: previews may be numbered that far on."""
        for sql, params in stmts:
            if sql.startswith(_EVENT_INTO) and params[0] in self._seq:
                self._kept[params[0]] = max(self._kept.get(params[0], 0), params[1])

    def _forget(self, run_id: str) -> None:
        """The run is no longer written by this process (it ended, or was taken over)."""
        self._seq.pop(run_id, None)
        self._kept.pop(run_id, None)
        self._claims.pop(run_id, None)

    async def queue_run(self, run_id: str, session_id: str, agent: str, input_text: str, *,
                        source: tuple[str, str] | None = None) -> None:
        def queue(conn: Any) -> None:
            conn.execute(
                "INSERT INTO runs (id, session_id, agent, status, input, started_at, owner,"
                " source_provider, source_id) VALUES (?,?,?,'queued',?,?,?,?,?) ON CONFLICT DO"
                " NOTHING", (run_id, session_id, agent, input_text, time.time(), self.owner,
                             *(source or (None, None))))
            _claim_source(conn, source, run_id, claim)  # handled with this very commit

        claim = self._claimed(run_id, source)
        await self.engine.transact(queue)

    async def start_run(self, run_id: str, session_id: str, agent: str, input_text: str,
                        event: RunEvent, *, source: tuple[str, str] | None = None,
                        message: bool = True) -> RunEvent:
        now = time.time()
        self._seq[run_id] = 0
        event = self._numbered(event)
        said = _message("user", input_text, run_id) if message else None
        stmts: list[Statement] = [
            ("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id)),
            *([_message_stmt(session_id, said)] if said is not None else []),
            _event_stmt(event)]

        running: Statement = (
            "INSERT INTO runs (id, session_id, agent, status, input, started_at, owner,"
            " source_provider, source_id) VALUES (?,?,?,'running',?,?,?,?,?)"
            " ON CONFLICT(id) DO UPDATE SET status = 'running',"
            " session_id = excluded.session_id, agent = excluded.agent,"
            " input = excluded.input, started_at = excluded.started_at,"
            " owner = excluded.owner WHERE runs.status = 'queued'",
            (run_id, session_id, agent, input_text, now, self.owner, *(source or (None, None))))

        def start(conn: Any) -> None:
            if conn.execute(*running).rowcount == 0:
                raise RunTakenOver(f"run {run_id} has ended (taken over) before it started")
            _claim_source(conn, source, run_id, claim)
            for stmt in stmts:
                conn.execute(*stmt)

        claim = self._claimed(run_id, source)
        try:
            if self.engine.dialect == "postgres":
                await self._start_together(run_id, running, source, claim, stmts)
            else:
                await self.engine.transact(start)
        except RunTakenOver:
            self._forget(run_id)
            raise
        self._kept[run_id] = event.seq
        if said is not None:
            self._remember(session_id, said)
        return event

    async def _start_together(self, run_id: str, running: Statement,
                              source: tuple[str, str] | None, claim: Claim | None,
                              stmts: list[Statement]) -> None:
        """(PostgreSQL) :meth:`start_run`'s change as one statement: the run's row, then its
        message marked handled (fenced by the chat's claim), then the rest — each only if the
        one before changed its row."""
        parts: list[tuple[str, Statement]] = [("r", (running[0] + " RETURNING 1", running[1]))]
        guard = "r"
        if source is not None:
            sql, params = fence(_handled(source, run_id), claim)
            parts.append(("h", (f"{sql} AND EXISTS (SELECT 1 FROM r) RETURNING 1", params)))
            guard = "h"
        parts += [(f"s{i}", _after(stmt, guard)) for i, stmt in enumerate(stmts)]
        row = await self.engine.write_returning(self._telling(
            together(parts, f"(SELECT count(*) FROM r), (SELECT count(*) FROM {guard})"),
            {run_id}))
        assert row is not None
        if not row[0]:
            raise RunTakenOver(f"run {run_id} has ended (taken over) before it started")
        if not row[1]:  # its row says running, its message is another's: it ends here
            assert source is not None
            raise RunTakenOver(f"message {source[1]} of {source[0]} is answered elsewhere, or "
                               "its chat was taken over", await self._end_unstarted(run_id))

    async def _end_unstarted(self, run_id: str) -> RunEnd | None:
        """A run whose row was written running but whose message another instance's run has
        (it took the chat over while this one was away): recorded interrupted, with its end
        event — a tab that was shown it accepted follows it until its end, and is then shown
        the run that answers its message. The end, if this instance recorded it."""
        def end_it(conn: Any) -> RunEnd | None:
            if conn.execute("UPDATE runs SET status = 'interrupted', error = ?, ended_at = ?"
                            " WHERE id = ? AND status = 'running' AND owner = ?",
                            ("its message is answered elsewhere, or its chat was taken over",
                             time.time(), run_id,
                             self.owner)).rowcount == 0:
                return None
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE"
                               " run_id = ?", (run_id,)).fetchone()[0]
            end = RunEnd(run_id=run_id, outcome="interrupted", seq=_next_seq_elsewhere(seq))
            conn.execute(*_event_stmt(end))
            self._tell(conn, {run_id}, always=True)
            return end

        return await self.engine.transact(end_it)

    async def append_event(self, event: RunEvent, *, durable: bool = True) -> RunEvent:
        event = self._numbered(event)
        if durable or event.seq > self._kept.get(event.run_id, 0) + PREVIEWS_AHEAD:
            # (a preview that far ahead of its run's commits waits for its own: storage is
            # behind by a whole window, and a number shown must survive a crash)
            claim = self._claims.get(event.run_id)
            stmts = [*self._take_behind(), fence(_event_stmt(event), claim)]
            if await self._in_order(_runs(stmts), lambda: self._write(stmts)) == 0 \
                    and claim is not None:
                raise RunTakenOver(f"run {event.run_id} was taken over by another instance")
            self._committed(stmts)
            return event
        # A preview (a batch of streamed text): numbered now, committed behind the caller with
        # the next write — at the latest with the run's next durable event, in its commit
        self._behind.append(fence(_event_stmt(event), self._claims.get(event.run_id)))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_behind())
        return event

    async def _in_order(self, runs: set[str], write: Callable[[], Awaitable[T]]) -> T:
        """``write`` (it commits events of ``runs``) after the writes of those runs' events
        handed over before it have committed — unless the engine commits in order anyway."""
        if self.engine.in_order or not runs:
            return await write()
        before = {self._tails[r] for r in runs if r in self._tails}
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for r in runs:
            self._tails[r] = mine
        try:
            if before:
                await asyncio.wait(before)  # (never cancels them)
            return await write()
        finally:
            mine.set_result(None)
            for r in runs:
                if self._tails.get(r) is mine:
                    del self._tails[r]

    async def _write(self, stmts: list[Statement]) -> int:
        """``stmts`` (events and messages: different rows) as one change; the row count of
        the last (on PostgreSQL one statement, which notifies the runs it writes events of)."""
        if self.notify_channel is None:
            return await self.engine.write_together(*stmts)
        *first, (last, params) = stmts
        row = await self.engine.write_returning(self._telling(together(
            [*((f"w{i}", s) for i, s in enumerate(first)),
             ("last", (last + " RETURNING 1", params))], "(SELECT count(*) FROM last)"),
            _runs(stmts)))
        return int(row[0]) if row is not None else 0

    def _telling(self, stmt: Statement, runs: set[str]) -> Statement:
        """(PostgreSQL, several instances) ``stmt`` — ``WITH … SELECT <results>`` — made to
        notify ``owner|run`` for each of ``runs`` on :attr:`notify_channel` as it commits: the
        other instances' watchers of those runs read them then, never before (a notification
        sent after the commit would cost a statement of its own). Only runs another instance
        follows (:meth:`follow_elsewhere`) are told: every instance hears every note."""
        if self.notify_channel is None or not runs:
            return stmt
        sql, params = stmt
        return (sql + f", (SELECT count(pg_notify(?, f.p)) FROM ({_FOLLOWED}) AS f)",
                (*params, self.notify_channel, self.owner, sorted(runs)))

    def _tell(self, conn: Any, runs: set[str], *, always: bool = False) -> None:
        """(In a transaction) :meth:`_telling`'s notifications, sent when it commits;
        ``always``: to every instance, followed or not (a run taken over: the instance that
        accepted it may show it live, without following it)."""
        if self.notify_channel is None or not runs:
            return
        if always:
            conn.execute("SELECT pg_notify(?, p) FROM unnest(?::text[]) AS u(p)",
                         (self.notify_channel, [f"{self.owner}|{r}" for r in sorted(runs)]))
        else:
            conn.execute(f"SELECT pg_notify(?, f.p) FROM ({_FOLLOWED}) AS f",
                         (self.notify_channel, self.owner, sorted(runs)))

    async def follow_elsewhere(self, run_id: str, following: bool = True) -> None:
        """(Several instances) This instance follows ``run_id``, which may execute on another:
        from now on, that one's writes of its events notify (:meth:`_telling`); ``following``
        False: no longer. Follows left by an instance that died go after a day."""
        if self.notify_channel is None:
            return
        if following:
            now = self.engine.now_sql  # (the database's clock: one for every instance)
            await self.engine.write((
                f"WITH gone AS (DELETE FROM run_follows WHERE since < {now} - ? AND NOT"
                " (run_id = ? AND instance = ?)) INSERT INTO run_follows (run_id, instance,"
                f" since) VALUES (?, ?, {now}) ON CONFLICT (run_id, instance)"
                " DO UPDATE SET since = excluded.since",
                (FOLLOWS_KEPT, run_id, self.owner, run_id, self.owner)))
        else:
            await self.engine.write(("DELETE FROM run_follows WHERE run_id = ? AND instance = ?",
                                     (run_id, self.owner)))

    def _take_behind(self) -> list[Statement]:
        """The preview events not yet handed to the engine: a write takes them along first."""
        if not self._behind:
            return []
        stmts, self._behind = self._behind, []
        return stmts

    async def _flush_behind(self) -> None:
        try:
            await asyncio.sleep(PREVIEWS_WAIT)
            while stmts := self._take_behind():
                try:
                    await self._in_order(_runs(stmts), lambda: self._write(stmts))
                except Exception as e:  # noqa: BLE001 - previews only: the answer is durable
                    log.warning("storage: %d streamed preview event(s) were not kept: %s",
                                len(stmts), e)
                else:
                    self._committed(stmts)
        finally:
            self._flusher = None

    async def end_run(self, run_id: str, status: str, *, error: str | None = None,
                      usage: dict[str, int] | None = None,
                      event: RunEvent | None = None) -> RunEvent | None:
        if event is not None and run_id not in self._seq:  # e.g. a queued run that never ran
            self._seq[run_id] = _next_seq_elsewhere(await self._last_seq(run_id)) - 1
        stmts: list[Statement] = []
        if event is not None:
            event = self._numbered(event)
            stmts.append(_event_stmt(event))
        update = fence(("UPDATE runs SET status = ?, error = ?, usage = ?, ended_at = ?"
                        " WHERE id = ? AND status IN ('queued', 'running')",
                        (status, error, json.dumps(usage or {}), time.time(), run_id)),
                       self._claims.get(run_id))
        behind = self._take_behind()

        def end(conn: Any) -> bool:
            for stmt in behind:
                conn.execute(*stmt)
            if conn.execute(*update).rowcount == 0:
                self._tell(conn, _runs(behind))
                return False  # it has ended already (taken over by another instance)
            for stmt in stmts:
                conn.execute(*stmt)
            self._tell(conn, _runs(behind) | {run_id})
            return True

        try:
            ended = await self._in_order(_runs(behind) | {run_id},
                                         lambda: self.engine.transact(end))
        finally:
            self._forget(run_id)
        return event if ended else None

    async def cancel_run(self, run_id: str, session_id: str, agent: str, input_text: str,
                         event: RunEvent, *, error: str,
                         source: tuple[str, str] | None = None) -> RunEvent | None:
        behind = self._take_behind()
        written = self._seq.get(run_id)  # numbered here: previews lost on the way count
        lock = _row_lock(self.engine)  # (a take-over on another instance waits, or we do)

        def cancel(conn: Any) -> RunEvent | None:
            for stmt in behind:
                conn.execute(*stmt)
            row = conn.execute(f"SELECT status FROM runs WHERE id = ?{lock}",
                               (run_id,)).fetchone()
            self._tell(conn, _runs(behind) | {run_id})
            if row is not None and row["status"] not in ("queued", "running"):
                return None  # it ended on its own
            now = time.time()
            if row is None:
                conn.execute("INSERT INTO runs (id, session_id, agent, status, input,"
                             " started_at) VALUES (?,?,?,'cancelled',?,?)",
                             (run_id, session_id, agent, input_text, now))
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = ?",
                               (run_id,)).fetchone()[0]
            end = replace(event, seq=max(seq, written) + 1 if written is not None
                          else _next_seq_elsewhere(seq))
            conn.execute(*_event_stmt(end))
            conn.execute("UPDATE runs SET status = 'cancelled', error = ?, ended_at = ?"
                         " WHERE id = ?", (error, now, run_id))
            if source is not None:
                conn.execute(*_handled(source, run_id))
            return end

        try:
            return await self._in_order(_runs(behind) | {run_id},
                                        lambda: self.engine.transact(cancel))
        finally:
            self._forget(run_id)

    async def complete_run(self, run_id: str, session_id: str, final: RunEvent, end: RunEvent,
                           *, usage: dict[str, int]) -> tuple[RunEvent, RunEvent]:
        final, end = self._numbered(final), self._numbered(end)
        message = _message("assistant", getattr(final, "text", None), run_id)
        behind = self._take_behind()
        ended = fence(("UPDATE runs SET status = 'ok', error = NULL, usage = ?, ended_at = ?"
                       " WHERE id = ? AND status = 'running'",
                       (json_text(usage), time.time(), run_id)), self._claims.get(run_id))

        answer = [_message_stmt(session_id, message), _event_stmt(final), _event_stmt(end)]

        def complete(conn: Any) -> None:
            for stmt in behind:  # the previews before it, in its commit
                conn.execute(*stmt)
            # fenced: a run taken over by another instance (it thought this one dead) ends
            # there, and its answer here is refused rather than given twice
            if conn.execute(*ended).rowcount == 0:
                raise RunTakenOver(f"run {run_id} was taken over by another instance")
            for stmt in answer:
                conn.execute(*stmt)

        async def in_one() -> None:  # (PostgreSQL: one statement, one round trip)
            # the ledger rows of the run's calls ride with it, fenced as its end is
            held = self.usage.take_held(session_id) if self.usage is not None else None
            ledger = held.statements("done") if held is not None else []
            try:
                done = await self.engine.write_returning(self._telling(together(
                    [*((f"b{i}", stmt) for i, stmt in enumerate(behind)),
                     ("done", (ended[0] + " RETURNING 1", ended[1])),
                     *((f"a{i}", _after(stmt, "done")) for i, stmt in enumerate(answer)),
                     *((f"u{i}", stmt) for i, stmt in enumerate(ledger))],
                    "(SELECT count(*) FROM done)"), _runs(behind) | {run_id}))
            except BaseException as e:
                if held is not None:  # (cancelled: it may have committed all the same)
                    held.settle(e if isinstance(e, Exception) else StorageError(
                        f"the end of run {run_id} was interrupted: its usage may be missing"))
                raise
            if done is None or not done[0]:
                if held is not None:  # (its calls were made and paid for: counted all the same)
                    await self._taken_over_usage(run_id, held)
                raise RunTakenOver(f"run {run_id} was taken over by another instance")
            if held is not None:
                held.settle(len(held.calls))

        try:
            await self._in_order(_runs(behind) | {run_id},
                                 in_one if self.engine.dialect == "postgres"
                                 else lambda: self.engine.transact(complete))
        finally:
            self._forget(run_id)
        self._remember(session_id, message)
        return final, end

    async def _last_seq(self, run_id: str) -> int:
        row = await self.engine.fetchone(
            "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = ?", (run_id,))
        return int(row[0]) if row else 0

    async def run(self, run_id: str) -> RunRow | None:
        r = await self.engine.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
        if r is None:
            return None
        return RunRow(r["id"], r["session_id"], r["agent"], r["status"], r["input"], r["error"],
                      json.loads(r["usage"]) if r["usage"] else {}, r["started_at"], r["ended_at"],
                      r["source_id"])

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        """The run's events after ``after``; past the end of an ended run, its end all the
        same. One statement, so one snapshot: read apart, a run ending between the two reads
        gave its end without the answer before it (a follower then answered without text)."""
        rows = await self.engine.fetchall(
            "SELECT seq, type, data FROM run_events WHERE run_id = ? AND (seq > ? OR"
            " (type = 'run.end' AND seq = (SELECT max(seq) FROM run_events WHERE run_id = ?)))"
            " ORDER BY seq", (run_id, after, run_id))
        return [replace(event_from_dict(json.loads(r["data"])), seq=r["seq"]) for r in rows]

    async def recover_interrupted(self, *, requeue: bool = True) -> list[RunEvent]:
        """At start, with one process per database: every run that had not ended was the last
        process's. Each is recorded interrupted and (``requeue``) its message goes back to the
        inbox, to be answered again (a run already answered is never run twice)."""
        return await self._take_over("status IN ('queued', 'running')", (), requeue=requeue)

    async def unfinished_runs(self, started_before: float) -> list[str]:
        """Runs queued or running that started before ``started_before`` (wall clock)."""
        rows = await self.engine.fetchall(
            "SELECT id FROM runs WHERE status IN ('queued', 'running') AND started_at < ?"
            " ORDER BY started_at", (started_before,))
        return [r[0] for r in rows]

    async def recover_runs(self, run_ids: list[str]) -> list[RunEvent]:
        """One process per database: runs that this process no longer runs (storage failed
        while they ran, so they could not even be ended) are recorded interrupted and their
        messages go back to the inbox, like a dead process's at start."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        return await self._take_over(f"status IN ('queued', 'running') AND id IN ({marks})",
                                      tuple(run_ids))

    async def take_over_chat(self, provider: str, chat_id: str) -> list[RunEvent]:
        """Several instances: this instance now holds the chat, so a run of the chat that has
        not ended and belongs to another instance was left by one that died (or lost the
        chat). Each is recorded interrupted — fencing its owner: a late answer from it is
        refused (:meth:`complete_run`) — and its message goes back to the inbox, ahead of the
        chat's later ones."""
        return await self._take_over(
            "status IN ('queued', 'running') AND owner != ? AND source_provider = ? AND"
            " source_id IN (SELECT message_id FROM inbound_seen WHERE provider = ? AND"
            " chat_id = ?)", (self.owner, provider, provider, chat_id))

    async def session_running(self, key: str) -> bool:
        """Whether the session ``key`` has a run going or waiting (on any instance)."""
        row = await self.engine.fetchone(
            "SELECT 1 FROM runs r JOIN sessions s ON s.id = r.session_id WHERE s.key = ? AND"
            " s.active = 1 AND r.status IN ('queued', 'running') LIMIT 1", (key,))
        return row is not None

    async def orphaned_chats(self, alive: set[str] | None, *,
                             answered_in_feed: tuple[str, ...] = (),
                             waiting_longer_than: float | None = None) -> list[tuple[str, str]]:
        """(provider, chat) of runs not ended whose owner is not among the ``alive``
        instances, or answered with no reply in the outbox — except for the providers
        ``answered_in_feed``, whose answers are read from the runs' events (never in the
        outbox: each of their runs would look undelivered for a day). ``alive`` None: the
        instances whose heartbeat lease (``instance:<id>``) is current, looked up by the same
        statement. ``waiting_longer_than`` (seconds): with, in the same statement, the chats
        with a message not handled that was received longer ago than that."""
        rows = await self.engine.fetchall(*self._orphans_query(
            alive is None, answered_in_feed, waiting_longer_than))
        return list(dict.fromkeys((r[0], r[1]) for r in rows
                                  if (alive is None or r[2] not in alive) and r[1] is not None))

    def _orphans_query(self, dead_only: bool, answered_in_feed: tuple[str, ...],
                       waiting_longer_than: float | None) -> Statement:
        """:meth:`orphaned_chats`'s statement. Each condition on the run's own row, the
        instances alive read once (ended runs of a day are many: 6,000 of them, half of a gone
        instance, took 35 ms with a look at the inbox and the leases for each, 7 ms so). One
        branch a kind of run, each read by its own index: the runs not ended (``runs_status``)
        and those answered in the last day (``runs_answered``); as one condition they were read
        by scanning every run ever kept."""
        unsent = _UNDELIVERED if not answered_in_feed else (
            f"({_UNDELIVERED} AND r.source_provider NOT IN"
            f" ({', '.join('?' * len(answered_in_feed))}))")
        now = self.engine.now_sql
        dead = "" if not dead_only else (
            " AND (r.owner IS NULL OR r.owner NOT IN (SELECT substr(l.name, 10) FROM leases l"
            f" WHERE substr(l.name, 1, 9) = 'instance:' AND l.until >= {now}))")
        runs = ("SELECT i.provider, i.chat_id, r.owner FROM runs r JOIN inbound_seen i"
                " ON i.provider = r.source_provider AND i.message_id = r.source_id WHERE ")
        params: tuple[Any, ...] = (time.time() - UNDELIVERED_WINDOW, *answered_in_feed)
        waiting = ""
        if waiting_longer_than is not None:  # (on the clock the inbox keeps its times by)
            waiting = (" UNION SELECT DISTINCT provider, chat_id, NULL FROM inbound_seen WHERE"
                       f" handled = 0 AND seen_at < {now if self.engine.shared else '?'} - ?")
            params = (*params, *(() if self.engine.shared else (time.time(),)),
                      waiting_longer_than)
        return (f"{runs}r.status IN ('queued', 'running'){dead}"
                f" UNION {runs}{unsent}{dead}{waiting}", params)

    async def undelivered_answer(self, run_id: str) -> RunEvent | None:
        """The answer of run ``run_id`` when it ended answered and no reply of it is in the
        outbox (storage failed between the two); else None."""
        def find(conn: Any) -> RunEvent | None:
            row = conn.execute(
                "SELECT e.seq, e.data FROM runs r JOIN run_events e ON e.run_id = r.id WHERE"
                " r.id = ? AND r.status = 'ok' AND e.type = 'message.final' AND NOT EXISTS"
                " (SELECT 1 FROM outbox o WHERE o.reply_id = r.id) ORDER BY e.seq DESC LIMIT 1",
                (run_id,)).fetchone()
            return None if row is None else replace(event_from_dict(json.loads(row[1])),
                                                     seq=row[0])

        return await self.engine.read(find)

    async def undelivered_in_chat(self, provider: str, chat_id: str | None
                                  ) -> list[tuple[dict[str, Any], RunEvent]]:
        """Runs of this chat (None: of every chat of the provider) that another instance — or
        the last process — answered but whose reply it never handed to the outbox (it died in
        between): (the message, the answer), oldest first, for this instance to deliver."""
        def find(conn: Any) -> list[tuple[dict[str, Any], RunEvent]]:
            chat = "" if chat_id is None else " AND i.chat_id = ?"
            rows = conn.execute(
                "SELECT r.id, i.payload, i.preview FROM runs r JOIN inbound_seen i ON"
                " i.provider ="
                " r.source_provider AND i.message_id = r.source_id WHERE i.provider = ?"
                f"{chat} AND r.owner != ? AND {_UNDELIVERED} ORDER BY r.started_at",
                (provider, *(() if chat_id is None else (chat_id,)), self.owner,
                 time.time() - UNDELIVERED_WINDOW)).fetchall()
            found = []
            for run_id, payload, preview in rows:
                final = conn.execute("SELECT seq, data FROM run_events WHERE run_id = ? AND"
                                     " type = 'message.final' ORDER BY seq DESC LIMIT 1",
                                     (run_id,)).fetchone()
                if final is not None and payload:
                    event = replace(event_from_dict(json.loads(final[1])), seq=final[0])
                    message = json.loads(payload)
                    if preview is not None:  # the preview it showed: the answer replaces it
                        message["shown"] = preview
                    found.append((message, event))
            return found

        return await self.engine.read(find)

    async def _take_over(self, where: str, params: tuple[Any, ...], *,
                         requeue: bool = True) -> list[RunEvent]:
        lock = _row_lock(self.engine)

        def take(conn: Any) -> list[RunEvent]:
            ended: list[RunEvent] = []
            now = time.time()
            rows = conn.execute(f"SELECT id, status, source_provider, source_id FROM runs"
                                f" WHERE {where} ORDER BY started_at, id{lock}",
                                params).fetchall()
            for r in rows:
                reason = ("the gateway stopped before this message was answered"
                          if r[1] == "queued" else "the gateway stopped during this run")
                seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE"
                                   " run_id = ?", (r[0],)).fetchone()[0]
                end = RunEnd(run_id=r[0], outcome="interrupted",
                             seq=_next_seq_elsewhere(seq))
                conn.execute(*_event_stmt(end))
                conn.execute("UPDATE runs SET status = 'interrupted', error = ?, ended_at = ?"
                             " WHERE id = ?", (reason, now, r[0]))
                if requeue and r[2] is not None:  # answered again: back in the inbox
                    requeued = conn.execute(  # (not one another run answers now)
                        "UPDATE inbound_seen SET handled = 0, outcome = NULL WHERE"
                        " provider = ? AND message_id = ? AND payload IS NOT NULL"
                        " AND (outcome IS NULL OR outcome = ?)",
                        (r[2], r[3], _accepted(r[0]))).rowcount
                    if requeued and self.engine.shared:  # several instances: what the run
                        # wrote (its user message, tool calls) never enters the history
                        # the re-run reads — it writes its own
                        if conn.execute("DELETE FROM messages WHERE run_id = ?",
                                        (r[0],)).rowcount:  # (copies of the history are
                            conn.execute(  # whole no more: every instance reads it again)
                                "UPDATE sessions SET trimmed = trimmed + 1 WHERE id ="
                                " (SELECT session_id FROM runs WHERE id = ?)", (r[0],))
                ended.append(end)
            self._tell(conn, {end.run_id for end in ended}, always=True)
            return ended

        ended = await self.engine.transact(take)
        self._prefetched.clear()  # (messages of the runs taken over may be gone)
        self._windows.clear()
        for end in ended:
            self._forget(end.run_id)
        return ended

    async def _taken_over_usage(self, run_id: str, held: Any) -> None:
        """The ledger rows of a run whose end was refused (taken over by another instance):
        the model calls made here were paid for, so they count for the budgets anyway — rows
        of their own, apart from the run's state, which stays the new owner's."""
        try:
            await self.engine.write(*held.statements())
        except Exception as e:  # noqa: BLE001 - the run's refusal goes on; this is logged
            log.warning("run %s was taken over, and the usage of its %d call(s) here could not "
                        "be recorded: %s", run_id, len(held.calls), e)
            held.settle(e)
            return
        log.info("run %s was taken over: the usage of its %d call(s) here is recorded",
                 run_id, len(held.calls))
        held.settle(len(held.calls))

    async def recent_runs(self, *, limit: int = 50, agent: str | None = None,
                          status: str | None = None) -> list[dict[str, Any]]:
        where, args = [], []
        if agent:
            where.append("r.agent = ?")
            args.append(agent)
        if status:
            where.append("r.status = ?")
            args.append(status)
        sql = ("SELECT r.id, r.session_id, r.agent, r.status, r.input, r.error, r.usage,"
               " r.started_at, r.ended_at, s.key AS session_key FROM runs r JOIN sessions s"
               " ON s.id = r.session_id" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY r.started_at DESC LIMIT ?")
        rows = await self.engine.fetchall(sql, (*args, limit))
        return [{"id": r["id"], "agent": r["agent"], "status": r["status"],
                 "session_id": r["session_id"], "session_key": r["session_key"], "input": _clip(r["input"]),
                 "error": r["error"], "usage": json.loads(r["usage"]) if r["usage"] else {},
                 "started_at": r["started_at"], "ended_at": r["ended_at"]} for r in rows]

    async def find_sessions(self, query: str = "", *, limit: int = 50) -> list[dict[str, Any]]:
        """Sessions, the newest first: those whose key or text holds ``query`` (the admin
        console's search: a scan of the messages, bounded by ``limit`` sessions found)."""
        like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where = "" if not query else (
            " WHERE s.key LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE"
            " m.session_id = s.id AND m.role IN ('user', 'assistant') AND m.content LIKE ?"
            " ESCAPE '\\')")
        rows = await self.engine.fetchall(
            "SELECT s.id, s.key, s.agent, s.active, s.created_at, s.updated_at FROM sessions s"
            + where + " ORDER BY s.updated_at DESC LIMIT ?",
            ((like, like, limit) if query else (limit,)))
        return [{"id": r["id"], "key": r["key"], "agent": r["agent"],
                 "active": bool(r["active"]), "created_at": r["created_at"],
                 "updated_at": r["updated_at"]} for r in rows]

    async def stats(self) -> dict[str, int]:
        def count(conn: Any) -> dict[str, int]:
            return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                    for table in ("sessions", "messages", "runs", "run_events")}
        return await self.engine.read(count)


def _clip(text: str | None, limit: int = 300) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "…"
