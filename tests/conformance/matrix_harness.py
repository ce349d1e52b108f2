"""The Matrix harness: the real provider (mautrix's client API) against the fake homeserver,
receiving by ``/sync`` long polling."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pluto.gateway.ports import Provider
from pluto.providers.matrix import MatrixProvider
from pluto.settings import ProviderConfig
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.fakes.matrix_server import SERVER, FakeMatrix, MatrixFailure
from tests.helpers.gateway import provider_context

TOKEN_ENV = "PLUTO_CONFORMANCE_MATRIX_TOKEN"
BOB = f"@bob:{SERVER}"
MALLORY = f"@mallory:{SERVER}"


class FloodingMatrix(FakeMatrix):
    """The fake homeserver, plus: refuse one new message in a room (429 M_LIMIT_EXCEEDED)
    once the bot has N messages there."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: dict[str, tuple[int, int]] = {}  # room → (after n messages, retry_after)
        self.refused: list[float] = []

    def _send(self, room: Any, kind: str, txn: str, content: Any) -> Any:
        rule = self.hold.get(room.id)
        relates = (content or {}).get("m.relates_to") if isinstance(content, dict) else None
        is_edit = isinstance(relates, dict) and relates.get("rel_type") == "m.replace"
        if rule is not None and not is_edit and len(self.bot_messages(room.id)) >= rule[0]:
            del self.hold[room.id]
            self.refused.append(time.monotonic())
            raise MatrixFailure("M_LIMIT_EXCEEDED", "Too Many Requests", 429,
                                retry_after_ms=rule[1] * 1000)
        return super()._send(room, kind, txn, content)


_CODE = re.compile(r"<code[^>]*>(.*?)</code>", re.S)
_TAG = re.compile(r"<[^>]+>")


def read_html(formatted: str) -> tuple[str, tuple[str, ...]]:
    """What a person reads in an ``org.matrix.custom.html`` body, and its code."""
    code = tuple(html.unescape(c) for c in _CODE.findall(formatted))
    text = html.unescape(_TAG.sub("", formatted.replace("<br>", "\n")))
    return text, code


@dataclass
class MatrixHarness(Harness):
    name: str = "matrix"
    caps: Any = MatrixProvider.capabilities
    features: frozenset[str] = frozenset(
        {"groups", "redelivery", "flood_control", "files_in", "serve"})
    direct_chat: str = f"!dm:{SERVER}"
    group_chat: str = f"!team:{SERVER}"
    stranger: str = MALLORY  # in the group room; may not decide Bob's requests
    fake: FloodingMatrix = field(default_factory=FloodingMatrix)
    _syncs: int = 0

    async def open(self) -> None:
        await self.fake.start()
        self.fake.add_user(BOB, "Bob")
        self.fake.add_user(MALLORY, "Mallory")
        self.fake.add_room(self.direct_chat, members=[self.fake.alice, self.fake.bot_id])
        self.fake.add_room(self.group_chat,
                           members=[self.fake.alice, BOB, MALLORY, self.fake.bot_id])
        os.environ[TOKEN_ENV] = self.fake.token

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        os.environ.pop(TOKEN_ENV, None)

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "homeserver": self.fake.url, "access_token_env": TOKEN_ENV,
                "sync_timeout_seconds": 10}

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"matrix": self.provider_config()}, {TOKEN_ENV: self.fake.token}

    async def make_provider(self) -> Provider:
        self.expect_connection()
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir, None)
        if self.gateway is not None:  # who may decide an approval is asked of the gateway
            check = self.gateway.pipeline.approvals
            ctx = dataclasses.replace(ctx, approvals=check.check if check is not None else None)
        return MatrixProvider.from_context(ctx)

    def _long_polls(self) -> int:
        return len([c for c in self.fake.calls if c.path == "client/v3/sync"
                    and c.query.get("since")])

    def expect_connection(self) -> None:
        self._syncs = self._long_polls()

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_until(lambda: self._long_polls() > self._syncs, timeout,
                                   "the provider to sync")

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        sender = BOB if chat == self.group_chat else self.fake.alice
        file = (document[0], document[1], "text/csv") if document else None
        event = self.fake.user_says(chat, text, sender=sender, mention=mention,
                                    reply_to=reply_to.id if reply_to else None, file=file)
        return UserMessage(chat, event["event_id"])

    async def redeliver(self, message: UserMessage) -> None:
        self.fake.replay(message.ref)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: the provider synced with a token past the event (it never asks for it
        again)."""
        [pos] = [p for p, _, e in self.fake.stream if e.get("event_id") == message.ref]
        return any(int(c.query["since"].removeprefix("s")) >= pos for c in self.fake.calls
                   if c.path.endswith("sync") and c.query.get("since"))

    def shown(self, chat: str | None = None) -> list[Shown]:
        out = []
        for event in self.fake.bot_messages(chat or self.direct_chat):
            content = self.fake.current(event)
            formatted = content.get("formatted_body")
            raw = formatted.replace("<br>", "\n") if formatted else str(content.get("body"))
            text, code = read_html(formatted) if formatted else (raw, ())
            kind = {"m.image": "image", "m.file": "file"}.get(content.get("msgtype"), "text")
            data = self.fake.media_bytes(content["url"]) if kind != "text" else None
            out.append(Shown(id=event["event_id"], text="" if data else text, raw=raw,
                             code=code, kind=kind, data=data,
                             edits=len(self.fake.edits.get(event["event_id"], []))))
        return out

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold[chat] = (after, retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        return [self.fake.sent_at[e["event_id"]]
                for e in self.fake.bot_messages(chat or self.direct_chat)]

    async def changed(self) -> None:
        await self.fake._wait_change(0.5)  # noqa: SLF001 - the fake's change notification
