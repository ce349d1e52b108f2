"""Approval buttons on Teams (issue 33): the real provider on a gateway HTTP server against the
fake Teams — what a click may and may not do beyond the conformance scenarios."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from pluto.providers.teams import TeamsProvider
from pluto.providers.teams.buttons import NOT_OURS, TOO_SLOW, buttons_card, click_of
from pluto.types import Button
from tests.conformance.harness import Shown
from tests.conformance.teams_harness import TeamsHarness
from tests.conformance.test_scenarios import approving, request_shown
from tests.fakes.teams_server import Sent

pytestmark = pytest.mark.slow


@pytest.fixture
async def harness(config_dir: Path, data_dir: Path) -> Any:
    h = TeamsHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def the_request(h: TeamsHarness, chat: str | None = None) -> tuple[Shown, Sent]:
    shown = await h.wait_shown(lambda s: (r := request_shown(s)) is not None
                               and r.buttons == ("Approve", "Deny"), chat=chat,
                               what="the request with its buttons")
    ask = request_shown(shown)
    assert ask is not None
    return ask, next(s for s in h.fake.sent if s.id == ask.id)


def test_the_card_and_what_a_click_carries() -> None:
    card = buttons_card((Button("Approve", "/approve abc234xyz", "primary"),
                         Button("Deny", "/deny abc234xyz", "danger")))
    actions = card["content"]["actions"]
    assert [a["style"] for a in actions] == ["positive", "destructive"]

    def invoke(data: Any, **action: Any) -> dict[str, Any]:
        return {"name": "adaptiveCard/action", "value": {"action": {
            "type": "Action.Execute", "verb": "pluto_approval", "data": data} | action}}

    assert click_of(invoke(actions[1]["data"])) == ("/deny abc234xyz", "abc234xyz")
    assert click_of(invoke({"pluto": "/approve abc234xyz; rm -rf /"})) is None
    assert click_of(invoke({"pluto": "/model gpt"})) is None
    assert click_of(invoke("/approve abc234xyz")) is None
    assert click_of(invoke(actions[0]["data"], verb="other")) is None
    assert click_of(invoke(actions[0]["data"], type="Action.Submit")) is None
    assert click_of({**invoke(actions[0]["data"]), "name": "composeExtension/query"}) is None


async def test_a_decision_takes_the_buttons_off_for_everyone(harness: TeamsHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted old.log.")
    await h.user_says("delete the old log")
    ask, sent = await the_request(h)
    await h.click(ask, "Approve")
    assert h.fake.private_cards["Alice"]  # the clicker's card, without buttons
    await h.wait_shown(lambda s: any(m.text == "Deleted old.log." for m in s)
                       and request_shown(s).buttons == (), what="the answer, buttons gone")
    assert deleter.calls == ["/srv/old.log"]
    assert "delete_file" in h.fake.bot_messages(h.direct_chat)[0].text  # the text stays
    assert not h.fake.invoke_failures


async def test_a_redelivered_click_is_one_decision(harness: TeamsHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted old.log.")
    await h.user_says("delete the old log")
    ask, sent = await the_request(h)
    click = await h.fake.click(sent, "Approve")
    again = await h.fake.post_activity(copy.deepcopy(click.activity), wait=True)
    assert again.statuses == [200]
    await h.wait_shown(lambda s: any(m.text == "Deleted old.log." for m in s),
                       what="the answer")
    await h.settled()
    assert deleter.calls == ["/srv/old.log"]
    assert [m.text for m in h.shown()].count("Deleted old.log.") == 1


async def test_forged_clicks_run_nothing(harness: TeamsHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted.")
    await h.user_says("delete the old log")
    ask, sent = await the_request(h)
    approval = sent.payload["attachments"][-1]["content"]["actions"][0]["data"]["pluto"]
    base = (await h.fake.click(sent, "Deny", user="Nobody")).activity  # (refused: not theirs)

    async def post(activity: dict[str, Any], token: str | None = None) -> tuple[int, Any]:
        d = await h.fake.post_activity(activity, token=token, wait=True)
        return d.statuses[-1], d.bodies[-1]

    forged = copy.deepcopy(base)
    forged["id"] += "1"
    forged["from"] = {"id": "29:1alice", "name": "Alice", "aadObjectId": "x"}
    forged["value"]["action"]["data"] = {"pluto": f"{approval}; /model other"}
    assert await post(forged) == (200, {"statusCode": 200, "type":
                                        "application/vnd.microsoft.activity.message",
                                        "value": NOT_OURS})
    unsigned = copy.deepcopy(base)
    unsigned["value"]["action"]["data"] = {"pluto": approval}
    alice = h.fake.activity(h.direct_chat, "x")["from"]
    unsigned |= {"id": unsigned["id"] + "2", "from": alice}
    status, _ = await post(unsigned, token=h.fake.token_for(aud="someone-else"))
    assert status == 401
    other = copy.deepcopy(unsigned)
    other["id"] += "3"
    other["value"]["action"]["data"] = {"pluto": "/approve zzzzzzzz"}  # no such request
    status, body = await post(other)
    assert status == 200 and "not from this chat" in body["value"]
    await h.settled()
    assert deleter.calls == [] and h.fake.notes["Nobody"]
    assert request_shown(h.shown()).buttons == ("Approve", "Deny")  # still undecided
    await h.click(ask, "Approve")
    await h.wait_shown(lambda s: any(m.text == "Deleted." for m in s), what="the answer")
    assert deleter.calls == ["/srv/old.log"]


async def test_a_slow_check_is_answered_within_teams_deadline(harness: TeamsHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted.")
    await h.user_says("delete the old log")
    ask, sent = await the_request(h)
    assert h.gateway is not None
    provider = h.gateway.providers["teams"]
    assert isinstance(provider, TeamsProvider)
    stuck = asyncio.Event()

    async def slow(*args: Any) -> str | None:
        await stuck.wait()  # a database that does not answer
        return None

    provider.approvals = slow
    await h.fake.click(sent, "Approve")
    assert h.fake.notes["Alice"] == [TOO_SLOW]
    assert not h.fake.invoke_failures
    await h.settled()
    assert deleter.calls == []
