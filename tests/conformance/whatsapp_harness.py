"""The WhatsApp harness: the real provider (the Cloud API over aiohttp) against the fake Cloud
API, which posts signed webhooks to the provider's endpoint on a gateway HTTP server.

WhatsApp has no group chats for a business number and cannot edit a message: the scenarios
for groups and streaming by edits do not apply. Its rate-limit refusals (131056, the pair rate
limit) name no wait: the provider waits ``pair_rate_wait_seconds``, which the harness sets to the
retry-after a scenario asks for.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from pluto.gateway.http.server import HttpServer
from pluto.gateway.ports import Provider
from pluto.providers.whatsapp import WhatsAppProvider
from pluto.settings import ProviderConfig
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.conformance.slack_harness import free_port
from tests.fakes.whatsapp_server import FakeWhatsApp
from tests.fakes.whatsapp_state import GraphFailure
from tests.helpers.gateway import provider_context

TOKEN_ENV = "PLUTO_CONFORMANCE_WHATSAPP_TOKEN"
SECRET_ENV = "PLUTO_CONFORMANCE_WHATSAPP_APP_SECRET"
VERIFY_ENV = "PLUTO_CONFORMANCE_WHATSAPP_VERIFY_TOKEN"
PATH = "/whatsapp/webhook"


class FloodingWhatsApp(FakeWhatsApp):
    """The fake Cloud API, plus: refuse one send to a person (131056, the pair rate limit) once
    they hold N of the bot's messages."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: dict[str, tuple[int, int]] = {}  # wa_id → (after n messages, retry_after)
        self.refused: list[float] = []

    async def _messages(self, p: dict[str, Any]) -> dict[str, Any]:
        to = str(p.get("to") or "")
        rule = self.hold.get(to)
        if p.get("status") != "read" and rule is not None and len(self.messages_to(to)) >= rule[0]:
            del self.hold[to]
            self.refused.append(time.monotonic())
            raise GraphFailure(131056)
        return await super()._messages(p)


_FENCE = re.compile(r"```\n?(.*?)\n?```", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_SPAN = re.compile(r"(?<![\w*_~])([*_~])(?=\S)(.+?)(?<=\S)\1(?![\w*_~])")


def read_whatsapp(raw: str) -> tuple[str, tuple[str, ...]]:
    """What a person reads in a WhatsApp message, and the contents of its monospaced parts."""
    code: list[str] = []

    def keep(m: re.Match[str]) -> str:
        code.append(m.group(1))
        return f"\x00{len(code) - 1}\x00"

    text = _INLINE.sub(keep, _FENCE.sub(keep, raw))
    for _ in range(3):  # nested spans: *_bold italic_*
        text = _SPAN.sub(r"\2", text)
    text = re.sub("\x00(\\d+)\x00", lambda m: code[int(m.group(1))], text)
    return text, tuple(code)


def _buttons(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """(title, id) of the reply buttons of an interactive message the bot sent."""
    interactive = payload.get("interactive") or {}
    return [(b["reply"]["title"], b["reply"]["id"])
            for b in (interactive.get("action") or {}).get("buttons") or []]


@dataclass
class WhatsAppHarness(Harness):
    name: str = "whatsapp"
    caps: Any = WhatsAppProvider.capabilities
    features: frozenset[str] = frozenset({"redelivery", "flood_control", "files_in", "serve"})
    direct_chat: str = "4915100000001"
    fake: FloodingWhatsApp = field(default_factory=FloodingWhatsApp)
    server: HttpServer | None = None
    _checks: int = 0

    async def open(self) -> None:
        await self.fake.start()
        self.fake.add_user(self.direct_chat, "Alice")
        os.environ.update(self.secrets())

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        for name in self.secrets():
            os.environ.pop(name, None)

    def secrets(self) -> dict[str, str]:
        return {TOKEN_ENV: self.fake.token, SECRET_ENV: self.fake.app_secret,
                VERIFY_ENV: self.fake.verify_token}

    def provider_config(self) -> dict[str, Any]:
        waits = [rule[1] for rule in self.fake.hold.values()]
        return {"enabled": True, "phone_number_id": self.fake.phone_number_id,
                "api_base": self.fake.url, "token_env": TOKEN_ENV, "app_secret_env": SECRET_ENV,
                "verify_token_env": VERIFY_ENV, "webhook_path": PATH,
                "pair_rate_wait_seconds": min(waits[0], 3600) if waits else 6}

    async def make_provider(self) -> Provider:
        assert self.gateway is not None
        self.expect_connection()
        self.server = HttpServer(self.gateway, "127.0.0.1", 0)
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir,
                               self.server)
        check = self.gateway.pipeline.approvals  # who may decide, as the gateway asks it
        ctx = dataclasses.replace(ctx, approvals=check.check if check is not None else None)
        provider = WhatsAppProvider.from_context(ctx)  # mounts its webhook
        await self.server.start()
        self.fake.webhook_url = f"{self.server.url}{PATH}"
        return provider

    async def stop_gateway(self) -> None:
        await super().stop_gateway()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def expect_connection(self) -> None:
        self._checks = len(self._number_checks())

    def _number_checks(self) -> list[Any]:
        return [c for c in self.fake.calls_to("GET", self.fake.phone_number_id) if c.status == 200]

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_until(lambda: len(self._number_checks()) > self._checks, timeout,
                                   "the provider to connect")

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Also pins ``http.port`` in the config dir's pluto.yaml to a free port, so the fake
        knows where ``pluto serve`` receives webhooks."""
        port = free_port()
        path = self.config_dir / "pluto.yaml"
        config = yaml.safe_load(path.read_text()) or {}
        config["http"] = {"host": "127.0.0.1", "port": port}
        path.write_text(yaml.safe_dump(config))
        self.fake.webhook_url = f"http://127.0.0.1:{port}{PATH}"
        return {"whatsapp": self.provider_config()}, self.secrets()

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        said = await self.fake.user_says(chat, text, document=document,
                                         reply_to=reply_to.id if reply_to else None)
        return UserMessage(chat, said)

    async def redeliver(self, message: UserMessage) -> None:
        await self.fake.redeliver(message.ref)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: a post of the webhook that carried the message was answered 200."""
        deliveries = [message.ref.delivery] + [
            d for d in self.fake.deliveries if d.payload == message.ref.delivery.payload]
        return any(200 in d.statuses for d in deliveries)

    def shown(self, chat: str | None = None) -> list[Shown]:
        out = []
        for sent in self.fake.messages_to(chat or self.direct_chat):
            text, code = read_whatsapp(sent.text)
            kind = {"image": "image", "document": "file"}.get(sent.type, "text")
            out.append(Shown(id=sent.id, text=text, raw=sent.text, code=code, kind=kind,
                             data=sent.file_bytes,
                             buttons=tuple(title for title, _ in _buttons(sent.payload))))
        return out

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A tap on a reply button: WhatsApp posts the button_reply webhook (awaited)."""
        chat = chat or self.direct_chat
        sent = next(s for s in self.fake.messages_to(chat) if s.id == message.id)
        button_id = next(b for title, b in _buttons(sent.payload) if title == label)
        said = await self.fake.user_clicks(user or chat, message.id, button_id)
        assert said.delivery.delivered, said.delivery.statuses

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold[chat] = (after, retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        return [s.time for s in self.fake.messages_to(chat or self.direct_chat)]

    async def changed(self) -> None:
        await self.fake._wait_change(0.5)  # noqa: SLF001 - the fake's change notification

