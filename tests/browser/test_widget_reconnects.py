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

from pluto.runtime.testing import ScriptedModel
from tests.browser.test_widget_features import chromium
from tests.helpers.served import served, url, wait_for
from tests.helpers.tcp_proxy import TcpProxy

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


async def _tab(browser: Any, gw: Any, socket: Socket) -> tuple[Any, list[str]]:
    """A page with the widget whose chat socket ``socket`` plays, online; its page errors."""
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.route_web_socket("**/ws", socket.connect)
    await page.goto(url(gw, "/"))
    await expect(page.locator(".pluto-status")).to_have_text("Online")
    return page, errors


async def _say(page: Any, text: str) -> None:
    await page.locator(".pluto-input").fill(text)
    await page.locator(".pluto-input").press("Enter")


@pytest.mark.slow
async def test_late_answers_keep_their_place_and_a_cut_off_one_is_withdrawn(
        config_dir, data_dir, monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", "s" * 40)
    socket = Socket()
    socket.history = [{"role": "user", "text": "first", "run_id": "r0", "ts": 1},
                      {"role": "assistant", "text": "Answer one.", "run_id": "r0", "ts": 2}]
    async with served(config_dir, data_dir) as gw, chromium() as browser:
        page, errors = await _tab(browser, gw, socket)
        await _say(page, "second")
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
        await _say(page, "third")
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


class Silent(Socket):
    """A gateway that answers pings, until its instance stops: from then on the connections it
    has (and the ``frozen_next`` ones opened after) hear everything and say nothing — as a
    SIGSTOPped instance behind a load balancer keeps its TCP connections open."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen: set[int] = set()
        self.frozen_next = 0
        self.closed: list[int] = []  # connections the tab closed

    def stop_instance(self, frozen_next: int = 0) -> None:
        self.frozen = set(range(len(self.routes)))
        self.frozen_next = frozen_next

    def connect(self, ws: Any) -> None:
        n = len(self.routes)
        if self.frozen_next:
            self.frozen.add(n)
            self.frozen_next -= 1
        self.routes.append(ws)
        frames: list[dict[str, Any]] = []
        self.sent.append(frames)
        ws.on_close(lambda code, reason: self.closed.append(n))

        def heard(message: str | bytes) -> None:
            frame = json.loads(message)
            frames.append(frame)
            if n in self.frozen:
                return
            if frame["type"] == "hello":
                self.send(ws, type="ready", token="t", agent="default", title="Pluto",
                          ping_seconds=1)
                self.send(ws, type="history", messages=self.history)
            elif frame["type"] == "ping":
                self.send(ws, type="pong")
        ws.on_message(heard)

    def pings(self, connection: int) -> int:
        return sum(f["type"] == "ping" for f in self.sent[connection])


@pytest.mark.slow
async def test_a_tab_whose_instance_stopped_answering_moves_to_another(
        config_dir, data_dir, monkeypatch):
    """An instance stopped (SIGSTOP) keeps its connections open: the tab, hearing nothing a
    ping_seconds after its message, drops that connection and opens another — one that never
    says ready either is dropped in turn — and sends the message again there, same id, drawn
    once. A tab that only waits pings, and a gateway that answers keeps its connection."""
    monkeypatch.setenv("PLUTO_WEB_SECRET", "s" * 40)
    socket = Silent()
    async with served(config_dir, data_dir) as gw, chromium() as browser:
        page, errors = await _tab(browser, gw, socket)
        await wait_for(lambda: socket.pings(0) >= 3, timeout=15)  # idle: pinged, answered
        assert len(socket.routes) == 1 and socket.closed == []
        socket.stop_instance(frozen_next=1)  # (the next connection lands on it too)
        await _say(page, "are you there?")
        await wait_for(lambda: socket.messages(0))
        sent = socket.messages(0)[0]["id"]
        # dropped after a second of silence; the next one never says ready: dropped too
        await wait_for(lambda: len(socket.routes) == 3, timeout=20)
        assert socket.closed[:2] == [0, 1] and socket.messages(1) == []
        await wait_for(lambda: socket.messages(2))
        assert [m["id"] for m in socket.messages(2)] == [sent]  # sent again, the same message
        socket.now(type="ack", reply_to=sent)
        socket.now(type="run.start", run_id="r1", seq=1, message_id=sent)
        socket.now(type="message.final", run_id="r1", seq=2, text="Here I am.")
        socket.now(type="run.end", run_id="r1", seq=3, outcome="ok")
        bubbles = page.locator(".pluto-msg .pluto-bubble")
        await expect(bubbles).to_have_count(2)
        assert await bubbles.all_inner_texts() == ["are you there?", "Here I am."]
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await expect(page.locator(".pluto-pending")).to_have_count(0)
        assert len(socket.routes) == 3 and errors == []


@pytest.mark.slow
async def test_a_tab_on_a_frozen_connection_to_a_real_gateway_gets_each_answer_once(
        config_dir, data_dir, monkeypatch):
    """The widget and a real gateway through a proxy that can freeze the connections open (a
    stopped instance's, or a dead middlebox's): a message that never reached the gateway is
    sent again on a new connection and answered; one the gateway recorded and answered whose
    frames never came back is found in the new connection's history — each answered once."""
    monkeypatch.setenv("PLUTO_WEB_SECRET", "s" * 40)
    model = ScriptedModel()
    async with served(config_dir, data_dir, model, web={"ping_seconds": 1}) as gw, \
            chromium() as browser:
        assert gw.http is not None
        proxy = TcpProxy("127.0.0.1", gw.http.port)
        await proxy.start()
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(f"http://127.0.0.1:{proxy.port}/")
            await expect(page.locator(".pluto-status")).to_have_text("Online")
            bubbles = page.locator(".pluto-msg .pluto-bubble")
            shown: list[str] = []
            for text, frozen in (("one", None), ("two", {}), ("three", {"up": False})):
                if frozen is not None:
                    proxy.freeze(**frozen)
                await _say(page, text)
                shown += [text, f"echo: {text}"]
                await expect(bubbles).to_have_text(shown, timeout=20_000)
            assert [m[-1]["content"] for m in model.calls] == ["one", "two", "three"]
            await expect(page.locator(".pluto-status")).to_have_text("Online")
            await expect(page.locator(".pluto-pending")).to_have_count(0)
            assert errors == []
        finally:
            await proxy.stop()
