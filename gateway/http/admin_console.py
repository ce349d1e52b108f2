"""What the console shows that the rest of the admin API did not have (docs/console.md).

- ``GET /admin/overview``: providers and their health, runs in progress, runs and errors
  today, cost today (UTC days)
- ``GET /admin/conversations?q=&limit=`` (operator): sessions, newest first, found by key or
  text; ``GET /admin/conversations/{session_id}`` (operator): its transcript — messages with
  their tool calls, and the approval requests of its runs
- ``GET /admin/runs/{id}/events?after=`` (operator): a run's events as Server-Sent Events,
  the stored ones after ``after`` then the live ones until its end (the run feed)
"""

from __future__ import annotations

import asyncio
import calendar
import dataclasses
import json
import time

from aiohttp import web

from pluto.events import RunEnd, event_to_dict
from pluto.gateway.http.server import GATEWAY_KEY


def _midnight() -> float:
    now = time.gmtime()
    return float(calendar.timegm((now.tm_year, now.tm_mon, now.tm_mday, 0, 0, 0)))


async def overview(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    since = _midnight()
    runs = await gw.store.conversations.recent_runs(limit=1000)
    today = [r for r in runs if (r.get("started_at") or 0) >= since]
    spent = await gw.store.usage.totals("agent", since=since)
    return web.json_response({
        "providers": [{"name": h.name, "state": h.state, "restarts": h.restarts,
                       "last_error": h.last_error} for h in gw.health.values()],
        "runs_in_progress": len(gw.pipeline.live),
        "runs_today": len(today),
        "errors_today": sum(1 for r in today if r.get("status") == "error"),
        "awaiting_approval": sum(1 for r in today if r.get("status") == "awaiting_approval"),
        "cost_today_usd": round(sum(t.cost for t in spent), 6),
        "tokens_today": sum(t.input_tokens + t.output_tokens for t in spent),
        "config_generation": gw.watcher.status.generation,
        "config_ok": gw.watcher.status.ok,
    })


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(request.query.get(name, default))))
    except ValueError:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"{name} must be a whole number"}),
                                 content_type="application/json") from None


async def conversations(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    query = request.query.get("q", "")[:200]
    found = await gw.store.conversations.find_sessions(
        query, limit=_int(request, "limit", 50, 1, 500))
    return web.json_response({"sessions": found})


async def transcript(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    session_id = request.match_info["session_id"]
    rows = await gw.store.conversations.messages(session_id, limit=1000)
    if not rows:
        return web.json_response({"error": f"no conversation {session_id!r}"}, status=404)
    messages = [dataclasses.asdict(m) for m in rows]
    run_ids = list(dict.fromkeys(m["run_id"] for m in messages if m.get("run_id")))
    approvals = []
    for run_id in run_ids[-100:]:
        approvals += [{k: v for k, v in dataclasses.asdict(a).items() if k != "turn"}
                      for a in await gw.store.approvals.of_run(run_id)]
    return web.json_response({"session_id": session_id, "messages": messages,
                              "approvals": approvals}, dumps=lambda o: json.dumps(o, default=str))


async def run_events(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY_KEY]
    run_id = request.match_info["run_id"]
    if run_id not in gw.pipeline.live and await gw.store.conversations.run(run_id) is None:
        # (a run accepted here a moment ago may not be recorded yet: it is followed all the same)
        return web.json_response({"error": f"no run {run_id!r}"}, status=404)
    after = _int(request, "after", 0, 0, 10**9)
    if (last := request.headers.get("Last-Event-ID", "")).isdigit():
        after = max(after, int(last))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    events = gw.feed.follow(run_id, after)
    try:
        async with asyncio.timeout(3600):
            async for event in events:
                data = json.dumps(event_to_dict(event), default=str)
                await response.write(f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"
                                     .encode())
                if isinstance(event, RunEnd):
                    break
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        await events.aclose()
    return response


def add_console_views(r: web.UrlDispatcher) -> None:
    r.add_get("/overview", overview)
    r.add_get("/conversations", conversations)
    r.add_get("/conversations/{session_id}", transcript)
    r.add_get("/runs/{run_id}/events", run_events)

