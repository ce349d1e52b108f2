"""What the web provider serves over plain HTTP: the widget (:mod:`.assets`), the demo page,
chart files, and the check a widget makes when its socket is refused (is this page's origin
allowed?)."""

from __future__ import annotations

import html
import logging
import mimetypes
import re
from typing import TYPE_CHECKING

from aiohttp import web

from pluto.errors import StorageError
from pluto.providers.web import assets as static_files
from pluto.providers.web.socket import origin_allowed

if TYPE_CHECKING:
    from pluto.providers.web.provider import WebProvider

log = logging.getLogger(__name__)
ORIGIN_SETTING = "providers.web.allowed_origins"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # never SVG: it runs script
DOWNLOADS = ("text/csv",)  # served as attachments, never shown in the gateway's origin
AUDIO_TYPES = ("audio/ogg",)  # spoken answers (docs/voice.md), played by the widget
DEMO_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:; "
            "img-src 'self' data: https: http:; media-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
            "form-action 'none'")


def mount(router: web.UrlDispatcher, provider: WebProvider) -> None:
    assets = static_files.load()
    demo = (static_files.STATIC / "index.html").read_text().replace(
        "{{title}}", html.escape(provider.settings.title, quote=True)).replace(
        "{{widget_js}}", assets["widget.js"].url).replace("{{demo_css}}", assets["demo.css"].url)

    async def index(request: web.Request) -> web.Response:
        # behind a TLS proxy (deploy/nginx.conf) the page was asked for over https: the embed
        # snippet says so (the header only changes what this one page shows its asker)
        scheme = request.headers.get("X-Forwarded-Proto", request.scheme).split(",")[0].strip()
        if scheme not in ("http", "https"):
            scheme = request.scheme
        origin = html.escape(f"{scheme}://{request.host}", quote=True)
        return web.Response(body=demo.replace("{{origin}}", origin).encode(), headers={
            "Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache",
            "Content-Security-Policy": DEMO_CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer"})

    async def file(request: web.Request) -> web.StreamResponse:
        try:  # made on another instance: fetched from the shared file store
            path = await provider.links.fetch(request.match_info["sig"],
                                              request.match_info["path"])
        except StorageError as e:
            log.warning("web: a file link could not be served: %s", e)
            return web.json_response({"error": "The file cannot be read right now; try again "
                                      "shortly."}, status=503, headers={"Retry-After": "5"})
        ctype = mimetypes.guess_type(path.name)[0] if path else None
        if path is None or ctype not in IMAGE_TYPES + DOWNLOADS + AUDIO_TYPES:
            return web.json_response({"error": "No such file."}, status=404)
        disposition = "attachment" if ctype in DOWNLOADS else "inline"
        return web.FileResponse(path, headers={
            "Content-Type": ctype, "X-Content-Type-Options": "nosniff",
            "Content-Disposition": f'{disposition}; filename="{_safe(path.name)}"',
            "Content-Security-Policy": "default-src 'none'",
            "Cache-Control": "private, max-age=3600",
            "Cross-Origin-Resource-Policy": "cross-origin"})

    async def origin_check(request: web.Request) -> web.Response:
        """A widget whose socket was refused asks why (a POST: browsers send ``Origin`` with
        it, same-origin too). Anyone may ask: a handshake with that origin tells the same."""
        origin = request.headers.get("Origin")
        allowed = origin_allowed(request, provider.settings.allowed_origins)
        return web.json_response(
            {"allowed": allowed, "origin": origin, "setting": ORIGIN_SETTING},
            headers={"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"})

    static_files.mount(router, assets)
    router.add_get("/", index)
    router.add_post("/web/origin", origin_check)
    router.add_get("/web/file/{sig}/{path:.+}", file)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]
