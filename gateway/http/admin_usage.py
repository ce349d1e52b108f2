"""The admin API's view of the usage ledger and budgets (mounted by :mod:`.admin`):

- ``GET /admin/usage?by=agent|user|chat|model|route|provider|origin|day&since=7d``: sums per
  group (``day``: per UTC date, oldest first)
- ``GET /admin/usage/runs/{run_id}``: a run's model calls, one row each
- ``GET /admin/usage/budgets``: each budget of pluto.yaml and who spent what of it this period
- ``POST /admin/usage/reset`` ``{"scope": "user", "key": "telegram:42"}``: reset a budget
"""

from __future__ import annotations

import dataclasses
import logging
import time

from aiohttp import web

from pluto import jsonlimits
from pluto.gateway.http.admin_agents import BadRequest
from pluto.gateway.http.server import GATEWAY_KEY
from pluto.runtime.usage import parse_since
from pluto.storage.sql.usage import GROUPS

log = logging.getLogger(__name__)

SCOPES = ("agent", "route", "user", "chat")


def add_usage_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/usage", _usage)
    router.add_get("/usage/runs/{run_id}", _run_usage)
    router.add_get("/usage/budgets", _budgets)
    router.add_post("/usage/reset", _reset)


async def _usage(request: web.Request) -> web.Response:
    by = request.query.get("by", "agent")
    if by not in GROUPS:
        raise BadRequest(f"'by' must be one of: {', '.join(GROUPS)}")
    since = None
    if raw := request.query.get("since"):
        try:
            since = parse_since(raw, time.time())
        except ValueError as e:
            raise BadRequest(f"'since': {e}") from None
    totals = await request.app[GATEWAY_KEY].store.usage.totals(by, since=since)
    rows = [t.as_dict() for t in totals]
    return web.json_response({
        "by": by, "since": since, "rows": rows,
        "total": {k: sum(r[k] for r in rows) for k in (
            "calls", "input_tokens", "output_tokens", "cached_tokens", "total_tokens", "cost",
            "unpriced_calls")}})


async def _run_usage(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    calls = await request.app[GATEWAY_KEY].store.usage.calls(run_id=run_id)
    return web.json_response({"run_id": run_id,
                              "calls": [dataclasses.asdict(c) for c in calls]})


async def _budgets(request: web.Request) -> web.Response:
    return web.json_response({"budgets": await request.app[GATEWAY_KEY].usage.status()})


async def _reset(request: web.Request) -> web.Response:
    try:
        body = jsonlimits.loads(await request.read())
    except (ValueError, UnicodeDecodeError):  # (JsonTooDeep is a ValueError too)
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with 'scope' and 'key'")
    scope, key = body.get("scope"), body.get("key")
    if scope not in SCOPES or not isinstance(key, str) or not key.strip():
        raise BadRequest(f"the body needs 'scope' (one of {', '.join(SCOPES)}) and 'key' (an "
                         "agent or route name, or provider:id of a user or chat)")
    await request.app[GATEWAY_KEY].usage.reset(scope, key.strip())
    log.info("admin API: reset the usage budgets of %s %s", scope, key)
    return web.json_response({"reset": {"scope": scope, "key": key.strip()}})
