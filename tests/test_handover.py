"""Acknowledge only what is recorded: provider details the conformance scenario
(tests/conformance/test_store_failure.py) does not reach — a Telegram batch recorded only in
part, the webhook's 503, the outage's log lines, the backoff and Discord's give-up."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import aiohttp
import pytest

from pluto.providers.handover import MAX_PAUSE, HandOver, NotRecorded
from pluto.providers.telegram import TelegramProvider, TelegramSettings
from pluto.providers.telegram.provider import SECRET_HEADER
from pluto.types import IncomingMessage
from tests.helpers.gateway import RecordingIntake
from tests.fakes.discord_server import FakeDiscord
from tests.test_discord import restore_redirect  # noqa: F401 - a fixture (autouse)
from tests.test_telegram import DM, fake, http_server, make, serve  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")


@pytest.fixture
async def discord_fake():  # type: ignore[no-untyped-def]
    async with FakeDiscord(heartbeat_interval=1.0) as server:
        yield server


class FailingIntake(RecordingIntake):
    """Refuses (like a full disk) every message whose text is in ``refuse``."""

    def __init__(self, *refuse: str) -> None:
        super().__init__()
        self.refuse = set(refuse)
        self.refused: list[str] = []

    async def submit(self, msg: IncomingMessage):  # type: ignore[no-untyped-def]
        if msg.text in self.refuse:
            self.refused.append(msg.text)
            raise sqlite3.OperationalError("database or disk is full")
        return await super().submit(msg)


def pending(fake) -> list[str]:  # type: ignore[no-untyped-def]
    return [u["message"]["text"] for u in fake.pending_updates]


async def test_a_batch_is_confirmed_only_up_to_the_first_update_not_recorded(fake, data_dir):
    for text in ("one", "two", "three"):  # waiting before the first poll: one batch
        fake.inject_message(DM, text)
    provider = make(fake, data_dir)
    intake = FailingIntake("two")
    task = asyncio.create_task(provider.run(intake))
    try:
        await fake.wait_until(lambda: len(intake.refused) >= 3, what="three tries of 'two'")
        assert [m.text for m in intake.got] == ["one"]  # "three" waits behind "two"
        assert pending(fake) == ["two", "three"]  # confirmed up to "one" only
        polls = len(fake.calls_to("getUpdates"))
        assert polls <= 6  # it paused between tries (no busy loop)
        intake.refuse.clear()  # storage works again
        await fake.wait_until(lambda: len(intake.got) == 3, what="the rest")
        await fake.wait_until_confirmed()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await provider.close()
    assert [m.text for m in intake.got] == ["one", "two", "three"]
    assert not provider.handover.failing


async def test_the_webhook_answers_503_until_the_message_is_recorded(fake, data_dir,
                                                                      http_server):
    app, runner = http_server
    settings = TelegramSettings(enabled=True, base_url=fake.url, mode="webhook",
                                public_url="http://127.0.0.1:1")
    provider = TelegramProvider(settings, fake.token, data_dir=data_dir,
                                webhook_secret="s3cret", http_app=app)
    base = await serve(runner)
    provider.settings = settings.model_copy(update={"public_url": base})
    intake = FailingIntake("hello")
    task = asyncio.create_task(provider.run(intake))
    try:
        await fake.wait_until(lambda: fake.webhook_url is not None, what="the webhook")
        fake.inject_message(DM, "hello")
        await fake.wait_until(lambda: len(fake.webhook_deliveries) >= 2, what="a redelivery")
        assert {d["status"] for d in fake.webhook_deliveries} == {503}
        assert pending(fake) == ["hello"]
        intake.refuse.clear()
        await fake.wait_until_confirmed()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await provider.close()
    assert [m.text for m in intake.got] == ["hello"]
    assert fake.webhook_deliveries[-1]["status"] == 200
    async with aiohttp.ClientSession() as http:  # (the endpoint still checks its secret)
        async with http.post(base + "/telegram/webhook", json={},
                             headers={SECRET_HEADER: "wrong"}) as resp:
            assert resp.status == 401


async def test_an_outage_is_logged_once_and_its_end_once(caplog):
    caplog.set_level(logging.INFO, logger="pluto.providers.handover")
    handover = HandOver("chat")
    msg = IncomingMessage(provider="chat", chat_id="1", user_id="u", text="hi")

    async def broken(m: IncomingMessage) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    async def works(m: IncomingMessage) -> str:
        return "ticket"

    pauses = []
    for _ in range(20):
        with pytest.raises(NotRecorded) as info:
            await handover(broken, msg)
        pauses.append(handover.backoff())
    assert str(info.value) == "the message could not be recorded"  # no driver text for users
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert pauses[0] > 0 and pauses == sorted(pauses) and pauses[-1] == MAX_PAUSE
    assert await handover(works, msg) == "ticket"
    assert await handover(works, msg) == "ticket"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(errors) == 1 and "database or disk is full" in errors[0].getMessage()
    assert len(infos) == 1 and "20 hand-over(s) refused" in infos[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # no stack trace per message
    assert handover.backoff() == 0 and not handover.failing


async def test_persist_retries_then_gives_up_once_the_outage_is_old(monkeypatch):
    monkeypatch.setattr("pluto.providers.handover.FIRST_PAUSE", 0.01)
    handover = HandOver("chat")
    msg = IncomingMessage(provider="chat", chat_id="1", user_id="u", text="hi")
    calls = 0

    async def flaky(m: IncomingMessage) -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise sqlite3.OperationalError("disk I/O error")
        return "ticket"

    assert await handover.persist(flaky, msg) == "ticket"
    assert calls == 4

    async def broken(m: IncomingMessage) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    with pytest.raises(NotRecorded):
        await handover.persist(broken, msg, give_up_after=0.1)
    tries = handover.failures
    with pytest.raises(NotRecorded):  # the outage is old now: one try, then the person is told
        await handover.persist(broken, msg, give_up_after=0.1)
    assert handover.failures == tries + 1


async def test_discord_keeps_a_message_then_asks_for_it_again_after_a_long_outage(
        discord_fake, monkeypatch, data_dir):
    from tests.test_discord import Running
    from tests.test_discord import make as make_discord

    monkeypatch.setattr("pluto.providers.handover.GIVE_UP_AFTER", 0.5)
    monkeypatch.setattr("pluto.providers.handover.FIRST_PAUSE", 0.05)
    dm = int(discord_fake.add_dm(discord_fake.default_user)["id"])
    provider = make_discord(discord_fake, data_dir)
    running = Running(provider, discord_fake)
    running.intake = intake = FailingIntake("kept", "lost")
    running.got = intake.got
    async with running:
        discord_fake.inject_message(dm, "kept")
        await discord_fake.wait_until(lambda: len(intake.refused) >= 3, what="tries")
        intake.refuse.discard("kept")  # storage back within the window: recorded, no notice
        await running.wait(1)
        discord_fake.inject_message(dm, "lost")  # an outage past the window: the person is told
        notice = await discord_fake.wait_until(
            lambda: [m for m in discord_fake.messages(dm) if "send it again" in m.content],
            what="the notice")
    assert [m.text for m in intake.got] == ["kept"]
    assert intake.refused.count("lost") >= 2  # tried again before giving up
    assert len(notice) == 1 and "Traceback" not in notice[0].content


async def test_slack_answers_503_until_recorded_for_both_copies_of_a_message(
        config_dir, data_dir):
    """The Events API: each refused post is answered 503 (never a 2xx, no X-Slack-No-Retry),
    and the app_mention + message pair of one channel message is confirmed only once the
    message is recorded, then answered once."""
    from tests.conformance.slack_harness import SlackHttpHarness
    from tests.conformance.test_store_failure import FailingInbox

    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        gateway = await h.start()
        store = FailingInbox(gateway.store.inbound)
        said = await h.user_says("hello bot", chat=h.group_chat, mention=True)
        deliveries = said.ref.deliveries
        assert {d.event["type"] for d in deliveries} == {"app_mention", "message"}
        await h.fake.wait_until(lambda: all(len(d.attempts) >= 2 for d in deliveries),
                                what="every event posted again")
        statuses = {a.status for d in deliveries for a in d.attempts if a.status}
        assert statuses == {503}
        store.heal()
        await h.wait_texts(["echo: hello bot"], chat=h.group_chat)
        await h.fake.wait_until(lambda: all(d.acked for d in deliveries), what="both acked")
        # A barrier: a later message in the same chat is answered after anything the first
        # one's second copy could have caused, so once its answer is shown, nothing else came.
        await h.user_says("marker", chat=h.group_chat, mention=True)
        await h.wait_shown(lambda shown: "echo: marker" in [s.text for s in shown],
                           chat=h.group_chat, what="the marker's answer")
        assert [s.text for s in h.shown(h.group_chat)] == ["echo: hello bot", "echo: marker"]
        assert len(h.model.calls) == 2 and len(store.accepted) == 2
    finally:
        await h.close()
