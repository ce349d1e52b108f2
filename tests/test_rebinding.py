"""DNS rebinding (issue 38): a page on an attacker's domain whose name now resolves to the
gateway's address reaches it with ``Host: attacker.example`` and ``Origin:
http://attacker.example``. Every HTTP request — pages, the HTTP API, the admin API, health and
the chat socket — must name an allowed host (``http.allowed_hosts``), and the chat socket takes
only allowed origins. Normal loopback use and configured names keep working."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from pluto.errors import ConfigError
from pluto.gateway.http.guard import HostPolicy, default_hosts, split_host
from pluto.settings import load_pluto_config
from tests.helpers.served import API_KEY, Tab, served, url

SECRET = "s" * 40
ADMIN_KEY = "admin-key-0123456789abcdef"
PATHS = ("/", "/widget.js", "/healthz", "/readyz", "/metrics", "/api/v1/agents",
         "/admin/agents", "/no/such/page")


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(autouse=True)
def secrets(monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    monkeypatch.setenv("PLUTO_ADMIN_KEY", ADMIN_KEY)


def auth(path: str) -> dict[str, str]:
    key = ADMIN_KEY if path.startswith("/admin") else API_KEY
    return {"Authorization": f"Bearer {key}"}


async def get(http: aiohttp.ClientSession, gw, path: str, host: str) -> tuple[int, str]:
    async with http.get(url(gw, path), headers={"Host": host, **auth(path)}) as r:
        return r.status, await r.text()


async def ws_status(http: aiohttp.ClientSession, gw, host: str, origin: str) -> int:
    """The status of the chat socket's handshake (101 when it opened)."""
    try:
        ws = await http.ws_connect(url(gw, "/ws"), headers={"Host": host, "Origin": origin})
    except aiohttp.WSServerHandshakeError as e:
        return e.status
    await ws.close()
    return 101


async def test_a_rebinding_page_is_refused_on_http_and_on_the_socket(config_dir, data_dir, http):
    async with served(config_dir, data_dir, admin={"api_key_env": "PLUTO_ADMIN_KEY"}) as gw:
        port = gw.http.port
        for host in (f"attacker.example:{port}", "attacker.example", f"localhost.attacker.example"
                     f":{port}", f"127.0.0.1.nip.io:{port}"):
            for path in PATHS:
                status, body = await get(http, gw, path, host)
                assert status == 421, (host, path, status)
                assert "does not answer to the name" in body and "http.allowed_hosts" in body
                assert "Traceback" not in body
            # the chat socket: refused before the origin is even looked at
            assert await ws_status(http, gw, host, f"http://{host}") == 421
        # the normal ways in keep working: loopback names, the address itself
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}",
                     f"LOCALHOST:{port}"):
            for path in ("/", "/healthz", "/api/v1/agents", "/admin/agents"):
                status, body = await get(http, gw, path, host)
                assert status == 200, (host, path, status, body)
            assert await ws_status(http, gw, host, f"http://{host}") == 101
        tab = await Tab.open(http, gw)  # (the test client's own Host: 127.0.0.1:port)
        assert tab.ready["token"]
        await tab.ws.close()


async def test_an_ip_address_always_passes_but_not_as_a_foreign_origin(config_dir, data_dir,
                                                                          http):
    """A Host that is an IP address cannot come from rebinding (a load balancer's probe sends
    one). A page served from some other address is still another origin for the socket."""
    async with served(config_dir, data_dir) as gw:
        for host in ("10.1.2.3:8000", "192.168.0.7", "[2001:db8::1]:443"):
            assert (await get(http, gw, "/healthz", host))[0] == 200, host
        port = gw.http.port
        assert await ws_status(http, gw, f"10.1.2.3:{port}", f"http://10.1.2.3:{port}") == 101
        assert await ws_status(http, gw, f"127.0.0.1:{port}", "http://1.2.3.4") == 403
        assert await ws_status(http, gw, f"127.0.0.1:{port}", f"http://attacker.example:{port}"
                               ) == 403


async def test_configured_names_work_and_nothing_else(config_dir, data_dir, http):
    async with served(config_dir, data_dir,
                      http={"allowed_hosts": ["chat.example.com", ".corp.example",
                                              "ops.example.net:9443"]},
                      web={"allowed_origins": ["https://shop.example.com"]}) as gw:
        for host in ("chat.example.com", "chat.example.com:443", "CHAT.example.com.",
                     "corp.example", "a.b.corp.example:8080", "ops.example.net:9443",
                     "127.0.0.1:1234"):
            assert (await get(http, gw, "/healthz", host))[0] == 200, host
        for host in ("attacker.example", "localhost", "ops.example.net", "ops.example.net:80",
                     "evilcorp.example", "chat.example.com.evil.io", "chat.example.com:x"):
            assert (await get(http, gw, "/healthz", host))[0] == 421, host
        # the socket: same origin on an allowed name, the configured page; not a third site
        assert await ws_status(http, gw, "chat.example.com", "https://chat.example.com") == 101
        assert await ws_status(http, gw, "chat.example.com", "https://shop.example.com") == 101
        assert await ws_status(http, gw, "chat.example.com", "https://attacker.example") == 403
        assert await ws_status(http, gw, "attacker.example", "http://attacker.example") == 421


async def test_malformed_hosts_get_one_sentence(config_dir, data_dir, http):
    async with served(config_dir, data_dir) as gw:
        reader_writer = []
        for host in ("", "a b", "[::1", "[::1]x", "::1", "localhost:99999999", "localhost:x",
                     "x" * 300, "local\x01host"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.http.port)
            reader_writer.append(writer)
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                         .encode("latin-1"))
            answer = await asyncio.wait_for(reader.read(), 10)
            status = answer.split(b"\r\n", 1)[0]
            # (a control character: aiohttp's parser answers 400 itself)
            assert status in (b"HTTP/1.1 421 Misdirected Request", b"HTTP/1.0 400 Bad Request"
                              ), (host, answer[:200])
            assert b"Traceback" not in answer
        for writer in reader_writer:
            writer.close()


def test_host_policy_rules():
    assert split_host("Example.COM.:8080") == ("example.com", 8080)
    assert split_host("[::1]:80") == ("[::1]", 80)
    assert split_host("[::1]") == ("[::1]", None)
    assert split_host("::1") is None and split_host("") is None and split_host("a:") is None
    assert default_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "[::1]"]
    assert default_hosts("0.0.0.0") == ["localhost", "127.0.0.1", "[::1]"]
    assert default_hosts("chat.internal") == ["localhost", "127.0.0.1", "[::1]", "chat.internal"]
    anyone = HostPolicy(["*"])
    assert anyone.allows("attacker.example") and not anyone.allows("a b c:x")
    policy = HostPolicy(default_hosts("::"))
    assert policy.allows(None)  # no Host at all: not a browser
    assert policy.allows("localhost:1") and not policy.allows("localhostx")


@pytest.mark.parametrize("entry", ["http://chat.example.com", "chat.example.com/x", "a b",
                                   "-x.example", "chat.example.com:port", ""])
def test_bad_allowed_hosts_are_refused_naming_the_field(tmp_path: Path, entry: str):
    (tmp_path / "pluto.yaml").write_text(f"http:\n  allowed_hosts: ['{entry}']\n")
    with pytest.raises(ConfigError, match=r"http\.allowed_hosts"):
        load_pluto_config(tmp_path)


def test_an_empty_list_is_refused(tmp_path: Path):
    (tmp_path / "pluto.yaml").write_text("http:\n  allowed_hosts: []\n")
    with pytest.raises(ConfigError, match="lists no host name"):
        load_pluto_config(tmp_path)
