"""The admin console in Debian's Chromium (Playwright): sign in with a local account, edit
routes with a problem shown by line, fix it, see the diff, apply it live; a viewer cannot
change anything (controls off, the API answers 403 if forced); the session cookie is out of
the page's reach and a change without the CSRF token is refused. With CONSOLE_SCREENSHOTS=1
the pages are saved to docs/img/console-*.png at 1280 and 390 px (taken once, locally)."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import playwright.async_api as playwright_api
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig
from tests.helpers.gateway import RecordingProvider
from tests.helpers.served import wait_for

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PASSWORD = "correct horse battery"
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS") == "1"

pytestmark = pytest.mark.slow


@pytest.fixture
async def gw(config_dir: Path, data_dir: Path) -> AsyncIterator[Gateway]:
    # (a budget in pluto.yaml itself: applying routes reloads the files)
    with (config_dir / "pluto.yaml").open("a") as f:
        f.write("\nusage:\n  budgets:\n    - {per: agent, tokens: 100000}\n")
    cfg = PlutoConfig(data_dir=data_dir, gateway={"reload_interval_seconds": 0},
                      usage={"budgets": [{"per": "agent", "tokens": 100_000}]})
    gateway = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                      model_factory=ScriptedModel())
    await gateway.start()
    p = RecordingProvider("test")
    gateway.add_provider(p)
    await p.running.wait()
    from pluto.gateway.console.accounts import hash_password
    for name, role in (("adam", "admin"), ("vera", "viewer")):
        await gateway.store.console.put_account(name, role,
                                                password_hash=await hash_password(PASSWORD))
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _browser(pw: Any) -> Any:
    assert CHROMIUM.exists(), "needs Debian's chromium: apt-get install -y chromium"
    return await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)


async def _sign_in(page: Any, url: str, name: str) -> None:
    expect = playwright_api.expect
    await page.goto(url + "/console/")
    await page.get_by_label("Name").fill(name)
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".who-name")).to_have_text(name)


async def _shots(page: Any, name: str) -> None:
    if not SHOTS:
        return
    await page.evaluate("document.querySelectorAll('.toast').forEach(t => t.remove())")
    for width in (1280, 390):
        await page.set_viewport_size({"width": width, "height": 900})
        await page.wait_for_timeout(300)  # (a picture only: layout settles; nothing asserted)
        await page.screenshot(path=str(IMG / f"console-{name}-{width}.png"), full_page=True)
    await page.set_viewport_size({"width": 1280, "height": 900})


BAD_LINE = "  - match: {provider: test}\n    agent: nobody\n"


async def test_an_admin_edits_routes_in_the_browser(gw: Gateway):
    expect = playwright_api.expect
    url = gw.http.url  # type: ignore[union-attr]
    p = gw.providers["test"]
    assert isinstance(p, RecordingProvider)
    await p.say("hello there")
    await p.wait_finals(1)
    async with playwright_api.async_playwright() as pw:
        browser = await _browser(pw)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(url + "/console/")
            await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
            await _shots(page, "signin")
            await _sign_in(page, url, "adam")
            await expect(page.locator(".stat").first).to_be_visible()
            await _shots(page, "overview")
            # the session cookie is out of the page's reach; a change without the token fails
            assert "pluto_session" not in await page.evaluate("document.cookie")
            status = await page.evaluate(
                "fetch('/admin/reload', {method: 'POST', credentials: 'same-origin'})"
                ".then(r => r.status)")
            assert status == 403
            # routes: a problem shown by its line, then fixed, the diff, applied live
            await page.get_by_role("link", name="Routes").click()
            editor = page.locator("#routes-text")
            await expect(editor).not_to_have_value("")
            original = await editor.input_value()
            text = original.replace("routes:\n", "routes:\n" + BAD_LINE, 1) \
                if "routes:\n" in original else original + "\nroutes:\n" + BAD_LINE
            await editor.fill(text)
            await page.get_by_role("button", name="Check").click()
            problem = page.locator(".problem").first
            await expect(problem).to_contain_text("unknown agent 'nobody'")
            line = text.splitlines().index("    agent: nobody") + 1
            await expect(problem.locator(".line")).to_have_text(f"Line {line}")
            generation = gw.watcher.status.generation
            await page.get_by_role("button", name="Apply").click()
            await expect(page.locator(".toast.error")).to_contain_text("problems")
            assert gw.watcher.status.generation == generation
            await _shots(page, "routes")
            fixed = original + "\n# edited in the console\n"
            await editor.fill(fixed)
            await page.get_by_role("button", name="Check").click()
            await expect(page.locator(".problems")).to_have_text("No problems.")
            await expect(page.locator("pre.diff .add")).to_contain_text(
                ["+# edited in the console"])
            await page.get_by_role("button", name="Apply").click()
            await expect(page.locator(".toast.ok")).to_contain_text("Routes applied")
            assert gw.watcher.status.generation == generation + 1
            assert (gw.config_dir / "routes.yaml").read_text() == fixed
            # a conversation's transcript
            await page.get_by_role("link", name="Conversations").click()
            await page.locator(".results a").first.click()
            await expect(page.locator(".msg.user .bubble")).to_have_text("hello there")
            await _shots(page, "conversations")
            await page.get_by_role("link", name="Usage & budgets").click()
            await expect(page.locator("svg.chart").first).to_be_visible()
            # a budget: what was spent, and a reset (the limits are pluto.yaml's)
            page.once("dialog", lambda d: d.accept())
            await page.get_by_role("button", name="Reset the budget of agent default").click()
            await expect(page.locator(".toast.ok").last).to_contain_text("Budget of default reset")
            [budget] = await gw.usage.status()
            assert all(s["total_tokens"] == 0 for s in budget["spent"])  # spent anew from now
            await expect(page.get_by_text("Nothing spent this period.")).to_be_visible()
            # change a budget: budgets.yaml with a problem shown by line, then fixed and applied
            budgets = page.locator("#budgets-text")
            await expect(budgets).to_have_value(re.compile("budgets:"))
            bad = "budgets:\n  - {per: user, period: week, tokens: 5000}\n"
            await budgets.fill(bad)
            await page.get_by_role("button", name="Check").click()
            await expect(page.locator(".problem").first).to_contain_text("period")
            await expect(page.locator(".problem .line").first).to_have_text("Line 2")
            generation = gw.watcher.status.generation
            await page.get_by_role("button", name="Apply").click()
            await expect(page.locator(".toast.error").last).to_contain_text("problems")
            assert not (gw.config_dir / "budgets.yaml").exists()
            await budgets.fill(bad.replace("week", "day"))
            await page.get_by_role("button", name="Apply").click()
            await expect(page.locator(".toast.ok").last).to_contain_text("Budgets applied")
            await expect(page.get_by_role("heading", name="Per user, per day: 5,000 tokens")
                         ).to_be_visible()
            assert gw.watcher.status.generation == generation + 1
            assert {(b["per"], b["tokens"]) for b in await gw.usage.status()} == {
                ("agent", 100_000), ("user", 5000)}
            await _shots(page, "usage")
            assert errors == []
        finally:
            await browser.close()


async def test_a_viewer_cannot_change_anything(gw: Gateway):
    expect = playwright_api.expect
    url = gw.http.url  # type: ignore[union-attr]
    async with playwright_api.async_playwright() as pw:
        browser = await _browser(pw)
        try:
            page = await browser.new_page(viewport={"width": 390, "height": 800})
            await _sign_in(page, url, "vera")
            await page.get_by_role("button", name="Menu").click()
            nav = page.locator(".nav")
            await expect(nav.get_by_role("link", name="Routes")).to_be_visible()
            await expect(nav.get_by_role("link", name="Conversations")).to_have_count(0)
            await nav.get_by_role("link", name="Routes").click()
            await expect(page.locator("#routes-text")).not_to_have_value("")
            assert await page.locator("#routes-text").get_attribute("readonly") is not None
            await expect(page.get_by_role("button", name="Apply")).to_have_count(0)
            await page.get_by_role("button", name="Menu").click()
            await nav.get_by_role("link", name="Usage & budgets").click()
            await expect(page.locator(".help").first).to_contain_text("takes the admin role")
            await expect(page.get_by_role("button", name="Reset")).to_have_count(0)
            # forced, with the right token: the API still says no
            status = await page.evaluate(
                "fetch('/console/me').then(r => r.json()).then(me => fetch('/admin/routes/file',"
                " {method: 'PUT', headers: {'X-CSRF-Token': me.csrf, 'Content-Type':"
                " 'application/json'}, body: JSON.stringify({text: '', version: 'x'})}))"
                ".then(r => r.status)")
            assert status == 403
        finally:
            await browser.close()


class GatedModel(ScriptedModel):
    """Writes its first half, waits for the test to open the gate, then writes the rest."""

    def __init__(self) -> None:
        super().__init__()
        import asyncio
        self.gate = asyncio.Event()

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: Any) -> AsyncIterator[Any]:
        from pluto.runtime.model import ModelTurn
        self.calls.append(messages)
        first, rest = "The first half arrives live,", " and then the rest."
        yield first
        await self.gate.wait()
        yield rest
        yield ModelTurn(first + rest, [], {"prompt_tokens": 10, "completion_tokens": 10}, "stop")


async def test_follow_a_run_live_and_sign_in_through_sso(config_dir: Path, data_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    import asyncio

    from pluto.gateway.console.accounts import hash_password
    from tests.fakes.oidc_server import FakeOidc

    expect = playwright_api.expect
    monkeypatch.setenv("PLUTO_OIDC_SECRET", "s3cret-client")
    model = GatedModel()
    async with FakeOidc() as provider:
        cfg = PlutoConfig(data_dir=data_dir, console={"oidc": {
            "issuer": provider.issuer, "client_id": "pluto-console",
            "client_secret_env": "PLUTO_OIDC_SECRET",
            "roles": {"ana@example.com": "operator"}}})
        gateway = Gateway(config_dir, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                          model_factory=model)
        await gateway.start()
        p = RecordingProvider("test")
        gateway.add_provider(p)
        await p.running.wait()
        await gateway.store.console.put_account("adam", "admin",
                                                password_hash=await hash_password(PASSWORD))
        url = gateway.http.url  # type: ignore[union-attr]
        try:
            async with playwright_api.async_playwright() as pw:
                browser = await _browser(pw)
                try:
                    page = await browser.new_page(viewport={"width": 1280, "height": 900})
                    await page.goto(url + "/console/")
                    sso = page.get_by_role("link", name="Sign in with SSO")
                    await expect(sso).to_be_visible()
                    await sso.click()
                    await expect(page.locator(".who-name")).to_have_text("ana@example.com")
                    await expect(page.locator(".who-role")).to_have_text("operator")
                    await expect(page.get_by_role("link", name="Routes")).to_be_visible()
                    # a run in progress, followed live from its conversation
                    running = asyncio.ensure_future(p.say("tell me slowly"))
                    await wait_for(lambda: gateway.pipeline.live)
                    await page.get_by_role("link", name="Conversations").click()
                    follow = page.get_by_role("button", name="Follow live")
                    await expect(follow).to_be_visible(timeout=10_000)
                    await follow.click()
                    live = page.locator(".msg.live .bubble")
                    await expect(live).to_have_text("The first half arrives live,")
                    assert gateway.pipeline.live  # the run is still going: shown live
                    model.gate.set()
                    await expect(page.locator(".live-runs .bubble")).to_have_text(
                        "The first half arrives live, and then the rest.")
                    await expect(page.locator(".live-runs .badge")).to_contain_text("ended")
                    await running
                finally:
                    await browser.close()
        finally:
            model.gate.set()
            await gateway.stop()
