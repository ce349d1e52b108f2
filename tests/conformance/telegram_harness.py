"""The Telegram harness: the real provider (python-telegram-bot) against the fake Bot API."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.gateway import provider_context
from pluto.settings import ProviderConfig
from pluto.gateway.ports import Provider, ProviderContext
from pluto.providers.telegram import TelegramProvider
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import ApiError

TOKEN_ENV = "PLUTO_CONFORMANCE_TELEGRAM_TOKEN"


class FloodingTelegram(FakeTelegram):
    """The fake Bot API, plus: refuse one send to a chat once it holds N bot messages."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: dict[int, tuple[int, int]] = {}  # chat → (after n messages, retry_after)
        self.refused: list[float] = []

    async def _m_send_message(self, p: dict, files: dict) -> dict:
        chat = int(p.get("chat_id") or 0)
        rule = self.hold.get(chat)
        if rule is not None and len(self.messages(chat)) >= rule[0]:
            del self.hold[chat]
            self.refused.append(time.monotonic())
            raise ApiError.too_many(rule[1])
        return await super()._m_send_message(p, files)


def _slice16(text: str, offset: int, length: int) -> str:
    data = text.encode("utf-16-le")
    return data[offset * 2:(offset + length) * 2].decode("utf-16-le")


@dataclass
class TelegramHarness(Harness):
    name: str = "telegram"
    caps: Any = TelegramProvider.capabilities
    features: frozenset[str] = frozenset(
        {"groups", "redelivery", "flood_control", "files_in", "serve", "strangers"})
    stranger: str = "999"
    direct_chat: str = "4242"
    group_chat: str = "-1001234567890"
    fake: FloodingTelegram = field(default_factory=FloodingTelegram)
    _polls: int = 0

    async def open(self) -> None:
        await self.fake.start()
        self.fake.add_chat(int(self.direct_chat), first_name="Alice")
        self.fake.add_chat(int(self.group_chat), title="Team")
        os.environ[TOKEN_ENV] = self.fake.token

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        os.environ.pop(TOKEN_ENV, None)

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "token_env": TOKEN_ENV, "base_url": self.fake.url,
                "poll_timeout": 10}

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"telegram": self.provider_config()}, {TOKEN_ENV: self.fake.token}

    async def make_provider(self) -> Provider:
        self.expect_connection()
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir, None)
        return TelegramProvider.from_context(self.checked(ctx))

    def checked(self, ctx: ProviderContext) -> ProviderContext:
        """The context as the gateway gives it: who may decide an approval is asked of it."""
        assert self.gateway is not None
        check = self.gateway.pipeline.approvals
        return dataclasses.replace(ctx, approvals=check.check if check is not None else None)

    async def click(self, message: Shown, label: str, *, chat: str | None = None,
                    user: str | None = None) -> None:
        """A press as Telegram delivers it (a callback_query update); returns once the bot
        answered the query. The button is found on the message as it is now, or as it was
        sent (a client still showing it before the keyboard was taken off)."""
        chat = chat or self.direct_chat
        default = 777 if chat == self.group_chat else int(chat)
        await self.fake.click(int(chat), int(message.id), label,
                              user_id=int(user) if user else default)
        assert not self.fake.callback_failures, self.fake.callback_failures

    def private_notes(self, user: str) -> list[str]:
        return self.fake.notes_for(int(user))

    def expect_connection(self) -> None:
        self._polls = len(self.fake.calls_to("getUpdates"))

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_for_calls("getUpdates", self._polls + 1, timeout=timeout,
                                       answered=False)

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        if mention:
            text = f"@{self.fake.bot_user['username']} {text}"
        kwargs: dict[str, Any] = {}
        if reply_to is not None:
            kwargs["reply_to_message_id"] = int(reply_to.id)
        if chat == self.group_chat:
            kwargs["user_id"] = 777
        if document is not None:
            kwargs.update(document=document[1], file_name=document[0], caption=text or None)
            update = self.fake.inject_message(int(chat), **kwargs)
        else:
            update = self.fake.inject_message(int(chat), text, **kwargs)
        return UserMessage(chat, update["update_id"])

    async def redeliver(self, message: UserMessage) -> None:
        self.fake.redeliver(message.ref)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: Telegram no longer keeps the update (a later offset, or a webhook 2xx)."""
        return all(u["update_id"] != message.ref for u in self.fake.pending_updates)

    def shown(self, chat: str | None = None) -> list[Shown]:
        chat_id = int(chat or self.direct_chat)
        records: dict[int, list[Any]] = {}
        for sent in self.fake.sent:
            if sent.chat_id == chat_id:
                records.setdefault(sent.message_id, []).append(sent)
        out = []
        for message_id, history in records.items():
            now = self.fake.message(chat_id, message_id) or {}
            text = now.get("text") or now.get("caption") or ""
            entities = now.get("entities") or now.get("caption_entities") or []
            code = tuple(_slice16(text, e["offset"], e["length"]) for e in entities
                         if e["type"] in ("pre", "code"))
            first = history[0]
            out.append(Shown(id=str(message_id), text=text, raw=history[-1].raw_text or "",
                             code=code, kind={"photo": "image", "document": "file"}.get(
                                 first.kind, "text"),
                             data=first.file_bytes, edits=len(history) - 1,
                             buttons=tuple(label for label, _ in
                                           self.fake.buttons(chat_id, message_id))))
        return out

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold[int(chat)] = (after, retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        chat_id = int(chat or self.direct_chat)
        return [s.time for s in self.fake.sent if s.chat_id == chat_id and s.kind != "edit"]

    async def changed(self) -> None:
        await self.fake._wait_change(0.5)  # noqa: SLF001 - the fake's change notification
