"""The admin console's backend (issue 35): local accounts and sign-in, the session cookie's
flags, CSRF, roles on the admin API, API keys per role, the audit log, editing routes.yaml with
a check and a diff, and sign-in through a fake OpenID Connect provider."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig
from tests.fakes.oidc_server import FakeOidc
from tests.helpers.gateway import RecordingProvider

PASSWORD = "correct horse battery"


class Console:
    """A browser's view: one cookie jar per person."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.url = gw.http.url  # type: ignore[union-attr]
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.csrf = ""

    async def call(self, method: str, path: str, json_body: Any = None, *,
                   csrf: bool = True, headers: dict[str, str] | None = None
                   ) -> tuple[int, Any]:
        h = dict(headers or {})
        if csrf and self.csrf:
            h["X-CSRF-Token"] = self.csrf
        async with self.http.request(method, self.url + path, json=json_body, headers=h,
                                     allow_redirects=False) as r:
            body = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body

    async def sign_in(self, name: str, password: str = PASSWORD) -> tuple[int, Any]:
        async with self.http.post(self.url + "/console/login",
                                  json={"username": name, "password": password}) as r:
            body = await r.json()
            if r.status == 200:
                self.csrf = body["csrf"]
            return r.status, body


async def add_account(gw: Gateway, name: str, role: str) -> None:
    from pluto.gateway.console.accounts import hash_password
    await gw.store.console.put_account(name, role, password_hash=await hash_password(PASSWORD))


@pytest.fixture
async def gw(config_dir: Path, data_dir: Path) -> AsyncIterator[Gateway]:
    cfg = PlutoConfig(data_dir=data_dir, gateway={"reload_interval_seconds": 0})
    gateway = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                      model_factory=ScriptedModel())
    await gateway.start()
    p = RecordingProvider("test")
    gateway.add_provider(p)
    await p.running.wait()
    try:
        yield gateway
    finally:
        await gateway.stop()


@pytest.fixture
async def people(gw: Gateway) -> AsyncIterator[dict[str, Console]]:
    out = {}
    for name, role in (("olga", "owner"), ("adam", "admin"), ("otto", "operator"),
                       ("vera", "viewer")):
        await add_account(gw, name, role)
        out[name] = Console(gw)
        status, _ = await out[name].sign_in(name)
        assert status == 200
    yield out
    for c in out.values():
        await c.http.close()


async def test_off_without_key_or_account_then_sign_in_and_cookie_flags(gw: Gateway):
    c = Console(gw)
    try:
        status, body = await c.call("GET", "/admin/agents")
        assert status == 403 and "off" in body["error"]
        await add_account(gw, "ana", "owner")
        assert (await c.call("GET", "/admin/agents"))[0] == 401
        assert (await c.sign_in("ana", "wrong password!"))[0] == 401
        assert (await c.sign_in("nobody", PASSWORD))[0] == 401  # the same answer
        async with c.http.post(c.url + "/console/login",
                               json={"username": "ana", "password": PASSWORD}) as r:
            assert r.status == 200
            cookie = r.headers["Set-Cookie"]
            c.csrf = (await r.json())["csrf"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=28800" in cookie
        assert "Secure" not in cookie  # plain HTTP on the loopback
        status, me = await c.call("GET", "/console/me")
        assert (me["user"], me["role"], me["csrf"]) == ("ana", "owner", c.csrf)
        assert (await c.call("GET", "/admin/agents"))[0] == 200
        # behind a TLS proxy on the same machine, the cookie is Secure
        async with aiohttp.ClientSession() as other:
            async with other.post(c.url + "/console/login", headers={"X-Forwarded-Proto": "https"},
                                  json={"username": "ana", "password": PASSWORD}) as r:
                assert "Secure" in r.headers["Set-Cookie"]
        # signing out ends the session everywhere it was used
        assert (await c.call("POST", "/console/logout", csrf=False))[0] == 403  # (CSRF)
        assert (await c.call("POST", "/console/logout"))[0] == 204
        assert (await c.call("GET", "/console/me"))[0] == 401
    finally:
        await c.http.close()


async def test_a_change_with_a_cookie_needs_the_csrf_token(gw: Gateway, people):
    adam = people["adam"]
    status, body = await adam.call("POST", "/admin/reload", csrf=False)
    assert status == 403 and "CSRF" in body["error"]
    status, _ = await adam.call("POST", "/admin/reload", headers={"X-CSRF-Token": "guess"},
                                csrf=False)
    assert status == 403
    assert (await adam.call("POST", "/admin/reload"))[0] == 200
    # a key needs no CSRF token (no browser sends it by itself)
    status, made = await people["olga"].call("POST", "/admin/keys",
                                             {"name": "deploy", "role": "admin"})
    assert status == 201
    async with aiohttp.ClientSession() as bare:
        async with bare.post(gw.http.url + "/admin/reload",  # type: ignore[union-attr]
                             headers={"Authorization": f"Bearer {made['key']}"}) as r:
            assert r.status == 200


async def test_roles_on_the_admin_api(gw: Gateway, people):
    vera, otto, adam, olga = (people[n] for n in ("vera", "otto", "adam", "olga"))
    p = next(iter(gw.providers.values()))
    assert isinstance(p, RecordingProvider)
    await p.say("my secret plan")
    await p.wait_finals(1)
    await gw.settled()
    # a viewer: the overview and runs, never a conversation's text
    status, overview = await vera.call("GET", "/admin/overview")
    assert status == 200 and overview["runs_today"] >= 1 and "cost_today_usd" in overview
    _, runs = await vera.call("GET", "/admin/runs")
    assert runs["runs"] and all("input" not in r for r in runs["runs"])
    run_id = runs["runs"][0]["id"]
    assert (await vera.call("GET", f"/admin/runs/{run_id}"))[0] == 403
    assert (await vera.call("GET", "/admin/conversations"))[0] == 403
    status, body = await vera.call("POST", "/admin/reload")
    assert status == 403 and "viewer" in body["error"]
    # an operator reads conversations and follows runs
    _, found = await otto.call("GET", "/admin/conversations?q=secret")
    [session] = found["sessions"]
    status, transcript = await otto.call("GET", f"/admin/conversations/{session['id']}")
    assert status == 200 and transcript["messages"][0]["content"] == "my secret plan"
    status, events = await otto.call("GET", f"/admin/runs/{run_id}/events")
    assert status == 200 and "event: run.end" in events
    assert (await otto.call("POST", "/admin/reload"))[0] == 403
    # an admin changes configuration, not accounts; an owner does
    assert (await adam.call("POST", "/admin/reload"))[0] == 200
    assert (await adam.call("GET", "/admin/accounts"))[0] == 403
    status, accounts = await olga.call("GET", "/admin/accounts")
    assert status == 200 and {a["username"] for a in accounts["accounts"]} >= {"vera", "olga"}
    # the last owner cannot be removed or demoted
    assert (await olga.call("DELETE", "/admin/accounts/olga"))[0] == 409
    status, _ = await olga.call("PUT", "/admin/accounts/vera", {"role": "operator"})
    assert status == 200
    assert (await vera.call("GET", "/admin/conversations"))[0] == 200  # her role now


async def test_keys_per_role_and_revocation(gw: Gateway, people):
    olga = people["olga"]
    status, made = await olga.call("POST", "/admin/keys", {"name": "grafana", "role": "viewer"})
    assert status == 201 and made["key"].startswith("pk_")
    _, listed = await olga.call("GET", "/admin/keys")
    assert made["key"] not in json.dumps(listed)  # shown once, never again
    url = gw.http.url  # type: ignore[union-attr]
    auth = {"Authorization": f"Bearer {made['key']}"}
    async with aiohttp.ClientSession() as bare:
        async with bare.get(url + "/admin/overview", headers=auth) as r:
            assert r.status == 200
        async with bare.post(url + "/admin/reload", headers=auth) as r:
            assert r.status == 403
        assert (await olga.call("DELETE", f"/admin/keys/{made['id']}"))[0] == 204
        async with bare.get(url + "/admin/overview", headers=auth) as r:
            assert r.status == 401


ROUTES_BAD = "routes:\n  - match: {provider: test}\n    agent: nobody\ndefault: default\n"


async def test_edit_routes_with_an_error_then_fix_it_and_see_the_diff_applied(gw: Gateway,
                                                                              people):
    adam, vera = people["adam"], people["vera"]
    _, current = await adam.call("GET", "/admin/routes/file")
    status, checked = await vera.call("POST", "/admin/routes/check", {"text": ROUTES_BAD})
    assert status == 200 and not checked["ok"]
    [problem] = checked["problems"]
    assert problem["line"] == 3 and "unknown agent 'nobody'" in problem["message"]
    before = gw.watcher.status.generation
    status, refused = await adam.call("PUT", "/admin/routes/file",
                                      {"text": ROUTES_BAD, "version": current["version"]})
    assert status == 422 and refused["problems"][0]["line"] == 3
    assert (await adam.call("GET", "/admin/routes/file"))[1]["text"] == current["text"]
    good = current["text"] + "\n# routed by the console\n"
    assert (await vera.call("PUT", "/admin/routes/file",
                            {"text": good, "version": current["version"]}))[0] == 403
    status, applied = await adam.call("PUT", "/admin/routes/file",
                                      {"text": good, "version": current["version"]})
    assert status == 200 and applied["applied"] and "+# routed by the console" in applied["diff"]
    assert gw.watcher.status.generation == before + 1
    # someone else's stale version is refused, never written over
    status, stale = await adam.call("PUT", "/admin/routes/file",
                                    {"text": current["text"], "version": current["version"]})
    assert status == 409 and stale["text"] == good
    # the change is in the audit log, with its diff, and exportable
    _, audit = await vera.call("GET", "/admin/audit")
    entry = next(e for e in audit["entries"] if e["target"] == "routes.yaml")
    assert entry["actor"] == "adam" and "+# routed by the console" in entry["diff"]
    status, exported = await vera.call("GET", "/admin/audit.csv")
    assert status == 200 and "routes.yaml" in exported and exported.startswith("id,at,actor")


async def test_guessing_passwords_is_slowed_down(gw: Gateway):
    await add_account(gw, "ana", "owner")
    c = Console(gw)
    try:
        statuses = [(await c.sign_in("ana", f"guess number {i}"))[0] for i in range(11)]
        assert statuses[:10] == [401] * 10 and statuses[10] == 429
        assert (await c.sign_in("ana"))[0] == 429  # also the right one, for a while
    finally:
        await c.http.close()


@pytest.fixture
async def oidc(config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
               ) -> AsyncIterator[tuple[Gateway, FakeOidc]]:
    monkeypatch.setenv("PLUTO_OIDC_SECRET", "s3cret-client")
    async with FakeOidc() as provider:
        cfg = PlutoConfig(data_dir=data_dir, console={"oidc": {
            "issuer": provider.issuer, "client_id": "pluto-console",
            "client_secret_env": "PLUTO_OIDC_SECRET", "roles": {"ana@example.com": "admin"}}})
        gateway = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                          model_factory=ScriptedModel())
        await gateway.start()
        try:
            yield gateway, provider
        finally:
            await gateway.stop()


async def test_sign_in_through_openid_connect(oidc):
    gw, provider = oidc
    c = Console(gw)
    try:
        async with c.http.get(c.url + "/console/oidc/login") as r:  # follows every redirect
            assert r.status in (200, 404) and str(r.url).startswith(c.url + "/console")
        status, me = await c.call("GET", "/console/me")
        assert status == 200 and (me["user"], me["role"]) == ("ana@example.com", "admin")
        # the callback's state is good once: a replayed callback finds nothing
        assert provider.token_calls == 1
        async with c.http.get(c.url + "/console/oidc/login", allow_redirects=False) as r:
            to_provider = r.headers["Location"]
        async with c.http.get(to_provider, allow_redirects=False) as r:
            callback = r.headers["Location"]
        async with c.http.get(callback, allow_redirects=False) as r:
            assert r.status == 302
        async with c.http.get(callback, allow_redirects=False) as r:
            assert r.status == 400 and "stale" in await r.text()
    finally:
        await c.http.close()


@pytest.mark.parametrize("tamper, words", [
    ("bad-signature", "signature"), ("wrong-nonce", "nonce"),
    ("wrong-audience", "aud"), ("expired", "exp")])
async def test_an_id_token_that_does_not_hold_signs_nobody_in(oidc, tamper, words):
    gw, provider = oidc
    provider.tamper = tamper
    c = Console(gw)
    try:
        async with c.http.get(c.url + "/console/oidc/login") as r:
            assert r.status == 401 and words in (await r.text())
        assert (await c.call("GET", "/console/me"))[0] == 401
    finally:
        await c.http.close()


async def test_a_person_without_a_role_is_refused(oidc):
    gw, provider = oidc
    provider.person = {"sub": "u-2", "email": "eve@example.com", "email_verified": True}
    c = Console(gw)
    try:
        async with c.http.get(c.url + "/console/oidc/login") as r:
            assert r.status == 403 and "no access" in await r.text()
    finally:
        await c.http.close()


async def test_an_agents_change_is_audited_with_the_diff_of_its_files(gw: Gateway, people):
    adam, vera = people["adam"], people["vera"]
    body = {"agent": {"description": "Support", "instructions": "i.md"},
            "files": {"i.md": "You answer support questions."}}
    assert (await adam.call("PUT", "/admin/agents/support", body))[0] == 201
    body["files"]["i.md"] = "You answer support questions, briefly."
    assert (await adam.call("PUT", "/admin/agents/support", body))[0] == 200
    assert (await adam.call("DELETE", "/admin/agents/support"))[0] == 204
    _, audit = await vera.call("GET", "/admin/audit?actor=adam")
    made, changed, removed = [e for e in reversed(audit["entries"])
                              if e["target"] == "agent support"]
    assert "+You answer support questions." in made["diff"] and "b/agent.yaml" in made["diff"]
    assert "-You answer support questions." in changed["diff"]
    assert "+You answer support questions, briefly." in changed["diff"]
    assert "-description: Support" in removed["diff"]
    _, exported = await vera.call("GET", "/admin/audit.csv?actor=vera")
    assert exported.strip().splitlines() == ["id,at,actor,role,action,target,diff"] or \
        "support" not in exported  # vera changed nothing


async def test_datasets_list_preview_load_and_remove(gw: Gateway, people):
    adam, vera = people["adam"], people["vera"]
    csv = b"city,visits\nParis,3\nOslo,5\n"
    async with adam.http.put(adam.url + "/admin/datasets/visits?format=csv", data=csv,
                             headers={"X-CSRF-Token": adam.csrf}) as r:
        assert r.status == 201
        made = await r.json()
    assert (made["name"], made["rows"]) == ("visits", 2)
    assert [c["name"] for c in made["columns"]] == ["city", "visits"]
    _, listed = await vera.call("GET", "/admin/datasets")
    assert "visits" in [d["name"] for d in listed["datasets"]]
    assert (await vera.call("GET", "/admin/datasets/visits/preview"))[0] == 403  # the rows
    status, rows = await people["otto"].call("GET", "/admin/datasets/visits/preview?limit=1")
    assert status == 200 and rows["columns"] == ["city", "visits"] and len(rows["rows"]) == 1
    async with vera.http.put(vera.url + "/admin/datasets/x", data=csv,
                             headers={"X-CSRF-Token": vera.csrf}) as r:
        assert r.status == 403  # a viewer loads nothing
    async with adam.http.put(adam.url + "/admin/datasets/broken?format=parquet",
                             data=b"not parquet", headers={"X-CSRF-Token": adam.csrf}) as r:
        assert r.status == 422
    assert (await adam.call("GET", "/admin/datasets/nope/preview"))[0] == 404
    assert (await adam.call("GET", "/admin/datasets/Bad%20Name/preview"))[0] == 400
    assert (await adam.call("DELETE", "/admin/datasets/visits"))[0] == 204
    _, listed = await vera.call("GET", "/admin/datasets")
    assert "visits" not in [d["name"] for d in listed["datasets"]]


async def test_memory_notes_are_read_by_operators_and_restored_by_admins(gw: Gateway, people):
    from pluto.runtime.memory import MemoryBook, Owner
    from pluto.runtime.memory.notes import remember

    book = gw.runner.services.setdefault("memory", MemoryBook(gw.data_dir / "memory"))
    ana = Owner("default", "user", "test", "ana")
    await book.edit(ana, lambda m: remember(m, "likes tea", 4000), op="remember", by="run r1",
                    why="she said so")
    await book.edit(ana, lambda m: remember(m, "lives in Oslo", 4000), op="remember",
                    by="run r2", why="she said so")
    assert (await people["vera"].call("GET", "/admin/memory"))[0] == 403  # people's notes
    otto, adam = people["otto"], people["adam"]
    _, found = await otto.call("GET", "/admin/memory?agent=default")
    [entry] = [o for o in found["owners"] if o["id"] == "ana"]
    assert (entry["scope"], entry["notes"]) == ("user", 2)
    status, shown = await otto.call("GET", "/admin/memory/default/user/test/ana")
    assert status == 200 and shown["notes"] == ["likes tea", "lives in Oslo"]
    first = shown["revisions"][0]["rev"]
    assert (await otto.call("POST", "/admin/memory/default/user/test/ana/restore",
                            {"rev": first}))[0] == 403
    status, restored = await adam.call("POST", "/admin/memory/default/user/test/ana/restore",
                                       {"rev": first})
    assert status == 200 and restored["notes"] == ["likes tea"]
    assert (await adam.call("GET", "/admin/memory/default/nonsense"))[0] == 404
    _, audit = await otto.call("GET", "/admin/audit?actor=adam")
    assert any(e["target"].startswith("memory user test:ana") for e in audit["entries"])


async def test_change_a_budget_in_budgets_yaml_and_see_it_applied(gw: Gateway, people):
    adam = people["adam"]
    _, current = await adam.call("GET", "/admin/usage/budgets/file")
    assert current["text"] == "" and gw.console_budgets == []
    bad = "budgets:\n  - {per: user, period: week, tokens: 10}\n"
    status, refused = await adam.call("PUT", "/admin/usage/budgets/file",
                                      {"text": bad, "version": current["version"]})
    assert status == 422 and refused["problems"][0]["line"] == 2
    good = "budgets:\n  - {per: user, period: day, tokens: 200000}\n"
    status, applied = await adam.call("PUT", "/admin/usage/budgets/file",
                                      {"text": good, "version": current["version"]})
    assert status == 200 and "+  - {per: user, period: day, tokens: 200000}" in applied["diff"]
    assert [(b.per, b.tokens) for b in gw.console_budgets] == [("user", 200000)]
    assert [(b.per, b.tokens) for b in gw.usage.budgets()] == [("user", 200000)]
    _, audit = await adam.call("GET", "/admin/audit?actor=adam")
    assert any(e["target"] == "budgets.yaml" and "200000" in e["diff"]
               for e in audit["entries"])


async def test_the_test_chat_speaks_to_an_agent_no_route_names(gw: Gateway, people):
    adam, otto, vera = people["adam"], people["otto"], people["vera"]
    body = {"agent": {"description": "Support", "instructions": "i.md"},
            "files": {"i.md": "You answer support questions."}}
    assert (await adam.call("PUT", "/admin/agents/support", body))[0] == 201
    status, said = await otto.call("POST", "/admin/agents/support/chat",
                                   {"text": "hello support", "conversation": "c1"})
    assert status == 202, said
    # the answer on the run's events (followed until its end), in a session of its own
    status, events = await otto.call("GET", f"/admin/runs/{said['run_id']}/events")
    assert status == 200 and "echo: hello support" in events and "event: run.end" in events
    status, transcript = await otto.call("GET", f"/admin/conversations/{said['session_id']}")
    assert [m["content"] for m in transcript["messages"]] == ["hello support",
                                                              "echo: hello support"]
    _, found = await otto.call("GET", "/admin/conversations?q=support/console/otto/c1")
    assert [x["id"] for x in found["sessions"]] == [said["session_id"]]
    # the same conversation goes on; another starts afresh
    _, again = await otto.call("POST", "/admin/agents/support/chat",
                               {"text": "and again", "conversation": "c1"})
    _, other = await otto.call("POST", "/admin/agents/support/chat",
                               {"text": "new one", "conversation": "c2"})
    assert again["session_id"] == said["session_id"] != other["session_id"]
    await gw.settled()
    # its spend is in the ledger as the console's; trying an agent changes nothing: no audit
    assert {t.key for t in await gw.store.usage.totals("provider")} >= {"console"}
    _, audit = await vera.call("GET", "/admin/audit?actor=otto")
    assert [e["action"] for e in audit["entries"]] == ["sign-in"]
    # refused: a viewer, an unknown agent, no text, a long one, a bad conversation id
    assert (await vera.call("POST", "/admin/agents/support/chat", {"text": "hi"}))[0] == 403
    assert (await otto.call("POST", "/admin/agents/nobody/chat", {"text": "hi"}))[0] == 404
    assert (await otto.call("POST", "/admin/agents/support/chat", {"text": " "}))[0] == 400
    assert (await otto.call("POST", "/admin/agents/support/chat", [1]))[0] == 400
    assert (await otto.call("POST", "/admin/agents/support/chat",
                            {"text": "x" * 20_001}))[0] == 413
    assert (await otto.call("POST", "/admin/agents/support/chat",
                            {"text": "é" * 20_000, "pad": "x" * 100_000}))[0] == 413
    assert (await otto.call("POST", "/admin/agents/support/chat",
                            {"text": "hi", "conversation": "../etc"}))[0] == 400
