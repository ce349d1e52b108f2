"""The Teams harness: the real provider (the Bot Framework protocol over aiohttp) on a gateway
HTTP server, against the fake Teams, which posts signed activities to its messaging endpoint
and takes its replies on the fake Connector.

The direct chat is a personal conversation; the group is a group chat, where the bot answers
@mentions and quoted replies to its messages. What a person sees of a message is its Markdown
text as Teams shows it, then the tables of its Adaptive Cards (a card's table is a grid, its
columns aligned: counted as a monospaced block too). Buttons are the card actions under a
message; a click is the signed ``adaptiveCard/action`` invoke Teams posts, from Alice or from
Mallory (the stranger, in the group chat), and what Teams showed a person alone is the invoke
answers it got.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from pluto.gateway.http.server import HttpServer
from pluto.gateway.ports import Provider
from pluto.providers.teams import TeamsProvider
from pluto.settings import ProviderConfig
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.conformance.slack_harness import free_port
from tests.fakes.teams_server import FakeTeams, Sent, card_tables, inline_image
from tests.helpers.gateway import provider_context

PASSWORD_ENV = "PLUTO_CONFORMANCE_TEAMS_APP_PASSWORD"
PATH = "/teams/messages"

_FENCE = re.compile(r"^(`{3,})[^\n]*\n(.*?)\n\1$", re.S | re.M)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_SPANS = re.compile(r"(\*\*|~~|\*)(?=\S)(.+?)(?<=\S)\1")
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")


def read_teams(raw: str) -> tuple[str, tuple[str, ...]]:
    """What a person reads of a Teams Markdown text, and its code blocks and inline code."""
    code: list[str] = []

    def keep(m: re.Match[str]) -> str:
        code.append(m.group(m.lastindex or 1))
        return f"\x00{len(code) - 1}\x00"

    text = _INLINE.sub(keep, _FENCE.sub(keep, raw))
    for _ in range(3):
        text = _SPANS.sub(r"\2", text)
    text = _ESCAPE.sub(r"\1", text)
    text = re.sub("\x00(\\d+)\x00", lambda m: code[int(m.group(1))], text)
    return text, tuple(code)


def shown_of(sent: Sent) -> Shown:
    text, code = read_teams(sent.text)
    grids = ["\n".join(" | ".join(row) for row in table) for table in card_tables(sent)]
    image = inline_image(sent)
    return Shown(id=sent.id, text="\n".join([text, *grids]).strip("\n"), raw=sent.text,
                 code=code + tuple(grids), kind="image" if image is not None else "text",
                 data=image, edits=sent.edits,
                 buttons=tuple(str(a.get("title")) for a in FakeTeams.buttons(sent)))


@dataclass
class TeamsHarness(Harness):
    name: str = "teams"
    caps: Any = TeamsProvider.capabilities
    features: frozenset[str] = frozenset(
        {"groups", "redelivery", "flood_control", "files_in", "serve", "strangers"})
    stranger: str = "Mallory"  # the fake's users are named; an id is made per name
    direct_chat: str = "a:1PlutoPersonalChatWithAlice"
    group_chat: str = "19:pluto-team-chat@thread.v2"
    fake: FakeTeams = field(default_factory=FakeTeams)
    server: HttpServer | None = None
    _tokens: int = 0

    async def open(self) -> None:
        await self.fake.start()
        self.fake.add_conversation(self.direct_chat, "personal")
        self.fake.add_conversation(self.group_chat, "groupChat")
        os.environ.update(self.secrets())

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        for name in self.secrets():
            os.environ.pop(name, None)

    def secrets(self) -> dict[str, str]:
        return {PASSWORD_ENV: self.fake.app_password}

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "app_id": self.fake.app_id, "app_password_env": PASSWORD_ENV,
                "messaging_path": PATH, "openid_metadata_url": self.fake.openid_url,
                "token_url": self.fake.token_url}

    async def make_provider(self) -> Provider:
        assert self.gateway is not None
        self.expect_connection()
        self.server = HttpServer(self.gateway, "127.0.0.1", 0)
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir,
                               self.server)
        check = self.gateway.pipeline.approvals  # who may decide is asked of the gateway
        ctx = dataclasses.replace(ctx, approvals=check.check if check is not None else None)
        provider = TeamsProvider.from_context(ctx)  # mounts its messaging endpoint
        await self.server.start()
        self.fake.endpoint_url = f"{self.server.url}{PATH}"
        return provider

    async def stop_gateway(self) -> None:
        await super().stop_gateway()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def _issued(self) -> int:
        return len([s for _, s in self.fake.token_requests if s == 200])

    def expect_connection(self) -> None:
        self._tokens = self._issued()

    async def connected(self, timeout: float = 10) -> None:
        # the provider fetches the signing keys, then its first access token, then receives
        await self.fake.wait_until(lambda: self._issued() > self._tokens, timeout,
                                   "the provider to connect")

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Also pins ``http.port`` in the config dir's pluto.yaml to a free port, so the fake
        knows where ``pluto serve`` receives activities."""
        port = free_port()
        path = self.config_dir / "pluto.yaml"
        config = yaml.safe_load(path.read_text()) or {}
        config["http"] = {"host": "127.0.0.1", "port": port}
        path.write_text(yaml.safe_dump(config))
        self.fake.endpoint_url = f"http://127.0.0.1:{port}{PATH}"
        return {"teams": self.provider_config()}, self.secrets()

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        quoted = next((s for s in self.fake.sent if reply_to and s.id == reply_to.id), None)
        said = await self.fake.user_says(chat, text, mention=mention, reply_to=quoted,
                                         document=document)
        return UserMessage(chat, said)

    async def redeliver(self, message: UserMessage) -> None:
        await self.fake.redeliver(message.ref)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: a post of the activity was answered 2xx."""
        same = [d for d in self.fake.deliveries if d.activity["id"] == message.ref.id]
        return any(200 <= s < 300 for d in same for s in d.statuses)

    def shown(self, chat: str | None = None) -> list[Shown]:
        return [shown_of(s) for s in self.fake.bot_messages(chat or self.direct_chat)]

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A click as Teams delivers it, on the button as shown now or as first posted (a
        client that still shows it)."""
        chat = chat or self.direct_chat
        sent = next(s for s in self.fake.bot_messages(chat) if s.id == message.id)
        now = any(a.get("title") == label for a in self.fake.buttons(sent))
        await self.fake.click(sent, label, user=user or "Alice", as_posted=not now)
        assert not self.fake.invoke_failures, self.fake.invoke_failures

    def private_notes(self, user: str) -> list[str]:
        return list(self.fake.notes.get(user, []))

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold(chat, after=after, retry_after=retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        return [s.time for s in self.fake.bot_messages(chat or self.direct_chat)]

    async def changed(self) -> None:
        await self.fake.wait_change(0.5)
