"""Discord's 429s go into the gateway's shared, persisted per-chat flood state.

discord.py used to wait a 429 out inside its own call, so the chat's sender sat in a request
nobody could see and the hold was never kept. Now a 429 on a send is raised, the outbox holds
the chat in :class:`FloodControl` (and its store), and retries after the window — once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import discord.gateway
import discord.http
import pytest

from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.delivery.outbox import Outbox
from pluto.providers.discord import DiscordProvider, DiscordSettings
from pluto.storage.sqlite import SqliteStore
from pluto.types import OutgoingMessage
from tests.fakes.discord_server import FakeDiscord

WINDOW = 1.5  # seconds of 429s on one channel


@pytest.fixture(autouse=True)
def restore_redirect() -> Iterator[None]:
    saved = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    yield
    discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=1.0) as server:
        yield server


async def until(condition, what: str, timeout: float = 10.0) -> None:
    async def check() -> None:
        while not condition():
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(check(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def test_a_429_window_on_a_channel_is_a_kept_hold_and_the_reply_goes_once_after_it(
        fake, data_dir: Path):
    guild = fake.add_guild(name="Pluto Lab")
    held_channel = int(fake.add_channel(guild["id"], name="busy")["id"])
    free_channel = int(fake.add_channel(guild["id"], name="quiet")["id"])
    provider = DiscordProvider(DiscordSettings(enabled=True, api_base=fake.api_base,
                                               gateway_url=fake.gateway_url),
                               fake.token, data_dir=data_dir)
    await provider.probe()
    held, free = ("discord", str(held_channel)), ("discord", str(free_channel))
    async with SqliteStore(data_dir / "pluto.db") as store:
        flood = FloodControl(store.flood)
        box = Outbox(store.outbox, {"discord": provider}, flood=flood, sweep_seconds=0)
        await box.open()
        try:
            fake.rate_limit_window(held_channel, WINDOW)
            started = time.monotonic()
            later = await box.deliver(provider, "r-held", [OutgoingMessage(
                chat_id=str(held_channel), text="after the window")])
            await until(lambda: flood.remaining(held) > 0, "the hold")
            kept = {(p, c) for p, c, _ in await store.flood.holds(time.time())}
            assert held in kept  # in storage: a restart inside the window still waits
            restarted = FloodControl(store.flood)
            assert await restarted.load() == 1 and restarted.remaining(held) > 0

            now = await box.deliver(provider, "r-free", [OutgoingMessage(
                chat_id=str(free_channel), text="not held")])
            assert await asyncio.wait_for(now, 5)  # another channel is not held
            assert flood.remaining(free) == 0 and not later.done()

            assert await asyncio.wait_for(later, 10)
            assert time.monotonic() - started >= WINDOW - 0.05
        finally:
            await box.close()
            await provider.close()
    sent = [m.content for m in fake.messages(held_channel)]
    assert sent == ["after the window"]  # once
    statuses = [c.status for c in fake.calls_to("send_message")
                if c.params.get("channel_id") == str(held_channel)]
    assert statuses[0] == 429 and statuses[-1] == 200 and statuses.count(200) == 1
    assert [m.content for m in fake.messages(free_channel)] == ["not held"]
