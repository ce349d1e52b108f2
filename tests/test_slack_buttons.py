"""Slack's approval buttons against the fake Slack: what only Slack has (signed interactivity
posts, Socket Mode envelopes sent again when not acked, the 3 s ack deadline, Block Kit's
limits)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.providers.slack import buttons as slack_buttons
from pluto.providers.slack.provider import SlackProvider
from pluto.types import Button, OutgoingMessage
from tests.conformance.slack_harness import SlackHarness, SlackHttpHarness, SlackSocketHarness
from tests.conformance.test_scenarios import approving, request_shown

MODES = {"http": SlackHttpHarness, "socket": SlackSocketHarness}


@pytest.fixture(params=sorted(MODES))
async def slack(request: pytest.FixtureRequest, config_dir: Path,
                data_dir: Path) -> AsyncIterator[SlackHarness]:
    h = MODES[request.param](config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def asked(h: SlackHarness, *answers: str) -> tuple[object, dict]:
    """The approval request shown with its buttons; (the deleter, the request message)."""
    deleter = await approving(h, *answers)
    await h.user_says("delete the old log")
    shown = await h.wait_shown(lambda s: (r := request_shown(s)) is not None and
                               r.buttons == ("Approve", "Deny"), what="the request")
    ask = request_shown(shown)
    message = h.fake.message(h.direct_chat, ask.id)
    assert message is not None
    return deleter, message


def clicks(h: SlackHarness) -> list[str]:
    return [m.text for m in h.received if m.message_id.startswith("click:")]


async def test_forged_unsigned_and_foreign_clicks_hand_nothing_over(config_dir: Path,
                                                                   data_dir: Path) -> None:
    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        deleter, message = await asked(h, "Deleted.")
        url = h.fake.events_url
        assert url
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        payload = h.fake.block_actions(h.direct_chat, message["ts"], "pluto_approval_0")
        body = h.fake.interaction_body(payload)
        assert (await h.fake.post_signed(url, body, headers=form, signature="v0=00"))[0] == 401
        assert (await h.fake.post_signed(url, body, headers=form, secret="nope"))[0] == 401
        assert (await h.fake.post_signed(url, body, headers=form,
                                         timestamp=1_600_000_000))[0] == 401  # stale
        status, _, text = await h.fake.post_signed(url, "payload=%7Bnot+json", headers=form)
        assert status == 400 and "Traceback" not in text
        # signed, but its value is not a command of ours: acknowledged, nothing handed over
        for value in ("rm -rf /", "/approve ../../etc", "/approve abc; /deny abc", None):
            foreign = h.fake.block_actions(h.direct_chat, message["ts"], "pluto_approval_0")
            foreign["actions"][0]["value"] = value
            assert (await h.fake.post_signed(url, h.fake.interaction_body(foreign),
                                             headers=form))[0] == 200
        await h.settled()
        assert clicks(h) == [] and deleter.calls == []  # type: ignore[attr-defined]
        assert h.fake.ephemerals == []
    finally:
        await h.close()


async def test_a_click_redelivered_over_socket_mode_is_one_decision(config_dir: Path,
                                                                   data_dir: Path) -> None:
    h = SlackSocketHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        deleter, message = await asked(h, "Deleted.")
        h.fake.event_ack_timeout = 0  # each ack counts as late: Slack sends the envelope again
        h.fake.event_retry_delays = (0.0, 0.0)
        delivery = await h.fake.click(h.direct_chat, message["ts"], "pluto_approval_0")
        assert [a.retry_num for a in delivery.attempts] == [0, 1, 2]
        await h.fake.wait_until(lambda: len([a for a in h.fake.acks
                                             if a.event_id == delivery.event_id]) == 3)
        await h.wait_shown(lambda s: any(m.text == "Deleted." for m in s), what="the answer")
        await h.settled()
        assert deleter.calls == ["/srv/old.log"]  # type: ignore[attr-defined]
        assert [m.text for m in h.shown()].count("Deleted.") == 1
        assert len({m.message_id for m in h.received if m.message_id.startswith("click:")}) == 1
    finally:
        await h.close()


async def test_a_click_is_acked_in_time_and_takes_the_buttons_off(slack: SlackHarness) -> None:
    deleter, message = await asked(slack, "Deleted.")
    delivery = await slack.fake.click(slack.direct_chat, message["ts"], "pluto_approval_0")
    assert delivery.acked and slack.fake.interaction_failures == []
    await slack.wait_shown(lambda s: any(m.text == "Deleted." for m in s), what="the answer")
    request = await slack.fake.wait_until(
        lambda: (m := slack.fake.message(slack.direct_chat, message["ts"])) is not None
        and not any(b["type"] == "actions" for b in m.get("blocks") or []) and m, 10,
        "the buttons taken off")
    assert "delete_file" in request["text"]
    assert deleter.calls == ["/srv/old.log"]  # type: ignore[attr-defined]


async def test_a_slow_check_still_acks_within_the_deadline(slack: SlackHarness,
                                                           monkeypatch) -> None:
    monkeypatch.setattr(slack_buttons, "CHECK_BUDGET", 0.2)
    monkeypatch.setattr(slack_buttons, "ACK_BUDGET", 0.3)
    deleter, message = await asked(slack)
    slack.fake.event_ack_timeout = 1.0  # the fake's deadline, shortened with the budgets
    assert slack.gateway is not None
    provider = slack.gateway.providers["slack"]
    assert isinstance(provider, SlackProvider)
    stalled = asyncio.Event()

    async def stuck(*args: str) -> str | None:
        await stalled.wait()  # the gateway's storage does not answer
        return None

    provider.clicks.check = stuck
    try:
        delivery = await slack.fake.click(slack.direct_chat, message["ts"], "pluto_approval_0")
    finally:
        stalled.set()
    assert delivery.acked and slack.fake.interaction_failures == []
    await slack.fake.wait_until(lambda: slack.fake.notes_for(slack.fake.default_user), 5,
                                "the clicker told")
    assert slack.fake.notes_for(slack.fake.default_user) == [slack_buttons.TOO_SLOW]
    await slack.settled()
    assert clicks(slack) == [] and deleter.calls == []  # type: ignore[attr-defined]


async def test_block_kit_limits_are_respected(slack: SlackHarness) -> None:
    await slack.start()
    assert slack.gateway is not None
    provider = slack.gateway.providers["slack"]
    long = "\n".join(f"line {i}: " + "x" * 90 for i in range(80))  # ~8,000 characters
    label = "A" * 100
    ts = await provider.send(OutgoingMessage(
        chat_id=slack.direct_chat, text=long[:3800], markup="slack_mrkdwn",
        buttons=(Button(label, "/approve abcdefgh", "primary"),
                 Button("Deny", "/deny abcdefgh", "danger"))))
    assert ts
    posted = slack.fake.message(slack.direct_chat, ts)
    assert posted is not None
    sections = [b for b in posted["blocks"] if b["type"] == "section"]
    assert len(sections) == 2 and all(len(b["text"]["text"]) <= 3000 for b in sections)
    [actions] = [b for b in posted["blocks"] if b["type"] == "actions"]
    assert [len(e["text"]["text"]) for e in actions["elements"]] == [75, 4]
    assert [e["value"] for e in actions["elements"]] == ["/approve abcdefgh", "/deny abcdefgh"]
    blocks = slack_buttons.blocks_for(long, (Button("Ok", "/approve abcdefgh"),))
    assert len(blocks) <= 50 and "style" not in blocks[-1]["elements"][0]
