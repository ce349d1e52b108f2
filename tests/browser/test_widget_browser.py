"""The chat widget in a real browser: Debian's Chromium driven by Playwright.

Open the demo page, send a message, watch the answer stream in and a table appear, lose the
connection and get it back, reload and find the conversation again; model output and user text
never turn into markup. Under CI this must run (a skip fails, see tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import playwright.async_api as playwright_api

from pluto.runtime.model import ModelSettings, ModelTurn
from pluto.runtime.testing import ScriptedModel
from tests.helpers.served import served, url

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


INTRO = "Here are the **sales** by region:\n\n"
TABLE = "| Region | Sales |\n|---|---:|\n| North | 120 |\n| South | 80 |\n\nNorth leads."
EVIL = ('<script>window.pwned = 1</script> <img src=x onerror="window.pwned = 2"> '
        '[click me](javascript:window.pwned=3) ![pic](https://tracker.invalid/x.png)')


class GatedModel(ScriptedModel):
    """Streams the intro, waits for the test to open the gate, then streams the table; any
    later message is echoed with the attacker's markup around it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[str | ModelTurn]:
        self.calls.append(messages)
        text = INTRO + TABLE if len(self.calls) == 1 else f"{EVIL} {messages[-1]['content']}"
        for i, word in enumerate(text.split(" ")):
            if len(self.calls) == 1 and i == len(INTRO.split(" ")) - 1:
                await self.gate.wait()
            yield word if i == 0 else " " + word
            await asyncio.sleep(0.01)
        yield ModelTurn(text, [], {"prompt_tokens": 10, "completion_tokens": 20}, "stop")


async def test_chat_in_the_browser(config_dir, data_dir, tmp_path):
    model = GatedModel()
    async with served(config_dir, data_dir, model) as gw, \
            playwright_api.async_playwright() as pw:
        assert CHROMIUM.exists(), "needs Debian's chromium: apt-get install -y chromium " \
            "(scripts/test.sh installs it)"
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            frames: list[dict[str, Any]] = []
            page.on("websocket", lambda ws: ws.on(
                "framereceived", lambda payload: frames.append(json.loads(payload))))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await _converse(page, gw, model, frames)
            await _reconnects(page, gw)
            await _survives_a_reload(page)
            await _never_injects_markup(page)
            await page.screenshot(path=str(tmp_path / "widget.png"))
            assert errors == []
        finally:
            await browser.close()


async def _converse(page: Any, gw: Any, model: GatedModel, frames: list[dict[str, Any]]) -> None:
    expect = playwright_api.expect
    await page.goto(url(gw, "/"))
    await expect(page.locator(".pluto-status")).to_have_text("Online")
    await expect(page.locator(".pluto-hint")).to_be_visible()
    await page.locator(".pluto-input").fill("How are sales?")
    await page.locator(".pluto-input").press("Enter")
    await expect(page.locator(".pluto-user .pluto-bubble")).to_have_text("How are sales?")
    answer = page.locator(".pluto-bot .pluto-bubble")
    await expect(answer).to_contain_text("Here are the sales")  # streamed: the table is not yet
    await expect(page.locator(".pluto-stop")).to_be_visible()
    assert await page.locator(".pluto-bot table").count() == 0
    assert await page.locator(".pluto-bot strong").inner_text() == "sales"
    model.gate.set()
    table = page.locator(".pluto-bot table")
    await expect(table).to_be_visible()
    await expect(table.locator("th")).to_have_text(["Region", "Sales"])
    await expect(table.locator("td")).to_have_text(["North", "120", "South", "80"])  # streamed
    await expect(answer).to_contain_text("North leads.")
    await expect(page.locator(".pluto-stop")).to_be_hidden()
    # streamed: words 10 ms apart arrive in batches (the runtime sends at most every 40 ms)
    assert sum(f["type"] == "message.delta" for f in frames) >= 3


async def _reconnects(page: Any, gw: Any) -> None:
    expect = playwright_api.expect
    for ws in list(gw.providers["web"].sockets):
        await ws.close()
    await expect(page.locator(".pluto-status")).not_to_have_text("Online")
    await expect(page.locator(".pluto-status")).to_have_text("Online", timeout=15_000)
    await expect(page.locator(".pluto-bot table")).to_have_count(1)  # the history, once
    await expect(page.locator(".pluto-user")).to_have_count(1)


async def _survives_a_reload(page: Any) -> None:
    expect = playwright_api.expect
    await page.reload()
    await expect(page.locator(".pluto-status")).to_have_text("Online")
    await expect(page.locator(".pluto-user .pluto-bubble")).to_have_text("How are sales?")
    await expect(page.locator(".pluto-bot table td").first).to_have_text("North")
    assert await page.locator(".pluto-hint").count() == 0


async def _never_injects_markup(page: Any) -> None:
    expect = playwright_api.expect
    await page.locator(".pluto-input").fill('<b>bold?</b><img src=y onerror="window.pwned=4">')
    await page.locator(".pluto-input").press("Enter")
    last = page.locator(".pluto-bot .pluto-bubble").last
    await expect(last).to_contain_text('<b>bold?</b><img src=y onerror="window.pwned=4">')
    await expect(last).to_contain_text("<script>window.pwned = 1</script>")  # shown as text
    assert await page.evaluate("window.pwned") is None
    log = page.locator(".pluto-log")
    assert await log.locator("script, img, b, iframe").count() == 0
    links = await log.locator("a").evaluate_all("(as) => as.map(a => a.getAttribute('href'))")
    assert links == ["https://tracker.invalid/x.png"]  # the image became a link; no javascript:
