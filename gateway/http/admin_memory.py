"""Long-term memory notes through the admin API (the console's memory page; ``pluto memory``
is the same from a shell). People's notes are their own text: reading them takes an operator,
restoring a revision an admin, and a restore is in the audit log.

- ``GET /admin/memory?agent=``: whose notes exist (agent, scope, provider, id, label, size)
- ``GET /admin/memory/{agent}/agent`` or ``/admin/memory/{agent}/{user|chat}/{provider}/{id}``:
  the notes, who wrote each, and their revisions
- ``POST`` the same path ``+ /restore`` ``{"rev": N}``: bring back revision N (a new revision)
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pluto.gateway.console.access import AUDIT, PRINCIPAL
from pluto.gateway.http.server import GATEWAY_KEY


def _book(request: web.Request) -> Any:
    from pluto.runtime.memory import MemoryBook

    gw = request.app[GATEWAY_KEY]
    return gw.runner.services.setdefault("memory", MemoryBook(gw.data_dir / "memory"))


def _owner(request: web.Request) -> Any:
    from pluto.runtime.memory.notes import Owner

    m = request.match_info
    scope = m["scope"]
    if scope == "agent" and not m.get("provider"):
        return Owner(m["agent"], "agent")
    if scope in ("user", "chat") and m.get("provider") and m.get("id"):
        return Owner(m["agent"], scope, m["provider"], m["id"])  # type: ignore[arg-type]
    raise web.HTTPNotFound(text='{"error": "a memory is /admin/memory/{agent}/agent or '
                           '/admin/memory/{agent}/{user|chat}/{provider}/{id}"}',
                           content_type="application/json")


async def owners(request: web.Request) -> web.Response:
    book = _book(request)
    found = await book.owners(request.query.get("agent") or None)
    out = []
    for o in found[:1000]:
        memory = await book.read(o)
        out.append({"agent": o.agent, "scope": o.scope, "provider": o.provider, "id": o.id,
                    "label": o.label(), "chars": memory.chars, "notes": len(memory.notes)})
    return web.json_response({"owners": out})


async def show(request: web.Request) -> web.Response:
    book = _book(request)
    owner = _owner(request)
    memory = await book.read(owner)
    revisions = await book.revisions(owner)
    return web.json_response({"label": owner.label(), "text": memory.text,
                              "notes": list(memory.notes), "writers": list(memory.writers),
                              "problem": memory.problem,
                              "revisions": [r.as_dict() for r in revisions[-50:]]})


async def restore(request: web.Request) -> web.Response:
    from pluto.runtime.memory import MemoryRefused

    book = _book(request)
    owner = _owner(request)
    try:
        body = await request.json()
        rev = int(body["rev"])
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": "send {\"rev\": N}"}, status=400)
    who = request[PRINCIPAL].name
    try:
        memory = await book.restore(owner, rev, by=f"admin {who} (console)")
    except MemoryRefused as e:
        return web.json_response({"error": str(e)}, status=422)
    request[AUDIT] = (f"memory {owner.label()}", f"restored revision {rev}")
    return web.json_response({"label": owner.label(), "text": memory.text,
                              "notes": list(memory.notes)})


def add_memory_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/memory", owners)
    r.add_get("/memory/{agent}/{scope}", show)
    r.add_get("/memory/{agent}/{scope}/{provider}/{id}", show)
    r.add_post("/memory/{agent}/{scope}/restore", restore)
    r.add_post("/memory/{agent}/{scope}/{provider}/{id}/restore", restore)
