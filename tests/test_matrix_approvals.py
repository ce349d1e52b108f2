"""Approvals on Matrix (issue 33): a reaction or a reply on the bot's request message decides
it — the real provider (mautrix) against the fake homeserver, through the whole gateway."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from pluto.providers.matrix.approvals import (approval_in, command, verdict_of_key,
                                              verdict_of_reply)
from tests.conformance.harness import Shown, UserMessage
from tests.conformance.matrix_harness import BOB, MatrixHarness
from tests.conformance.test_scenarios import approving, request_shown

pytestmark = pytest.mark.slow


@pytest.fixture
async def harness(config_dir: Path, data_dir: Path) -> Any:
    h = MatrixHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def the_request(h: MatrixHarness, chat: str | None = None) -> Shown:
    shown = await h.wait_shown(lambda s: request_shown(s) is not None, chat=chat,
                               what="the approval request")
    found = request_shown(shown)
    assert found is not None and "/approve " in found.text
    return found


async def handled(h: MatrixHarness, event: dict[str, Any]) -> None:
    """The provider synced past ``event`` (it was handled), and the gateway is idle."""
    await h.fake.wait_until(lambda: h.confirmed(UserMessage("", event["event_id"])), 10,
                            "the provider to sync past the event")
    await h.settled()


def test_what_a_reaction_or_a_reply_means() -> None:
    assert verdict_of_key("✅") == verdict_of_key("👍🏽") == verdict_of_key("✔️") == "approve"
    assert verdict_of_key("❌") == verdict_of_key("👎") == "deny"
    assert verdict_of_key("🎉") is verdict_of_key(None) is verdict_of_key("✅" * 40) is None
    assert verdict_of_reply("approve") == ("approve", "")
    assert verdict_of_reply("Deny: too risky\n") == ("deny", "too risky")
    assert verdict_of_reply("approved it yesterday") is None
    assert verdict_of_reply("please approve") is None
    assert approval_in("Reply `/approve abc234xyz` or `/deny abc234xyz`.") == "abc234xyz"
    assert approval_in("/approve") is None
    assert command("deny", "abc234xyz", "too risky") == "/deny abc234xyz too risky"
    assert command("approve", "abc234xyz", "ignored") == "/approve abc234xyz"


async def test_a_reaction_approves_and_the_tool_runs_exactly_once(
        harness: MatrixHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted old.log.")
    await h.user_says("delete the old log")
    ask = await the_request(h)
    assert deleter.calls == []
    first = h.fake.user_reacts(h.direct_chat, ask.id, "✅\ufe0f")
    await h.wait_shown(lambda s: any(m.text == "Deleted old.log." for m in s),
                       what="the answer after the reaction")
    assert deleter.calls == ["/srv/old.log"]
    h.fake.replay(first["event_id"])  # the same reaction delivered again
    again = h.fake.user_reacts(h.direct_chat, ask.id, "👍")  # and a second one
    await handled(h, again)
    assert deleter.calls == ["/srv/old.log"]
    assert [m.text for m in h.shown()].count("Deleted old.log.") == 1


async def test_a_reply_deny_tells_the_model_and_it_answers(harness: MatrixHarness) -> None:
    h = harness
    deleter = await approving(h, "Understood, I left it.")
    await h.user_says("delete the old log")
    ask = await the_request(h)
    await h.user_says("deny not today", reply_to=ask)
    await h.wait_shown(lambda s: any(m.text == "Understood, I left it." for m in s),
                       what="the answer after the denial")
    assert deleter.calls == []
    told = [str(m.get("content")) for m in h.model.calls[-1] if m["role"] == "tool"]
    assert any("denied" in t for t in told), told
    assert any("not today" in t for t in told), told


async def test_a_reply_approve_after_a_restart(harness: MatrixHarness) -> None:
    """The provider forgot what it sent: it reads the replied-to event from the homeserver."""
    h = harness
    deleter = await approving(h, "Deleted after all.")
    await h.user_says("delete the old log")
    ask = await the_request(h)
    await h.settled()
    await h.restart()
    await h.user_says("Approve", reply_to=ask)
    await h.wait_shown(lambda s: any(m.text == "Deleted after all." for m in s),
                       what="the answer after the reply")
    assert deleter.calls == ["/srv/old.log"]


async def test_a_strangers_reaction_does_nothing(harness: MatrixHarness,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    h = harness
    deleter = await approving(h, "Deleted.")
    chat = h.group_chat
    await h.user_says("delete the old log", chat=chat, mention=True)  # Bob asks
    ask = await the_request(h, chat)
    before = len(h.shown(chat))
    with caplog.at_level(logging.INFO, logger="pluto.providers.matrix"):
        reaction = h.fake.user_reacts(chat, ask.id, "✅", sender=h.stranger)
        await handled(h, reaction)
    assert deleter.calls == [] and len(h.shown(chat)) == before  # nothing in the room
    assert any("was not taken" in r.getMessage() and h.stranger in r.getMessage()
               for r in caplog.records)
    h.fake.user_reacts(chat, ask.id, "✅", sender=BOB)  # the asker may
    await h.wait_shown(lambda s: any(m.text == "Deleted." for m in s), chat=chat,
                       what="the answer once the asker approved")
    assert deleter.calls == ["/srv/old.log"]


async def test_a_reaction_to_another_message_is_ignored(harness: MatrixHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted.")
    asked = await h.user_says("delete the old log")
    ask = await the_request(h)
    before = len(h.shown())
    h.fake.user_reacts(h.direct_chat, asked.ref, "✅")  # on the person's own message
    last = h.fake.user_reacts(h.direct_chat, ask.id, "🎉")  # not a decision
    await handled(h, last)
    assert deleter.calls == [] and len(h.shown()) == before
    h.fake.user_reacts(h.direct_chat, ask.id, "✅")  # still pending: a real decision works
    await h.wait_shown(lambda s: any(m.text == "Deleted." for m in s),
                       what="the answer after the reaction")
    assert deleter.calls == ["/srv/old.log"]
