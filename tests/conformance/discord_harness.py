"""The Discord harness: the real provider (discord.py) against the fake Discord (REST and the
gateway websocket). The direct chat is a DM channel; the group is a server's text channel."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

import discord.gateway
import discord.http
from markdown_it import MarkdownIt

from tests.helpers.gateway import provider_context
from pluto.settings import ProviderConfig
from pluto.gateway.ports import Provider, ProviderContext
from pluto.providers.discord import DiscordProvider
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.fakes.discord_clicks import buttons_of
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.discord_state import Failure, Sent, normalize_route

TOKEN_ENV = "PLUTO_CONFORMANCE_DISCORD_TOKEN"
SEND = normalize_route("send_message")


class FloodingDiscord(FakeDiscord):
    """The fake Discord, plus: refuse one send to a channel (429, per route) once the bot has
    N messages there."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.hold: dict[int, tuple[int, float]] = {}  # channel → (after n messages, retry_after)
        self.refused: list[float] = []

    def _take_failure(self, route: str, channel_id: int | None) -> Failure | None:
        rule = self.hold.get(channel_id or 0)
        if route == SEND and rule is not None and len(self.messages(channel_id)) >= rule[0]:
            del self.hold[channel_id or 0]
            self.refused.append(time.monotonic())
            return Failure(route, 1, channel_id, "ratelimit", retry_after=rule[1], scope="user")
        return super()._take_failure(route, channel_id)


_MARKDOWN = MarkdownIt("commonmark").enable("strikethrough")


def as_shown(raw: str) -> tuple[str, tuple[str, ...]]:
    """What Discord shows for a message's markdown, and the contents of its code."""
    blocks: list[str] = []
    code: list[str] = []
    for token in _MARKDOWN.parse(raw):
        if token.type in ("fence", "code_block"):
            blocks.append(token.content.rstrip("\n"))
            code.append(blocks[-1])
        elif token.type == "inline":
            parts = []
            for child in token.children or []:
                if child.type in ("softbreak", "hardbreak"):
                    parts.append("\n")
                elif child.type in ("text", "code_inline", "html_inline"):
                    parts.append(child.content)
                    if child.type == "code_inline":
                        code.append(child.content)
            blocks.append("".join(parts))
    return "\n".join(blocks), tuple(code)


def _shown(sent: Sent, components: list[dict] | None = None) -> Shown:
    raw = sent.current_content or ""
    text, code = as_shown(raw)
    files = sent.current_attachments
    kind = "text"
    if files:
        kind = "image" if (files[0].content_type or "").startswith("image/") else "file"
    return Shown(id=str(sent.message_id), text=text, raw=raw, code=code, kind=kind,
                 data=files[0].data if files else None, edits=len(sent.edits),
                 buttons=tuple(label for label, _, _ in buttons_of(components)))


@dataclass
class DiscordHarness(Harness):
    name: str = "discord"
    caps: Any = DiscordProvider.capabilities
    features: frozenset[str] = frozenset(
        {"groups", "redelivery", "flood_control", "files_in", "serve", "strangers"})
    fake: FloodingDiscord = field(default_factory=FloodingDiscord)
    member: str = ""  # a user in the server who talks in the group
    guild: str = ""
    _identified: int = 0
    _redirect: tuple[Any, Any] = (None, None)  # discord.py's process-wide targets, to restore

    async def open(self) -> None:
        self._redirect = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
        await self.fake.start()
        bob = self.fake.add_user(username="bob", global_name="Bob")
        guild = self.fake.add_guild(name="Pluto Lab", members=[bob["id"]])
        channel = self.fake.add_channel(guild["id"], name="general")
        dm = self.fake.add_dm(self.fake.default_user)
        mallory = self.fake.add_user(username="mallory", global_name="Mallory")
        self.fake.add_member(guild["id"], mallory["id"])
        self.stranger = mallory["id"]
        self.member, self.guild = bob["id"], str(guild["id"])
        self.direct_chat, self.group_chat = dm["id"], channel["id"]
        os.environ[TOKEN_ENV] = self.fake.token

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        os.environ.pop(TOKEN_ENV, None)
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = self._redirect

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "token_env": TOKEN_ENV, "api_base": self.fake.api_base,
                "gateway_url": self.fake.gateway_url, "guild_ready_timeout": 0.2}

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"discord": self.provider_config()}, {TOKEN_ENV: self.fake.token}

    async def make_provider(self) -> Provider:
        self.expect_connection()
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir, None)
        return DiscordProvider.from_context(self.checked(ctx))

    def checked(self, ctx: ProviderContext) -> ProviderContext:
        """The context as the gateway gives it: who may decide an approval is asked of it."""
        assert self.gateway is not None
        check = self.gateway.pipeline.approvals
        return dataclasses.replace(ctx, approvals=check.check if check is not None else None)

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A click as Discord delivers it (INTERACTION_CREATE over the gateway); returns once
        the bot responded to the interaction. The button is found on the message as it is now,
        or as it was sent (a client still showing it before the buttons were taken off)."""
        channel = int(chat or self.direct_chat)
        now = self.fake.message(channel, int(message.id)) or {}
        sent = self.fake.sent_message(int(message.id))
        for components in (now.get("components"), sent.payload.get("components")):
            for found, custom_id, _ in buttons_of(components):
                if found == label:
                    if user is None and chat == self.group_chat:
                        user = self.member
                    shown = now if components is now.get("components") else {
                        **now, "components": components}
                    interaction = self.fake.click(channel, int(message.id), custom_id,
                                                  user=int(user) if user else None,
                                                  message=shown or None)
                    await self.fake.wait_responded(interaction, timeout=10)
                    assert not self.fake.interaction_failures, self.fake.interaction_failures
                    return
        raise AssertionError(f"no button {label!r} under message {message.id}")

    def private_notes(self, user: str) -> list[str]:
        return self.fake.notes_for(int(user))

    def identified(self) -> int:
        return len([i for i in self.fake.identifies if i.accepted])

    def expect_connection(self) -> None:
        self._identified = self.identified()

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_until(lambda: self.identified() > self._identified, timeout,
                                   "the provider to IDENTIFY on the gateway")

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        if mention:
            text = f"{self.fake.bot_mention} {text}"
        kwargs: dict[str, Any] = {}
        if reply_to is not None:
            kwargs["reply_to"] = int(reply_to.id)
        if chat == self.group_chat:
            kwargs["author"] = int(self.member)
        if document is not None:
            kwargs["attachments"] = [document]
        sent = self.fake.inject_message(int(chat), text, **kwargs)
        return UserMessage(chat, int(sent["id"]))

    async def redeliver(self, message: UserMessage) -> None:
        self.fake.redeliver(int(message.chat), message.ref)

    def confirmed(self, message: UserMessage) -> bool | None:
        return None  # Discord's gateway never delivers a message again: nothing to confirm

    def shown(self, chat: str | None = None) -> list[Shown]:
        channel = int(chat or self.direct_chat)
        return [_shown(s, (self.fake.message(channel, s.message_id) or {}).get("components"))
                for s in self.fake.messages(channel, include_deleted=False)]

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold[int(chat)] = (after, float(retry_after))

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        return [s.time for s in self.fake.messages(int(chat or self.direct_chat))]

    async def changed(self) -> None:
        await self.fake._wait_change(0.5)  # noqa: SLF001 - the fake's change notification
