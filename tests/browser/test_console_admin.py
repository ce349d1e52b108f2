"""The console's admin pages (gateway/console/static/pages-admin.js) in Debian's Chromium.

An owner adds an operator account (and is told she is the last owner when she tries to stop
being one), makes an API key — shown once — that works, and revokes it by keyboard; an operator
approves a pairing code, adds a schedule (a wrong time refused) and cancels it; an admin saves
an agent with a YAML error, sees the problem by file and line, fixes it and deletes the copy;
the audit log lists these changes with their diffs, filtered by actor; a viewer sees no accounts
page and no edit controls; the pages fit a 390 px wide phone, where an agent is written anew.
Data never turns into markup. Under CI this must run.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import playwright.async_api as playwright_api
import pytest

from pluto.gateway.app import Gateway
from tests.helpers.served import served, url

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PASSWORD = "correct horse battery"
MARKUP = '<img src=x onerror="window.pwned=1">'
expect = playwright_api.expect


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    assert CHROMIUM.exists(), "needs Debian's chromium: apt-get install -y chromium " \
        "(scripts/test.sh installs it)"
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def add_account(gw: Gateway, name: str, role: str) -> None:
    from pluto.gateway.console.accounts import hash_password
    await gw.store.console.put_account(name, role, password_hash=await hash_password(PASSWORD))


class Person:
    """One person's browser context, signed in to the console."""

    def __init__(self, page: Any, gw: Gateway):
        self.page, self.gw = page, gw
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.errors.append(m.text)
                if m.type == "error" and "Content Security Policy" in m.text else None)

    @classmethod
    async def sign_in(cls, browser: Any, gw: Gateway, name: str, width: int = 1280) -> Person:
        context = await browser.new_context(viewport={"width": width, "height": 900})
        me = cls(await context.new_page(), gw)
        await me.page.goto(url(gw, "/console/"))
        await me.page.locator("#signin-name").fill(name)
        await me.page.locator("#signin-password").fill(PASSWORD)
        await me.page.get_by_role("button", name="Sign in").click()
        await expect(me.page.locator(".who-name")).to_have_text(name)
        return me

    async def open(self, page_id: str, heading: str) -> Any:
        await self.page.goto(url(self.gw, f"/console/#/{page_id}"))
        await expect(self.page.locator("#main h2").first).to_have_text(heading)
        return self.page.locator("#main")

    def nav(self) -> Any:
        return self.page.locator(".nav a")

    async def fits(self) -> None:
        """Nothing sticks out sideways: the page does not scroll horizontally."""
        wide = await self.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert wide <= 1, f"{self.page.url} is {wide}px wider than the window"


def agent_row(main: Any, name: str) -> Any:
    return main.locator("tr").filter(
        has=main.page.get_by_role("button", name=f"Open the agent {name}", exact=True))


async def _owner(browser: Any, gw: Gateway) -> None:
    olga = await Person.sign_in(browser, gw, "olga")
    page = olga.page
    await expect(olga.nav()).to_contain_text(["Agents", "Accounts", "API keys", "Audit log"])
    main = await olga.open("accounts", "Accounts")
    await main.get_by_label("Username").fill("otto")
    await main.get_by_label("Role", exact=True).select_option("operator")
    await main.get_by_label("Password").fill(PASSWORD)
    await main.get_by_role("button", name="Add account").click()
    await expect(main.locator(".pc-msg")).to_have_text("Added otto (operator).")
    row = main.locator("tr", has_text="otto")
    await expect(row.get_by_label("Role of otto", exact=True)).to_have_value("operator")
    found = await gw.store.console.account("otto")
    assert found is not None and found.role == "operator"
    # the last owner cannot stop being one: the 409 is a message, and the role stays
    mine = main.locator("tr", has_text="olga")
    await mine.get_by_label("Role of olga", exact=True).select_option("admin")
    await mine.get_by_role("button", name="Change the role of olga").click()
    await expect(main.get_by_role("alert")).to_contain_text("last owner")
    await expect(mine.get_by_label("Role of olga", exact=True)).to_have_value("owner")
    await olga.fits()

    # a key for a role, by keyboard: shown once, works, then revoked
    main = await olga.open("keys", "API keys")
    name = main.get_by_label("Key name")
    await name.fill("ci-bot")
    await main.get_by_label("Role", exact=True).select_option("viewer")
    await name.press("Enter")
    secret = main.get_by_label("The new key", exact=True)
    await expect(secret).to_be_focused()
    key = await secret.input_value()
    assert key.startswith("pk_")
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await main.get_by_role("button", name="Copy the key to the clipboard").click()
    await expect(page.locator(".toasts")).to_contain_text("Copied.")
    assert await page.evaluate("navigator.clipboard.readText()") == key
    async with aiohttp.ClientSession() as http:
        async with http.get(url(gw, "/admin/agents"),
                            headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200
    await main.get_by_role("button", name="I have kept it").click()
    await expect(secret).to_have_count(0)  # never shown again
    assert key not in await page.content()
    row = main.locator("tr", has_text="ci-bot")
    await expect(row).to_contain_text("live")
    await row.get_by_role("button", name="Revoke: Revoke the key ci-bot?").focus()
    await page.keyboard.press("Enter")
    yes = row.get_by_role("button", name="Yes, revoke")
    await expect(yes).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(main.locator("tr", has_text="ci-bot")).to_contain_text("revoked")
    async with aiohttp.ClientSession() as http:
        async with http.get(url(gw, "/admin/agents"),
                            headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 401
    assert olga.errors == []


async def _operator(browser: Any, gw: Gateway) -> None:
    asked = await gw.access.pairing.request("telegram", "4242", "4242", f"Pat {MARKUP}", 3600)
    otto = await Person.sign_in(browser, gw, "otto")
    await expect(otto.nav()).not_to_contain_text(["Accounts"])
    main = await otto.open("pairing", "Pairing requests")
    row = main.locator("tr", has_text=asked.code)
    await expect(row).to_contain_text(f"Pat {MARKUP}")  # as text
    await row.get_by_role("button", name="Approve").click()
    await expect(main.locator(".pc-msg")).to_contain_text("Approved")
    assert await gw.access.pairing.is_approved("telegram", "4242")
    approved = main.locator("tr", has_text="4242")
    await approved.get_by_role("button", name="Revoke: Revoke").click()
    await approved.get_by_role("button", name="Yes, revoke").click()
    await expect(main.get_by_text("Nobody is approved yet.")).to_be_visible()
    assert not await gw.access.pairing.is_approved("telegram", "4242")
    assert await otto.page.evaluate("window.pwned") is None

    main = await otto.open("schedules", "Schedules")
    await expect(main.get_by_text("No schedules.")).to_be_visible()
    await main.get_by_label("Agent", exact=True).select_option("default")
    await main.get_by_label("To", exact=True).fill("web:someone")
    await main.get_by_label("Repeat", exact=True).select_option("every")
    await main.get_by_label("When", exact=True).fill("every 1 fortnight")
    await main.get_by_label("What the agent is asked each time").fill("Summarise the week")
    await main.get_by_role("button", name="Add schedule").click()
    await expect(main.get_by_role("alert")).to_contain_text("Not added: 'every'")
    await main.get_by_label("When", exact=True).fill("1d")
    await main.get_by_role("button", name="Add schedule").click()
    await expect(main.locator(".pc-msg")).to_contain_text("Added the schedule")
    row = main.locator("tr", has_text="Summarise the week")
    await expect(row).to_contain_text("default")
    await expect(row).to_contain_text("web:someone")
    await row.get_by_role("button", name=re.compile("^History of ")).click()
    await expect(main.get_by_text("It has not fired yet.")).to_be_visible()
    await row.get_by_role("button", name="Cancel: Cancel the schedule").click()
    await row.get_by_role("button", name="Yes, cancel").click()
    await expect(main.get_by_text("No schedules.")).to_be_visible()
    assert await gw.store.schedules.list(active=False) == []
    assert otto.errors == []


async def _admin(browser: Any, gw: Gateway, data_dir: Path) -> None:
    adam = await Person.sign_in(browser, gw, "adam")
    main = await adam.open("agents", "Agents")
    broken = agent_row(main, "broken")
    await expect(broken).to_contain_text("does not load")
    await expect(broken).to_contain_text("agent.yaml line 2 (modle): unknown field")
    row = agent_row(main, "default")
    await expect(row).to_contain_text("loads")
    await row.get_by_role("button", name="Open the agent default").click()
    await expect(main.get_by_role("heading", name="Agent default")).to_be_visible()
    yaml = main.get_by_label("agent.yaml")
    text = await yaml.input_value()
    assert "description:" in text
    await yaml.fill(text + "\ntools: [current_time\n")  # a YAML error on its last lines
    await main.get_by_role("button", name="Save").click()
    alert = main.locator(".pc-errors [role=alert]")
    await expect(alert).to_contain_text("Not saved")
    await expect(alert.locator("li").first).to_contain_text("agent.yaml line")
    assert not (data_dir / "agents" / "default").exists()  # nothing replaced
    await yaml.fill(text.replace("A helpful general assistant.", f"Helpful {MARKUP}"))
    await main.get_by_label("instructions.md").fill("Answer briefly.")
    await main.get_by_role("button", name="Save").click()
    await expect(main.locator(".pc-msg")).to_contain_text("Saved default; it loads.")
    await expect(alert).to_have_count(0)
    saved = data_dir / "agents" / "default"
    assert (saved / "instructions.md").read_text() == "Answer briefly."
    assert MARKUP in (saved / "agent.yaml").read_text()
    await expect(main).to_contain_text("Deployed through the admin API")
    # the test chat: a message to this agent, its answer streamed in; a conversation goes on
    chat = main.locator(".pc-test-chat")
    await main.get_by_label("Message to default").fill("hello from the console")
    await main.get_by_role("button", name="Send").click()
    await expect(chat.locator(".msg.assistant .bubble")).to_have_text(
        "echo: hello from the console")
    await expect(chat.locator(".msg.assistant.live")).to_have_count(0)  # the run ended
    await main.get_by_label("Message to default").fill("/help")
    await main.get_by_label("Message to default").press("Enter")
    await expect(chat.locator(".msg.assistant .bubble").nth(1)).to_contain_text("/new")
    [session] = [s for s in await gw.store.conversations.find_sessions("default/console/adam/")]
    messages = await gw.store.conversations.messages(session["id"])
    assert [m.content for m in messages][:2] == ["hello from the console",
                                                 "echo: hello from the console"]
    await main.get_by_role("button", name="New conversation").click()
    await expect(chat.locator(".msg")).to_have_count(0)
    # the copy made through the API can go (the config directory's agent comes back)
    await main.get_by_role("button", name="Delete: Delete the agent default?").click()
    await main.get_by_role("button", name="Yes, delete").click()
    await expect(main.locator(".pc-msg")).to_have_text("Deleted default.")
    await expect(agent_row(main, "default")).to_contain_text("config files")
    assert not saved.exists()
    assert await adam.page.evaluate("window.pwned") is None
    await expect(adam.nav()).not_to_contain_text(["Accounts"])
    assert adam.errors == []


async def _audit(browser: Any, gw: Gateway) -> None:
    vera = await Person.sign_in(browser, gw, "vera")
    await expect(vera.nav()).to_contain_text(["Agents", "Audit log"])
    await expect(vera.nav()).not_to_contain_text(["Accounts"])
    await expect(vera.nav()).not_to_contain_text(["API keys"])
    main = await vera.open("accounts", "Accounts")
    await expect(main).to_contain_text("cannot see this page")
    assert await main.locator("input, select, form").count() == 0

    main = await vera.open("audit", "Audit log")
    table = main.locator("table")
    for who, what in (("olga", "POST /admin/accounts"), ("olga", "POST /admin/keys"),
                      ("olga", "DELETE /admin/keys/"), ("otto", "POST /admin/pairing/approve"),
                      ("otto", "POST /admin/schedules"),
                      ("otto", "DELETE /admin/schedules/"), ("adam", "PUT /admin/agents/default"),
                      ("adam", "DELETE /admin/agents/default")):
        await expect(table.locator("tr", has_text=what).filter(has_text=who).first) \
            .to_be_visible()
    added = table.locator("tr", has_text="account otto")
    await added.get_by_text("Show the change").click()
    await expect(added.locator("pre")).to_have_text("role: - -> operator (password set)")
    assert await main.get_by_role("link", name="Download the whole log (CSV)") \
        .get_attribute("href") == "/admin/audit.csv"
    await main.get_by_label("Actor").fill("adam")
    await main.get_by_label("Actor").press("Enter")
    await expect(table.locator("tbody tr")).to_have_count(3)  # newest first
    await expect(table.locator("tbody tr")).to_contain_text(
        ["DELETE /admin/agents/default", "PUT /admin/agents/default", "sign-in"])
    await expect(table.locator("tbody tr", has_text="olga")).to_have_count(0)

    # a viewer reads an agent; nothing to change it with
    main = await vera.open("agents/default", "Agents")  # a link to one agent
    await expect(main.get_by_role("heading", name="Agent default")).to_be_focused()
    await expect(main.get_by_label("agent.yaml")).not_to_be_editable()
    assert await main.get_by_role("button", name="Save").count() == 0
    assert await main.get_by_role("button", name="Delete").count() == 0
    assert await main.get_by_label("New agent's name").count() == 0
    assert await main.get_by_role("button", name="Send").count() == 0  # no test chat either
    assert vera.errors == []


async def _phone(browser: Any, gw: Gateway) -> None:
    olga = await Person.sign_in(browser, gw, "olga", width=390)
    for page_id, heading in (("accounts", "Accounts"), ("keys", "API keys"),
                             ("audit", "Audit log"), ("agents", "Agents"),
                             ("pairing", "Pairing requests"), ("schedules", "Schedules"),
                             ("datasets", "Datasets")):
        main = await olga.open(page_id, heading)
        await expect(main.locator(".pc-body > *").first).to_be_visible()
        text = await main.inner_text()
        assert "null" not in text and "undefined" not in text and "[object" not in text
        await olga.fits()
    main = await olga.open("accounts", "Accounts")
    await expect(main.get_by_role("button", name="Add account")).to_be_in_viewport()
    await main.get_by_role("button", name="Remove: Remove the account otto?").click()
    await main.get_by_role("button", name="Yes, remove").click()
    await expect(main.locator(".pc-msg")).to_have_text("Removed otto.")
    assert await gw.store.console.account("otto") is None
    main = await olga.open("agents", "Agents")
    await main.get_by_role("button", name="Open the agent default").click()
    await expect(main.get_by_label("agent.yaml")).to_be_visible()
    await olga.fits()
    await olga.page.go_back()  # the list again
    await expect(main.get_by_role("button", name="Open the agent cook")).to_be_visible()
    await main.get_by_label("New agent's name").fill("cook")  # there: it opens, not a blank one
    await main.get_by_role("button", name="Write a new agent").click()
    await expect(main.get_by_role("heading", name="Agent cook")).to_be_visible()
    await expect(main.get_by_label("agent.yaml")).to_have_value(re.compile("kitchen"))
    await main.get_by_role("button", name="← All agents").click()
    await main.get_by_label("New agent's name").fill("helper")
    await main.get_by_role("button", name="Write a new agent").click()
    await expect(main.get_by_role("heading", name="New agent helper")).to_be_visible()
    await main.get_by_role("button", name="Create agent").click()
    await expect(main.locator(".pc-msg")).to_have_text("Saved helper; it loads.")
    assert (gw.registry.dirs[-1] / "helper" / "instructions.md").is_file()
    await main.get_by_role("button", name="Delete: Delete the agent helper?").click()
    await main.get_by_role("button", name="Yes, delete").click()
    await expect(main.locator(".pc-msg")).to_have_text("Deleted helper.")
    await expect(main.get_by_role("button", name="Open the agent cook")).to_be_visible()
    assert "helper" not in gw.registry
    assert olga.errors == []


@pytest.mark.slow
async def test_the_admin_pages_in_the_browser(config_dir: Path, data_dir: Path):
    broken = config_dir / "agents" / "broken"  # an agent that does not load
    broken.mkdir()
    (broken / "agent.yaml").write_text("description: a typo below\nmodle: default\n")
    async with served(config_dir, data_dir) as gw, chromium() as browser:
        for name, role in (("olga", "owner"), ("adam", "admin"), ("vera", "viewer")):
            await add_account(gw, name, role)
        await _owner(browser, gw)
        await _operator(browser, gw)
        await _admin(browser, gw, data_dir)
        await _audit(browser, gw)
        await _phone(browser, gw)

