"""Discord approval buttons (issue 33): components under the request, component interactions
responded to within 3 s and once, forged custom_ids refused, refusals ephemeral, a click
dispatched again one decision.

The provider runs against the fake Discord (REST and the gateway websocket); the end-to-end
scenarios (a click runs the tool once, a deny, a stranger refused) are in tests/conformance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import discord.gateway
import discord.http
import pytest

from pluto.providers.discord import DiscordProvider, DiscordSettings
from pluto.types import Button, IncomingMessage, OutgoingMessage
from tests.conformance.discord_harness import DiscordHarness
from tests.conformance.test_scenarios import approving, request_shown
from tests.fakes.discord_clicks import buttons_of
from tests.fakes.discord_server import FakeDiscord
from tests.helpers.gateway import RecordingIntake

APPROVAL = "abcdef2345"
BUTTONS = (Button("Approve", f"/approve {APPROVAL}", "primary"),
           Button("Deny", f"/deny {APPROVAL}", "danger"),
           Button("Later", "/deny zzzzzz", "default"))
REFUSAL = "Only Alice can decide this request."


@pytest.fixture(autouse=True)
def restore_redirect() -> Iterator[None]:
    """The provider points discord.py (process-wide) at the fake: undo that after each test."""
    saved = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    yield
    discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=1.0) as server:
        yield server


@pytest.fixture
def world(fake: FakeDiscord) -> dict[str, int]:
    bob = fake.add_user(username="bob", global_name="Bob")
    mallory = fake.add_user(username="mallory", global_name="Mallory")
    guild = fake.add_guild(name="Pluto Lab", members=[bob["id"], mallory["id"]])
    general = fake.add_channel(guild["id"], name="general")
    dm = fake.add_dm(fake.default_user)
    return {"guild": guild["id"], "general": int(general["id"]), "dm": int(dm["id"]),
            "bob": int(bob["id"]), "mallory": int(mallory["id"]),
            "alice": int(fake.default_user["id"])}


class Approvals:
    """``ProviderContext.approvals`` as the gateway answers it: Alice and Bob may decide."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.asked: list[tuple[str, str, str, str]] = []

    async def __call__(self, provider: str, chat_id: str, user_id: str,
                       approval_id: str) -> str | None:
        self.asked.append((provider, chat_id, user_id, approval_id))
        return None if user_id in self.allowed else REFUSAL


class Running:
    """A provider receiving in the background; ``got`` is what it handed to the gateway."""

    def __init__(self, fake: FakeDiscord, world: dict[str, int], data_dir: Path):
        self.fake = fake
        self.approvals = Approvals({str(world["alice"]), str(world["bob"])})
        settings = DiscordSettings(enabled=True, api_base=fake.api_base,
                                   gateway_url=fake.gateway_url, guild_ready_timeout=0.1)
        self.provider = DiscordProvider(settings, fake.token, data_dir=data_dir,
                                        approvals=self.approvals)
        self.intake = RecordingIntake()
        self.got: list[IncomingMessage] = self.intake.got
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.provider.run(self.intake))
        await self.fake.wait_for_identifies(1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.provider.close()

    async def request(self, channel: int) -> int:
        sent = await self.provider.send(OutgoingMessage(chat_id=str(channel), text="May I?",
                                                        buttons=BUTTONS))
        assert sent is not None
        return int(sent)

    async def click(self, channel: int, message: int, custom_id: str, **kwargs: Any) -> Any:
        interaction = self.fake.click(channel, message, custom_id, **kwargs)
        return await self.fake.wait_responded(interaction)

    async def wait(self, n: int) -> list[IncomingMessage]:
        await self.fake.wait_until(lambda: len(self.got) >= n, what=f"{n} message(s)")
        return self.got


async def test_buttons_are_an_action_row_of_components(fake, world, data_dir):
    async with Running(fake, world, data_dir) as r:
        mid = await r.request(world["dm"])
    [row] = fake.message(world["dm"], mid)["components"]
    assert row["type"] == 1
    assert buttons_of([row]) == [("Approve", f"/approve {APPROVAL}", 1),
                                 ("Deny", f"/deny {APPROVAL}", 4), ("Later", "/deny zzzzzz", 2)]


async def test_a_click_is_acknowledged_then_handed_over(fake, world, data_dir):
    async with Running(fake, world, data_dir) as r:
        mid = await r.request(world["general"])
        inter = await r.click(world["general"], mid, f"/approve {APPROVAL}", user=world["bob"])
        [got] = await r.wait(1)
        await fake.wait_until(lambda: fake.message(world["general"], mid)["components"] == [],
                              what="the buttons taken off")
    assert inter.response == {"type": 6}  # DEFERRED_UPDATE_MESSAGE
    assert (got.text, got.chat_id, got.user_id) == (f"/approve {APPROVAL}",
                                                    str(world["general"]), str(world["bob"]))
    assert got.message_id == f"click:{inter.id}" and got.guild_id == str(world["guild"])
    assert not got.is_direct and got.mentions_bot
    assert fake.interaction_failures == []


@pytest.mark.parametrize("custom_id", ["/approve ../../etc", "/approve abcdef2345 now",
                                       "/kick abcdef2345", "x" * 100])
async def test_a_forged_custom_id_is_refused_and_nothing_handed_over(fake, world, data_dir,
                                                                     custom_id):
    async with Running(fake, world, data_dir) as r:
        mid = await r.request(world["dm"])
        forged = await r.click(world["dm"], mid, custom_id)
        await r.click(world["dm"], mid, f"/deny {APPROVAL}")
        [got] = await r.wait(1)
    assert forged.response["type"] == 4 and forged.response["data"]["flags"] == 64
    assert "no longer valid" in forged.response["data"]["content"]
    assert got.text == f"/deny {APPROVAL}"
    assert r.approvals.asked == [("discord", str(world["dm"]), str(world["alice"]), APPROVAL)]
    assert fake.interaction_failures == []


async def test_a_refusal_is_ephemeral_and_nothing_reaches_the_channel(fake, world, data_dir):
    async with Running(fake, world, data_dir) as r:
        mid = await r.request(world["general"])
        refused = await r.click(world["general"], mid, f"/approve {APPROVAL}",
                                user=world["mallory"])
        await r.click(world["general"], mid, f"/approve {APPROVAL}", user=world["bob"])
        [got] = await r.wait(1)
    assert refused.response["type"] == 4  # CHANNEL_MESSAGE_WITH_SOURCE
    assert refused.response["data"]["flags"] == 64  # ephemeral: the clicker alone
    assert refused.response["data"]["content"] == REFUSAL
    assert fake.notes_for(world["mallory"]) == [REFUSAL]
    assert got.user_id == str(world["bob"])
    assert len(fake.messages(world["general"])) == 1  # only the request
    assert fake.interaction_failures == []


async def test_an_interaction_dispatched_again_is_one_click_responded_to_once(fake, world,
                                                                              data_dir):
    async with Running(fake, world, data_dir) as r:
        mid = await r.request(world["dm"])
        inter = await r.click(world["dm"], mid, f"/approve {APPROVAL}")
        fake.click(world["dm"], mid, f"/approve {APPROVAL}", interaction_id=inter.id)
        got = await r.wait(2)
    assert got[0].message_id == got[1].message_id == f"click:{inter.id}"  # the inbox dedupes
    callbacks = fake.calls_to("interaction_callback")
    assert [c.status for c in callbacks] == [200]  # never a second response (40060)
    assert fake.interaction_failures == []


class Capturing(DiscordHarness):
    """The harness, keeping the provider it made."""

    provider: DiscordProvider | None = None

    async def make_provider(self) -> Any:
        self.provider = await super().make_provider()  # type: ignore[assignment]
        return self.provider


async def test_a_click_dispatched_again_is_one_decision_through_the_gateway(config_dir,
                                                                            data_dir):
    harness = Capturing(config_dir=config_dir, data_dir=data_dir)
    await harness.open()
    try:
        deleter = await approving(harness, "Deleted old.log.")
        assert harness.provider is not None
        checked: list[str | None] = []
        check = harness.provider.approvals
        assert check is not None

        async def counting(*args: str) -> str | None:
            answer = await check(*args)
            checked.append(answer)
            return answer

        harness.provider.approvals = counting
        await harness.user_says("delete the old log")
        shown = await harness.wait_shown(lambda s: request_shown(s) is not None,
                                         what="the request")
        ask = request_shown(shown)
        await harness.click(ask, "Approve")
        await harness.wait_shown(lambda s: any(m.text == "Deleted old.log." for m in s),
                                 what="the answer")
        [inter] = harness.fake.interactions.values()
        sent = harness.fake.sent_message(int(ask.id))
        harness.fake.click(int(harness.direct_chat), int(ask.id), inter.custom_id,
                           interaction_id=inter.id,
                           message={**harness.fake.message(int(harness.direct_chat),
                                                           int(ask.id)),
                                    "components": sent.payload["components"]})
        await harness.fake.wait_until(lambda: len(checked) >= 2, what="the click checked again")
        assert checked == [None, "This request was already approved."]  # decided: not handed over
        await harness.settled()
        assert deleter.calls == ["/srv/old.log"]
        assert [m.text for m in harness.shown()].count("Deleted old.log.") == 1
        assert harness.fake.interaction_failures == []
    finally:
        await harness.close()


async def test_a_custom_id_is_never_over_the_limits(fake, world, data_dir):
    long = Button("Approve", "/approve " + "a" * 100)
    async with Running(fake, world, data_dir) as r:
        mid = await r.provider.send(OutgoingMessage(chat_id=str(world["dm"]), text="May I?",
                                                    buttons=(long, BUTTONS[1])))
    assert mid is not None
    assert buttons_of(fake.message(world["dm"], int(mid))["components"]) == [
        ("Deny", f"/deny {APPROVAL}", 4)]


# the fake's interaction mechanics --------------------------------------------------------------

async def _callback(fake: FakeDiscord, inter: Any, body: dict) -> tuple[int, dict | None]:
    url = f"{fake.api_base}/interactions/{inter.id}/{inter.token}/callback"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as resp:
            return resp.status, (await resp.json() if resp.status != 204 else None)


async def test_the_fake_refuses_a_second_response_and_records_late_ones(fake, world):
    dm = world["dm"]
    msg = fake.inject_message(dm, "not the bot's, but clickable for the test")
    inter = fake.click(dm, int(msg["id"]), "/go")
    assert (await _callback(fake, inter, {"type": 6}))[0] == 204
    status, body = await _callback(fake, inter, {"type": 6})
    assert (status, body["code"]) == (400, 40060)
    assert fake.interaction_failures == []
    fake.deadline = 0.05
    never = fake.click(dm, int(msg["id"]), "/go")
    await fake.wait_until(lambda: fake.interaction_failures, what="the missed deadline")
    assert str(never.id) in fake.interaction_failures[0]
    status, body = await _callback(fake, never, {"type": 6})
    assert (status, body["code"]) == (404, 10062)


async def test_the_fake_refuses_a_custom_id_over_100_characters(fake, world):
    url = f"{fake.api_base}/channels/{world['dm']}/messages"
    row = {"type": 1, "components": [{"type": 2, "style": 1, "label": "Go",
                                      "custom_id": "x" * 101}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json={"content": "hi", "components": [row]},
                                headers={"Authorization": f"Bot {fake.token}"}) as resp:
            assert resp.status == 400 and (await resp.json())["code"] == 50035
    assert fake.messages(world["dm"]) == []
