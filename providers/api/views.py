"""The HTTP API's JSON: request bodies checked strictly, and tasks and steps as responses.

Shapes follow the Agent Protocol (task, step, paginated lists); :mod:`gateway.openapi` describes
exactly these, and a test checks every response against it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from pluto import jsonlimits
from pluto.errors import PlutoError
from pluto.jsonlimits import JsonTooDeep
from pluto.events import (ApprovalRequest, MessageDelta, MessageFinal, RunEvent, ToolEnd,
                          ToolStart)
from pluto.gateway.ports import SharedFileReader
from pluto.providers.api.artifacts import Artifact, artifacts_of
from pluto.providers.kit.http import read_limited
from pluto.storage.ports import RunReader
from pluto.storage.rows import RunRow, StepRow, TaskRow

AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_ADDITIONAL_BYTES = 16 * 1024
MAX_PAGE_SIZE = 100
LAST_EVENT_ID = re.compile(r"[0-9]{1,18}")


BLANK = " \t\n\r\f\v"  # what the OpenAPI document's pattern treats as blank


def is_text(value: str) -> bool:
    """False for strings that cannot be stored (lone surrogates from JSON escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ApiError(PlutoError):
    """Answered as ``{"error": message, "code": code}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> web.Response:
        headers = {"WWW-Authenticate": 'Bearer realm="pluto"'} if self.status == 401 else None
        return web.json_response({"error": self.message, "code": self.code},
                                 status=self.status, headers=headers)


def bad(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


async def json_body(request: web.Request, fields: tuple[str, ...],
                    max_bytes: int) -> dict[str, Any]:
    """The request's JSON object, with only ``fields`` in it."""
    raw = await read_body(request, max_bytes)
    if not raw.strip():
        raise bad("The request body is empty; send a JSON object.")
    try:
        data = jsonlimits.loads(raw)
    except JsonTooDeep as e:
        raise bad(str(e)) from None
    except (ValueError, UnicodeDecodeError):
        raise bad("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise bad("The request body must be a JSON object.")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise bad(f"Unknown field '{unknown[0][:40]}'; expected: {', '.join(fields)}.")
    return data


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The body, read no further than ``max_bytes`` (a chunked body has no length to check
    first): over it, 413."""
    body = await read_limited(request, max_bytes)
    if body is None:
        raise ApiError(413, "too_large", f"The request body is larger than {max_bytes:,} bytes.")
    return body


def text_input(data: dict[str, Any], max_chars: int) -> str:
    value = data.get("input")
    if not isinstance(value, str):
        raise bad("'input' must be a string (the message for the agent).")
    if not value.strip(BLANK):
        raise bad("'input' is empty.")
    if not is_text(value):
        raise bad("'input' is not valid Unicode text.")
    if len(value) > max_chars:
        raise bad(f"'input' is too long ({len(value):,} characters; the limit is {max_chars:,}).")
    return value


def additional_input(data: dict[str, Any]) -> dict[str, Any]:
    value = data.get("additional_input")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("'additional_input' must be a JSON object.")
    if len(json.dumps(value)) > MAX_ADDITIONAL_BYTES:
        raise bad(f"'additional_input' is larger than {MAX_ADDITIONAL_BYTES:,} bytes.")
    return value


def agent_name(data: dict[str, Any]) -> str | None:
    value = data.get("agent")
    if value is None:
        return None
    if not isinstance(value, str) or not AGENT_NAME.fullmatch(value):
        raise bad("'agent' must be an agent's name (letters, digits, '_', '.', '-').")
    return value


def only_query(request: web.Request, *allowed: str) -> None:
    """A misspelt query parameter is an error, not silently ignored."""
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise bad(f"Unknown query parameter '{unknown[0][:40]}'" + (
            f"; expected: {', '.join(allowed)}." if allowed else "; this takes none."))


def int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad(f"'{name}' must be a whole number from {low} to {high}.") from None
    if not low <= value <= high:
        raise bad(f"'{name}' must be a whole number from {low} to {high}.")
    return value


def last_event_id(request: web.Request, default: int) -> int:
    """The seq in ``Last-Event-ID`` (an EventSource's reconnect sends the last ``id`` it saw):
    any whole number, even past the run's end (the stream then holds just ``run.end``); absent
    or empty: ``default``; anything else: 400 (a stream replayed from the start would show a
    client the run's text twice)."""
    raw = request.headers.get("Last-Event-ID", "").strip()
    if not raw:
        return default
    if not LAST_EVENT_ID.fullmatch(raw):
        raise bad("'Last-Event-ID' must be the id of an event of this stream (a whole number "
                  "of at most 18 digits).")
    return int(raw)


def page(request: web.Request) -> tuple[int, int]:
    """(page, page size) from the query."""
    return (int_query(request, "page", 1, 1, 1_000_000),
            int_query(request, "page_size", 20, 1, MAX_PAGE_SIZE))


def pagination(total: int, current: int, size: int) -> dict[str, int]:
    return {"total_items": total, "total_pages": max(1, -(-total // size)),
            "current_page": current, "page_size": size}


def run_output(events: list[RunEvent]) -> str | None:
    """The answer of a run: its final message, or what it had written when it stopped."""
    partial: list[str] = []
    for event in events:
        match event:
            case MessageFinal(text=text):
                return text
            case MessageDelta(text=text):
                partial.append(text)
            case ToolStart() | ToolEnd():
                partial = []
    return "".join(partial) or None


def pending_approval(events: list[RunEvent]) -> ApprovalRequest | None:
    """The request a run that ended ``awaiting_approval`` waits on (its last)."""
    found = [e for e in events if isinstance(e, ApprovalRequest)]
    return found[-1] if found else None


def approval_view(row: StepRow, request: ApprovalRequest) -> dict[str, Any]:
    """What a step waiting for a person shows: the call, and how to decide it."""
    base = f"/api/v1/agent/tasks/{row.task_id}/steps/{row.id}"
    return {"approval_id": request.approval_id, "tool": request.name,
            "arguments": request.arguments, "approvers": request.approvers,
            "expires_at": request.expires_at, "approve_url": f"{base}/approve",
            "deny_url": f"{base}/deny",
            "commands": [f"/approve {request.approval_id}", f"/deny {request.approval_id}"]}


async def step_view(runs: RunReader, row: StepRow,
                    files: SharedFileReader | None = None, *, run: RunRow | None = None,
                    events: list[RunEvent] | None = None) -> dict[str, Any]:
    """A step as the API shows it; with ``files``, the files its run made as artifacts.
    ``run`` and ``events``: its run's row and events when known already (else read)."""
    view: dict[str, Any] = {
        "task_id": row.task_id, "step_id": row.id, "name": None, "input": row.input,
        "additional_input": row.additional_input, "run_id": row.run_id,
        "created_at": row.created_at, "artifacts": [], "events_url": None,
        "additional_output": {}, "approval": None,
    }
    if row.run_id is None:
        status = "created" if row.status == "created" else "completed"
        outcome = None if status == "created" else ("ok" if row.status == "completed" else "error")
        view |= {"status": status, "outcome": outcome, "output": row.output, "error": row.error,
                 "ended_at": row.ended_at}
    else:
        if run is None:
            run = await runs.run(row.run_id)
        if events is None:
            events = await runs.events(row.run_id)
        running = run is None or run.status in ("queued", "running")
        waiting = run is not None and run.status == "queued"  # behind earlier messages
        view |= {
            "status": "created" if waiting else "running" if running else "completed",
            "outcome": None if running or run is None else run.status,
            "output": run_output(events), "error": run.error if run else None,
            "ended_at": run.ended_at if run else None,
            "events_url": f"/api/v1/agent/{row.run_id}/events",
            "additional_output": {"usage": run.usage if run else {}},
            "artifacts": [a.view(row.task_id) for a in artifacts_of(events, files)],
        }
        if run is not None and run.status == "awaiting_approval" and \
                (request := pending_approval(events)) is not None:
            # a tool call waits for a person: POST approve_url or deny_url (the step then
            # continues with the run that resumes it)
            view |= {"status": "awaiting_approval", "approval": approval_view(row, request)}
    view["is_last"] = view["status"] == "completed"
    return view


async def task_view(runs: RunReader, task: TaskRow, last: StepRow | None,
                    files: SharedFileReader | None = None,
                    artifacts: list[Artifact] | None = None, *, run: RunRow | None = None,
                    events: list[RunEvent] | None = None) -> dict[str, Any]:
    """A task with its last step; ``artifacts``: those of all its steps. ``run`` and
    ``events``: the last step's run and events when known already (else read)."""
    return {"task_id": task.id, "input": task.input, "additional_input": task.additional_input,
            "agent": task.agent, "created_at": task.created_at,
            "artifacts": [a.view(task.id) for a in artifacts or ()],
            "last_step": await step_view(runs, last, files, run=run, events=events)
            if last is not None else None}
