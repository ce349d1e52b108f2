"""The admin API under ``/admin/`` and the A2A Agent Cards, on the gateway's HTTP server.

Who may call it (gateway/console/access.py): the owner's key — ``admin.api_key_env`` in
``pluto.yaml`` names the environment variable that holds it (16+ characters) — sent as
``Authorization: Bearer <key>``; a key an owner made for a role; or a console session (its
cookie, and ``X-CSRF-Token`` for a change). Each role may do what its rules say (viewer,
operator, admin, owner), and every change is a line in the audit log. Without a key and without
any console account the admin API is off and says so (403). Endpoints (JSON in and out):

- ``GET /admin/agents?offset=&limit=``: the agents, their source and whether they load
- ``GET /admin/agents/{name}``: one agent, with its ``agent.yaml``, files and problems
- ``PUT /admin/agents/{name}``: create or replace, from
  ``{"agent": {...fields of agent.yaml...}, "files": {"instructions.md": "..."}}``
  (or ``"agent_yaml": "<text>"`` instead of ``"agent"``)
- ``DELETE /admin/agents/{name}``: remove an agent deployed through this API
- ``POST /admin/agents/{name}/chat``: the console's test chat, a message to that agent whatever
  the routes say (gateway/console/trychat.py); its answer follows on the run's events
- ``GET /admin/reload``, ``POST /admin/reload``: the live-reload status; reload now
- ``GET /admin/routes``, ``POST /admin/routes/explain``: the table in force; explain a message
- ``GET|PUT /admin/routes/file``, ``POST /admin/routes/check``: routes.yaml's text, checked
  and applied live with a diff (:mod:`.admin_routes`)
- ``GET /admin/overview``, ``GET /admin/conversations[/{id}]``, ``GET /admin/runs/{id}/events``
  (SSE): what the console shows (:mod:`.admin_console`)
- ``/admin/datasets`` (:mod:`.admin_datasets`), ``/admin/memory`` (:mod:`.admin_memory`)
- ``/admin/accounts``, ``/admin/keys``, ``/admin/audit``: accounts, API keys per role, the audit
  log (gateway/console/http.py)
- ``GET /admin/pairing``, ``POST /admin/pairing/approve``,
  ``DELETE /admin/pairing/{provider}/{user}``: pairing requests and approvals
- ``GET /admin/runs?limit=&agent=&status=``, ``GET /admin/runs/{id}``: recent runs, one run
  (its events, and the approvals it asked for with their decisions)
- ``GET /admin/usage?by=&since=``, ``GET /admin/usage/runs/{id}``, ``GET /admin/usage/budgets``,
  ``POST /admin/usage/reset``: the usage ledger and budgets (:mod:`.admin_usage`)

Agents put here are files in ``<data_dir>/agents/<name>/``, validated exactly like the ones in
the config dir before they replace anything (atomically), and they override a config agent of
the same name. ``GET /agents/{name}/.well-known/agent.json`` is the agent's A2A Agent Card.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pluto import jsonlimits
from pluto.errors import ConfigError, UnknownAgent
from pluto.jsonlimits import JsonTooDeep
from pluto.gateway.http.admin_agents import (AgentFiles, BadRequest, a2a_refusal, agent_card,
                                             agent_view, delete, save)
from pluto.gateway.http.admin_schedules import add_schedule_routes
from pluto.gateway.http.admin_console import add_console_views
from pluto.gateway.http.admin_datasets import add_dataset_routes
from pluto.gateway.http.admin_memory import add_memory_routes
from pluto.gateway.http.admin_routes import add_routes_file_routes
from pluto.gateway.http.admin_usage import add_usage_routes
from pluto.gateway.console.access import (AUDIT, PRINCIPAL, SAFE_METHODS, admin_key,
                                          authenticate, csrf_refusal, required)
from pluto.gateway.console.http import add_admin_routes as add_console_routes
from pluto.gateway.console.http import mount_console
from pluto.gateway.console.trychat import add_test_chat_routes
from pluto.runtime.tracing import trace_id_for
from pluto.gateway.http.server import GATEWAY_KEY
from pluto.events import event_to_dict
from pluto.storage.rows import PairingError

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

MIN_KEY_LENGTH = 16
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
         409: "conflict", 413: "too_large", 422: "invalid", 500: "internal",
         503: "unavailable"}  # the same words as the HTTP API's errors


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, "code": CODES.get(status, "error"), **extra},
                             status=status)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who asks (a session cookie, the admin key, or a key made for a role), whether their
    role may do this, the CSRF token of a change sent with a cookie; then, once a change
    succeeded, its line in the audit log (docs/console.md)."""
    gw = request.app[GATEWAY_KEY]
    who = await authenticate(request, gw)
    if who is None:
        key, why = admin_key(gw)
        if key is None and not await gw.store.console.accounts():
            return _error(403, f"the admin API is off: {why}")
        log.warning("admin API: refused %s %s from %s (not signed in, or a wrong key)",
                    request.method, request.path, request.remote)
        return web.json_response({"error": "sign in, or send a valid admin key "
                                  "(Authorization: Bearer <key>)", "code": "unauthorized"},
                                 status=401,
                                 headers={"WWW-Authenticate": 'Bearer realm="pluto-admin"'})
    need = required(request.method, request.path)
    if not who.may(need):
        log.info("admin API: %s (%s) may not %s %s", who.name, who.role, request.method,
                 request.path)
        return _error(403, f"your role ({who.role}) cannot do this; it takes {need} or above")
    if (refused := csrf_refusal(request, who)) is not None:
        return _error(403, refused)
    request[PRINCIPAL] = who
    try:
        response = await handler(request)
    except BadRequest as e:
        return _error(e.status, str(e), **e.extra)
    except web.HTTPException:
        raise  # aiohttp's own answers (a 413 for a body too large, a redirect): unchanged
    except Exception:
        log.exception("admin API: %s %s failed", request.method, request.path)
        return _error(500, "internal error; the details are in the gateway log")
    if request.method not in SAFE_METHODS and response.status < 400 and \
            not request.path.endswith(("/explain", "/check", "/chat")):  # (no change made)
        target, diff = request.get(AUDIT) or (request.path.removeprefix("/admin"), "")
        try:
            await gw.store.console.audit(who.name, who.role,
                                         f"{request.method} {request.path}", target, diff=diff)
        except Exception:  # noqa: BLE001 - the change stands; its record is logged as lost
            log.exception("admin API: the audit line of %s %s by %s was not recorded",
                          request.method, request.path, who.name)
    return response


def mount_admin(app: web.Application, gateway: Gateway) -> None:
    """Add ``/admin/`` and the agent cards to the gateway's HTTP app (before it starts)."""
    admin = web.Application(middlewares=[_guard])
    admin[GATEWAY_KEY] = gateway
    r = admin.router
    r.add_get("/", _index)
    r.add_get("/agents", _list_agents)
    r.add_get("/agents/{name}", _get_agent)
    r.add_put("/agents/{name}", _put_agent)
    r.add_delete("/agents/{name}", _delete_agent)
    r.add_get("/reload", _reload_status)
    r.add_post("/reload", _reload)
    r.add_get("/routes", _routes)
    r.add_post("/routes/explain", _explain)
    r.add_get("/pairing", _pairing)
    r.add_post("/pairing/approve", _approve)
    r.add_delete("/pairing/{provider}/{user}", _revoke)
    r.add_get("/runs", _runs)
    r.add_get("/runs/{run_id}", _run)
    add_usage_routes(r)  # /admin/usage...: the usage ledger and budgets (admin_usage.py)
    add_schedule_routes(r)  # /admin/schedules...: schedules and firings (admin_schedules.py)
    add_console_routes(r)  # accounts, keys, the audit log (gateway/console/http.py)
    add_routes_file_routes(r)  # routes.yaml: read, check, replace (admin_routes.py)
    add_console_views(r)  # overview, conversations, a run's live events (admin_console.py)
    add_test_chat_routes(r)  # an agent tried from its page (gateway/console/trychat.py)
    add_dataset_routes(r)  # datasets: list, preview, load, remove (admin_datasets.py)
    add_memory_routes(r)  # long-term memory notes: read, restore (admin_memory.py)
    app.add_subapp("/admin", admin)
    if gateway.config.console.enabled:
        mount_console(app, gateway)  # sign-in, and the pages (gateway/console)
    app.router.add_get("/agents/{name}/.well-known/agent.json", _card)
    app.router.add_get("/agents/{name}/.well-known/agent-card.json", _card)
    key, why = admin_key(gateway)
    log.info("admin API: %s", "on at /admin/ (admin key and console accounts)" if key
             else f"on at /admin/ for console accounts; {why}")


async def _index(request: web.Request) -> web.Response:
    paths = sorted({str(res.canonical) for res in request.app.router.resources()})
    return web.json_response({"endpoints": paths})


# agents -------------------------------------------------------------------------------------------

async def _list_agents(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    offset = _int(request, "offset", 0, 0, 10**9)
    limit = _int(request, "limit", 100, 1, 1000)
    names = await gw.registry.list_names()
    page = await asyncio.to_thread(  # the agents' files are read off the loop
        lambda: [agent_view(gw, name, full=False) for name in names[offset:offset + limit]])
    return web.json_response({"total": len(names), "offset": offset, "agents": page})


async def _get_agent(request: web.Request) -> web.Response:
    gw, name = request.app[GATEWAY_KEY], request.match_info["name"]
    if name not in gw.registry:
        return _error(404, f"no agent named {name!r}")
    return web.json_response(await asyncio.to_thread(agent_view, gw, name, full=True))


async def _put_agent(request: web.Request) -> web.Response:
    gw, name = request.app[GATEWAY_KEY], request.match_info["name"]
    files = AgentFiles.from_body(name, await _json(request))
    before = await asyncio.to_thread(_agent_files, gw, name)
    created = await save(gw, files)
    log.info("admin API: agent %s %s (by %s)", name, "created" if created else "replaced",
             request[PRINCIPAL].name)
    view = await asyncio.to_thread(agent_view, gw, name, full=True)
    after = {"agent.yaml": view.get("agent_yaml", ""), **view.get("files", {})}
    request[AUDIT] = (f"agent {name}", _files_diff(before, after))
    return web.json_response(view, status=201 if created else 200)


def _agent_files(gw: Gateway, name: str) -> dict[str, str]:
    """An agent's files as text (none when it does not exist yet): for the audit's diff."""
    try:
        view = agent_view(gw, name, full=True)
    except (UnknownAgent, OSError):
        return {}
    return {"agent.yaml": view.get("agent_yaml", ""), **view.get("files", {})} \
        if view.get("path") else {}


def _files_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A unified diff of an agent's files, file by file (the audit log's record)."""
    import difflib

    out: list[str] = []
    for file in sorted(before.keys() | after.keys()):
        out += difflib.unified_diff(before.get(file, "").splitlines(keepends=True),
                                    after.get(file, "").splitlines(keepends=True),
                                    fromfile=f"a/{file}", tofile=f"b/{file}", n=2)
    return "".join(out)[:200_000]


async def _delete_agent(request: web.Request) -> web.Response:
    gw, name = request.app[GATEWAY_KEY], request.match_info["name"]
    before = await asyncio.to_thread(_agent_files, gw, name)
    await delete(gw, name)
    log.info("admin API: agent %s deleted (by %s)", name, request[PRINCIPAL].name)
    request[AUDIT] = (f"agent {name}", _files_diff(before, {}))
    return web.Response(status=204)


async def _card(request: web.Request) -> web.Response:
    gw, name = request.app[GATEWAY_KEY], request.match_info["name"]
    try:
        spec = await gw.registry.load(name)
    except UnknownAgent:
        return _error(404, f"no agent named {name!r}")
    except ConfigError:
        return _error(503, f"the agent {name!r} has configuration errors")
    if (refused := a2a_refusal(gw, name)) is not None:  # no card for a URL that cannot answer
        return _error(404, refused)
    base = f"{request.url.origin()}/agents/{name}"
    return web.json_response(agent_card(spec, base))


# reload and routes --------------------------------------------------------------------------------

async def _reload_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[GATEWAY_KEY].watcher.status.as_dict())


async def _reload(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    status = await gw.watcher.reload_now_async()
    log.info("admin API: reload requested by %s: %s", request.remote,
             "ok" if status.ok else "refused")
    return web.json_response(status.as_dict(), status=200 if status.ok else 422)


async def _routes(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    table = gw.routes
    rules = [{"rule": table.label(i), "line": table.line_of(i),
              **rule.model_dump(mode="json", exclude_none=True, exclude_defaults=True)}
             for i, rule in enumerate(table.spec.routes)]
    return web.json_response({"source": table.source, "generation": gw.watcher.status.generation,
                              "defaults": table.spec.defaults.model_dump(mode="json"),
                              "routes": rules, "default": table.spec.default})


async def _explain(request: web.Request) -> web.Response:
    body = await _json(request)
    missing = [k for k in ("provider", "chat", "user") if not isinstance(body.get(k), (str, int))]
    if missing:
        raise BadRequest(f"missing or not a string: {', '.join(missing)}")
    from pluto.gateway.pipeline.explain import explain, message_from  # (admin API only)

    m = message_from(str(body["provider"]), str(body["chat"]), str(body["user"]),
                     group=bool(body.get("group")), mention=bool(body.get("mention")),
                     thread=_opt_str(body, "thread"), guild=_opt_str(body, "guild"),
                     text=str(body.get("text") or ""))
    gw = request.app[GATEWAY_KEY]
    result = explain(gw.routes, m).as_dict()
    if result["access"] == "pairing":
        result["approved"] = await gw.access.pairing.is_approved(m.provider, m.user_id)
    return web.json_response(result)


# pairing and runs ---------------------------------------------------------------------------------

async def _pairing(request: web.Request) -> web.Response:
    pairing = request.app[GATEWAY_KEY].access.pairing
    return web.json_response({"pending": [r.as_dict() for r in await pairing.pending()],
                              "approved": [a.as_dict() for a in await pairing.approved()]})


async def _approve(request: web.Request) -> web.Response:
    body = await _json(request)
    if not isinstance(body.get("code"), str) or not body["code"].strip():
        raise BadRequest("the body needs 'code': the pairing code the user was given")
    pairing = request.app[GATEWAY_KEY].access.pairing
    try:
        approval = await pairing.approve(body["code"], by=request[PRINCIPAL].name)
    except PairingError as e:
        return _error(404, str(e))
    log.info("admin API: approved %s user %s", approval.provider, approval.user_id)
    return web.json_response({"approved": approval.as_dict()})


async def _revoke(request: web.Request) -> web.Response:
    pairing = request.app[GATEWAY_KEY].access.pairing
    provider, user = request.match_info["provider"], request.match_info["user"]
    if not await pairing.revoke(provider, user):
        return _error(404, f"{provider} user {user} is not approved")
    log.info("admin API: revoked %s user %s", provider, user)
    return web.Response(status=204)


async def _runs(request: web.Request) -> web.Response:
    conversations = request.app[GATEWAY_KEY].store.conversations
    runs = await conversations.recent_runs(limit=_int(request, "limit", 50, 1, 1000),
                                           agent=request.query.get("agent"),
                                           status=request.query.get("status"))
    if not request[PRINCIPAL].may("operator"):  # a viewer sees no conversation's text
        runs = [{k: v for k, v in run.items() if k not in ("input", "error")} for run in runs]
    return web.json_response({"runs": runs})


async def _run(request: web.Request) -> web.Response:
    conversations, run_id = request.app[GATEWAY_KEY].store.conversations, request.match_info[
        "run_id"]
    row = await conversations.run(run_id)
    if row is None:
        return _error(404, f"no run {run_id!r}")
    events = [event_to_dict(e) for e in await conversations.events(run_id)]
    # the tool calls it asked a person about, and their decisions (docs/approvals.md)
    approvals = [_approval(a) for a in
                 await request.app[GATEWAY_KEY].store.approvals.of_run(run_id)]
    return web.json_response({"run": dataclasses.asdict(row), "trace_id": trace_id_for(run_id),
                              "events": events, "approvals": approvals}, dumps=_dumps)


def _approval(row: Any) -> dict[str, Any]:
    """An approval request as the admin run view shows it (its paused turn stays inside)."""
    return {k: v for k, v in dataclasses.asdict(row).items() if k != "turn"}


# helpers ------------------------------------------------------------------------------------------

async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = jsonlimits.loads(await request.read())
    except JsonTooDeep as e:
        raise BadRequest(str(e)) from None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"'{name}' must be a whole number") from None
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be between {low} and {high}")
    return value


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    v = body.get(key)
    return str(v) if v not in (None, "") else None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
