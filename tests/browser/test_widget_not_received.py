"""The widget when the gateway cannot record a message (its storage fails): the tab keeps the
message, says so in its status bar, sends it again by itself and, once storage works, the
message is answered once — in Debian's Chromium, as in tests/browser/test_widget_browser.py."""

from __future__ import annotations

import sqlite3
from typing import Any

import playwright.async_api as playwright_api

from pluto.runtime.testing import ScriptedModel
from tests.browser.test_widget_browser import ARGS, CHROMIUM
from tests.helpers.served import served, url


async def test_a_message_not_recorded_is_kept_and_sent_again(config_dir, data_dir):
    expect = playwright_api.expect
    model = ScriptedModel()
    async with served(config_dir, data_dir, model) as gw, \
            playwright_api.async_playwright() as pw:
        assert CHROMIUM.exists(), "needs Debian's chromium: apt-get install -y chromium"
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(url(gw, "/"))
            await expect(page.locator(".pluto-status")).to_have_text("Online")
            inbox = gw.store.inbound
            real, tries = inbox.accept, []

            async def full(*args: Any) -> bool:
                tries.append(args[1])
                raise sqlite3.OperationalError("database or disk is full")

            inbox.accept = full
            await page.locator(".pluto-input").fill("are you there?")
            await page.locator(".pluto-input").press("Enter")
            status = page.locator(".pluto-status")
            await expect(status).to_have_text("Not sent yet — trying again…")
            mine = page.locator(".pluto-user .pluto-bubble")
            await expect(page.locator(".pluto-user.pluto-pending, .pluto-pending")).to_have_count(1)
            while len(tries) < 2:  # the tab sent it again by itself
                await page.wait_for_timeout(50)
            assert len(set(tries)) == 1  # the same message (same id), again
            inbox.accept = real  # storage works again
            answer = page.locator(".pluto-bot .pluto-bubble")
            await expect(answer).to_have_text("echo: are you there?", timeout=15_000)
            await expect(status).to_have_text("Online")
            await expect(page.locator(".pluto-pending")).to_have_count(0)
            await expect(mine).to_have_count(1)
            assert "Traceback" not in await page.locator(".pluto-log").inner_text()
            assert len(model.calls) == 1 and errors == []
        finally:
            await browser.close()
