"""The Slack harnesses: the real provider (slack-bolt, slack_sdk) against the fake Slack, once
with events posted over HTTP to the gateway's aiohttp server and once over Socket Mode."""

from __future__ import annotations

import copy
import dataclasses
import html
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.helpers.gateway import provider_context
from pluto.settings import ProviderConfig
from pluto.gateway.http.server import HttpServer
from pluto.gateway.ports import Provider, ProviderContext
from pluto.providers.slack import SlackProvider
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.fakes.slack_server import FakeSlack, slack_escape
from tests.fakes.slack_state import SlackError

BOT_TOKEN_ENV = "PLUTO_CONFORMANCE_SLACK_BOT_TOKEN"
SECRET_ENV = "PLUTO_CONFORMANCE_SLACK_SIGNING_SECRET"
APP_TOKEN_ENV = "PLUTO_CONFORMANCE_SLACK_APP_TOKEN"
SUBSCRIPTIONS = frozenset({"app_mention", "message.im", "message.channels"})


class FloodingSlack(FakeSlack):
    """The fake Slack, plus: refuse one post to a channel once it holds N bot messages."""

    def __init__(self) -> None:
        super().__init__(subscriptions=SUBSCRIPTIONS, event_retry_delays=(0.0, 0.2, 0.5))
        self.hold: dict[str, tuple[int, int]] = {}  # channel → (after n posts, retry_after)
        self.refused: list[float] = []

    async def _m_chat_post_message(self, p: dict) -> dict:
        channel = str(p.get("channel") or "")
        rule = self.hold.get(channel)
        if rule is not None and len(self.posts(channel)) >= rule[0]:
            del self.hold[channel]
            self.refused.append(time.monotonic())
            raise SlackError("ratelimited", 429, {"Retry-After": str(rule[1])})
        return await super()._m_chat_post_message(p)


_FENCE = re.compile(r"```\n?(.*?)\n?```", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"<[^|>\s]+\|([^>]*)>|<([^>|\s]+)>")
_SPAN = re.compile(r"(?<![\w*_~])([*_~])(?=\S)(.+?)(?<=\S)\1(?![\w*_~])")


def read_mrkdwn(raw: str) -> tuple[str, tuple[str, ...]]:
    """What a person reads in a mrkdwn message, and the contents of its code."""
    code: list[str] = []

    def keep(m: re.Match[str]) -> str:
        code.append(html.unescape(m.group(1)))
        return f"\x00{len(code) - 1}\x00"

    text = _INLINE.sub(keep, _FENCE.sub(keep, raw))
    text = _LINK.sub(lambda m: m.group(1) or m.group(2), text)
    for _ in range(3):  # nested spans: *_bold italic_*
        text = _SPAN.sub(r"\2", text)
    text = html.unescape(text)
    text = re.sub("\x00(\\d+)\x00", lambda m: code[int(m.group(1))], text)
    return text, tuple(code)


def _buttons(msg: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, action_id) of the buttons in a message's actions blocks."""
    return [(str((el.get("text") or {}).get("text") or ""), str(el.get("action_id") or ""))
            for block in msg.get("blocks") or [] if block.get("type") == "actions"
            for el in block.get("elements") or [] if el.get("type") == "button"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlackHarness(Harness):
    """What both modes share: the fake workspace, users, what the bot shows."""

    caps: Any = SlackProvider.capabilities
    features: frozenset[str] = frozenset(
        {"groups", "redelivery", "flood_control", "files_in", "serve", "strangers"})
    direct_chat: str = "D0PLUTODM1"
    stranger: str = "U0STRANGER"
    group_chat: str = "C0PLUTOTEAM"
    mode: str = "http"
    fake: FloodingSlack = field(default_factory=FloodingSlack)

    async def open(self) -> None:
        await self.fake.start()
        self.fake.add_dm(channel_id=self.direct_chat)
        self.fake.add_user(self.stranger, name="mallory")
        self.fake.add_channel("team", channel_id=self.group_chat,
                              members=(self.fake.default_user, self.stranger))
        os.environ.update(self.secrets())

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        for name in self.secrets():
            os.environ.pop(name, None)

    def secrets(self) -> dict[str, str]:
        if self.mode == "socket":
            return {BOT_TOKEN_ENV: self.fake.bot_token, APP_TOKEN_ENV: self.fake.app_token}
        return {BOT_TOKEN_ENV: self.fake.bot_token, SECRET_ENV: self.fake.signing_secret}

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "mode": self.mode, "api_base": self.fake.api_url,
                "bot_token_env": BOT_TOKEN_ENV, "signing_secret_env": SECRET_ENV,
                "app_token_env": APP_TOKEN_ENV}

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        wire = slack_escape(text)
        if mention:
            wire = f"{self.fake.bot_mention} {wire}"
        thread_ts = None
        if reply_to is not None:  # a reply on Slack: in the thread of the bot's message
            replied = self.fake.message(chat, reply_to.id) or {}
            thread_ts = replied.get("thread_ts") or reply_to.id
        files = [self.fake.add_file(document[1], document[0])] if document else None
        said = await self.fake.user_message(chat, wire, thread_ts=thread_ts, files=files)
        return UserMessage(chat, said)

    async def redeliver(self, message: UserMessage) -> None:
        for delivery in message.ref.deliveries:  # the same event_id again
            await self.fake.send_event(copy.deepcopy(delivery.payload))

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: an attempt of each of the message's events got a 2xx (HTTP) or an ack."""
        deliveries = message.ref.deliveries
        return bool(deliveries) and all(any(a.acked for a in d.attempts) for d in deliveries)

    def bot_messages(self, chat: str) -> list[dict[str, Any]]:
        """The bot's messages in a conversation, threads included, oldest first."""
        found: list[dict[str, Any]] = []
        for top in self.fake.history(chat):
            found.append(top)
            if top.get("reply_count"):
                found += self.fake.history(chat, top["ts"])[1:]
        mine = [m for m in found if m.get("bot_id") == self.fake.bot_id]
        return sorted(mine, key=lambda m: float(m["ts"]))

    def shown(self, chat: str | None = None) -> list[Shown]:
        chat = chat or self.direct_chat
        out = []
        for msg in self.bot_messages(chat):
            raw = str(msg.get("text") or "")
            text, code = read_mrkdwn(raw)
            files = msg.get("files") or []
            kind, data = "text", None
            if files:
                kind = "image" if str(files[0].get("mimetype", "")).startswith("image/") else "file"
                data = self.fake.file_bytes(files[0]["id"])
            out.append(Shown(id=msg["ts"], text=text, raw=raw, code=code, kind=kind, data=data,
                             edits=len(self.fake.edits(chat, msg["ts"])),
                             buttons=tuple(label for label, _ in _buttons(msg))))
        return out

    def checked(self, ctx: ProviderContext) -> ProviderContext:
        """The context as the gateway gives it: who may decide an approval is asked of it."""
        assert self.gateway is not None
        check = self.gateway.pipeline.approvals
        return dataclasses.replace(ctx, approvals=check.check if check is not None else None)

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A click as Slack delivers it; the button is found on the message as it is now, or
        as it was posted (a client still showing it before the buttons were taken off)."""
        chat = chat or self.direct_chat
        now = self.fake.message(chat, message.id) or {}
        versions = [now] + [{**now, "blocks": p.blocks} for p in self.fake.posts(chat)
                            if p.ts == message.id and p.blocks]
        for version in versions:
            for found, action_id in _buttons(version):
                if found == label:
                    await self.fake.click(chat, message.id, action_id, user=user,
                                          message=version if version is not now else None)
                    assert not self.fake.interaction_failures, self.fake.interaction_failures
                    return
        raise AssertionError(f"no button {label!r} under message {message.id}")

    def private_notes(self, user: str) -> list[str]:
        return self.fake.notes_for(user)

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold[chat] = (after, retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        chat = chat or self.direct_chat
        return sorted([p.time for p in self.fake.posts(chat)]
                      + [u.time for u in self.fake.uploads if u.channel == chat])

    async def changed(self) -> None:
        await self.fake._wait_change(0.5)  # noqa: SLF001 - the fake's change notification


@dataclass
class SlackHttpHarness(SlackHarness):
    """Events API: the fake posts signed events to ``/slack/events`` on a gateway HTTP server."""

    name: str = "slack-http"
    mode: str = "http"
    server: HttpServer | None = None
    _auth_calls: int = 0

    async def make_provider(self) -> Provider:
        assert self.gateway is not None
        self.expect_connection()
        self.server = HttpServer(self.gateway, "127.0.0.1", 0)
        ctx = self.checked(provider_context(ProviderConfig(**self.provider_config()),
                                            self.data_dir, self.server))
        provider = SlackProvider.from_context(ctx)  # mounts its endpoint
        await self.server.start()
        self.fake.events_url = f"{self.server.url}/slack/events"
        return provider

    async def stop_gateway(self) -> None:
        await super().stop_gateway()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def expect_connection(self) -> None:
        self._auth_calls = len(self.fake.calls_to("auth.test"))

    async def connected(self, timeout: float = 10) -> None:
        # the provider takes events from before it asks who it is (auth.test)
        await self.fake.wait_until(
            lambda: len([c for c in self.fake.calls_to("auth.test") if c.status]) >
            self._auth_calls, timeout, "the provider to connect")

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Also pins ``http.port`` in the config dir's pluto.yaml to a free port, so the fake
        knows where ``pluto serve`` receives events."""
        port = free_port()
        path = self.config_dir / "pluto.yaml"
        config = yaml.safe_load(path.read_text()) or {}
        config["http"] = {"host": "127.0.0.1", "port": port}
        path.write_text(yaml.safe_dump(config))
        self.fake.events_url = f"http://127.0.0.1:{port}/slack/events"
        return {"slack": self.provider_config()}, self.secrets()


@dataclass
class SlackSocketHarness(SlackHarness):
    """Socket Mode: the provider opens the fake's websocket and acknowledges envelopes."""

    name: str = "slack-socket"
    mode: str = "socket"
    _sockets: int = 0

    async def make_provider(self) -> Provider:
        self.expect_connection()
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir, None)
        return SlackProvider.from_context(self.checked(ctx))

    def expect_connection(self) -> None:
        self._sockets = len(self.fake.socket_connections)

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_for_socket(self._sockets + 1, timeout=timeout)

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"slack": self.provider_config()}, self.secrets()
