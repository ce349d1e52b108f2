"""A2A (Agent2Agent protocol 0.3, JSON-RPC binding) at the URL each agent's card advertises:
``POST /agents/{name}``, with the HTTP API's keys (``Authorization: Bearer <key>``).

It is the HTTP API in another shape: an A2A context is an API task (a conversation), an A2A
task is one of its steps (one message and its run), so both go through the same intake,
routing, lanes, storage and ownership (a key sees its own contexts and tasks only; an admin
key sees all). Methods:

- ``message/send``: the message's text parts become a step of the context ``contextId`` names
  (a new one without it); the answer is the A2A ``Task`` once its run ended (or as it is after
  ``WAIT_SECONDS``; ``configuration.blocking: false`` answers at once). The agent's answer is
  the artifact ``answer`` (a text part), each chart or result a file artifact whose ``uri`` is
  its HTTP API artifact URL (fetched with the same key).
- ``message/stream``: the same, as Server-Sent Events: the ``Task``, ``status-update``s while it
  works, ``artifact-update``s for files and the answer, and a last ``status-update`` with
  ``final: true``.
- ``tasks/get``; ``tasks/cancel`` (sends ``/stop`` to the context, as a chat would).
- Push notifications, ``tasks/resubscribe`` and the extended card are not offered (their
  A2A error codes say so).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pluto import jsonlimits
from pluto.errors import PlutoError
from pluto.events import MessageFinal, RunEnd, RunError, RunEvent, ToolEnd, ToolStart
from pluto.jsonlimits import JsonTooDeep
from pluto.providers.api import artifacts, views
from pluto.providers.api.auth import CALLER
from pluto.providers.api.views import ApiError
from pluto.storage.rows import StepRow, TaskRow

if TYPE_CHECKING:
    from pluto.providers.api.provider import ApiProvider

log = logging.getLogger(__name__)

WAIT_SECONDS = 120  # a blocking message/send waits this long for the run at most
PROTOCOL_VERSION = "0.3.0"
_ID = re.compile(r"^[0-9a-f]{32}$")
# JSON-RPC and A2A error codes
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = (
    -32700, -32600, -32601, -32602, -32603)
TASK_NOT_FOUND, NOT_CANCELABLE, NO_PUSH, UNSUPPORTED, CONTENT_TYPE, NO_EXTENDED_CARD = (
    -32001, -32002, -32003, -32004, -32005, -32007)
REFUSED = -32000  # the gateway did not take the message (routing, rate limits, storage)


class RpcError(PlutoError):
    """A JSON-RPC error answer: its code and one sentence."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def rpc_result(rid: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def rpc_error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class A2A:
    """The JSON-RPC endpoint of every agent, served by the HTTP API provider."""

    def __init__(self, api: ApiProvider):
        self.api = api

    # the request --------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        agent = request.match_info["name"]
        if not any(a.name == agent for a in await self.api.chats.agents()):
            raise ApiError(404, "unknown_agent", f"There is no agent '{agent[:64]}'.")
        rid: Any = None
        try:
            body = await self._body(request)
            rid = body.get("id")
            if body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str) \
                    or not isinstance(rid, (str, int)) or isinstance(rid, bool):
                rid = rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
                raise RpcError(INVALID_REQUEST, "A JSON-RPC 2.0 request needs \"jsonrpc\": "
                               "\"2.0\", a string \"method\" and an \"id\" (string or number).")
            params = body.get("params", {})
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "\"params\" must be an object.")
            match body["method"]:
                case "message/send":
                    return web.json_response(rpc_result(rid, await self._send(request, agent,
                                                                              params)))
                case "message/stream":
                    return await self._stream(request, agent, params, rid)
                case "tasks/get":
                    task, step = await self._find(request, agent, params)
                    return web.json_response(rpc_result(rid, await self.task(request, task,
                                                                             step)))
                case "tasks/cancel":
                    return web.json_response(rpc_result(rid, await self._cancel(request, agent,
                                                                                params)))
                case m if m.startswith("tasks/pushNotificationConfig/"):
                    raise RpcError(NO_PUSH, "Push notifications are not supported; use "
                                   "message/stream or tasks/get.")
                case "tasks/resubscribe":
                    raise RpcError(UNSUPPORTED, "tasks/resubscribe is not supported; use "
                                   "tasks/get.")
                case "agent/getAuthenticatedExtendedCard":
                    raise RpcError(NO_EXTENDED_CARD, "This agent has no extended card.")
                case other:
                    raise RpcError(METHOD_NOT_FOUND, f"There is no method {other[:60]!r}; "
                                   "this agent answers message/send, message/stream, tasks/get "
                                   "and tasks/cancel.")
        except RpcError as e:
            return web.json_response(rpc_error(rid, e.code, e.message))
        except ApiError as e:  # refused by the API's own checks: the same words
            if e.status == 401 or e.code == "unknown_agent":
                raise  # answered over HTTP (401, 404): there is no agent to speak for
            code = {400: INVALID_PARAMS, 404: TASK_NOT_FOUND}.get(e.status, REFUSED)
            return web.json_response(rpc_error(rid, code, e.message))

    async def _body(self, request: web.Request) -> dict[str, Any]:
        raw = await views.read_body(request, self.api._max_body())
        try:
            body = jsonlimits.loads(raw)
        except JsonTooDeep as e:
            raise RpcError(PARSE_ERROR, str(e)) from None
        except (ValueError, UnicodeDecodeError):
            raise RpcError(PARSE_ERROR, "The body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise RpcError(INVALID_REQUEST, "The body must be one JSON-RPC request object "
                           "(batches are not supported).")
        return body

    # message/send and message/stream ------------------------------------------------------

    async def _enter(self, request: web.Request, agent: str,
                     params: dict[str, Any]) -> tuple[TaskRow, StepRow]:
        """The message as a new step of its context (a new context without ``contextId``)."""
        message = params.get("message")
        if not isinstance(message, dict):
            raise RpcError(INVALID_PARAMS, "params.message must be a Message object.")
        if message.get("role") != "user":
            raise RpcError(INVALID_PARAMS, "params.message.role must be \"user\".")
        text = _text_of(message)
        views.text_input({"input": text}, self.api.settings.max_input_chars)
        if message.get("taskId") is not None:
            raise RpcError(UNSUPPORTED, "A task here ends with its answer and cannot be "
                           "continued; send the next message with the task's contextId.")
        context = message.get("contextId")
        routed = await self.api._check_route(agent, text)
        if context is None:
            task = await self.api.tasks.create_task(routed, text, {}, agent,
                                                    owner=request[CALLER])
        else:
            task = await self._context(request, agent, context)
        step = await self.api.tasks.add_step(task.id, text, {})
        await self.api._enter(request, task.id, agent, step)
        return task, await self.api.tasks.step(task.id, step.id) or step

    async def _send(self, request: web.Request, agent: str,
                    params: dict[str, Any]) -> dict[str, Any]:
        task, step = await self._enter(request, agent, params)
        configuration = params.get("configuration") or {}
        if not isinstance(configuration, dict):
            raise RpcError(INVALID_PARAMS, "params.configuration must be an object.")
        if configuration.get("blocking") is not False:
            step = await self.api.steps.wait(step, WAIT_SECONDS)
        return await self.task(request, task, step)

    async def _stream(self, request: web.Request, agent: str, params: dict[str, Any],
                      rid: Any) -> web.StreamResponse:
        task, step = await self._enter(request, agent, params)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        try:
            async for result in self._updates(request, task, step):
                await resp.write(f"data: {json.dumps(rpc_result(rid, result))}\n\n".encode())
        except (ConnectionError, RuntimeError) as e:  # the client went away
            log.debug("a2a: stream of task %s closed by the client: %s", step.id, e)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await resp.write_eof()
        return resp

    async def _updates(self, request: web.Request, task: TaskRow,
                       step: StepRow) -> AsyncIterator[dict[str, Any]]:
        """The Task, then its run's progress as A2A events, the last one ``final``."""
        snapshot = await self.task(request, task, step)
        yield snapshot
        if step.run_id is None:
            return  # answered without a run: the Task says it all
        ids = {"taskId": snapshot["id"], "contextId": task.id}
        error: str | None = None
        async with aclosing(self.api.feed.follow(step.run_id)) as events:
            async for event in events:
                for update in self._updates_of(request, ids, event):
                    yield update
                match event:
                    case RunError(message=message):
                        error = message
                    case RunEnd(outcome=outcome):
                        yield _status(ids, _state_of(outcome), time.time(), error, final=True)
                        return

    def _updates_of(self, request: web.Request, ids: dict[str, str],
                     event: RunEvent) -> list[dict[str, Any]]:
        """What one run event shows an A2A client (often nothing)."""
        match event:
            case ToolStart(name=name):
                return [_status(ids, "working", event.ts, f"Using {name}…")]
            case ToolEnd(details=details) if self.api.files is not None:
                found = [artifacts.artifact_at(p, self.api.files)
                         for p in artifacts.paths_in(details)]
                return [{"kind": "artifact-update", **ids, "lastChunk": True,
                         "artifact": _file_artifact(request, ids["contextId"], a)}
                        for a in found if a is not None]
            case MessageFinal(text=text):
                return [{"kind": "artifact-update", **ids, "lastChunk": True,
                         "artifact": {"artifactId": "answer", "name": "answer",
                                      "parts": [{"kind": "text", "text": text}]}}]
        return []

    # tasks/get and tasks/cancel -----------------------------------------------------------

    async def _find(self, request: web.Request, agent: str,
                    params: dict[str, Any]) -> tuple[TaskRow, StepRow]:
        wanted = params.get("id")
        if not isinstance(wanted, str):
            raise RpcError(INVALID_PARAMS, "params.id must be the task's id.")
        context, _, step_id = wanted.partition("-")
        task = await self._context(request, agent, context, TASK_NOT_FOUND)
        step = await self.api.tasks.step(task.id, step_id) if _ID.fullmatch(step_id) else None
        if step is None:
            raise RpcError(TASK_NOT_FOUND, "There is no task with that id.")
        return task, step

    async def _context(self, request: web.Request, agent: str, context: Any,
                       code: int = INVALID_PARAMS) -> TaskRow:
        """The context (an API task) the caller may use with this agent."""
        task = await self.api.tasks.task(context) if isinstance(context, str) \
            and _ID.fullmatch(context) else None
        if task is None or not self.api._may_see(request, task) \
                or task.requested_agent != agent:
            raise RpcError(code, "There is no context with that id for this agent." if
                           code == INVALID_PARAMS else "There is no task with that id.")
        return task

    async def _cancel(self, request: web.Request, agent: str,
                      params: dict[str, Any]) -> dict[str, Any]:
        task, step = await self._find(request, agent, params)
        current = await self.task(request, task, step)
        if current["status"]["state"] not in ("submitted", "working"):
            raise RpcError(NOT_CANCELABLE, f"The task has ended "
                           f"({current['status']['state']}); there is nothing to cancel.")
        stop = await self.api.tasks.add_step(task.id, "/stop", {})
        await self.api._enter(request, task.id, agent, stop)
        step = await self.api.steps.wait(step, 10)
        return await self.task(request, task, step)

    # the A2A Task -------------------------------------------------------------------------

    async def task(self, request: web.Request, task: TaskRow, step: StepRow) -> dict[str, Any]:
        """A step as an A2A Task: its state, the question and answer, its files."""
        view = await views.step_view(self.api.runs, step, self.api.files)
        state = _state(view)
        ids = {"taskId": f"{task.id}-{step.id}", "contextId": task.id}
        history = [_message(ids, "user", view["input"], f"{step.id}-in")]
        made: list[dict[str, Any]] = []
        if view["output"] and view["status"] == "completed":
            history.append(_message(ids, "agent", view["output"], f"{step.id}-out"))
            made.append({"artifactId": "answer", "name": "answer",
                         "parts": [{"kind": "text", "text": view["output"]}]})
        for item in view["artifacts"]:
            found = artifacts.Artifact(item["artifact_id"], "", item["file_name"],
                                       item["media_type"])
            made.append(_file_artifact(request, task.id, found))
        status = _status(ids, state, view["ended_at"] or view["created_at"],
                         view["error"] if state in ("failed", "rejected", "canceled") else None)
        return {"kind": "task", "id": ids["taskId"], "contextId": task.id,
                "status": status["status"], "history": history, "artifacts": made,
                "metadata": {"run_id": step.run_id, "events_url": view["events_url"]}}


def _text_of(message: dict[str, Any]) -> str:
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise RpcError(INVALID_PARAMS, "params.message.parts must be a non-empty list.")
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("kind") not in ("text", "file", "data"):
            raise RpcError(INVALID_PARAMS, "Each part needs a kind: text, file or data.")
        if part["kind"] != "text":
            raise RpcError(CONTENT_TYPE, f"{part['kind']} parts are not accepted here; send "
                           "text parts (text/plain).")
        if not isinstance(part.get("text"), str):
            raise RpcError(INVALID_PARAMS, "A text part needs a string \"text\".")
        texts.append(part["text"])
    return "\n".join(texts)


def _state(view: dict[str, Any]) -> str:
    if view["status"] == "created":
        return "submitted"
    if view["status"] == "running":
        return "working"
    if view["run_id"] is None:  # answered without a run: a command, or a refusal
        return "rejected" if view["outcome"] == "error" else "completed"
    return _state_of(view["outcome"])


def _state_of(outcome: str | None) -> str:
    return {"ok": "completed", "cancelled": "canceled"}.get(outcome or "", "failed")


def _status(ids: dict[str, str], state: str, ts: float, text: str | None = None, *,
            final: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state, "timestamp": _iso(ts)}
    if text:
        status["message"] = _message(ids, "agent", text, f"{ids['taskId']}-{int(ts * 1000)}")
    return {"kind": "status-update", **ids, "status": status, "final": final}


def _message(ids: dict[str, str], role: str, text: str, message_id: str) -> dict[str, Any]:
    return {"kind": "message", "messageId": message_id, "role": role, **ids,
            "parts": [{"kind": "text", "text": text}]}


def _file_artifact(request: web.Request, task_id: str,
                   found: artifacts.Artifact) -> dict[str, Any]:
    uri = f"{request.url.origin()}{artifacts.url(task_id, found.id)}"
    return {"artifactId": found.id, "name": found.name,
            "parts": [{"kind": "file", "file": {"uri": uri, "name": found.name,
                                                "mimeType": found.media_type}}]}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")

