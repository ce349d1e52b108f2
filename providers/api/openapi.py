"""The OpenAPI 3.1 document of the HTTP API (served at ``/api/v1/openapi.json``).

Written by hand to say exactly what :mod:`gateway.api` does; ``tests/test_api.py`` runs
schemathesis against a live gateway to hold the two together.
"""

from __future__ import annotations

from typing import Any

from pluto import __version__
from pluto.providers.api.artifacts import MEDIA
from pluto.providers.api.idempotency import PATTERN as IDEMPOTENCY_KEY_PATTERN

NON_BLANK = "[^ \\t\\n\\r\\f\\v]"  # the same rule the handlers apply: not only spaces
AGENT = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
OUTCOMES = ["ok", "error", "cancelled", "budget", "interrupted", "awaiting_approval", None]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "The request is malformed (the error says how).",
            401: "No valid API key.", 403: "routes.yaml does not send this to an agent (for "
                 "approve / deny: this key may not decide the request).",
            404: "Not found (the task, step, run, artifact or agent).",
            409: "A request with this Idempotency-Key is still being answered (send it again "
                 "once it is done); for approve / deny: the step waits for no decision (none "
                 "pending, or decided already, or expired).",
            410: "The artifact's file is no longer kept (old files are deleted).",
            413: "The request body is too large.",
            422: "This Idempotency-Key was used with another request (a different body or "
                 "path): a new request needs a new key.",
            503: "The API is starting, or a file cannot be read right now."}
    return {str(c): _json(_ref("Error"), text[c]) for c in codes}


def _schemas(max_input: int) -> dict[str, Any]:
    text_input = {"type": "string", "minLength": 1, "maxLength": max_input, "pattern": NON_BLANK,
                  "description": "The message for the agent."}
    extra = {"type": ["object", "null"], "description": "Anything the client wants kept "
             "with the task or step (up to 16 KiB of JSON)."}
    step = _obj({
        "task_id": {"type": "string"}, "step_id": {"type": "string"},
        "name": _nullable("string"), "input": {"type": "string"},
        "additional_input": {"type": "object"}, "run_id": _nullable("string"),
        "status": {"enum": ["created", "running", "completed", "awaiting_approval"],
                   "description": "awaiting_approval: a tool call waits for a person's "
                                  "decision (see approval)."},
        "outcome": {"enum": OUTCOMES, "description": "How the step ended (null until it has)."},
        "output": _nullable("string"), "error": _nullable("string"),
        "is_last": {"type": "boolean"}, "created_at": {"type": "number"},
        "ended_at": _nullable("number"),
        "artifacts": {"type": "array", "items": _ref("Artifact"),
                      "description": "The files the step's run made (charts, query results)."},
        "events_url": _nullable("string"), "additional_output": {"type": "object"},
        "approval": {"anyOf": [_ref("Approval"), {"type": "null"}],
                     "description": "The tool call the step's run waits on (status "
                                    "awaiting_approval), else null."},
    })
    approval = _obj({
        "approval_id": {"type": "string", "pattern": "^[a-z2-9]{6,16}$"},
        "tool": {"type": "string"},
        "arguments": {"type": "string", "description": "The call's arguments as JSON text "
                      "(cut short)."},
        "approvers": {"type": "string", "description": "Who may decide, in words."},
        "expires_at": {"type": "number", "description": "When nobody deciding means denied "
                       "(epoch seconds)."},
        "approve_url": {"type": "string"}, "deny_url": {"type": "string"},
        "commands": {"type": "array", "items": {"type": "string"},
                     "description": "The same decisions as chat commands (a step's input)."},
    })
    artifact = _obj({
        "artifact_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "agent_created": {"type": "boolean"}, "file_name": {"type": "string"},
        "relative_path": _nullable("string"),
        "media_type": {"type": "string", "description": "e.g. image/png, text/csv."},
        "url": {"type": "string", "description": "Where to GET the file, with the same "
                "Authorization as the task (a path on this server)."},
    })
    return {
        "Error": _obj({"error": {"type": "string"}, "code": {"type": "string"}}),
        "TaskRequest": _obj({"input": text_input,
                             "agent": {"type": ["string", "null"], "pattern": AGENT},
                             "additional_input": extra}, ["input"]),
        "StepRequest": _obj({"input": text_input, "additional_input": extra}, ["input"]),
        "Step": step,
        "Approval": approval,
        "DecisionRequest": _obj({"reason": {"type": ["string", "null"], "maxLength": 300,
                                            "description": "Why (a denial's reason, told to "
                                            "the model)."}}, []),
        "Artifact": artifact,
        "ArtifactList": _obj({"artifacts": {"type": "array", "items": _ref("Artifact")},
                              "pagination": _ref("Pagination")}),
        "Task": _obj({
            "task_id": {"type": "string"}, "input": {"type": "string"},
            "additional_input": {"type": "object"}, "agent": _nullable("string"),
            "created_at": {"type": "number"},
            "artifacts": {"type": "array", "items": _ref("Artifact"),
                          "description": "The files every step of the task made."},
            "last_step": {"anyOf": [_ref("Step"), {"type": "null"}]},
        }),
        "Pagination": _obj({k: {"type": "integer", "minimum": 0} for k in
                            ("total_items", "total_pages", "current_page", "page_size")}),
        "TaskList": _obj({"tasks": {"type": "array", "items": _ref("Task")},
                          "pagination": _ref("Pagination")}),
        "StepList": _obj({"steps": {"type": "array", "items": _ref("Step")},
                          "pagination": _ref("Pagination")}),
        "Agent": _obj({"name": {"type": "string"}, "description": _nullable("string"),
                       "available": {"type": "boolean"}, "reachable": {"type": "boolean"}}),
        "AgentList": _obj({"agents": {"type": "array", "items": _ref("Agent")}}),
    }


def _param(name: str, where: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema,
            "description": description}


TASK_ID = _param("task_id", "path", {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                 "The task's id.")
WAIT = _param("wait", "query", {"type": "integer", "minimum": 0, "maximum": 60},
              "Seconds to wait for the step to finish before answering (default 0).")
IDEMPOTENCY_KEY = _param(
    "Idempotency-Key", "header", {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
    "Makes the request safe to send again (IETF httpapi Idempotency-Key draft): a string "
    "(\"...\", or a bare token) of 1-255 visible ASCII characters, unique per request. The "
    "same key with the same request (path and body) within 24 h gets the first answer again "
    "(status and body, header `Idempotent-Replayed: true`) and makes nothing new; with another "
    "request, 422; while the first is still being answered, 409. Keys are per API key. A "
    "request refused with 400/403/404 keeps no key.")
REPLAYED = {"Idempotent-Replayed": {
    "description": "`true` when this is the stored answer to an earlier request with the "
                   "same Idempotency-Key.", "schema": {"type": "string", "enum": ["true"]}}}
PAGE = [_param("page", "query", {"type": "integer", "minimum": 1, "maximum": 1_000_000},
               "Page number (from 1)."),
        _param("page_size", "query", {"type": "integer", "minimum": 1, "maximum": 100},
               "Items per page (default 20).")]


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


def _paths() -> dict[str, Any]:
    return {
        "/api/v1/agents": {"get": {
            "operationId": "listAgents", "summary": "The agents, and whether the API reaches them.",
            "responses": {"200": _json(_ref("AgentList"), "The agents."), **_errors(401, 503)}}},
        "/api/v1/agent/tasks": {
            "post": {"operationId": "createAgentTask",
                     "summary": "Start a conversation: a task, and its first step (a run).",
                     "parameters": [WAIT, IDEMPOTENCY_KEY], "requestBody": _body("TaskRequest"),
                     "responses": {"201": {**_json(_ref("Task"), "The task, with its first "
                                                   "step."), "headers": REPLAYED},
                                   **_errors(400, 401, 403, 404, 409, 413, 422, 503)}},
            "get": {"operationId": "listAgentTasks", "summary": "Tasks, newest first.",
                    "parameters": PAGE,
                    "responses": {"200": _json(_ref("TaskList"), "A page of tasks."),
                                  **_errors(400, 401, 503)}}},
        "/api/v1/agent/tasks/{task_id}": {"get": {
            "operationId": "getAgentTask", "summary": "A task and its latest step.",
            "parameters": [TASK_ID],
            "responses": {"200": _json(_ref("Task"), "The task."), **_errors(401, 404, 503)}}},
        "/api/v1/agent/tasks/{task_id}/steps": {
            "post": {"operationId": "executeAgentTaskStep",
                     "summary": "Send the next message of the conversation.",
                     "parameters": [TASK_ID, WAIT, IDEMPOTENCY_KEY],
                     "requestBody": _body("StepRequest"),
                     "responses": {"201": {**_json(_ref("Step"), "The new step."),
                                           "headers": REPLAYED},
                                   **_errors(400, 401, 403, 404, 409, 413, 422, 503)}},
            "get": {"operationId": "listAgentTaskSteps", "summary": "The task's steps, in order.",
                    "parameters": [TASK_ID, *PAGE],
                    "responses": {"200": _json(_ref("StepList"), "A page of steps."),
                                  **_errors(400, 401, 404, 503)}}},
        "/api/v1/agent/tasks/{task_id}/steps/{step_id}": {"get": {
            "operationId": "getAgentTaskStep", "summary": "One step.",
            "parameters": [TASK_ID, _param("step_id", "path",
                                           {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                                           "The step's id.")],
            "responses": {"200": _json(_ref("Step"), "The step."), **_errors(401, 404, 503)}}},
        **_approval_paths(), **_artifact_paths(), **_event_paths()}


def _approval_paths() -> dict[str, Any]:
    step_id = _param("step_id", "path", {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                     "The step's id.")
    out: dict[str, Any] = {}
    for verb, says in (("approve", "Approve"), ("deny", "Deny")):
        out[f"/api/v1/agent/tasks/{{task_id}}/steps/{{step_id}}/{verb}"] = {"post": {
            "operationId": f"{verb}AgentTaskStep",
            "summary": f"{says} the tool call the step waits on (status awaiting_approval).",
            "description": "Sent as the task's user, in the task's conversation, like the chat "
                           f"command `/{verb} <approval_id>`. Decided: the step continues with "
                           "the run that resumes it (its run_id and events_url are that run's; "
                           "it ends with the answer). Sent again: the step as it is now.",
            "parameters": [TASK_ID, step_id],
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": _ref("DecisionRequest")}}},
            "responses": {"200": _json(_ref("Step"), "The step, continuing."),
                          **_errors(400, 401, 403, 404, 409, 503)}}}
    return out


def _artifact_paths() -> dict[str, Any]:
    return {
        "/api/v1/agent/tasks/{task_id}/artifacts": {"get": {
            "operationId": "listAgentTaskArtifacts",
            "summary": "The files the task's runs made (charts, query results), in order.",
            "parameters": [TASK_ID, *PAGE],
            "responses": {"200": _json(_ref("ArtifactList"), "A page of artifacts."),
                          **_errors(400, 401, 404, 503)}}},
        "/api/v1/agent/tasks/{task_id}/artifacts/{artifact_id}": {"get": {
            "operationId": "downloadAgentTaskArtifact",
            "summary": "One artifact's file (a PNG chart inline, a CSV result as a download).",
            "parameters": [TASK_ID, _param("artifact_id", "path",
                                           {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                                           "The artifact's id (a step's artifacts[].artifact_id)."
                                           )],
            "responses": {"200": {"description": "The file.", "content": {
                media: {"schema": {"type": "string", "format": "binary"}}
                for media in sorted(set(MEDIA.values()))}},
                          **_errors(401, 404, 410, 503)}}},
    }


def _event_paths() -> dict[str, Any]:
    return {
        "/api/v1/agent/{run_id}/events": {"get": {
            "operationId": "streamRunEvents",
            "summary": "A run's events as Server-Sent Events: stored ones, then live ones.",
            "description": "Each event is `id: <seq>`, `event: <type>` and `data: <JSON>` "
                           "(run.start, message.delta, tool.start, tool.end, message.final, "
                           "run.error, run.end). A tool.end's files (details.image, "
                           "details.csv, details.attachments[].url) are their artifacts' URLs. "
                           "The stream ends after run.end. Send "
                           "`Last-Event-ID` or `after` to resume after a seq: the events after "
                           "it, ending with run.end; at or past the end of an ended run, just "
                           "its run.end, at once. Seqs only grow (a crash may skip some, never "
                           "reuses one). `Last-Event-ID` wins over `after`.",
            "parameters": [_param("run_id", "path", {"type": "string",
                                                     "pattern": "^[0-9a-f]{32}$"},
                                  "The run's id (a step's run_id)."),
                           _param("after", "query", {"type": "integer", "minimum": 0,
                                                     "maximum": 10_000_000},
                                  "Only events after this seq."),
                           _param("Last-Event-ID", "header",
                                  {"type": "string", "pattern": "^[ ]*[0-9]{0,18}[ ]*$"},
                                  "The last seq the client saw (an EventSource sends it on "
                                  "reconnect). Empty: from the start; not a whole number of at"
                                  " most 18 digits: 400.")],
            "responses": {"200": {"description": "The event stream.",
                                  "content": {"text/event-stream": {"schema":
                                                                    {"type": "string"}}}},
                          **_errors(400, 401, 404, 503)}}},
    }


def openapi_document(max_input_chars: int) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Pluto HTTP API", "version": __version__,
                 "description": "Tasks and steps in the shape of the Agent Protocol; a step is "
                                "one message to an agent and one run. Authenticate with "
                                "`Authorization: Bearer <key>`."},
        "paths": _paths(),
        "components": {"schemas": _schemas(max_input_chars),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
