"""The Mattermost harness: the real provider (API v4 over aiohttp) against the fake server,
receiving over its WebSocket and catching up with ``since`` after a reconnect."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt

from pluto.gateway.http.server import HttpServer
from pluto.gateway.ports import Provider
from pluto.providers.mattermost import MattermostProvider
from pluto.settings import ProviderConfig
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.conformance.slack_harness import free_port
from tests.fakes.mattermost_buttons import actions_of
from tests.fakes.mattermost_server import ApiFailure, FakeMattermost
from tests.helpers.gateway import provider_context

TOKEN_ENV = "PLUTO_CONFORMANCE_MATTERMOST_TOKEN"
ZWSP = "\u200b"


class FloodingMattermost(FakeMattermost):
    """The fake server, plus: refuse one new post in a channel once the bot has N posts there
    (429, ``X-Ratelimit-Reset``)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: dict[str, tuple[int, int]] = {}  # channel → (after n posts, retry_after)

    async def _create_post(self, body: dict[str, Any]) -> Any:
        channel = str(body.get("channel_id") or "")
        rule = self.hold.get(channel)
        if rule is not None and len(self.bot_posts(channel)) >= rule[0]:
            del self.hold[channel]
            self.refused.append(time.monotonic())
            raise ApiFailure.too_many(rule[1])
        return await super()._create_post(body)


_MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def as_shown(raw: str) -> tuple[str, tuple[str, ...]]:
    """What Mattermost shows for a post's Markdown (a table row on one line), and its code."""
    lines: list[str] = []
    code: list[str] = []
    row: list[str] | None = None
    for token in _MARKDOWN.parse(raw.replace(ZWSP, "")):
        if token.type == "tr_open":
            row = []
        elif token.type == "tr_close" and row is not None:
            lines.append(" | ".join(row))
            row = None
        elif token.type in ("fence", "code_block"):
            lines.append(token.content.rstrip("\n"))
            code.append(lines[-1])
        elif token.type == "inline":
            text = _inline(token, code)
            row.append(text) if row is not None else lines.append(text)
    return "\n".join(lines), tuple(code)


def _inline(token: Any, code: list[str]) -> str:
    parts = []
    for child in token.children or []:
        if child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
        elif child.type in ("text", "code_inline", "html_inline"):
            parts.append(child.content)
            if child.type == "code_inline":
                code.append(child.content)
    return "".join(parts)


@dataclass
class MattermostHarness(Harness):
    name: str = "mattermost"
    caps: Any = MattermostProvider.capabilities
    features: frozenset[str] = frozenset(
        {"groups", "redelivery", "flood_control", "files_in", "serve", "strangers"})
    fake: FloodingMattermost = field(default_factory=FloodingMattermost)
    server: HttpServer | None = None
    actions_url: str = ""
    _sockets: int = 0

    async def open(self) -> None:
        await self.fake.start()
        self.direct_chat = self.fake.add_direct(self.fake.alice)
        self.group_chat = self.fake.add_channel(
            "town-square", [self.fake.alice, self.fake.bob, self.fake.carol, self.fake.bot])
        self.stranger = self.fake.carol["id"]
        os.environ[TOKEN_ENV] = self.fake.token

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        os.environ.pop(TOKEN_ENV, None)

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "url": self.fake.url, "token_env": TOKEN_ENV}

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"mattermost": self.provider_config()}, {TOKEN_ENV: self.fake.token}

    async def make_provider(self) -> Provider:
        """The provider with the gateway's HTTP server, where Mattermost posts clicks."""
        assert self.gateway is not None
        self.expect_connection()
        port = free_port()
        self.server = HttpServer(self.gateway, "127.0.0.1", port)
        self.actions_url = f"http://127.0.0.1:{port}/mattermost/actions"
        config = {**self.provider_config(), "actions_url": self.actions_url}
        ctx = provider_context(ProviderConfig(**config), self.data_dir, self.server)
        check = self.gateway.pipeline.approvals  # who may decide, as the gateway asks it
        ctx = dataclasses.replace(ctx, approvals=check.check if check is not None else None)
        provider = MattermostProvider.from_context(ctx)  # mounts its actions endpoint
        await self.server.start()
        return provider

    async def stop_gateway(self) -> None:
        await super().stop_gateway()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A click as the Mattermost server makes it (the integration's answer applied); a
        button taken off meanwhile is one a stale client still shows (the server refuses it)."""
        chat = chat or self.direct_chat
        default = self.fake.bob if chat == self.group_chat else self.fake.alice
        who = self.fake.users[user] if user else default
        actions = self.fake.created_actions.get(message.id, [])
        action = next(a for a in actions if a["name"] == label)
        await self.fake.click(message.id, action["id"], who)
        assert not self.fake.click_failures, self.fake.click_failures

    def private_notes(self, user: str) -> list[str]:
        return list(self.fake.ephemerals.get(user, []))

    def expect_connection(self) -> None:
        self._sockets = self.fake.sockets_opened

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_until(lambda: self.fake.sockets_opened > self._sockets
                                   and self.fake.sockets, timeout, "the provider to connect")

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        sender = self.fake.bob if chat == self.group_chat else self.fake.alice
        root = ""
        if reply_to is not None:  # a reply continues the thread of the post it answers
            root = self.fake.posts[reply_to.id]["root_id"] or reply_to.id
        file = (document[0], document[1], "text/csv") if document else None
        post = await self.fake.user_says(chat, text, sender=sender, mention=mention,
                                         root_id=root, file=file)
        return UserMessage(chat, post["id"])

    async def redeliver(self, message: UserMessage) -> None:
        """Mattermost never sends an event twice; what comes again comes by ``since``: the post
        changes (a reaction) and the socket drops, so the catch-up after the reconnect
        returns it once more."""
        self.fake.touch(message.ref)
        self.expect_connection()
        await self.fake.disconnect()
        await self.connected()

    def confirmed(self, message: UserMessage) -> bool | None:
        """Mattermost has no acknowledgement of an event: the provider keeps its own
        position (and fetches again with ``since`` what it could not record)."""
        return None

    def shown(self, chat: str | None = None) -> list[Shown]:
        out = []
        for post in self.fake.bot_posts(chat or self.direct_chat):
            text, code = as_shown(post["message"])
            files = post["file_ids"]
            kind, data = "text", None
            if files:
                info = self.fake.files[files[0]][1]
                kind = "image" if info["mime_type"].startswith("image/") else "file"
                data = self.fake.file_bytes(files[0])
            actions = actions_of(post)
            out.append(Shown(id=post["id"], text=text, raw=post["message"], code=code,
                             kind=kind, data=data, edits=len(self.fake.edits.get(post["id"],
                                                                                 [])),
                             buttons=tuple(a["name"] for a in actions)))
        return out

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold[chat] = (after, retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        return [self.fake.sent_at[p["id"]] for p in self.fake.bot_posts(chat or self.direct_chat)]

    async def changed(self) -> None:
        await self.fake._wait_change(0.5)  # noqa: SLF001 - the fake's change notification
