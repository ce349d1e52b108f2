"""The widget's own features in Debian's Chromium (as in test_widget_browser.py): files sent by
the button, by drag and drop and by paste (a picture; refusals in one sentence), the copy button, a page's
CSS variables, answers that failed or were stopped still marked after a reload, messages over
the rate limit shown as not sent with a retry, and a page whose origin is refused told why."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import playwright.async_api as playwright_api
from aiohttp import web

from pluto.runtime.errors import ModelError
from pluto.runtime.images import text_of
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.browser.test_widget_browser import ARGS, CHROMIUM
from tests.helpers.served import served, url

expect = playwright_api.expect
CSV = "region,sales\nnorth,120\nsouth,80\n"
FAILED = "The model service rejected the API key."

# A file dropped on the panel / pasted in the input, as a browser makes them.
DROP = """([name, text]) => {
  const data = new DataTransfer();
  data.items.add(new File([text], name, {type: "text/csv"}));
  const panel = document.querySelector("[data-pluto-widget]").shadowRoot.querySelector(".pluto-panel");
  for (const kind of ["dragenter", "dragover", "drop"]) {
    panel.dispatchEvent(new DragEvent(kind, {dataTransfer: data, bubbles: true, cancelable: true}));
  }
}"""
PASTE = """() => {
  const data = new DataTransfer();
  data.items.add(new File([new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10, 0, 0, 0, 13, 73, 72, 68, 82, 0, 0, 0, 3, 0, 0, 0, 2, 8, 2, 0, 0, 0, 18, 22, 241, 77, 0, 0, 0, 21, 73, 68, 65, 84, 120, 156, 99, 60, 33, 39, 199, 192, 192, 192, 192, 192, 192, 196, 0, 3, 0, 19, 46, 1, 8, 106, 192, 101, 97, 0, 0, 0, 0, 73, 69, 78, 68, 174, 66, 96, 130])], "image.png", {type: "image/png"}));
  const input = document.querySelector("[data-pluto-widget]").shadowRoot.querySelector(".pluto-input");
  input.dispatchEvent(new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true}));
}"""


@asynccontextmanager
async def chromium(**launch: Any) -> AsyncIterator[Any]:
    assert CHROMIUM.exists(), "needs Debian's chromium: apt-get install -y chromium"
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM),
                                           **{"args": ARGS, **launch})
        try:
            yield browser
        finally:
            await browser.close()


async def _ask(page: Any, text: str) -> None:
    await page.locator(".pluto-input").fill(text)
    await page.locator(".pluto-input").press("Enter")


async def test_files_copy_theme_and_history_marks(config_dir, data_dir):
    model = ScriptedModel(Scripted(text="**42** regions, `north` first", chunk=6),
                          Scripted(error=ModelError(FAILED)),
                          Scripted(text="z" * 600, chunk=2, delay=0.02))
    async with served(config_dir, data_dir, model) as gw, chromium() as browser:
        context = await browser.new_context(bypass_csp=True)  # (to add the page's own CSS)
        await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url(gw))
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")

        # theming: the page sets a variable on the widget's element
        await page.add_style_tag(content="[data-pluto-widget] { --pluto-accent: #0f766e; }")
        await expect(page.locator(".pluto-send")).to_have_css("background-color",
                                                              "rgb(15, 118, 110)")

        # a file by the button, one dropped, a pasted picture; a PDF refused in one sentence
        await page.locator(".pluto-picker").set_input_files(
            [{"name": "sales.csv", "mimeType": "text/csv", "buffer": CSV.encode()},
             {"name": "report.pdf", "mimeType": "application/pdf", "buffer": b"%PDF-1.4"}])
        await page.evaluate(DROP, ["more.csv", CSV])
        await page.evaluate(PASTE)
        refusals = page.locator(".pluto-system.pluto-error")
        await expect(refusals).to_have_count(1)
        await expect(refusals.nth(0)).to_contain_text("Files like report.pdf cannot be read")
        await expect(page.locator(".pluto-file.pluto-file-ready")).to_have_count(3)
        await _ask(page, "which region sells most?")
        mine = page.locator(".pluto-user .pluto-bubble")
        await expect(mine.locator(".pluto-attached")).to_have_text(["sales.csv", "more.csv",
                                                                    "image.png"])
        await expect(page.locator(".pluto-files .pluto-file")).to_have_count(0)
        answer = page.locator(".pluto-bot").last
        await expect(answer.locator(".pluto-bubble")).to_have_text("42 regions, north first")
        await expect(page.locator(".pluto-system").filter(has_text="Added dataset")).to_have_text(
            ["Added dataset `sales_2`: 2 rows × 2 columns.",  # (the demo has a `sales`)
             "Added dataset `more`: 2 rows × 2 columns."])
        sent = text_of(model.calls[0][-1]["content"])
        assert "which region sells most?" in sent and "[The user sent the file more.csv" in sent
        assert [(i.width, i.height) for i in model.images[0]] == [(3, 2)]  # the pasted picture

        # the copy button copies the answer as written (Markdown)
        await answer.locator(".pluto-copy").click()
        await expect(answer.locator(".pluto-copy")).to_have_text("Copied")
        assert await page.evaluate("navigator.clipboard.readText()") == \
            "**42** regions, `north` first"

        # a failed answer and a stopped one, then a reload: both still marked
        await _ask(page, "and now?")
        await expect(page.locator(".pluto-run-error")).to_have_text(FAILED)
        await _ask(page, "go on forever")
        await expect(page.locator(".pluto-bot .pluto-bubble").last).to_contain_text("zzzz")
        await page.locator(".pluto-stop").click()
        await expect(page.locator(".pluto-stopped")).to_have_count(1)
        await page.reload()
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await expect(page.locator(".pluto-run-error")).to_have_text(FAILED)
        await expect(page.locator(".pluto-stopped")).to_have_count(1)
        await expect(page.locator(".pluto-user")).to_have_count(3)
        await expect(page.locator(".pluto-user .pluto-bubble").first).to_have_text(
            "which region sells most?sales.csvmore.csvimage.png")  # names, not the notes
        assert errors == []
        await context.close()


async def test_messages_over_the_rate_limit_look_not_sent_until_retried(config_dir, data_dir):
    async with served(config_dir, data_dir, web={"rate_messages": 3, "rate_seconds": 3}) as gw, \
            chromium() as browser:
        page = await browser.new_page()
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        for text in ("one", "two", "three"):  # the hello took one of the three
            await _ask(page, text)
        failed = page.locator(".pluto-user.pluto-failed")
        await expect(failed).to_have_count(1)
        await expect(failed.locator(".pluto-bubble")).to_have_text("three")
        await expect(failed.locator(".pluto-not-sent")).to_contain_text("Not sent")
        await expect(page.locator(".pluto-bot .pluto-bubble")).to_have_text(
            ["echo: one", "echo: two"])
        while await failed.count():  # "wait N s" until the limit has passed, then sent
            await failed.locator(".pluto-retry").click()
            with contextlib.suppress(AssertionError):
                await expect(failed).to_have_count(0, timeout=500)
        await expect(page.locator(".pluto-bot .pluto-bubble")).to_have_text(
            ["echo: one", "echo: two", "echo: three"])


async def test_a_message_the_gateway_will_not_answer_looks_not_sent(config_dir, data_dir):
    (config_dir / "routes.yaml").write_text(  # one message a minute
        "routes:\n  - name: web\n    match: {provider: web}\n    agent: default\n"
        "    rate_limit: {user: 1/minute}\ndefault: default\n")
    async with served(config_dir, data_dir) as gw, chromium() as browser:
        page = await browser.new_page()
        frames: list[str] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda f: frames.append(f)))
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await _ask(page, "one")
        await expect(page.locator(".pluto-bot .pluto-bubble")).to_have_text("echo: one")
        await _ask(page, "two")
        failed = page.locator(".pluto-user.pluto-failed")
        await expect(failed.locator(".pluto-bubble")).to_have_text("two")
        await expect(page.locator(".pluto-system").last).to_contain_text("faster than I can")
        first_id = await failed.get_attribute("data-id")
        await failed.locator(".pluto-retry").click()  # a new message (the gateway has the first)
        mine = page.locator(".pluto-user").last
        await expect(mine).not_to_have_attribute("data-id", first_id or "")
        await expect(mine).to_have_class(re.compile("pluto-failed"))  # still over the limit
        await expect(mine.locator(".pluto-retry")).to_be_visible()
        await expect(page.locator(".pluto-bot")).to_have_count(1)
        assert any('"text":"two"' in f and first_id not in f for f in frames)


@asynccontextmanager
async def elsewhere(widget_src: str) -> AsyncIterator[int]:
    """A page on another origin (``shop.test``, mapped to loopback) that embeds the widget."""
    page = f'<!doctype html><title>Shop</title><script src="{widget_src}" defer></script>'

    async def shop(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", shop)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def test_a_page_whose_origin_is_refused_says_what_to_configure(config_dir, data_dir):
    async with served(config_dir, data_dir) as gw, elsewhere(url(gw, "/widget.js")) as port, \
            chromium(args=[*ARGS, "--host-resolver-rules=MAP shop.test 127.0.0.1"]) as browser:
        page = await browser.new_page()
        await page.goto(f"http://shop.test:{port}/")
        await page.locator(".pluto-launcher").click()
        refused = page.locator(".pluto-refused")
        await expect(refused).to_have_text(
            f"This site (http://shop.test:{port}) is not allowed to open this chat: the "
            f"gateway's admin should add http://shop.test:{port} to "
            "providers.web.allowed_origins in pluto.yaml.")
        await expect(page.locator(".pluto-status")).to_have_text("Not available on this site")
        await expect(page.locator(".pluto-input")).to_be_disabled()
