"""Runs the widget did not start, live, and nested runs, in Debian's Chromium (as in
test_widget_browser.py).

- A request nobody decided in time: the gateway resumes the run on the tab's instance and tells
  the web provider (``run_started``); the open tab streams its answer — its first words show
  while the model is still writing (the polling fallback could only find it once answered).
- An agent asking another (``ask_analyst``): the child's work is a collapsed ``<details>`` in
  the asking answer's bubble ("Asked analyst: …"), opened by the keyboard to show the child's
  tool call and answer; the parent's answer shows once. ``/stop`` (the stop button) while the child writes
  stops both: the child's block and the answer say Stopped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import playwright.async_api as playwright_api
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted
from pluto.runtime.tools import ToolContext, ToolResult, tool
from pluto.settings import PlutoConfig
from tests.browser.test_widget_approvals import Deleter, call, served
from tests.browser.test_widget_features import chromium
from tests.helpers.inspect_store import runs
from tests.helpers.served import url, wait_for
from tests.test_delegation import gateway_config
from tests.test_web_live_runs import Gated

expect = playwright_api.expect
ANSWER = "Nobody approved, so I did not delete anything at all."


@pytest.mark.slow
async def test_an_expired_requests_answer_streams_in_the_open_tab(config_dir, data_dir):
    deleter = Deleter()
    model = Gated(call("/srv/old.log"), Scripted(text=ANSWER), on=1)
    async with served(config_dir, data_dir, model, deleter, timeout=1) as gw, \
            chromium() as browser:
        gw.approval_sweep.every = 0.05  # (looks by itself; quickly here)
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await page.locator(".pluto-input").fill("delete the old log")
        await page.locator(".pluto-input").press("Enter")
        card = page.locator(".pluto-approval")
        await expect(card).to_be_visible()

        async def writing() -> bool:
            return model.waiting.is_set()
        await wait_for(writing, timeout=20)  # resumed: its first words written, the rest held
        # told of it (run_started): heard from the feed, not found by a look and read
        assert list(gw.providers["web"].following().values()) == [False]
        bubbles = page.locator(".pluto-bot .pluto-bubble")
        await expect(bubbles.filter(has_text=ANSWER[:8])).to_have_count(1)  # shown live
        assert await bubbles.filter(has_text=ANSWER).count() == 0  # (not yet written)
        await expect(card.locator(".pluto-approval-decision")).to_contain_text(
            "Nobody approved delete_file in time")
        model.gate.set()
        await expect(bubbles.filter(has_text=ANSWER)).to_have_count(1)
        await wait_for(lambda: not gw.providers["web"].following())
        assert deleter.calls == [] and errors == []


@tool
async def count_rows(ctx: ToolContext, table: str) -> ToolResult:
    """Count a table's rows.

    Args:
        table: The table.
    """
    return ToolResult(f"{table}: 42 rows")


@asynccontextmanager
async def asking(tmp_path: Path, model: Gated) -> AsyncIterator[Gateway]:
    """The default agent may ask the analyst, who may count rows."""
    cfg = PlutoConfig(data_dir=tmp_path / "data", providers={"web": {"enabled": True}})
    config = gateway_config(tmp_path, "agents: [analyst]\n")
    analyst = config / "agents" / "analyst" / "agent.yaml"
    analyst.write_text(analyst.read_text() + "tools: [count_rows]\n")
    gw = Gateway(config, config=cfg, model_factory=model, serve=True,
                 http_bind=("127.0.0.1", 0), tools={"count_rows": count_rows})
    async with gw:
        await wait_for(lambda: gw.health["web"].state == "running")
        yield gw


def ask_analyst(question: str) -> Scripted:
    return Scripted(tool_calls=[ToolCall("c1", "ask_analyst",
                                         json.dumps({"question": question}))])


@pytest.mark.slow
async def test_a_childs_work_is_a_collapsed_block_in_the_answer(tmp_path):
    model = Gated(ask_analyst("What were sales in May?"),
                  Scripted(tool_calls=[ToolCall("k1", "count_rows", '{"table": "sales"}')]),
                  Scripted(text="May sales were 42."), Scripted(text="The analyst says 42."),
                  on=2)
    async with asking(tmp_path, model) as gw, chromium() as browser:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await page.locator(".pluto-input").fill("how were sales?")
        await page.locator(".pluto-input").press("Enter")
        block = page.locator(".pluto-bot details.pluto-child")
        await expect(block).to_have_count(1)
        summary = block.locator("summary")
        await expect(summary).to_contain_text("Asking analyst: What were sales in May?")
        await wait_for(lambda: model.waiting.is_set())  # the child is writing
        model.gate.set()
        final = page.locator(".pluto-bot .pluto-bubble").filter(has_text="The analyst says 42.")
        await expect(final).to_have_count(1)
        await expect(summary).to_contain_text("✓ Asked analyst: What were sales in May?")
        answer = block.locator(".pluto-child-answer")
        assert await block.get_attribute("open") is None  # collapsed by default
        await expect(answer).to_be_hidden()
        await summary.focus()  # by the keyboard
        await page.keyboard.press("Enter")
        await expect(answer).to_be_visible()
        await expect(answer).to_have_text("May sales were 42.")
        await expect(block.locator(".pluto-tools .pluto-tool")).to_have_text("✓ count_rows")
        # the child's answer is not an answer of the chat's: one bot bubble, drawn once
        assert await page.locator(".pluto-bot .pluto-bubble").filter(
            has_text="May sales were 42.").count() == 0
        assert await page.locator(".pluto-bot[data-run]").count() == 1
        await page.keyboard.press("Enter")
        await expect(answer).to_be_hidden()
        await wait_for(lambda: not gw.providers["web"].following())
        assert errors == []


@pytest.mark.slow
async def test_stop_while_the_child_writes_stops_both(tmp_path):
    model = Gated(ask_analyst("count everything"), Scripted(text="x" * 200), on=1)
    async with asking(tmp_path, model) as gw, chromium() as browser:
        page = await browser.new_page()
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await page.locator(".pluto-input").fill("how many?")
        await page.locator(".pluto-input").press("Enter")
        block = page.locator(".pluto-bot details.pluto-child")
        await expect(block).to_have_count(1)
        await wait_for(lambda: model.waiting.is_set())  # the child is writing, held
        await page.get_by_role("button", name="Stop the answer").click()
        await expect(block.locator(":scope > .pluto-stop-mark")).to_have_count(1)
        parent = page.locator(".pluto-bot[data-run]").first
        await expect(parent.locator(":scope > .pluto-stop-mark")).to_have_text("Stopped.")
        await gw.settled()
        assert sorted((r["agent"], r["status"]) for r in await runs(gw.store)) == [
            ("analyst", "cancelled"), ("default", "cancelled")]
        await wait_for(lambda: not gw.providers["web"].following())
