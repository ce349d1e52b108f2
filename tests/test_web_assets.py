"""The widget's files over HTTP: hashed URLs cached for good, gzip when the browser accepts it
(compressed once, at start), plain names revalidated, the demo page and its embed snippet on
the hashed URLs; and the origin check a refused widget asks."""

from __future__ import annotations

import gzip
import re

import aiohttp
import pytest

from pluto.providers.web import assets as static_files
from pluto.providers.web.assets import accepts_gzip
from tests.helpers.served import served, url


@pytest.fixture
async def gw(config_dir, data_dir):
    async with served(config_dir, data_dir,
                      web={"allowed_origins": ["https://shop.example.com"]}) as gateway:
        yield gateway


@pytest.fixture
async def raw():
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def _urls(page: str) -> dict[str, str]:
    return {m.group(1) + m.group(3): m.group(0)
            for m in re.finditer(r"/(widget|demo)\.([0-9a-f]{12})\.(js|css)", page)}


async def test_the_demo_page_and_its_snippet_name_the_hashed_files(gw, raw):
    async with raw.get(url(gw, "/")) as resp:
        page = await resp.text()
    found = _urls(page)
    assert set(found) == {"widgetjs", "democss"}
    snippet = re.search(r'&lt;script src="([^"]+)"', page).group(1)
    assert snippet == url(gw, found["widgetjs"])  # the embed snippet: the full, hashed URL
    assert f'<script src="{found["widgetjs"]}"' in page


async def test_hashed_files_are_immutable_and_gzipped_when_accepted(gw, raw):
    async with raw.get(url(gw, "/")) as resp:
        js_url = _urls(await resp.text())["widgetjs"]
    async with raw.get(url(gw, js_url), headers={"Accept-Encoding": "gzip, br"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert resp.headers["Vary"] == "Accept-Encoding"
        assert resp.headers["Content-Type"].startswith("application/javascript")
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        zipped = await resp.read()
        etag = resp.headers["ETag"]
    js = gzip.decompress(zipped)
    assert len(zipped) < len(js) / 2  # (about 4x smaller)
    css_url = re.search(rb'var CSS_FILE = "(widget\.[0-9a-f]{12}\.css)"', js).group(1).decode()
    async with raw.get(url(gw, js_url), headers={"Accept-Encoding": "identity"}) as resp:
        assert "Content-Encoding" not in resp.headers and await resp.read() == js
        assert resp.headers["ETag"] != etag  # another representation, another tag
    async with raw.get(url(gw, js_url), headers={"Accept-Encoding": "gzip;q=0, deflate"}) as resp:
        assert "Content-Encoding" not in resp.headers and await resp.read() == js
    async with raw.get(url(gw, "/" + css_url), headers={"Accept-Encoding": "gzip"}) as resp:
        assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip"
        assert b".pluto-panel" in gzip.decompress(await resp.read())
        assert "immutable" in resp.headers["Cache-Control"]
    async with raw.get(url(gw, js_url), headers={"Accept-Encoding": "gzip",
                                                 "If-None-Match": etag}) as resp:
        assert resp.status == 304 and await resp.read() == b""


async def test_plain_names_are_revalidated_and_old_hashes_redirect(gw, raw):
    plain = {"Accept-Encoding": "identity"}
    async with raw.get(url(gw, "/widget.js"), headers=plain) as resp:  # embedded before
        assert resp.status == 200 and resp.headers["Cache-Control"] == "no-cache"
        etag = resp.headers["ETag"]
        assert "Content-Encoding" not in resp.headers
    async with raw.get(url(gw, "/widget.js"), headers={**plain, "If-None-Match": etag}) as resp:
        assert resp.status == 304
    async with raw.get(url(gw, "/widget.0123456789ab.js"), allow_redirects=False) as resp:
        assert resp.status == 302 and resp.headers["Cache-Control"] == "no-cache"
        assert re.fullmatch(r"/widget\.[0-9a-f]{12}\.js", resp.headers["Location"])
        assert resp.headers["Location"] != "/widget.0123456789ab.js"
    for bad in ("/widget.zz.js", "/widget..js", "/widget.0123456789ab.css.map", "/widget.ts"):
        async with raw.get(url(gw, bad)) as resp:
            assert resp.status == 404, bad


def test_files_are_compressed_once_at_start(monkeypatch):
    calls = []
    real = gzip.compress
    monkeypatch.setattr(static_files.gzip, "compress",
                        lambda data, **kw: calls.append(len(data)) or real(data, **kw))
    loaded = static_files.load()
    assert len(calls) == len(loaded) == 3
    assert loaded["widget.js"].url != "/widget.js"


def test_accept_encoding_is_read_with_its_weights():
    assert accepts_gzip("gzip, deflate, br")
    assert accepts_gzip("br;q=1.0, gzip;q=0.8")
    assert accepts_gzip("*")
    assert not accepts_gzip("")
    assert not accepts_gzip("identity")
    assert not accepts_gzip("gzip;q=0")
    assert not accepts_gzip("*;q=0.5, gzip;q=0")
    assert not accepts_gzip("gzip;q=abc")


async def test_a_refused_origin_can_ask_why(gw, raw):
    for origin, allowed in (("https://evil.example", False), ("https://shop.example.com", True),
                            ("null", False), (url(gw), True)):
        async with raw.post(url(gw, "/web/origin"), headers={"Origin": origin}) as resp:
            assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "*"
            body = await resp.json()
            assert body == {"allowed": allowed, "origin": origin,
                            "setting": "providers.web.allowed_origins"}, origin
