"""Mattermost's approval buttons against the fake server: interactive message buttons whose
clicks the server posts to the gateway (a post without the button's token refused), a click
posted twice one decision, and the commands written where clicks have nowhere to go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.providers.mattermost import MattermostProvider
from pluto.settings import ProviderConfig
from pluto.types import Button, OutgoingMessage
from tests.conformance.mattermost_harness import MattermostHarness
from tests.conformance.test_scenarios import approving, request_shown
from tests.fakes.mattermost_buttons import actions_of
from tests.helpers.gateway import provider_context


@pytest.fixture
async def mm(config_dir: Path, data_dir: Path) -> AsyncIterator[MattermostHarness]:
    h = MattermostHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def asked(h: MattermostHarness, *answers: str) -> tuple[Any, Any]:
    deleter = await approving(h, *answers)
    await h.user_says("delete the old log")
    shown = await h.wait_shown(lambda s: (r := request_shown(s)) is not None and
                               r.buttons == ("Approve", "Deny"), what="the request")
    return deleter, request_shown(shown)


def clicks(h: MattermostHarness) -> list[str]:
    return [m.text for m in h.received if m.message_id.startswith("click:")]


async def post(url: str, body: Any) -> int:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
        return r.status


async def test_a_click_without_the_buttons_token_is_refused(mm: MattermostHarness) -> None:
    deleter, ask = await asked(mm, "Deleted.")
    [approve] = [a for a in actions_of(mm.fake.posts[ask.id]) if a["name"] == "Approve"]
    context = approve["integration"]["context"]
    request = {"user_id": mm.fake.alice["id"], "channel_id": mm.direct_chat,
               "post_id": ask.id, "trigger_id": "t1"}
    assert await post(mm.actions_url, {**request, "context": {"command": context["command"]}}
                      ) == 401
    assert await post(mm.actions_url, {**request, "context": {
        "command": context["command"], "token": "0" * 64}}) == 401
    [deny] = [a for a in actions_of(mm.fake.posts[ask.id]) if a["name"] == "Deny"]
    assert await post(mm.actions_url, {**request, "context": {  # a token of another command
        "command": context["command"], "token": deny["integration"]["context"]["token"]}}
                      ) == 401
    assert await post(mm.actions_url, [1, 2]) == 400
    assert await post(mm.actions_url, {**request, "user_id": "../x", "context": context}) == 400
    await mm.settled()
    assert clicks(mm) == [] and deleter.calls == []
    assert actions_of(mm.fake.posts[ask.id])  # the buttons are still there


async def test_a_click_posted_twice_is_one_decision(mm: MattermostHarness) -> None:
    deleter, ask = await asked(mm, "Deleted.")
    [approve] = [a for a in actions_of(mm.fake.posts[ask.id]) if a["name"] == "Approve"]
    request = {"user_id": mm.fake.alice["id"], "user_name": "alice",
               "channel_id": mm.direct_chat, "post_id": ask.id, "trigger_id": "trigger-1",
               "context": approve["integration"]["context"]}
    assert await post(mm.actions_url, request) == 200
    assert await post(mm.actions_url, request) == 200
    await mm.wait_shown(lambda s: any(m.text == "Deleted." for m in s), what="the answer")
    await mm.settled()
    assert deleter.calls == ["/srv/old.log"]
    assert [m.text for m in mm.shown()].count("Deleted.") == 1


async def test_a_decided_request_loses_its_buttons(mm: MattermostHarness) -> None:
    deleter, ask = await asked(mm, "Deleted.")
    await mm.click(ask, "Approve")
    await mm.wait_shown(lambda s: any(m.text == "Deleted." for m in s), what="the answer")
    post_now = mm.fake.posts[ask.id]
    assert actions_of(post_now) == [] and "delete_file" in post_now["message"]
    click = await mm.fake.click(ask.id, mm.fake.created_actions[ask.id][0]["id"],
                                mm.fake.alice)
    assert click.status == 404  # a stale client's click: the server has no such button now
    assert deleter.calls == ["/srv/old.log"]


async def test_without_the_http_server_the_commands_are_written(mm: MattermostHarness) -> None:
    config = {**mm.provider_config(), "actions_url": "http://127.0.0.1:9/mattermost/actions"}
    provider = MattermostProvider.from_context(
        provider_context(ProviderConfig(**config), mm.data_dir, None))
    try:
        await provider.identity()
        await provider.send(OutgoingMessage(chat_id=mm.direct_chat, text="Delete it?", buttons=(
            Button("Approve", "/approve abcdefgh", "primary"),
            Button("Deny", "/deny abcdefgh", "danger"))))
    finally:
        await provider.close()
    [sent] = mm.fake.bot_posts(mm.direct_chat)
    assert sent["message"] == "Delete it?\n\nReply `/approve abcdefgh` or `/deny abcdefgh`."
    assert actions_of(sent) == []
