"""The console's pages as served (gateway/console/pages.py): index.html at /console and
/console/, its files under hashed names (cached for a year, gzip when accepted), a Content
Security Policy without inline script or style on every answer, and a 404 for any other name."""

from __future__ import annotations

import gzip
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.gateway.console import pages
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig


@pytest.fixture
async def gw(config_dir: Path, data_dir: Path) -> AsyncIterator[Gateway]:
    cfg = PlutoConfig(data_dir=data_dir, gateway={"reload_interval_seconds": 0})
    gateway = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                      model_factory=ScriptedModel())
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


def _assets(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="(/console/static/[^"]+)"', page)


async def test_index_names_hashed_files_and_forbids_inline_code(gw: Gateway):
    url = gw.http.url  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http:
        for path in ("/console", "/console/"):
            async with http.get(url + path) as r:
                assert r.status == 200 and r.content_type == "text/html"
                csp = r.headers["Content-Security-Policy"]
                assert "default-src 'self'" in csp and "unsafe-inline" not in csp
                assert "frame-ancestors 'none'" in csp
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert "no-cache" in r.headers["Cache-Control"]
                page = await r.text()
        found = _assets(page)
        names = [re.sub(r"\.[0-9a-f]{12}\.", ".", u.rsplit("/", 1)[1]) for u in found]
        assert names[:3] == ["console.css", "app.js", "pages-core.js"]
        assert "<script>" not in page and "style=" not in page  # nothing inline
        assert page.index("app.") < page.index("pages-core.")
        for u in found:
            async with http.get(url + u, headers={"Accept-Encoding": "gzip"},
                                auto_decompress=False) as r:
                assert r.status == 200
                assert r.headers["Content-Encoding"] == "gzip"
                assert r.headers["Cache-Control"] == pages.IMMUTABLE
                assert "default-src 'self'" in r.headers["Content-Security-Policy"]
                body = gzip.decompress(await r.read())
                etag = r.headers["ETag"]
            async with http.get(url + u, headers={"Accept-Encoding": "identity"}) as r:
                assert await r.read() == body and "Content-Encoding" not in r.headers
            async with http.get(url + u, headers={"Accept-Encoding": "gzip",
                                                  "If-None-Match": etag}) as r:
                assert r.status == 304


async def test_unknown_files_are_404_and_an_old_hash_finds_the_current_file(gw: Gateway):
    url = gw.http.url  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/console/") as r:
            app_js = next(u for u in _assets(await r.text()) if "/app." in u)
        for path in ("/console/static/evil.0123456789ab.js", "/console/static/app.js",
                     "/console/static/../pages.py", "/console/static/index.html",
                     "/console/static/__init__.py", "/console/static/app.0123456789ab.css"):
            async with http.get(url + path, allow_redirects=False) as r:
                assert r.status == 404, path
                if "/static/" in str(r.url):  # (a client folds ../ away before sending)
                    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
        async with http.get(url + "/console/static/app.0123456789ab.js",
                            allow_redirects=False) as r:
            assert r.status == 302 and r.headers["Location"] == app_js


def test_without_the_admin_pages_the_shell_loads_alone(tmp_path: Path):
    for name in ("index.html", "console.css", "app.js", "pages-core.js"):
        (tmp_path / name).write_bytes((pages.STATIC / name).read_bytes())
    index, assets = pages.load(tmp_path)
    page = index.body.decode()
    assert "pages-admin" not in page and "{{" not in page
    assert set(assets) == {"console.css", "app.js", "pages-core.js"}
    (tmp_path / "pages-admin.js").write_text("")  # an empty file is served as it is
    index, assets = pages.load(tmp_path)
    assert assets["pages-admin.js"].url in index.body.decode()
    assert index.body.decode().index("/app.") < index.body.decode().index("/pages-admin.")
