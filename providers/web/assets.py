"""The widget's files as a browser gets them: each under a URL that names its content's hash
(``/widget.3f2a9c1d0b7e.js``, cached for a year and never asked for again), gzip-compressed
once at start (sent compressed to a browser that accepts it), and under its plain name
(``/widget.js``, for pages that embedded it before: revalidated with an ETag each time).
A hashed URL of an earlier version redirects to the current one."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from pluto.httpcoding import accepts_gzip

STATIC = Path(__file__).parent / "static"
FILES = {"widget.css": "text/css; charset=utf-8", "demo.css": "text/css; charset=utf-8",
         "widget.js": "application/javascript; charset=utf-8"}  # (the CSS first: the JS names it)
CSS_NAME = 'var CSS_FILE = "widget.css";'  # in widget.js: replaced by the hashed name
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
HASH_CHARS = 12
Handler = Callable[[web.Request], Awaitable[web.Response]]


@dataclass(frozen=True, slots=True)
class Asset:
    name: str  # widget.js
    url: str  # /widget.<hash>.js
    body: bytes
    gzipped: bytes
    content_type: str
    etag: str  # (quoted) the hash; the compressed body's ends in .gz

    def response(self, request: web.Request, cache: str) -> web.Response:
        gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        etag = f'"{self.etag}.gz"' if gz else f'"{self.etag}"'
        headers = {"Content-Type": self.content_type, "Cache-Control": cache, "ETag": etag,
                   "Vary": "Accept-Encoding", "X-Content-Type-Options": "nosniff",
                   # the widget's files are public, like any CDN's
                   "Access-Control-Allow-Origin": "*",
                   "Cross-Origin-Resource-Policy": "cross-origin"}
        if etag in _tags(request.headers.get("If-None-Match", "")):
            return web.Response(status=304, headers={k: v for k, v in headers.items()
                                                     if k != "Content-Type"})
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=self.gzipped if gz else self.body, headers=headers)


def load(static: Path = STATIC) -> dict[str, Asset]:
    """Every file, read, hashed and compressed (once: at start)."""
    assets: dict[str, Asset] = {}
    for name, ctype in FILES.items():
        body = (static / name).read_bytes()
        if name == "widget.js":
            if CSS_NAME.encode() not in body:
                raise RuntimeError("widget.js no longer names its stylesheet as expected")
            body = body.replace(CSS_NAME.encode(),
                                f'var CSS_FILE = "{assets["widget.css"].url[1:]}";'.encode())
        digest = hashlib.sha256(body).hexdigest()[:HASH_CHARS]
        stem, ext = name.rsplit(".", 1)
        assets[name] = Asset(name, f"/{stem}.{digest}.{ext}", body,
                             gzip.compress(body, compresslevel=9, mtime=0), ctype, digest)
    return assets


def mount(router: web.UrlDispatcher, assets: dict[str, Asset]) -> None:
    def plain(asset: Asset) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            return asset.response(request, REVALIDATE)
        return handler

    def hashed(asset: Asset) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            if request.match_info["hash"] == asset.etag:
                return asset.response(request, IMMUTABLE)
            # an earlier version's URL (a page embedded it before an upgrade): the current one
            raise web.HTTPFound(asset.url, headers={"Cache-Control": REVALIDATE})
        return handler

    for name, asset in assets.items():
        stem, ext = name.rsplit(".", 1)
        router.add_get(f"/{name}", plain(asset))
        router.add_get(f"/{stem}.{{hash:[0-9a-f]{{8,64}}}}.{ext}", hashed(asset))


def _tags(header: str) -> set[str]:
    return {t.strip().removeprefix("W/") for t in header.split(",") if t.strip()}
