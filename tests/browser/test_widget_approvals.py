"""Approvals in the widget, in Debian's Chromium (as in test_widget_browser.py): a tool call
behind ``approval: always`` shows a card in its answer's bubble — the tool, its arguments as
text in a ``<pre>`` (markup a model wrote in them stays text), Approve / Deny buttons with
labels for screen readers. A click sends the command as the visitor and disables both (a reload
shows the card again, its buttons only while it is open); the decision's line shows on the card, and the resumed run's answer follows (the tool ran once).
Deny, by the keyboard, tells the model; the tool never runs. Nobody deciding in time: the
gateway resumes the run itself, and the open tab shows that run too (its line, its answer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import playwright.async_api as playwright_api
import pytest
import yaml

from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import ToolContext, ToolResult, tool
from pluto.settings import PlutoConfig
from tests.browser.test_widget_features import chromium
from tests.helpers.served import url, wait_for

expect = playwright_api.expect
MARKUP = "<img src=x onerror=alert(1)>.log"


class Deleter:
    def __init__(self) -> None:
        self.calls: list[str] = []

        @tool
        async def delete_file(ctx: ToolContext, path: str) -> ToolResult:
            """Delete a file.

            Args:
                path: The file.
            """
            self.calls.append(path)
            return ToolResult(f"deleted {path}")

        self.tool = delete_file


@asynccontextmanager
async def served(config_dir: Path, data_dir: Path, model: ScriptedModel,
                 deleter: Deleter, timeout: int = 300) -> AsyncIterator[Gateway]:
    agent = config_dir / "agents" / "default" / "agent.yaml"
    spec = yaml.safe_load(agent.read_text())
    agent.write_text(yaml.safe_dump({**spec, "tools": [*spec.get("tools", []), "delete_file"],
                                     "approval": {"delete_file": "always"},
                                     "approval_timeout": timeout}))
    cfg = PlutoConfig(data_dir=data_dir, providers={"web": {"enabled": True}})
    gw = Gateway(config_dir, config=cfg, model_factory=model, serve=True,
                 http_bind=("127.0.0.1", 0), tools={"delete_file": deleter.tool})
    async with gw:
        await wait_for(lambda: gw.health["web"].state == "running")
        yield gw


def call(path: str) -> Scripted:
    return Scripted(tool_calls=[ToolCall("c1", "delete_file", f'{{"path": "{path}"}}')])


@pytest.mark.slow
async def test_approve_and_deny_in_the_widget(config_dir, data_dir):
    deleter = Deleter()
    model = ScriptedModel(call(f"/srv/{MARKUP}"), Scripted(text="Deleted it."),
                          call("/srv/keep.log"), Scripted(text="Understood, I left it."))
    async with served(config_dir, data_dir, model, deleter) as gw, chromium() as browser:
        page = await browser.new_page()
        errors: list[str] = []
        dialogs: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: dialogs.append(d.message))
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")

        # the request: a card in the run's bubble, the arguments as text
        await page.locator(".pluto-input").fill("delete the odd log")
        await page.locator(".pluto-input").press("Enter")
        card = page.locator(".pluto-approval").first
        await expect(card).to_be_visible()
        await expect(card.locator(".pluto-approval-title")).to_contain_text("delete_file")
        await expect(card.locator("pre.pluto-approval-args")).to_contain_text(MARKUP)
        assert await card.locator("img").count() == 0  # (the model's markup stayed text)
        approve = card.get_by_role("button", name="Approve running delete_file")
        deny = card.get_by_role("button", name="Deny running delete_file")
        await expect(approve).to_be_enabled()
        await expect(deny).to_be_enabled()
        assert deleter.calls == []
        # a reload: the request is still there to decide (from the history)
        await page.reload()
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await expect(card.locator("pre.pluto-approval-args")).to_contain_text(MARKUP)
        await expect(approve).to_be_enabled()

        # Approve: both buttons off at once, the decision's line, the answer; the tool ran once
        await approve.click()
        await expect(approve).to_be_disabled()
        await expect(deny).to_be_disabled()
        await expect(card.locator(".pluto-approval-decision")).to_contain_text(
            "delete_file approved")
        await expect(page.locator(".pluto-bot .pluto-bubble").filter(
            has_text="Deleted it.")).to_have_count(1)
        assert deleter.calls == [f"/srv/{MARKUP}"]
        await expect(page.locator(".pluto-user").last).to_contain_text("/approve ")
        await page.reload()  # decided: the card stays, its buttons do not come back
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await expect(card.locator("pre.pluto-approval-args")).to_contain_text(MARKUP)
        await expect(approve).to_be_disabled()
        assert await card.locator("img").count() == 0

        # Deny, by the keyboard: the tool never runs, the model is told
        await page.locator(".pluto-input").fill("now delete keep.log")
        await page.locator(".pluto-input").press("Enter")
        second = page.locator(".pluto-approval").nth(1)
        await expect(second.locator("pre")).to_contain_text("/srv/keep.log")
        deny2 = second.get_by_role("button", name="Deny running delete_file")
        await deny2.focus()
        await page.keyboard.press("Enter")
        await expect(deny2).to_be_disabled()
        await expect(second.get_by_role("button", name="Approve running delete_file")
                     ).to_be_disabled()
        await expect(second.locator(".pluto-approval-decision")).to_contain_text(
            "delete_file denied")
        await expect(page.locator(".pluto-bot .pluto-bubble").filter(
            has_text="Understood, I left it.")).to_have_count(1)
        assert deleter.calls == [f"/srv/{MARKUP}"]
        told = [str(m.get("content")) for m in model.calls[-1] if m["role"] == "tool"]
        assert any("denied" in t for t in told), told
        assert errors == [] and dialogs == []


@pytest.mark.slow
async def test_an_expired_request_shows_its_resumed_answer_in_the_open_tab(config_dir,
                                                                          data_dir):
    deleter = Deleter()
    model = ScriptedModel(call("/srv/old.log"), Scripted(text="Nobody approved, so I did not."))
    async with served(config_dir, data_dir, model, deleter, timeout=1) as gw, \
            chromium() as browser:
        gw.approval_sweep.every = 0.05  # (its first look comes at the old period's end)
        page = await browser.new_page()
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await page.locator(".pluto-input").fill("delete the old log")
        await page.locator(".pluto-input").press("Enter")
        card = page.locator(".pluto-approval")
        await expect(card).to_be_visible()

        async def answered() -> bool:
            await gw.approval_sweep.look()
            return await page.locator(".pluto-bot .pluto-bubble").filter(
                has_text="Nobody approved, so I did not.").count() == 1
        await wait_for(answered, timeout=20)
        await expect(card.locator(".pluto-approval-decision")).to_contain_text(
            "Nobody approved delete_file in time")
        await expect(card.get_by_role("button", name="Approve running delete_file")
                     ).to_be_disabled()
        assert deleter.calls == []
