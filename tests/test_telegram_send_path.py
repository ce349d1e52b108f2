"""Telegram's send path cannot wedge: cancelled calls under pool contention never use it up.

The pinned httpcore (1.0.9, behind python-telegram-bot's HTTPXRequest) loses a connection slot
for good when a request waiting for a connection is cancelled just after the pool handed it a
new one (encode/httpcore#1093); under load the typing indicator's cancel did that until every
send failed with "Pool timeout". The fake Telegram answers slowly here, a small pool is
contended by many typing calls, and most of them are cancelled while in flight or queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from telegram import Bot
from telegram.error import NetworkError, TimedOut
from telegram.request import HTTPXRequest

from pluto.errors import ProviderError
from pluto.providers.telegram import TelegramProvider, TelegramSettings
from pluto.providers.telegram.errors import provider_error
from pluto.types import OutgoingMessage
from tests.fakes.telegram_server import FakeTelegram

CHAT = 4242
POOL = 2
PER_ROUND = 60  # calls started per round, for a pool of POOL connections
MAX_ROUNDS = 600  # the stock class wedged within 1-81 rounds in 8 of 8 runs (~0.5-4 s)


@pytest.fixture(autouse=True)
def _quiet_fake_server() -> Iterator[None]:
    # the fake logs every request whose client went away (most of them, here)
    server_log = logging.getLogger("aiohttp.server")
    level = server_log.level
    server_log.setLevel(logging.CRITICAL)
    yield
    server_log.setLevel(level)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        server.add_chat(CHAT, first_name="Alice")
        server.set_latency(0.02, "sendChatAction")  # slow enough to contend a pool of 2
        yield server


async def churn(call: Callable[[int], Awaitable[object]]) -> None:
    """One round: PER_ROUND calls at once, each cancelled 5-40 ms later (in flight or queued,
    many in the same turn of the loop, as typing indicators are when replies end)."""
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(call(i)) for i in range(PER_ROUND)]
    for i, task in enumerate(tasks):
        loop.call_later((1 + i % 8) * 0.005, task.cancel)
    await asyncio.gather(*tasks, return_exceptions=True)


async def rounds_to_wedge_stock_request(fake: FakeTelegram, attempts: int = 3) -> int:
    """The reproduction: python-telegram-bot's own HTTPXRequest under the churn. Returns the
    round after which every send fails with a pool timeout. The leak is a race: a pool that
    survived MAX_ROUNDS (about one run in four on a busy machine) is dropped and a fresh one
    churned, up to ``attempts`` times."""
    for _ in range(attempts):
        bot = Bot(fake.token, base_url=f"{fake.url}/bot",
                  request=HTTPXRequest(connection_pool_size=POOL, pool_timeout=0.5))
        await bot.initialize()
        try:
            for round_ in range(1, MAX_ROUNDS + 1):
                await churn(lambda _: bot.send_chat_action(CHAT, "typing"))
                try:
                    await bot.send_message(CHAT, f"after round {round_}")
                except TimedOut as e:
                    failure = e
                    break
            else:
                continue  # this pool survived: a fresh one
            for _ in range(3):  # for good: with nothing else running, no slot ever comes back
                with pytest.raises(TimedOut, match="Pool timeout"):
                    await bot.send_message(CHAT, "still wedged?")
            # what the mapping makes of it names the real cause, not "did not answer in time"
            error = provider_error(failure)
            assert str(error).startswith("Telegram request not sent: pool timeout"), error
            assert error.unsent  # (never left: not a chunk that may have been delivered)
            assert fake.token not in str(error)
            return round_
        finally:
            await bot.shutdown()
    pytest.fail(f"the stock HTTPXRequest did not wedge in {attempts} pools of {MAX_ROUNDS} "
                "rounds: encode/httpcore#1093 may be fixed (SendRequest may be unneeded)")


async def test_cancelled_typing_under_contention_never_wedges_sends(fake, data_dir: Path):
    wedged_after = await rounds_to_wedge_stock_request(fake)

    settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5)
    provider = TelegramProvider(settings, fake.token, data_dir=data_dir, send_pool=POOL)
    try:
        rounds = max(100, 3 * wedged_after)  # well past what wedged the stock class

        async def typing_or_send(i: int) -> object:
            if i % 20 == 0:  # a few sends are cancelled too
                return await provider.send(OutgoingMessage(chat_id=str(CHAT), text=f"c{i}"))
            return await provider.typing(str(CHAT))

        for _ in range(rounds):
            await churn(typing_or_send)
        for n in range(5):  # every send goes out, none is refused for want of a connection
            await provider.send(OutgoingMessage(chat_id=str(CHAT), text=f"after churn {n}"))
        texts = [m.text for m in fake.messages(CHAT)]
        assert [t for t in texts if t.startswith("after churn")] == [
            f"after churn {n}" for n in range(5)]
        request = provider.bot.request
        await fake.wait_until(lambda: request.in_flight == 0, what="requests finished")
    finally:
        await provider.close()


async def test_a_cancelled_caller_stops_waiting_and_the_request_still_completes(fake, data_dir):
    fake.set_latency(0.3, "sendMessage")
    settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5)
    provider = TelegramProvider(settings, fake.token, data_dir=data_dir, send_pool=1)
    try:
        await provider.probe()
        call = asyncio.create_task(provider.send(OutgoingMessage(chat_id=str(CHAT),
                                                                 text="sent anyway")))
        await fake.wait_for_calls("sendMessage", 1, answered=False)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call  # at once: the caller does not wait for Telegram
        await fake.wait_for_messages(CHAT, 1)  # the request went on and returned its slot
        await provider.send(OutgoingMessage(chat_id=str(CHAT), text="next"))
        assert [m.text for m in fake.messages(CHAT)] == ["sent anyway", "next"]
    finally:
        await provider.close()


async def test_no_free_connection_is_a_clear_error_and_nothing_is_sent(fake, data_dir):
    fake.set_latency(2.0, "sendMessage")
    settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5)
    provider = TelegramProvider(settings, fake.token, data_dir=data_dir, send_pool=1)
    try:
        await provider.probe()
        first = asyncio.create_task(provider.send(OutgoingMessage(chat_id=str(CHAT), text="a")))
        await fake.wait_for_calls("sendMessage", 1, answered=False)
        with pytest.raises(ProviderError) as raised:
            await provider.send(OutgoingMessage(chat_id=str(CHAT), text="b"))
        assert str(raised.value).startswith("Telegram request not sent: pool timeout (all 1 "
                                            "connections to Telegram stayed busy"), raised.value
        assert fake.token not in str(raised.value)
        await first
        assert [m.text for m in fake.messages(CHAT)] == ["a"]
    finally:
        await provider.close()


async def test_reset_rebuilds_the_send_client_and_keeps_sending(fake, data_dir):
    settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5)
    provider = TelegramProvider(settings, fake.token, data_dir=data_dir)
    try:
        await provider.send(OutgoingMessage(chat_id=str(CHAT), text="before"))
        old = provider.bot
        await provider.reset()
        assert provider.bot is not old and provider.outbound.bot is provider.bot
        assert provider.bot.username == old.username  # connected (getMe) before the swap
        await provider.send(OutgoingMessage(chat_id=str(CHAT), text="after"))
        assert [m.text for m in fake.messages(CHAT)] == ["before", "after"]
        with pytest.raises(RuntimeError):  # the old pool was shut down
            await old.request.do_request(f"{fake.url}/bot{fake.token}/getMe", "POST")
    finally:
        await provider.close()


def test_what_timed_out_says_whether_the_request_may_have_reached_telegram() -> None:
    """A connect timeout or failure: the request never left (unsent, not a "maybe delivered");
    a read timeout: Telegram may have taken it."""
    def timed_out_by(cause: Exception) -> TimedOut:
        try:
            raise TimedOut("Timed out") from cause
        except TimedOut as e:
            return e

    def network_by(cause: Exception) -> NetworkError:
        try:
            raise NetworkError(f"httpx.{type(cause).__name__}: x") from cause
        except NetworkError as e:
            return e

    connect = provider_error(timed_out_by(httpx.ConnectTimeout("x")))
    assert connect.unsent and "could not connect" in str(connect)
    read = provider_error(timed_out_by(httpx.ReadTimeout("x")))
    assert not read.unsent and "did not answer in time" in str(read)
    assert provider_error(network_by(httpx.ConnectError("refused"))).unsent
    assert not provider_error(network_by(httpx.RemoteProtocolError("cut"))).unsent
