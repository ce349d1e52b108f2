"""The HTTP API's tasks and steps (Agent Protocol shape) in SQLite.

A task is a conversation started over the API (a chat of the ``api`` provider, so a session);
a step is one message in it. A step that starts a run points at it (``run_id``), and its output
and outcome are read from the run itself; a step answered without a run (a command such as
``/help``, a refusal) keeps its answer here.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pluto.storage.rows import StepRow, TaskRow
from pluto.storage.sql import Engine

COMPONENT = "api_tasks"
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
    # tasks belong to the API key that made them (by its name)
    """
    ALTER TABLE api_tasks ADD COLUMN owner TEXT;
    CREATE INDEX api_tasks_owner ON api_tasks(owner, created_at);
    """,
]

ORPHANED = "The gateway restarted before this step could run; send it again."


def _task(r: Any) -> TaskRow:
    return TaskRow(r["id"], r["agent"], r["input"], json.loads(r["additional_input"]),
                   r["created_at"], r["requested_agent"], r["owner"])


def _step(r: Any) -> StepRow:
    return StepRow(r["id"], r["task_id"], r["seq"], r["input"], r["run_id"], r["status"],
                   r["output"], r["error"], r["created_at"], r["ended_at"],
                   json.loads(r["additional_input"]))


class SqliteTasks:
    def __init__(self, engine: Engine):
        self.engine = engine

    async def migrate(self) -> None:
        """Migrate; steps still waiting for a run were lost with the last process."""
        await self.engine.migrate(COMPONENT, MIGRATIONS)
        await self.engine.write((
            "UPDATE api_steps SET status = 'failed', error = ?, ended_at = ?"
            " WHERE status = 'created' AND run_id IS NULL", (ORPHANED, time.time())))

    async def create_task(self, agent: str | None, text: str, additional_input: dict[str, Any],
                          requested_agent: str | None = None,
                          owner: str | None = None) -> TaskRow:
        row = TaskRow(uuid.uuid4().hex, agent, text, additional_input, time.time(),
                      requested_agent, owner)
        await self.engine.write((
            "INSERT INTO api_tasks (id, agent, requested_agent, input, additional_input,"
            " created_at, owner) VALUES (?,?,?,?,?,?,?)",
            (row.id, agent, requested_agent, text, json.dumps(additional_input),
             row.created_at, owner)))
        return row

    async def task(self, task_id: str) -> TaskRow | None:
        row = await self.engine.fetchone("SELECT * FROM api_tasks WHERE id = ?", (task_id,))
        return _task(row) if row is not None else None

    async def tasks(self, offset: int, limit: int,
                    owner: str | None = None) -> tuple[list[TaskRow], int]:
        where, params = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())

        def page(conn: Any) -> tuple[list[TaskRow], int]:
            rows = conn.execute(f"SELECT * FROM api_tasks {where} ORDER BY created_at DESC, id"
                                " LIMIT ? OFFSET ?", (*params, limit, offset)).fetchall()
            total = conn.execute(f"SELECT COUNT(*) FROM api_tasks {where}",
                                 params).fetchone()[0]
            return [_task(r) for r in rows], total
        return await self.engine.read(page)

    async def task_of_run(self, run_id: str) -> TaskRow | None:
        row = await self.engine.fetchone(
            "SELECT t.* FROM api_tasks t JOIN api_steps s ON s.task_id = t.id"
            " WHERE s.run_id = ? LIMIT 1", (run_id,))
        return _task(row) if row is not None else None

    async def add_step(self, task_id: str, text: str,
                       additional_input: dict[str, Any]) -> StepRow:
        """The task's next step (its ``seq`` counted in the statement): one statement, its
        row returned by it."""
        row = await self.engine.write_returning((
            "INSERT INTO api_steps (id, task_id, seq, input, additional_input, status,"
            " created_at) VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM api_steps"
            " WHERE task_id = ?), ?, ?, 'created', ?) RETURNING *",
            (uuid.uuid4().hex, task_id, task_id, text, json.dumps(additional_input),
             time.time())))
        assert row is not None  # (an INSERT … VALUES returns its row)
        return _step(row)

    async def step(self, task_id: str, step_id: str) -> StepRow | None:
        row = await self.engine.fetchone(
            "SELECT * FROM api_steps WHERE task_id = ? AND id = ?", (task_id, step_id))
        return _step(row) if row is not None else None

    async def last_step(self, task_id: str) -> StepRow | None:
        row = await self.engine.fetchone(
            "SELECT * FROM api_steps WHERE task_id = ? ORDER BY seq DESC LIMIT 1", (task_id,))
        return _step(row) if row is not None else None

    async def steps(self, task_id: str, offset: int, limit: int) -> tuple[list[StepRow], int]:
        def page(conn: Any) -> tuple[list[StepRow], int]:
            rows = conn.execute("SELECT * FROM api_steps WHERE task_id = ? ORDER BY seq"
                                " LIMIT ? OFFSET ?", (task_id, limit, offset)).fetchall()
            total = conn.execute("SELECT COUNT(*) FROM api_steps WHERE task_id = ?",
                                 (task_id,)).fetchone()[0]
            return [_step(r) for r in rows], total
        return await self.engine.read(page)

    async def started(self, step_id: str, run_id: str) -> None:
        await self.engine.write((
            "UPDATE api_steps SET run_id = ?, status = 'running' WHERE id = ?", (run_id, step_id)))

    async def has_run(self, run_id: str) -> bool:
        return await self.engine.fetchone("SELECT 1 FROM api_steps WHERE run_id = ?",
                                          (run_id,)) is not None

    async def answered(self, step_id: str, *, output: str | None = None,
                       error: str | None = None) -> None:
        """A step answered without a run: a command's reply, or a refusal (``error``)."""
        await self.engine.write((
            "UPDATE api_steps SET status = ?, output = ?, error = ?, ended_at = ?"
            " WHERE id = ? AND run_id IS NULL",
            ("failed" if error else "completed", output, error, time.time(), step_id)))
