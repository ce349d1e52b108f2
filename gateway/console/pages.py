"""The console's pages as a browser gets them (docs/console.md).

``/console`` and ``/console/`` serve ``index.html`` (revalidated each time: it names the other
files); the scripts and the stylesheet are served under ``/console/static/<stem>.<hash>.<ext>``
— a URL that names its content's hash, cached for a year — gzip-compressed once at start and
sent compressed to a browser that accepts it. A hash of an earlier version redirects to the
current file; a name that is not one of ours is a 404. Every answer carries a Content Security
Policy of ``default-src 'self'``: no inline script or style, nothing from another site.

``pages-admin.js`` (the admin pages) is optional: without it the shell runs with its own pages.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from pluto.httpcoding import accepts_gzip

STATIC = Path(__file__).parent / "static"
PREFIX = "/console/static"
# in the order index.html loads them; the optional ones may be missing from the folder
FILES = {"console.css": "text/css; charset=utf-8",
         "app.js": "application/javascript; charset=utf-8",
         "pages-core.js": "application/javascript; charset=utf-8",
         "pages-admin.js": "application/javascript; charset=utf-8"}
OPTIONAL = frozenset({"pages-admin.js"})
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
HASH_CHARS = 12
CSP = ("default-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
SECURITY = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Asset:
    name: str  # app.js
    url: str  # /console/static/app.<hash>.js
    body: bytes
    gzipped: bytes
    content_type: str
    digest: str

    def response(self, request: web.Request, cache: str) -> web.Response:
        gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        etag = f'"{self.digest}.gz"' if gz else f'"{self.digest}"'
        headers = {"Content-Type": self.content_type, "Cache-Control": cache, "ETag": etag,
                   "Vary": "Accept-Encoding", **SECURITY}
        if etag in {t.strip().removeprefix("W/")
                    for t in request.headers.get("If-None-Match", "").split(",")}:
            del headers["Content-Type"]
            return web.Response(status=304, headers=headers)
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=self.gzipped if gz else self.body, headers=headers)


def _asset(name: str, url: str, body: bytes, content_type: str) -> Asset:
    digest = hashlib.sha256(body).hexdigest()[:HASH_CHARS]
    return Asset(name, url.format(hash=digest), body,
                 gzip.compress(body, compresslevel=9, mtime=0), content_type, digest)


def load(static: Path = STATIC) -> tuple[Asset, dict[str, Asset]]:
    """index.html (with the hashed names written in) and every file, hashed and compressed."""
    assets: dict[str, Asset] = {}
    for name, ctype in FILES.items():
        path = static / name
        if name in OPTIONAL and not path.exists():
            continue
        stem, ext = name.rsplit(".", 1)
        assets[name] = _asset(name, f"{PREFIX}/{stem}.{{hash}}.{ext}", path.read_bytes(), ctype)
    page = (static / "index.html").read_text(encoding="utf-8")
    for name in FILES:
        slot = "{{" + name + "}}"
        if name in assets:
            page = page.replace(slot, html.escape(assets[name].url, quote=True))
        else:  # an optional file that is not there: its tag goes
            page = re.sub(r"[ \t]*<script[^>]*" + re.escape(slot) + r"[^>]*></script>\n?", "",
                          page)
    if "{{" in page:
        raise RuntimeError("console index.html names a file that is not in its folder")
    index = _asset("index.html", "/console/", page.encode(), "text/html; charset=utf-8")
    return index, assets


def mount(app: web.Application) -> None:
    """Serve the console at /console (called by gateway/console/http.py's mount_console)."""
    index, assets = load()
    by_stem = {tuple(name.rsplit(".", 1)): asset for name, asset in assets.items()}

    async def page(request: web.Request) -> web.Response:
        response = index.response(request, REVALIDATE)
        response.headers["Cache-Control"] = "no-cache, private"
        return response

    async def static(request: web.Request) -> web.StreamResponse:
        stem, digest, ext = (request.match_info[k] for k in ("stem", "hash", "ext"))
        asset = by_stem.get((stem, ext))
        if asset is None:
            return _not_found()
        if digest != asset.digest:  # a page from before an upgrade: the file it asks is this
            raise web.HTTPFound(asset.url, headers={"Cache-Control": REVALIDATE, **SECURITY})
        return asset.response(request, IMMUTABLE)

    async def unknown(request: web.Request) -> web.Response:
        return _not_found()

    app.router.add_get("/console", page)
    app.router.add_get("/console/", page)
    app.router.add_get(PREFIX + r"/{stem:[a-z-]{1,40}}.{hash:[0-9a-f]{8,64}}.{ext:js|css}",
                       static)
    app.router.add_get(PREFIX + "/{tail:.*}", unknown)


def _not_found() -> web.Response:
    return web.json_response({"error": "no such file"}, status=404,
                             headers={"Cache-Control": REVALIDATE, **SECURITY})


