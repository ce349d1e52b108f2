"""A chat's order is delivery order, under load: hundreds of messages over many Telegram chats
at once, answered by a streaming model (live previews edited as it writes), through the real
provider (python-telegram-bot) against the fake Bot API — with and without the platform's 429
windows. Every answer names its message, so the chat itself shows whether an answer came
twice, never came, or came above an earlier one; a preview left behind shows as a stray message.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pluto.gateway.app import Gateway
from pluto.providers.telegram import TelegramProvider
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig, ProviderConfig
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import ApiError
from tests.helpers.chat_order import problems, shown
from tests.helpers.gateway import provider_context

TOKEN_ENV = "PLUTO_ORDER_TELEGRAM_TOKEN"
FIRST_CHAT = 5000
WORDS = "and here is the rest of that answer, written a few words at a time"


def answer(text: str) -> str:
    return f"answer to {text}: {WORDS}"


class WindowedTelegram(FakeTelegram):
    """The fake Bot API, plus windows in which every send, edit and typing call answers 429
    with the time left (as Telegram does when a bot floods)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed_until = 0.0
        self.refused = 0

    def close_for(self, seconds: float) -> None:
        self.closed_until = time.monotonic() + seconds

    def _window(self) -> None:
        left = self.closed_until - time.monotonic()
        if left > 0:
            self.refused += 1
            raise ApiError.too_many(max(1, round(left)))

    async def _m_send_message(self, p: dict, files: dict) -> dict:
        self._window()
        return await super()._m_send_message(p, files)

    async def _m_edit_message_text(self, p: dict, files: dict) -> dict:
        self._window()
        return await super()._m_edit_message_text(p, files)

    async def _m_send_chat_action(self, p: dict, files: dict) -> bool:
        self._window()
        return await super()._m_send_chat_action(p, files)


@dataclass
class Burst:
    fake: WindowedTelegram
    gw: Gateway
    chats: list[int]
    asked: dict[int, list[str]] = field(default_factory=dict)

    def ask(self, per_chat: int) -> None:
        """``per_chat`` messages to every chat, interleaved across chats, all at once."""
        for i in range(per_chat):
            for chat in self.chats:
                text = f"c{chat}m{len(self.asked.setdefault(chat, []))}"
                self.asked[chat].append(text)
                self.fake.inject_message(chat, text)

    def shown(self, chat: int) -> list[str]:
        return shown(self.fake, chat)

    def expected(self, chat: int) -> list[str]:
        return [answer(t) for t in self.asked.get(chat, [])]

    def complete(self) -> bool:
        return all(self.shown(c) == self.expected(c) for c in self.chats)

    async def settle(self, timeout: float) -> None:
        """Wait until every chat shows its answers, or the gateway has nothing left to do."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.complete() and loop.time() < deadline:
            await asyncio.sleep(0.2)
        async with asyncio.timeout(max(1.0, deadline - loop.time())):
            await self.gw.pipeline.lanes.idle()
            await self.gw.outbox.idle()

    def problems(self) -> dict[int, list[str]]:
        """Per chat, what is wrong: out of order, twice, lost, or a stray message."""
        found = {c: problems(self.shown(c), self.expected(c)) for c in self.chats}
        return {c: notes for c, notes in found.items() if notes}


@pytest.fixture
async def burst(config_dir: Path, data_dir: Path) -> AsyncIterator[Burst]:
    fake = WindowedTelegram()
    await fake.start()
    os.environ[TOKEN_ENV] = fake.token
    chats = [FIRST_CHAT + i for i in range(60)]
    for chat in chats:
        fake.add_chat(chat, first_name=f"user{chat}")
    model = ScriptedModel(fallback=lambda msgs: Scripted(
        text=answer(msgs[-1]["content"]), chunk=9, delay=0.01))
    config = PlutoConfig(data_dir=data_dir, gateway={"stream_edit_interval_seconds": 0.2})
    gw = Gateway(config_dir, config=config, model_factory=model)
    await gw.start()
    try:
        ctx = provider_context(ProviderConfig(enabled=True, token_env=TOKEN_ENV,
                                              base_url=fake.url, poll_timeout=1),
                               data_dir, None, name="telegram")
        gw.add_provider(TelegramProvider.from_context(ctx))
        yield Burst(fake, gw, chats)
    finally:
        await gw.stop()
        await fake.stop()
        os.environ.pop(TOKEN_ENV, None)


async def test_600_messages_over_60_chats_are_answered_in_order_once(burst: Burst) -> None:
    burst.ask(10)
    await burst.settle(timeout=240)
    assert burst.problems() == {}
    assert sum(len(burst.shown(c)) for c in burst.chats) == 600
    assert burst.fake.edits()  # the answers were shown as they were written


async def test_429_windows_delay_chats_without_reordering_them(burst: Burst) -> None:
    burst.ask(7)
    for _ in range(3):  # three 4-second windows while the answers stream
        await burst.fake.wait_until(lambda: burst.fake.edits() or burst.fake.messages(),
                                    timeout=60, what="the bot to speak")
        burst.fake.close_for(4)
        await asyncio.sleep(4.5)  # the window itself: the platform's time, not a wait for us
        burst.ask(1)
    await burst.settle(timeout=240)
    assert burst.fake.refused > 0
    assert burst.problems() == {}
