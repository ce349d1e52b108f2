"""Approvals of tool calls: a durable wait is a row (docs/approvals.md).

A run that reaches a tool call a person must approve records the call here and ends
``awaiting_approval``. The decision is one statement that only a pending, unexpired row takes
(so it is decided once, whoever clicks first, on whichever instance); the run that resumes it
claims it with one more (so it is resumed once, even when its message is handled again after a
crash). Time is the database's clock: every instance agrees on when a request expires.
"""

from __future__ import annotations

import json
from typing import Any

from pluto.storage.rows import ToolApproval
from pluto.storage.sql import Engine

COMPONENT = "approvals"
MIGRATIONS = [
    """
    CREATE TABLE tool_approvals (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        session_key TEXT NOT NULL,
        agent TEXT NOT NULL,
        provider TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        thread_id TEXT,
        asker TEXT NOT NULL,
        approvers TEXT NOT NULL,
        tool TEXT NOT NULL,
        call_id TEXT NOT NULL,
        arguments TEXT NOT NULL,
        turn TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',
        reason TEXT,
        decided_by TEXT,
        decided_at REAL,
        decided_message TEXT,
        resumed_run TEXT,
        resumed_message TEXT,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE INDEX tool_approvals_due ON tool_approvals(status, expires_at);
    CREATE INDEX tool_approvals_session ON tool_approvals(session_id, tool, status);
    CREATE INDEX tool_approvals_chat ON tool_approvals(provider, chat_id, status, created_at);
    CREATE INDEX tool_approvals_run ON tool_approvals(run_id);
    """,
]


def _row(r: Any) -> ToolApproval:
    return ToolApproval(
        id=r["id"], run_id=r["run_id"], session_id=r["session_id"],
        session_key=r["session_key"], agent=r["agent"], provider=r["provider"],
        chat_id=r["chat_id"], thread_id=r["thread_id"], asker=r["asker"],
        approvers=tuple(json.loads(r["approvers"])), tool=r["tool"], call_id=r["call_id"],
        arguments=r["arguments"], turn=json.loads(r["turn"]), status=r["status"],
        reason=r["reason"], decided_by=r["decided_by"], decided_at=r["decided_at"],
        decided_message=r["decided_message"], resumed_run=r["resumed_run"],
        created_at=r["created_at"], expires_at=r["expires_at"])


class SqlApprovals:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.now = engine.now_sql

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)

    async def create(self, *, id: str, run_id: str, session_id: str, session_key: str,
                     agent: str, provider: str, chat_id: str, thread_id: str | None,
                     asker: str, approvers: tuple[str, ...], tool: str, call_id: str,
                     arguments: str, turn: dict[str, Any], timeout: float) -> ToolApproval:
        """Record a pending request; it expires ``timeout`` seconds from now (database time)."""
        row = await self.engine.write_returning((
            "INSERT INTO tool_approvals (id, run_id, session_id, session_key, agent, provider,"
            " chat_id, thread_id, asker, approvers, tool, call_id, arguments, turn, created_at,"
            f" expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,{self.now},{self.now} + ?)"
            " RETURNING *",
            (id, run_id, session_id, session_key, agent, provider, chat_id, thread_id, asker,
             json.dumps(list(approvers)), tool, call_id, arguments, json.dumps(turn), timeout)))
        assert row is not None
        return _row(row)

    async def _changed(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """The rows an ``UPDATE … RETURNING`` changed, committed."""
        return await self.engine.write_returning_all((sql, params))

    async def get(self, approval_id: str) -> ToolApproval | None:
        row = await self.engine.fetchone("SELECT * FROM tool_approvals WHERE id = ?",
                                         (approval_id,))
        return _row(row) if row is not None else None

    async def latest_pending(self, provider: str, chat_id: str) -> ToolApproval | None:
        """The chat's newest request still waiting (``/approve`` without an id)."""
        row = await self.engine.fetchone(
            "SELECT * FROM tool_approvals WHERE provider = ? AND chat_id = ? AND"
            f" status = 'pending' AND expires_at > {self.now} ORDER BY created_at DESC LIMIT 1",
            (provider, chat_id))
        return _row(row) if row is not None else None

    async def of_run(self, run_id: str) -> list[ToolApproval]:
        rows = await self.engine.fetchall(
            "SELECT * FROM tool_approvals WHERE run_id = ? ORDER BY created_at", (run_id,))
        return [_row(r) for r in rows]

    async def decide(self, approval_id: str, verdict: str, *, by: str, message_id: str | None,
                     reason: str | None = None) -> tuple[ToolApproval | None, bool]:
        """Approve or deny a pending, unexpired request: (the row, whether this decided it —
        or had decided it already: the same message, handled again after a crash)."""
        row = await self.engine.write_returning((
            "UPDATE tool_approvals SET status = ?, decided_by = ?, decided_message = ?,"
            f" reason = ?, decided_at = {self.now} WHERE id = ? AND status = 'pending' AND"
            f" expires_at > {self.now} RETURNING *",
            (verdict, by, message_id, reason, approval_id)))
        if row is not None:
            return _row(row), True
        found = await self.get(approval_id)
        again = (found is not None and message_id is not None
                 and found.decided_message == message_id and found.status == verdict)
        return found, again

    async def expire_due(self, limit: int = 100) -> list[ToolApproval]:
        """Requests nobody decided in time, marked expired (each by one instance only)."""
        rows = await self._changed(
            f"UPDATE tool_approvals SET status = 'expired', decided_at = {self.now},"
            " decided_by = '', reason = 'nobody decided in time' WHERE id IN (SELECT id FROM"
            f" tool_approvals WHERE status = 'pending' AND expires_at <= {self.now} LIMIT ?)"
            " AND status = 'pending' RETURNING *", (limit,))
        return [_row(r) for r in rows]

    async def unresumed(self, older_than: float, limit: int = 100) -> list[ToolApproval]:
        """Decided requests no run has resumed for ``older_than`` seconds (the instance that
        decided one died before it handed the decision over): to be handed over again."""
        rows = await self.engine.fetchall(
            "SELECT * FROM tool_approvals WHERE status <> 'pending' AND resumed_run IS NULL"
            f" AND decided_at <= {self.now} - ? AND EXISTS (SELECT 1 FROM runs WHERE"
            " runs.id = tool_approvals.run_id AND runs.status = 'awaiting_approval')"
            " ORDER BY decided_at LIMIT ?",
            (older_than, limit))
        return [_row(r) for r in rows]

    async def claim_resume(self, approval_id: str, run_id: str, message_id: str | None) -> bool:
        """The run ``run_id`` resumes the decided request — once: a second run is refused,
        unless it answers the same message (handled again after a crash), and a run that was
        taken over (no longer awaiting its approval) is never resumed."""
        return await self.engine.write((
            "UPDATE tool_approvals SET resumed_run = ?, resumed_message = ? WHERE id = ? AND"
            " status <> 'pending' AND (resumed_run IS NULL OR resumed_message = ?) AND EXISTS"
            " (SELECT 1 FROM runs WHERE runs.id = tool_approvals.run_id AND"
            " runs.status = 'awaiting_approval')",
            (run_id, message_id, approval_id, message_id))) > 0

    async def approved_before(self, session_id: str, tool: str) -> bool:
        """Whether the session approved this tool once already (rule ``first_time``)."""
        row = await self.engine.fetchone(
            "SELECT 1 FROM tool_approvals WHERE session_id = ? AND tool = ? AND"
            " status = 'approved' LIMIT 1", (session_id, tool))
        return row is not None

    async def cancel_pending(self, session_key: str, reason: str) -> list[ToolApproval]:
        """``/stop``: the session's waiting requests, cancelled — and not resumed: the person
        said stop (the half-made tool exchange drops out of the history by itself)."""
        rows = await self._changed(
            f"UPDATE tool_approvals SET status = 'cancelled', decided_at = {self.now},"
            " decided_by = '', reason = ?, resumed_run = '' WHERE session_key = ? AND"
            " status = 'pending' RETURNING *", (reason, session_key))
        return [_row(r) for r in rows]
