"""The web harness: the real web provider (the chat widget's WebSocket ``/ws``) on the gateway's
HTTP server, and a visitor's tab in the test that talks to it as the widget does.

The gateway runs as ``pluto serve`` runs it, in-process (:class:`ServedHarness`, shared with the
API harness): ``serve=True``, its HTTP server on an ephemeral loopback port, the provider enabled
in ``pluto.yaml``'s ``providers`` and built by the gateway. A restart is a new gateway on the same
data dir (a new port); the tab then reconnects with the session token it was given, like the
widget after a reload.

What the visitor sees is what the widget draws from the frames its tab receives
(``static/widget.js``):

- a run is one bubble: its text as the ``message.delta`` frames write it, replaced by its
  ``message.final`` (one per run, through delivery, after the run's progress), the charts of its
  ``tool.end`` frames (``details.image``: a signed link, fetched like the ``<img>`` would) and a
  run's ``error``;
- a command's answer is a ``message.final`` with ``run_id`` null; ``notice`` and ``error``
  frames without a run are lines of their own;
- a ``history`` frame (after ``hello``) redraws the conversation from what was stored.

As :class:`Shown` messages, a bubble is its text, then its images, then its error; the other
lines follow in the order they came. The tab also checks the protocol as it reads: every frame
has an ``id``, a run's frames carry its ``run_id`` and a ``seq`` that only grows (no frame
twice, none out of order), a run has one ``message.final`` and nothing after its ``run.end``.
A breach fails the scenario at its next look at what is shown, or when the harness closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pluto.gateway.app import Gateway
from pluto.gateway.ports import Provider
from pluto.providers.web import WebProvider
from pluto.runtime.testing import ScriptedModel
from pluto.runtime.tools import Tool
from pluto.settings import PlutoConfig
from pluto.types import IncomingMessage, Outcome
from tests.conformance.harness import Harness, Shown, UserMessage

_FENCE = re.compile(r"^```[^\n]*\n(.*?)\n```", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
RUN_FRAMES = ("run.start", "message.delta", "tool.start", "tool.end", "message.final", "run.end",
              "approval.request", "approval.decision")
APPROVAL_ID = re.compile(r"^[a-z2-9]{6,16}$")


def code_of(text: str) -> tuple[str, ...]:
    """The contents of the code blocks and inline code of a Markdown text."""
    return tuple(_FENCE.findall(text) + _INLINE.findall(text))


@dataclass
class ServedHarness(Harness):
    """A gateway as ``pluto serve`` runs it, in-process: the HTTP server on 127.0.0.1 (an
    ephemeral port) and the providers of :meth:`providers_config`, built by the gateway from
    its configuration. Subclasses connect their client in :meth:`connected`."""

    http: aiohttp.ClientSession | None = None
    violations: list[str] = field(default_factory=list)  # what the client found wrong

    def providers_config(self) -> dict[str, Any]:
        """The ``providers:`` of pluto.yaml for this front-end."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The secrets the provider reads from the environment."""
        return {}

    @property
    def base_url(self) -> str:
        assert self.gateway is not None and self.gateway.http is not None, "not started"
        return f"http://127.0.0.1:{self.gateway.http.port}"

    async def open(self) -> None:
        os.environ.update(self.environment())
        self.http = aiohttp.ClientSession()

    async def close(self) -> None:
        """Stop everything; then a breach of the protocol the client saw at any time (after
        the scenario's last look too) fails the test."""
        try:
            await super().close()
        finally:
            if self.http is not None:
                await self.http.close()
            for name in self.environment():
                os.environ.pop(name, None)
        assert not self.violations, f"{self.name}: the client saw the protocol broken: " \
            f"{self.violations}"

    async def start(self, model: ScriptedModel | None = None, *,
                    tools: dict[str, Tool] | None = None) -> Gateway:
        """As :meth:`Harness.start`, but the gateway serves HTTP and builds the provider from
        its configuration, as ``pluto serve`` does."""
        self.model = model or self.model
        self.tools = tools if tools is not None else self.tools
        cfg = PlutoConfig(data_dir=self.data_dir, providers=self.providers_config(), gateway={
            "stream_edit_interval_seconds": 0.05, "shutdown_grace_seconds": 0.2})
        gw = Gateway(self.config_dir, config=cfg, model_factory=self.model, serve=True,
                     http_bind=("127.0.0.1", 0), tools=self.tools)
        handle = gw.pipeline.handle

        async def recording(msg: IncomingMessage) -> Outcome:
            self.received.append(msg)
            return await handle(msg)

        # before start: the provider's intake takes the pipeline's handler when it is added
        gw.pipeline.handle = recording  # type: ignore[method-assign]
        await gw.start()
        self.gateway = gw
        await self.connected()
        return gw

    async def make_provider(self) -> Provider:
        raise AssertionError("under 'pluto serve' the gateway builds the provider from its "
                             "configuration (providers_config)")

    async def provider_running(self, name: str, timeout: float) -> None:
        assert self.gateway is not None
        health = self.gateway.health

        async def until() -> None:
            while name not in health or health[name].state != "running":
                await asyncio.sleep(0.01)
        try:
            await asyncio.wait_for(until(), timeout)
        except TimeoutError:
            raise AssertionError(f"{self.name}: the {name} provider did not start: "
                                 f"{self.gateway.status()}") from None


@dataclass
class _Bubble:
    """One bubble of the widget: a run's, or a command's answer (``run`` None)."""

    run: str | None
    id: str
    text: str = ""
    final: bool = False
    images: list[bytes] = field(default_factory=list)
    error: str | None = None
    approvals: list[_Card] = field(default_factory=list)


@dataclass
class _Card:
    """An approval request's card in a run's bubble (the widget's ``approvalRequest``): the
    tool, its arguments in a ``<pre>``, Approve / Deny until one is clicked or it is decided."""

    approval_id: str
    name: str
    arguments: str
    commands: dict[str, str]  # label → the command its click sends
    clicked: str | None = None  # the client id of the message a click sent
    decision: str | None = None  # the decision's line
    open: bool = True  # (from the history: the run paused last, not expired)

    @property
    def text(self) -> str:
        line = f"\n{self.decision}" if self.decision else ""
        return f"The agent wants to run {self.name} with:\n{self.arguments}{line}"

    @property
    def buttons(self) -> tuple[str, ...]:
        return () if self.clicked or self.decision or not self.open else tuple(self.commands)


class Tab:
    """One browser tab with the widget: its socket, what it draws, what it has checked."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, token: str | None,
                 changed: asyncio.Event, violation: Callable[[str], None]):
        self.http = http
        self.base_url = base_url
        self.token = token
        self.changed = changed
        self.violation = violation
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.items: list[_Bubble | tuple[str, str]] = []  # bubbles and (kind, text) lines
        self.runs: dict[str, _Bubble] = {}
        self.seqs: dict[str, int] = {}  # run → the last seq this tab got
        self.finals: dict[str, int] = {}  # run → how many message.final frames
        self.ended: set[str] = set()
        self.acks: list[str] = []
        self.pending: dict[str, str] = {}  # sent, not acknowledged: client id → text
        self.resend: asyncio.TimerHandle | None = None  # after a "not received"
        self._resending: asyncio.Task[None] | None = None
        self.frames: list[dict[str, Any]] = []
        self.history = asyncio.Event()
        self.reader: asyncio.Task[None] | None = None

    async def open(self, timeout: float = 10) -> None:
        """Connect, say hello (with the token of an earlier visit) and wait for the history."""
        self.ws = await self.http.ws_connect(f"{self.base_url}/ws",
                                             headers={"Origin": self.base_url})
        await self.ws.send_json({"type": "hello", "token": self.token, "agent": None})
        self.reader = asyncio.create_task(self._read(), name="web-harness:tab")
        try:
            await asyncio.wait_for(self.history.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"web: no history frame after hello: {self.frames}") from None

    async def close(self) -> None:
        if self.resend is not None:
            self.resend.cancel()
        if self.ws is not None and not self.ws.closed:
            await self.ws.close()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader

    async def say(self, client_id: str, text: str) -> None:
        assert self.ws is not None
        self.pending[client_id] = text
        await self.ws.send_json({"type": "message", "id": client_id, "text": text})

    def _not_received(self, f: dict[str, Any]) -> None:
        """The gateway could not record a message: like the widget, keep what is pending (a
        status, not a line) and send it again, same ids, after ``retry_after``."""
        if self.resend is None:
            wait = min(15.0, max(0.5, float(f.get("retry_after") or 1)))
            self.resend = asyncio.get_running_loop().call_later(wait, self._resend_soon)

    def _resend_soon(self) -> None:
        self.resend = None
        task = asyncio.get_running_loop().create_task(self._resend())
        self._resending = task  # (kept until done)

    async def _resend(self) -> None:
        assert self.ws is not None
        for client_id, text in list(self.pending.items()):
            if not self.ws.closed:
                await self.ws.send_json({"type": "message", "id": client_id, "text": text})

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            frame = msg.json()
            self.frames.append(frame)
            try:
                await self._on(frame)
            except (KeyError, TypeError, ValueError, AssertionError, aiohttp.ClientError) as e:
                # a frame the widget could not draw (a field missing, a chart link broken)
                self.violation(f"drawing {frame} failed: {e!r}")
            self.changed.set()
        self.changed.set()

    def _bubble(self, run: str) -> _Bubble:
        if run not in self.runs:
            self.runs[run] = _Bubble(run, run)
            self.items.append(self.runs[run])
        return self.runs[run]

    async def _image(self, link: str) -> bytes:
        """The chart an ``<img src=link>`` shows (a signed link on this gateway)."""
        assert link.startswith("/web/file/"), f"not a link to the gateway: {link[:80]}"
        async with self.http.get(self.base_url + link) as resp:
            if resp.status != 200 or not resp.content_type.startswith("image/"):
                raise AssertionError(f"the chart link answered {resp.status} "
                                     f"{resp.content_type}")
            return await resp.read()

    def _check_run_frame(self, frame: dict[str, Any]) -> str | None:
        run, seq = frame.get("run_id"), frame.get("seq")
        if not isinstance(run, str) or not isinstance(seq, int) or isinstance(seq, bool):
            self.violation(f"a run's frame without its run_id and seq: {frame}")
            return None
        if run in self.ended:
            self.violation(f"a frame after the run's run.end: {frame}")
        if seq <= self.seqs.get(run, 0):
            self.violation(f"seq {seq} came after seq {self.seqs[run]} of run {run}: {frame}")
        self.seqs[run] = max(seq, self.seqs.get(run, 0))
        return run

    async def _on(self, f: dict[str, Any]) -> None:
        kind = f.get("type")
        if not f.get("id"):
            self.violation(f"a frame without an id: {f}")
        if kind == "ready":
            self.token = f["token"]
        elif kind == "history":
            await self._redraw(f.get("messages") or [])
            self.history.set()
        elif kind == "ack":
            self.acks.append(str(f.get("reply_to")))
            self.pending.pop(str(f.get("reply_to")), None)
            if self.resend is not None:  # recorded again: what waits goes now
                self.resend.cancel()
                self._resend_soon()
        elif kind == "error" and f.get("code") == "not_received":
            self._not_received(f)
        elif kind == "message.final" and f.get("run_id") is None:  # a command's answer
            self.items.append(_Bubble(None, f["id"], text=f["text"], final=True))
        elif kind in RUN_FRAMES:
            run = self._check_run_frame(f)
            if run is None:
                return
            bubble = self._bubble(run)
            if kind == "message.delta" and not bubble.final:
                bubble.text += f["text"]
            elif kind == "tool.end" and not bubble.final:
                image = (f.get("details") or {}).get("image")
                if image:
                    bubble.images.append(await self._image(image))
            elif kind == "message.final":
                self.finals[run] = self.finals.get(run, 0) + 1
                if self.finals[run] > 1:
                    self.violation(f"a second message.final for run {run}: {f}")
                bubble.text, bubble.final = f["text"], True
            elif kind == "run.end":
                bubble.final = True
                self.ended.add(run)
            elif kind == "approval.request":
                self._approval_request(bubble, f)
            elif kind == "approval.decision":
                self._approval_decision(f)
        elif kind == "error" and f.get("run_id") and f.get("code") != "rate_limited":
            run = self._check_run_frame(f)
            if run is not None:
                bubble = self._bubble(run)
                bubble.final, bubble.error = True, f["message"]
        elif kind == "error":
            self.pending.pop(str(f.get("reply_to")), None)
            self.items.append(("error", f["message"]))
        elif kind == "notice":
            self.items.append(("notice", f["text"]))
        elif kind != "message.user":  # what another tab of the visitor sent
            self.violation(f"a frame of an unknown type: {f}")

    def _approval_request(self, bubble: _Bubble, f: dict[str, Any]) -> None:
        approval_id = f["approval_id"]
        assert isinstance(approval_id, str) and APPROVAL_ID.fullmatch(approval_id), f
        assert f["approve"] == f"/approve {approval_id}" and f["deny"] == f"/deny {approval_id}"
        assert isinstance(f["arguments"], str) and isinstance(f["expires_at"], int | float)
        if self.card(approval_id) is None:
            bubble.approvals.append(_Card(approval_id, f["name"], f["arguments"],
                                          {"Approve": f["approve"], "Deny": f["deny"]}))

    def _approval_decision(self, f: dict[str, Any]) -> None:
        assert f["verdict"] in ("approved", "denied", "expired", "cancelled"), f
        card = self.card(f["approval_id"])
        if card is not None and card.decision is None:
            by = f" by {f['by']}" if f.get("by") else ""
            card.decision = f"{f['name']} {f['verdict']}{by}."

    def card(self, approval_id: str) -> _Card | None:
        return next((c for b in self.runs.values() for c in b.approvals
                     if c.approval_id == approval_id), None)

    async def _redraw(self, messages: list[dict[str, Any]]) -> None:
        """The conversation as stored (the widget's ``showHistory``)."""
        self.items, self.runs = [], {}
        for m in messages:
            if m["role"] == "user":
                continue
            bubble = self._bubble(m["run_id"]) if m.get("run_id") else None
            if bubble is None:
                bubble = _Bubble(None, f"history:{len(self.items)}")
                self.items.append(bubble)
            if m["role"] == "approval.request":  # a paused run: its card
                self._approval_request(bubble, m)
                card = self.card(m["approval_id"])
                if card is not None:
                    card.open = m["open"] is True
                bubble.final = True  # (the run ended: paused)
                continue
            if m["role"] == "tool":
                image = (m.get("details") or {}).get("image")
                if image:
                    bubble.images.append(await self._image(image))
                continue
            bubble.text = f"{bubble.text}\n\n{m['text']}" if bubble.text else m["text"]
            bubble.final = True

    def shown(self) -> list[Shown]:
        out = []
        for item in self.items:
            if isinstance(item, tuple):
                out.append(Shown(id=f"{item[0]}:{len(out)}", text=item[1], raw=item[1]))
                continue
            for card in item.approvals:
                out.append(Shown(id=f"approval:{card.approval_id}", text=card.text,
                                 raw=card.text, code=(card.arguments,), buttons=card.buttons))
            if item.text:
                out.append(Shown(id=item.id, text=item.text, raw=item.text,
                                 code=code_of(item.text)))
            for i, data in enumerate(item.images):
                out.append(Shown(id=f"{item.id}:image:{i}", text="", kind="image", data=data))
            if item.error:
                out.append(Shown(id=f"{item.id}:error", text=item.error, raw=item.error))
        return out


@dataclass
class WebHarness(ServedHarness):
    name: str = "web"
    caps: Any = WebProvider.capabilities
    # redelivery: after a reconnect the widget sends again the messages it has no ack for,
    # with the same client id (the gateway dedupes by "<chat>:<client id>")
    features: frozenset[str] = frozenset({"redelivery"})
    direct_chat: str = ""  # the visitor's chat id: set once the first tab is ready
    tab: Tab | None = None
    token: str | None = None  # the session token, kept like localStorage does
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: int = 0

    def providers_config(self) -> dict[str, Any]:
        # as shipped: the session key is made once in the data dir (a restart keeps it)
        return {"web": {"enabled": True}}

    async def connected(self, timeout: float = 10) -> None:
        await self.provider_running("web", timeout)
        await self.reconnect(timeout)

    async def reconnect(self, timeout: float = 10) -> None:
        """Close the tab (if open) and open a new one with the session token."""
        if self.tab is not None:
            await self.tab.close()
            self.token = self.tab.token
        assert self.http is not None
        self.tab = Tab(self.http, self.base_url, self.token, self._changed,
                       self.violations.append)
        await self.tab.open(timeout)
        self.token = self.tab.token
        visitor = (self.token or "").split(".")[1]
        assert not self.direct_chat or self.direct_chat == visitor, "the visitor changed"
        self.direct_chat = visitor

    async def stop_gateway(self) -> None:
        await super().stop_gateway()  # the server closes the tab's socket (going away)
        if self.tab is not None:
            await self.tab.close()

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        assert chat in (None, self.direct_chat), f"web: one chat per visitor, not {chat}"
        assert document is None, "the widget sends text only"
        assert self.tab is not None
        self._ids += 1
        client_id = f"m{self._ids}"
        await self.tab.say(client_id, text)
        return UserMessage(self.direct_chat, (client_id, text))

    async def redeliver(self, message: UserMessage) -> None:
        """What the widget does after a reconnect: send again, with the same id."""
        assert self.tab is not None
        client_id, text = message.ref
        await self.reconnect()
        await self.tab.say(client_id, text)

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """What the widget does on a click of the card's button: send its command as the
        visitor's message (a new client id) and disable both buttons. A click on a card
        already clicked is its message sent again with the same id (what the widget does
        after a reconnect). Returns once the message is acknowledged."""
        assert chat in (None, self.direct_chat) and user is None, "web: one visitor per chat"
        assert self.tab is not None
        card = self.tab.card(message.id.removeprefix("approval:"))
        assert card is not None, f"web: no approval card {message.id}"
        if card.clicked is None:
            assert label in card.buttons, f"web: no button {label} on {card.buttons}"
            self._ids += 1
            card.clicked = f"m{self._ids}"
            await self.tab.say(card.clicked, card.commands[label])
        else:
            await self.tab.say(card.clicked, card.commands[label])
        while card.clicked not in self.tab.acks:
            await self.changed()

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: the tab got the message's ``ack`` (and may forget it)."""
        return self.tab is not None and message.ref[0] in self.tab.acks

    def shown(self, chat: str | None = None) -> list[Shown]:
        assert chat in (None, self.direct_chat), f"web: one chat per visitor, not {chat}"
        assert not self.violations, f"web: the chat socket broke its protocol: {self.violations}"
        return self.tab.shown() if self.tab is not None else []

    async def caught_up(self) -> None:
        """The tab has every run it was shown up to its final text (the socket carries a
        run's frames in order; a run redrawn from the history is final)."""
        while self.tab is None or not all(b.final for b in self.tab.runs.values()):
            await self.changed()

    async def changed(self) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), 0.5)
