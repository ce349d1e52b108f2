"""The HTTP API's tasks and steps (Agent Protocol shape).

A task is a conversation started over the API (a chat of the ``api`` provider, so a session);
a step is one message in it. A step that starts a run points at it (``run_id``), and its output
and outcome are read from the run itself; a step answered without a run (a command such as
``/help``, a refusal) keeps its answer here.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pluto.storage.sqlite import SqliteStore

MIGRATIONS: list[str] = [
    """
    CREATE TABLE api_tasks (
        id TEXT PRIMARY KEY,
        agent TEXT,
        requested_agent TEXT,
        input TEXT NOT NULL,
        additional_input TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL
    );
    CREATE INDEX api_tasks_created ON api_tasks(created_at);
    CREATE TABLE api_steps (
        id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES api_tasks(id),
        seq INTEGER NOT NULL,
        input TEXT NOT NULL,
        additional_input TEXT NOT NULL DEFAULT '{}',
        run_id TEXT,
        status TEXT NOT NULL,
        output TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        ended_at REAL,
        UNIQUE (task_id, seq)
    );
    CREATE INDEX api_steps_run ON api_steps(run_id);
    """,
]

ORPHANED = "The gateway restarted before this step could run; send it again."


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    agent: str | None  # the agent routes.yaml chose
    input: str
    additional_input: dict[str, Any]
    created_at: float
    requested_agent: str | None = None  # the agent the client asked for (a routing hint)


@dataclass(frozen=True, slots=True)
class StepRow:
    id: str
    task_id: str
    seq: int
    input: str
    run_id: str | None
    status: str  # created | running | completed | failed (the last two only without a run)
    output: str | None
    error: str | None
    created_at: float
    ended_at: float | None
    additional_input: dict[str, Any] = field(default_factory=dict)


def _task(r: Any) -> TaskRow:
    return TaskRow(r["id"], r["agent"], r["input"], json.loads(r["additional_input"]),
                   r["created_at"], r["requested_agent"])


def _step(r: Any) -> StepRow:
    return StepRow(r["id"], r["task_id"], r["seq"], r["input"], r["run_id"], r["status"],
                   r["output"], r["error"], r["created_at"], r["ended_at"],
                   json.loads(r["additional_input"]))


class TaskStore:
    def __init__(self, store: SqliteStore):
        self.store = store

    async def open(self) -> None:
        """Migrate; steps still waiting for a run were lost with the last process."""
        await self.store.migrate_component("api_tasks", MIGRATIONS)
        await self.store.db.execute(
            "UPDATE api_steps SET status = 'failed', error = ?, ended_at = ?"
            " WHERE status = 'created' AND run_id IS NULL", (ORPHANED, time.time()))
        await self.store.db.commit()

    async def create_task(self, agent: str | None, text: str, additional_input: dict[str, Any],
                          requested_agent: str | None = None) -> TaskRow:
        row = TaskRow(uuid.uuid4().hex, agent, text, additional_input, time.time(),
                      requested_agent)
        await self.store.db.execute(
            "INSERT INTO api_tasks (id, agent, requested_agent, input, additional_input,"
            " created_at) VALUES (?,?,?,?,?,?)",
            (row.id, agent, requested_agent, text, json.dumps(additional_input),
             row.created_at))
        await self.store.db.commit()
        return row

    async def task(self, task_id: str) -> TaskRow | None:
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM api_tasks WHERE id = ?", (task_id,))
        return _task(list(rows)[0]) if rows else None

    async def tasks(self, offset: int, limit: int) -> tuple[list[TaskRow], int]:
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM api_tasks ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
            (limit, offset))
        (total,), = await self.store.db.execute_fetchall("SELECT COUNT(*) FROM api_tasks")
        return [_task(r) for r in rows], total

    async def add_step(self, task_id: str, text: str,
                       additional_input: dict[str, Any]) -> StepRow:
        now = time.time()
        step_id = uuid.uuid4().hex
        await self.store.db.execute(
            "INSERT INTO api_steps (id, task_id, seq, input, additional_input, status, created_at)"
            " VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM api_steps WHERE task_id = ?),"
            " ?, ?, 'created', ?)",
            (step_id, task_id, task_id, text, json.dumps(additional_input), now))
        await self.store.db.commit()
        step = await self.step(task_id, step_id)
        assert step is not None
        return step

    async def step(self, task_id: str, step_id: str) -> StepRow | None:
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM api_steps WHERE task_id = ? AND id = ?", (task_id, step_id))
        return _step(list(rows)[0]) if rows else None

    async def last_step(self, task_id: str) -> StepRow | None:
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM api_steps WHERE task_id = ? ORDER BY seq DESC LIMIT 1", (task_id,))
        return _step(list(rows)[0]) if rows else None

    async def steps(self, task_id: str, offset: int, limit: int) -> tuple[list[StepRow], int]:
        rows = await self.store.db.execute_fetchall(
            "SELECT * FROM api_steps WHERE task_id = ? ORDER BY seq LIMIT ? OFFSET ?",
            (task_id, limit, offset))
        (total,), = await self.store.db.execute_fetchall(
            "SELECT COUNT(*) FROM api_steps WHERE task_id = ?", (task_id,))
        return [_step(r) for r in rows], total

    async def started(self, step_id: str, run_id: str) -> None:
        await self.store.db.execute(
            "UPDATE api_steps SET run_id = ?, status = 'running' WHERE id = ?", (run_id, step_id))
        await self.store.db.commit()

    async def answered(self, step_id: str, *, output: str | None = None,
                       error: str | None = None) -> None:
        """A step answered without a run: a command's reply, or a refusal (``error``)."""
        await self.store.db.execute(
            "UPDATE api_steps SET status = ?, output = ?, error = ?, ended_at = ?"
            " WHERE id = ? AND run_id IS NULL",
            ("failed" if error else "completed", output, error, time.time(), step_id))
        await self.store.db.commit()
