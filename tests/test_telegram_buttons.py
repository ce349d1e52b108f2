"""Telegram approval buttons (issue 33): the inline keyboard, callback queries answered in time
and once, forged data refused, refusals private, redelivered clicks one decision.

The provider runs against the fake Bot API (tests/fakes/telegram_*); the end-to-end scenarios
(a click runs the tool once, a deny, a stranger refused) are in tests/conformance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.providers.telegram import TelegramProvider, TelegramSettings
from pluto.types import Button, IncomingMessage, OutgoingMessage
from tests.conformance.telegram_harness import TelegramHarness
from tests.conformance.test_scenarios import approving, request_shown
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.gateway import RecordingIntake

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

DM = 4242
GROUP = -1001234567890
STRANGER = 999
APPROVAL = "abcdef2345"
BUTTONS = (Button("Approve", f"/approve {APPROVAL}", "primary"),
           Button("Deny", f"/deny {APPROVAL}", "danger"))
REFUSAL = "Only Alice can decide this request."


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        server.add_chat(DM, first_name="Alice")
        server.add_chat(GROUP, title="Team")
        yield server


class Approvals:
    """``ProviderContext.approvals`` as the gateway answers it: Alice (4242, or 777 in the
    group) may decide, anyone else is told why not."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str, str]] = []

    async def __call__(self, provider: str, chat_id: str, user_id: str,
                       approval_id: str) -> str | None:
        self.asked.append((provider, chat_id, user_id, approval_id))
        return None if user_id in (str(DM), "777") else REFUSAL


class Running:
    """A provider receiving in the background; ``got`` is what it handed to the gateway."""

    def __init__(self, fake: FakeTelegram, data_dir: Path):
        self.fake = fake
        self.approvals = Approvals()
        settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5)
        self.provider = TelegramProvider(settings, fake.token, data_dir=data_dir,
                                         approvals=self.approvals)
        self.intake = RecordingIntake()
        self.got: list[IncomingMessage] = self.intake.got
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.provider.run(self.intake))
        await self.fake.wait_for_calls("getUpdates", 1, answered=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.provider.close()

    async def request(self, chat: int = DM) -> int:
        sent = await self.provider.send(OutgoingMessage(chat_id=str(chat), text="May I?",
                                                        buttons=BUTTONS))
        assert sent is not None
        return int(sent)

    async def wait(self, n: int) -> list[IncomingMessage]:
        await self.fake.wait_until(lambda: len(self.got) >= n, what=f"{n} message(s)")
        return self.got


async def test_buttons_are_an_inline_keyboard_and_clicks_are_asked_for(fake, data_dir):
    async with Running(fake, data_dir) as r:
        mid = await r.request()
    assert fake.buttons(DM, mid) == [("Approve", f"/approve {APPROVAL}"),
                                     ("Deny", f"/deny {APPROVAL}")]
    polls = fake.calls_to("getUpdates")
    assert "callback_query" in polls[-1].params["allowed_updates"]


async def test_a_click_is_answered_then_handed_over_as_the_command(fake, data_dir):
    async with Running(fake, data_dir) as r:
        mid = await r.request()
        query = await fake.click(DM, mid, "Approve")
        [got] = await r.wait(1)
        await fake.wait_until(lambda: fake.buttons(DM, mid) == [], what="the keyboard gone")
    assert (query.text, query.show_alert) == ("Approved", False)
    assert (got.text, got.chat_id, got.user_id) == (f"/approve {APPROVAL}", str(DM), str(DM))
    assert got.message_id == f"click:{query.id}" and got.is_direct and got.mentions_bot
    assert r.approvals.asked == [("telegram", str(DM), str(DM), APPROVAL)]
    assert fake.callback_failures == []


@pytest.mark.parametrize("data", ["/approve ../../etc", "/approve abcdef2345; rm -rf /",
                                  "/delete abcdef2345", "x" * 64, "{}"])
async def test_forged_callback_data_is_refused_and_nothing_handed_over(fake, data_dir, data):
    async with Running(fake, data_dir) as r:
        mid = await r.request()
        forged = fake.inject_callback_query(DM, mid, data)
        answer = await fake.wait_answered(forged["callback_query"]["id"])
        await fake.click(DM, mid, "Deny")  # a barrier: clicks are handled in order
        [got] = await r.wait(1)
    assert (answer.text, answer.show_alert) == ("This button is no longer valid", True)
    assert got.text == f"/deny {APPROVAL}"
    assert r.approvals.asked == [("telegram", str(DM), str(DM), APPROVAL)]  # never for forged
    assert fake.callback_failures == []


async def test_a_refusal_is_a_private_alert_and_nothing_reaches_the_chat(fake, data_dir):
    async with Running(fake, data_dir) as r:
        mid = await r.request(GROUP)
        query = await fake.click(GROUP, mid, "Approve", user_id=STRANGER)
        await fake.click(GROUP, mid, "Approve", user_id=777)  # a barrier: handed over
        [got] = await r.wait(1)
    assert (query.text, query.show_alert) == (REFUSAL, True)
    assert fake.notes_for(STRANGER) == [REFUSAL]
    assert got.user_id == "777" and not got.is_direct
    assert len(fake.messages(GROUP)) == 1  # only the request: nothing said in the group
    assert fake.callback_failures == []


async def test_a_redelivered_callback_is_one_click_answered_once(fake, data_dir):
    async with Running(fake, data_dir) as r:
        mid = await r.request()
        query = await fake.click(DM, mid, "Approve")
        update = next(u for u in fake._updates.values()  # noqa: SLF001
                      if u.get("callback_query", {}).get("id") == query.id)
        fake.redeliver(update["update_id"])
        got = await r.wait(2)
    assert got[0].message_id == got[1].message_id == f"click:{query.id}"  # the inbox dedupes
    answers = fake.calls_to("answerCallbackQuery")
    assert len(answers) == 1 and answers[0].status == 200
    assert fake.callback_failures == []


async def test_a_redelivered_click_is_one_decision_through_the_gateway(config_dir, data_dir):
    harness = TelegramHarness(config_dir=config_dir, data_dir=data_dir)
    await harness.open()
    try:
        deleter = await approving(harness, "Deleted old.log.")
        await harness.user_says("delete the old log")
        shown = await harness.wait_shown(lambda s: request_shown(s) is not None,
                                         what="the request")
        ask = request_shown(shown)
        await harness.click(ask, "Approve")
        await harness.wait_shown(lambda s: any(m.text == "Deleted old.log." for m in s),
                                 what="the answer")
        [query] = harness.fake.callbacks
        update = next(u for u in harness.fake._updates.values()  # noqa: SLF001
                      if u.get("callback_query", {}).get("id") == query.id)
        harness.fake.redeliver(update["update_id"])
        await harness.fake.wait_until(lambda: not harness.fake.pending_updates,
                                      what="the redelivery taken")
        await harness.settled()
        assert deleter.calls == ["/srv/old.log"]
        assert [m.text for m in harness.shown()].count("Deleted old.log.") == 1
        assert harness.fake.callback_failures == []
    finally:
        await harness.close()


async def test_callback_data_over_64_bytes_is_never_sent(fake, data_dir):
    long = Button("Approve", "/approve " + "a" * 60)
    async with Running(fake, data_dir) as r:
        sent = await r.provider.send(OutgoingMessage(chat_id=str(DM), text="May I?",
                                                     buttons=(long, BUTTONS[1])))
    assert sent is not None
    assert fake.buttons(DM, int(sent)) == [("Deny", f"/deny {APPROVAL}")]
    for call in fake.calls_to("sendMessage"):
        rows = (call.params.get("reply_markup") or {}).get("inline_keyboard") or []
        assert all(len(b["callback_data"].encode()) <= 64 for row in rows for b in row)


# the fake's button mechanics ------------------------------------------------------------------

async def _api(fake: FakeTelegram, method: str, body: dict[str, Any]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{fake.base_url}{fake.token}/{method}", json=body) as resp:
            return resp.status, await resp.json()


async def test_the_fake_refuses_callback_data_over_64_bytes(fake):
    for data in ("x" * 65, ""):
        status, body = await _api(fake, "sendMessage", {
            "chat_id": DM, "text": "hi",
            "reply_markup": {"inline_keyboard": [[{"text": "Go", "callback_data": data}]]}})
        assert (status, body["description"]) == (400, "Bad Request: BUTTON_DATA_INVALID")
    assert fake.messages(DM) == []


async def test_the_fake_answers_a_callback_once_and_records_late_ones(fake):
    status, body = await _api(fake, "sendMessage", {
        "chat_id": DM, "text": "hi",
        "reply_markup": {"inline_keyboard": [[{"text": "Go", "callback_data": "/go"}]]}})
    mid = body["result"]["message_id"]
    query = fake.inject_callback_query(DM, mid, "/go")["callback_query"]
    first = await _api(fake, "answerCallbackQuery", {"callback_query_id": query["id"]})
    second = await _api(fake, "answerCallbackQuery", {"callback_query_id": query["id"]})
    assert first[0] == 200 and second[0] == 400
    assert "query is too old" in second[1]["description"]
    assert fake.callback_failures == []
    fake.callback_window = 0.05
    never = fake.inject_callback_query(DM, mid, "/go")["callback_query"]
    await fake.wait_until(lambda: fake.callback_failures, what="the unanswered query recorded")
    assert never["id"] in fake.callback_failures[0]
