"""Editing ``routes.yaml`` and ``budgets.yaml`` through the admin API (the console's routes and
budgets pages).

- ``GET /admin/routes/file``: the file's text and its version (a hash of the text)
- ``POST /admin/routes/check`` ``{"text"}``: the problems it would have (file, line, field,
  message) and its diff against the file in force; nothing changes
- ``PUT /admin/routes/file`` ``{"text", "version"}``: checked exactly as a reload checks it
  (the routing table and every agent it names), then written atomically and applied live; a
  text with a problem is refused (422, the problems) and the table in force keeps running;
  a ``version`` that is not the file's current one is refused (409: someone changed it since
  — read it again), so two admins never overwrite each other's edit unseen.
- ``GET|PUT /admin/usage/budgets/file``, ``POST /admin/usage/budgets/check``: the same for
  ``budgets.yaml`` (gateway/budgets_file.py): usage budgets kept apart from pluto.yaml.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from pluto import jsonlimits
from pluto.errors import ConfigError
from pluto.gateway.console.access import AUDIT
from pluto.gateway.budgets_file import load_budgets
from pluto.gateway.http.server import GATEWAY_KEY
from pluto.gateway.reload import load_routes

MAX_ROUTES_BYTES = 2 * 1024 * 1024
FILE = "routes.yaml"
BUDGETS = "budgets.yaml"


def version_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def _diff(old: str, new: str, file: str = FILE) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=f"a/{file}", tofile=f"b/{file}", n=2))


def _check(text: str, registry: Any, file: str = FILE) -> list[dict[str, Any]]:
    """The problems ``text`` would have as routes.yaml (or budgets.yaml), in a worker thread
    (parsing)."""
    with tempfile.TemporaryDirectory(prefix="pluto-config-") as tmp:
        (Path(tmp) / file).write_text(text, encoding="utf-8")
        try:
            if file == FILE:
                load_routes(Path(tmp), registry)
            else:
                load_budgets(Path(tmp))
        except ConfigError as e:
            return [{"file": file, "line": line, "field": field, "message": message}
                    for _file, line, field, message in e.problems]
    return []


async def _text(request: web.Request) -> tuple[str, dict[str, Any]]:
    raw = await request.content.read(MAX_ROUTES_BYTES + 1)
    if len(raw) > MAX_ROUTES_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_ROUTES_BYTES, actual_size=len(raw))
    try:
        body = jsonlimits.loads(raw or b"{}")
    except Exception:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise web.HTTPBadRequest(text='{"error": "send {\\"text\\": \\"...routes.yaml...\\"}"}',
                                 content_type="application/json")
    return body["text"], body


def _file_of(request: web.Request) -> str:
    return BUDGETS if request.path.startswith("/admin/usage/") else FILE


async def get_file(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    file = _file_of(request)
    text = await asyncio.to_thread(_read, gw.config_dir / file)
    return web.json_response({"file": file, "text": text, "version": version_of(text)})


async def check(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    file = _file_of(request)
    text, _ = await _text(request)
    current = await asyncio.to_thread(_read, gw.config_dir / file)
    problems = await asyncio.to_thread(_check, text, gw.registry, file)
    return web.json_response({"ok": not problems, "problems": problems,
                              "diff": _diff(current, text, file)})


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


async def put_file(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    file = _file_of(request)
    text, body = await _text(request)
    path = gw.config_dir / file
    async with _lock(gw):
        current = await asyncio.to_thread(_read, path)
        if body.get("version") != version_of(current):
            return web.json_response({"error": f"{file} changed since you read it; read it "
                                      "again and redo your edit", "code": "conflict",
                                      "version": version_of(current), "text": current},
                                     status=409)
        problems = await asyncio.to_thread(_check, text, gw.registry, file)
        if problems:
            return web.json_response({"error": f"{file} has problems; nothing changed",
                                      "code": "invalid", "problems": problems}, status=422)
        diff = _diff(current, text, file)
        await asyncio.to_thread(_write, path, text)
        status = await gw.watcher.reload_now_async()
    request[AUDIT] = (file, diff)
    return web.json_response({"file": file, "version": version_of(text), "diff": diff,
                              "applied": status.ok, "generation": status.generation})


_LOCKS: dict[int, asyncio.Lock] = {}


def _lock(gw: Any) -> asyncio.Lock:
    """One edit of the file at a time in this process (the version check covers the rest)."""
    return _LOCKS.setdefault(id(gw), asyncio.Lock())


def add_routes_file_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/routes/file", get_file)
    r.add_put("/routes/file", put_file)
    r.add_post("/routes/check", check)
    r.add_get("/usage/budgets/file", get_file)
    r.add_put("/usage/budgets/file", put_file)
    r.add_post("/usage/budgets/check", check)
