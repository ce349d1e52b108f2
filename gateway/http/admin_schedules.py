"""The admin API's schedules (mounted by :mod:`.admin`; docs/schedules.md):

- ``GET /admin/schedules?all=1``: the schedules, soonest first (``all``: done ones too)
- ``POST /admin/schedules`` ``{"agent", "to": "PROVIDER:CHAT", "at"|"cron"|"every", "tz",
  "prompt", "thread", "group"}``: a new schedule (201), or 400 with one sentence
- ``DELETE /admin/schedules/{id}``: the schedule and its history
- ``POST /admin/schedules/{id}/run``: due at once
- ``GET /admin/schedules/{id}/history?limit=50`` (and ``/admin/schedules/history``: all)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from aiohttp import web

from pluto import jsonlimits
from pluto.gateway.http.admin_agents import BadRequest
from pluto.gateway.http.server import GATEWAY_KEY
from pluto.gateway.schedules.config import _when
from pluto.gateway.schedules.recurrence import BadTime, When, parse_at, zone
from pluto.gateway.schedules.scheduler import add_schedule

log = logging.getLogger(__name__)
FIELDS = {"agent", "to", "at", "cron", "every", "tz", "prompt", "thread", "group"}


def add_schedule_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/schedules", _list)
    router.add_post("/schedules", _add)
    router.add_get("/schedules/history", _history)
    router.add_delete("/schedules/{id}", _remove)
    router.add_post("/schedules/{id}/run", _run_now)
    router.add_get("/schedules/{id}/history", _history)


def _row(s: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(s), "describe": When(s.kind, s.expr, s.tz).describe()}


async def _list(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    rows = await gw.store.schedules.list(active=request.query.get("all") not in ("1", "true"))
    return web.json_response({"schedules": [_row(s) for s in rows],
                              "next_firing": gw.scheduler.next_firing})


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = jsonlimits.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with 'agent', 'to', 'prompt' and one "
                         "of 'at', 'cron' or 'every'")
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise BadRequest(f"unknown field '{extra[0]}' (known: {', '.join(sorted(FIELDS))})")
    return body


async def _add(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    body = _body(await request.read())
    agent, to, prompt = body.get("agent"), body.get("to"), body.get("prompt")
    if not isinstance(agent, str) or agent not in gw.registry:
        known = ", ".join(gw.registry.names()) or "none"
        raise BadRequest(f"'agent': unknown agent {agent!r} (known: {known})")
    provider, _, chat = to.partition(":") if isinstance(to, str) else ("", "", "")
    if not provider or not chat:
        raise BadRequest("'to' must be PROVIDER:CHAT (a provider of pluto.yaml, a colon, a "
                         "chat id)")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("'prompt' must be the text the agent is asked each time")
    given = [k for k in ("at", "cron", "every") if body.get(k) is not None]
    if len(given) != 1 or not isinstance(body[given[0]], str):
        raise BadRequest("give exactly one of 'at', 'cron' or 'every' (a string)")
    kind = given[0]
    tz = body.get("tz") or gw.scheduler.settings.default_tz
    try:
        zone(str(tz))
        store = gw.store.schedules
        when = When("at", str(parse_at(body["at"], tz, await store.now())), tz) \
            if kind == "at" else _when(kind, body[kind], tz, 0.0)
        made = await add_schedule(store, source="admin", owner=None, provider=provider,
                                  chat_id=chat, agent=agent, prompt=prompt, when=when,
                                  created_by="admin-api", thread_id=body.get("thread"),
                                  is_direct=not body.get("group"))
    except BadTime as e:
        raise BadRequest(f"'{'tz' if 'time zone' in str(e) else kind}': {e}") from None
    gw.scheduler.wake()
    log.info("admin API: schedule %s added (%s -> %s)", made.id, agent, to)
    return web.json_response({"schedule": _row(made)}, status=201)


async def _remove(request: web.Request) -> web.Response:
    sid = request.match_info["id"]
    if not await request.app[GATEWAY_KEY].store.schedules.remove(sid):
        raise BadRequest(f"there is no schedule '{sid}'", status=404)
    return web.json_response({"removed": sid})


async def _run_now(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    sid = request.match_info["id"]
    if not await gw.store.schedules.due_now(sid):
        raise BadRequest(f"there is no schedule '{sid}'", status=404)
    gw.scheduler.wake()
    return web.json_response({"due_now": sid})


async def _history(request: web.Request) -> web.Response:
    try:
        limit = max(1, min(1000, int(request.query.get("limit", "50"))))
    except ValueError:
        raise BadRequest("'limit' must be a whole number") from None
    sid = request.match_info.get("id")
    firings = await request.app[GATEWAY_KEY].store.schedules.history(sid, limit=limit)
    return web.json_response({"firings": [dataclasses.asdict(f) for f in firings]})
