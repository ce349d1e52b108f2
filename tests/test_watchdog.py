"""The send watchdog: a provider whose sends all fail for a window is wedged (named for
/readyz), its client is rebuilt, it gets another window, and it is well again at the first send
that works. End to end: a Telegram send pool wedged for real (encode/httpcore#1093) is rebuilt
and the reply the outbox held goes out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from telegram import Bot
from telegram.error import TimedOut
from telegram.request import HTTPXRequest

from pluto.errors import DeliveryRefused, ProviderError, RateLimited
from pluto.gateway.app import Gateway
from pluto.gateway.delivery.outbox import Outbox, RetryPolicy
from pluto.gateway.delivery.watchdog import SendWatchdog
from pluto.gateway.ports import Provider
from pluto.providers.telegram import TelegramProvider, TelegramSettings
from pluto.settings import GatewayLimits, PlutoConfig
from pluto.storage.sqlite import SqliteStore
from pluto.types import OutgoingMessage
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.gateway import RecordingProvider
from tests.test_telegram_send_path import CHAT, MAX_ROUNDS, _quiet_fake_server, churn  # noqa: F401

WINDOW = 60.0
POOL_DOWN = ProviderError("Telegram request not sent: pool timeout (all connections in the "
                          "connection pool are occupied)")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Resettable(RecordingProvider):
    def __init__(self, name: str = "chat", *, fails: bool = False) -> None:
        super().__init__(name)
        self.resets = 0
        self.reset_fails = fails

    async def reset(self) -> None:
        self.resets += 1
        if self.reset_fails:
            raise ProviderError("still unreachable")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def resets() -> list[str]:
    return []


@pytest.fixture
def dog(clock: Clock, resets: list[str]) -> SendWatchdog:
    return SendWatchdog(window=WINDOW, clock=clock, on_reset=resets.append)


async def test_failures_for_a_whole_window_wedge_a_provider_and_reset_it_once_per_window(
        dog, clock, resets, caplog):
    caplog.set_level(logging.INFO, logger="pluto.gateway.delivery.watchdog")
    p = Resettable()
    providers: dict[str, Provider] = {p.name: p}
    dog.failed(p.name, POOL_DOWN)
    clock.now += WINDOW - 1
    dog.failed(p.name, POOL_DOWN)
    assert dog.wedged() == {} and await dog.check(providers) == [] and p.resets == 0

    clock.now += 1  # a whole window of nothing but failures
    assert dog.wedged() == {"chat": str(POOL_DOWN)}
    assert await dog.check(providers) == ["chat"] and p.resets == 1 and resets == ["chat"]

    clock.now += WINDOW / 2  # the reset has its window; still failing, still named
    dog.failed(p.name, POOL_DOWN)
    assert await dog.check(providers) == [] and p.resets == 1
    assert dog.wedged() == {"chat": str(POOL_DOWN)}

    clock.now += WINDOW / 2  # a window after the reset, still failing: rebuilt again
    dog.failed(p.name, POOL_DOWN)
    assert await dog.check(providers) == ["chat"] and p.resets == 2

    dog.succeeded(p.name)  # the first send that works ends it
    assert dog.wedged() == {} and await dog.check(providers) == []
    # (its own lines: a summary of lines another test's logging cut may come meanwhile)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "pluto.gateway.delivery.watchdog"]
    assert len(lines) == 2, lines  # one line for the wedge, one for the recovery
    assert "every send failed for 60s" in lines[0] and "pool timeout" in lines[0]
    assert "sends work again" in lines[1] and "2 client reset(s)" in lines[1]


async def test_one_success_starts_the_window_again(dog, clock):
    dog.failed("chat", POOL_DOWN)
    clock.now += WINDOW - 1
    dog.succeeded("chat")
    dog.failed("chat", POOL_DOWN)
    clock.now += WINDOW - 1
    assert dog.wedged() == {}


async def test_refusals_and_rate_limits_are_the_platform_answering(dog, clock):
    dog.failed("chat", POOL_DOWN)
    clock.now += WINDOW / 2
    dog.failed("chat", RateLimited("slow down", retry_after=30))
    dog.failed("other", DeliveryRefused("bot was blocked by the user"))
    clock.now += WINDOW
    assert dog.wedged() == {}


async def test_a_failed_reset_is_tried_again_after_another_window(dog, clock):
    p = Resettable(fails=True)
    providers: dict[str, Provider] = {p.name: p}
    dog.failed(p.name, POOL_DOWN)
    clock.now += WINDOW
    assert await dog.check(providers) == ["chat"] and p.resets == 1
    dog.failed(p.name, POOL_DOWN)
    clock.now += WINDOW
    assert await dog.check(providers) == ["chat"] and p.resets == 2
    assert "chat" in dog.wedged()


async def test_a_reset_followed_by_a_quiet_window_is_well_again(dog, clock):
    p = Resettable()
    providers: dict[str, Provider] = {p.name: p}
    dog.failed(p.name, POOL_DOWN)
    clock.now += WINDOW
    await dog.check(providers)
    clock.now += WINDOW  # nothing failed since the rebuild (nothing was sent either)
    assert await dog.check(providers) == [] and dog.wedged() == {} and p.resets == 1


async def test_a_provider_no_longer_running_is_forgotten_and_zero_turns_it_off(clock):
    window = [WINDOW]
    dog = SendWatchdog(window=lambda: window[0], clock=clock)
    dog.failed("gone", POOL_DOWN)
    clock.now += WINDOW
    assert await dog.check({}) == [] and dog.wedged() == {}
    dog.failed("chat", POOL_DOWN)
    clock.now += WINDOW
    window[0] = 0  # (live reload) the watch is off
    assert dog.wedged() == {} and await dog.check({"chat": Resettable()}) == []


# the gateway ------------------------------------------------------------------------------------

async def test_the_gateway_watches_every_send_with_its_setting(config_dir, data_dir):
    config = PlutoConfig(data_dir=data_dir, gateway=GatewayLimits(send_wedged_seconds=90))
    async with Gateway(config_dir, config=config) as gw:
        assert gw.outbox.watchdog is gw.watchdog and gw.watchdog.window == 90
        p = RecordingProvider()
        gw.add_provider(p)
        p.fail_next(POOL_DOWN)
        await gw.delivery.outbox.deliver(p, "r1", [OutgoingMessage(chat_id="c", text="hi")])
        await gw.outbox.idle()
        assert [m.text for m in p.sent] == ["hi"] and gw.watchdog.wedged() == {}
        gw.metrics.provider_reset("test")
        assert b'pluto_provider_resets_total{provider="test"} 1.0' in gw.metrics.render()[0]


# end to end: a Telegram pool wedged for real ---------------------------------------------------

@pytest.fixture
async def fake(_quiet_fake_server: None) -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        server.add_chat(CHAT, first_name="Alice")
        server.set_latency(0.02, "sendChatAction")
        yield server


async def wedged_stock_bot(fake: FakeTelegram, attempts: int = 3) -> Bot:
    """A Bot on python-telegram-bot's own HTTPXRequest, its pool wedged by cancelled typing.
    The leak is a race: a pool that survived MAX_ROUNDS (about one run in four on a busy
    machine) is dropped and a fresh one churned, up to ``attempts`` times."""
    for _ in range(attempts):
        bot = Bot(fake.token, base_url=f"{fake.url}/bot",
                  request=HTTPXRequest(connection_pool_size=2, pool_timeout=0.2))
        await bot.initialize()
        for _ in range(MAX_ROUNDS):
            await churn(lambda _: bot.send_chat_action(CHAT, "typing"))
            try:
                await bot.send_message(CHAT, "probe")
            except TimedOut:
                return bot
        await bot.shutdown()
    pytest.fail(f"the stock pool did not wedge in {attempts} pools of {MAX_ROUNDS} rounds")


async def test_a_wedged_telegram_pool_is_rebuilt_and_the_held_reply_goes_out(
        fake, data_dir: Path, caplog):
    caplog.set_level(logging.INFO, logger="pluto.gateway.delivery.watchdog")
    settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5)
    telegram = TelegramProvider(settings, fake.token, data_dir=data_dir)
    await telegram.probe()
    stuck = await wedged_stock_bot(fake)
    telegram.bot = telegram.outbound.bot = stuck  # as the old provider was after such a load
    providers: dict[str, Provider] = {telegram.name: telegram}
    resets: list[str] = []
    dog = SendWatchdog(window=0.5, on_reset=resets.append)
    watching = asyncio.create_task(dog.run(providers))
    async with SqliteStore(data_dir / "pluto.db") as store:
        box = Outbox(store.outbox, providers, sweep_seconds=0, watchdog=dog,
                     retry=RetryPolicy(attempts=1000, base_delay=0.05, max_delay=0.1))
        await box.open()
        try:
            done = await box.deliver(telegram, "r1", [OutgoingMessage(
                chat_id=str(CHAT), text="held, then delivered")])
            assert await asyncio.wait_for(done, 30)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await box.close()
            await telegram.close()
            await stuck.shutdown()
    assert [m.text for m in fake.messages(CHAT) if m.text.startswith("held")] == [
        "held, then delivered"]
    assert resets == ["telegram"] and dog.wedged() == {}
    lines = [r.getMessage() for r in caplog.records if r.name.endswith(".watchdog")]
    assert len(lines) == 2, lines
    assert "Telegram request not sent: pool timeout" in lines[0]
    assert "sends work again" in lines[1]
    assert fake.token not in caplog.text
