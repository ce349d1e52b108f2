"""What a tab draws when its answers come late or twice, in Debian's Chromium, against a
gateway whose chat socket is played by the test (Playwright's WebSocket routing): the frames
an instance sends after a reconnect, a stop or a take-over, exactly as tests/test_cluster_chaos_web.py
saw them come (its visitors model the widget; this checks the widget itself).

- A message sent, not acknowledged (its instance stopped), then listed by the next
  connection's history as waiting (it had been recorded): drawn once.
- An answer whose ``run.start`` comes after a later message was typed, naming the message it
  answers (``message_id``): drawn right after that message, not at the end.
- An answer cut off (``run.end`` ``interrupted``: its instance stopped) is withdrawn; the run
  answering the message again is drawn in its place.
"""

from __future__ import annotations

import json
from typing import Any

import playwright.async_api as playwright_api
import pytest

from tests.browser.test_widget_features import chromium
from tests.helpers.served import served, url, wait_for

expect = playwright_api.expect


class Socket:
    """The gateway's side of the chat socket, played by the test: each connection, the
    frames the tab sent on it."""

    def __init__(self) -> None:
        self.routes: list[Any] = []
        self.sent: list[list[dict[str, Any]]] = []
        self.history: list[dict[str, Any]] = []

    def connect(self, ws: Any) -> None:
        self.routes.append(ws)
        frames: list[dict[str, Any]] = []
        self.sent.append(frames)

        def heard(message: str | bytes) -> None:
            frame = json.loads(message)
            frames.append(frame)
            if frame["type"] == "hello":
                self.send(ws, type="ready", token="t", agent="default", title="Pluto")
                self.send(ws, type="history", messages=self.history)
        ws.on_message(heard)

    @staticmethod
    def send(ws: Any, **frame: Any) -> None:
        ws.send(json.dumps({"id": "f", **frame}))

    def now(self, **frame: Any) -> None:
        self.send(self.routes[-1], **frame)

    def messages(self, connection: int) -> list[dict[str, Any]]:
        return [f for f in self.sent[connection] if f["type"] == "message"]


@pytest.mark.slow
async def test_late_answers_keep_their_place_and_a_cut_off_one_is_withdrawn(
        config_dir, data_dir, monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", "s" * 40)
    socket = Socket()
    socket.history = [{"role": "user", "text": "first", "run_id": "r0", "ts": 1},
                      {"role": "assistant", "text": "Answer one.", "run_id": "r0", "ts": 2}]
    async with served(config_dir, data_dir) as gw, chromium() as browser:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.route_web_socket("**/ws", socket.connect)
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await page.locator(".pluto-input").fill("second")
        await page.locator(".pluto-input").press("Enter")
        await wait_for(lambda: socket.messages(0))
        second = socket.messages(0)[0]["id"]
        # its instance stops before the ack: the socket closes; the message had been recorded
        socket.history = [*socket.history, {"role": "user", "text": "second", "run_id": None,
                                            "ts": 3, "id": second, "files": []}]
        await socket.routes[0].close(code=1011, reason="gone")
        await wait_for(lambda: len(socket.routes) == 2, timeout=20)  # the widget reconnects
        bubbles = page.locator(".pluto-msg .pluto-bubble")
        await expect(bubbles).to_have_count(3)  # first, its answer, second — once
        assert socket.messages(1) == []  # listed as recorded: not sent again
        await page.locator(".pluto-input").fill("third")
        await page.locator(".pluto-input").press("Enter")
        await wait_for(lambda: socket.messages(1))
        third = socket.messages(1)[0]["id"]
        socket.now(type="ack", reply_to=third)
        # the answer to "second", found late (after "third" was typed): in its place
        socket.now(type="run.start", run_id="r1", seq=1, message_id=second)
        socket.now(type="message.final", run_id="r1", seq=2, text="Answer two.")
        socket.now(type="run.end", run_id="r1", seq=3, outcome="ok")
        # the answer to "third" is cut off, then answered again by another run
        socket.now(type="run.start", run_id="r2", seq=1, message_id=third)
        socket.now(type="message.delta", run_id="r2", seq=2, text="Answer th")
        await expect(page.locator(".pluto-bot", has_text="Answer th")).to_have_count(1)
        socket.now(type="run.end", run_id="r2", seq=1000003, outcome="interrupted")
        await expect(page.locator(".pluto-bot", has_text="Answer th")).to_have_count(0)
        socket.now(type="run.start", run_id="r3", seq=1, message_id=third)
        socket.now(type="message.final", run_id="r3", seq=2, text="Answer three.")
        socket.now(type="run.end", run_id="r3", seq=3, outcome="ok")
        await expect(bubbles).to_have_count(6)
        assert await bubbles.all_inner_texts() == [
            "first", "Answer one.", "second", "Answer two.", "third", "Answer three."]
        assert errors == []
