"""The Teams provider against the fake Teams: what only Teams has (activities proven by a
Bot Framework JWT, the app's access token, mention gating in group chats and channel threads,
tables as Adaptive Cards, serviceUrls kept for proactive messages), and its settings."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from pluto.errors import ConfigError, DeliveryRefused, ProviderUnusable, RateLimited
from pluto.providers.teams import TeamsProvider
from pluto.settings import ProviderConfig
from pluto.types import OutgoingMessage
from tests.conformance.teams_harness import PASSWORD_ENV, PATH, shown_of
from tests.fakes.teams_server import APP_PASSWORD, FakeTeams
from tests.helpers.gateway import RecordingIntake, provider_context

ALICE = "a:1PersonalChatWithAlice"
GROUP = "19:group-chat@thread.v2"
CHANNEL = "19:general-channel@thread.tacv2"


class Rig:
    """The provider on its own aiohttp server, the fake posting to it, a recording intake."""

    def __init__(self, fake: FakeTeams, data_dir: Path):
        self.fake, self.data_dir = fake, data_dir
        self.intake = RecordingIntake()
        self.provider: TeamsProvider | None = None
        self.task: asyncio.Task[None] | None = None
        self.runner: web.AppRunner | None = None

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"enabled": True, "app_id": self.fake.app_id, "app_password_env": PASSWORD_ENV,
                "messaging_path": PATH, "openid_metadata_url": self.fake.openid_url,
                "token_url": self.fake.token_url, **extra}

    def build(self, **extra: Any) -> tuple[TeamsProvider, web.Application]:
        app = web.Application()
        ctx = provider_context(ProviderConfig(**self.config(**extra)), self.data_dir, app,
                               name="teams")
        return TeamsProvider.from_context(ctx), app

    async def start(self, **extra: Any) -> TeamsProvider:
        self.provider, app = self.build(**extra)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.fake.endpoint_url = f"http://127.0.0.1:{port}{PATH}"
        issued = len(self.fake.tokens)
        self.task = asyncio.create_task(self.provider.run(self.intake))  # type: ignore[arg-type]
        await self.fake.wait_until(lambda: len(self.fake.tokens) > issued, 5, "the provider")
        await self.fake.wait_until(lambda: self.provider._intake is not None, 5, "intake")
        return self.provider

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.provider is not None:
            await self.provider.close()
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    async with FakeTeams(retry_delays=(0.05, 0.1)) as f:
        f.add_conversation(ALICE, "personal")
        f.add_conversation(GROUP, "groupChat")
        f.add_conversation(CHANNEL, "channel")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(PASSWORD_ENV, f.app_password)
            yield f


@pytest.fixture
async def rig(fake: FakeTeams, tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(fake, tmp_path)
    try:
        yield r
    finally:
        await r.stop()


async def says(fake: FakeTeams, conversation: str, text: str, **kw: Any) -> int:
    """The status of the one attempt to post a person's message."""
    said = await fake.user_says(conversation, text, **kw)
    await said.delivery.done.wait()
    return said.delivery.statuses[-1]


# who may post -----------------------------------------------------------------------------

def _other_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


REFUSED = {
    "forged (another key, the real kid)": lambda f: f.token_for(key=_other_key()),
    "wrong audience": lambda f: f.token_for(aud="another-app-id"),
    "wrong issuer": lambda f: f.token_for(iss="https://sts.windows.net/evil/"),
    "expired": lambda f: f.token_for(exp=int(time.time()) - 3600, nbf=int(time.time()) - 7200),
    "not yet valid": lambda f: f.token_for(nbf=int(time.time()) + 3600),
    "serviceUrl not the token's": lambda f: f.token_for(serviceurl="https://evil.example/"),
    "no expiry": lambda f: f.token_for(exp=None),
    "unknown key": lambda f: f.token_for(kid="not-a-known-kid"),
    "not a JWT": lambda f: "not.a.jwt",
}


@pytest.mark.parametrize("make", REFUSED.values(), ids=REFUSED.keys())
async def test_an_activity_without_a_good_token_is_refused_401_and_not_recorded(
        rig: Rig, fake: FakeTeams, make: Any) -> None:
    await rig.start()
    delivery = await fake.post_activity(fake.activity(ALICE, "let me in"), token=make(fake),
                                        wait=True)
    assert delivery.statuses == [401]  # a 4xx: the Connector does not deliver it again
    assert rig.intake.got == []
    assert await says(fake, ALICE, "a real one") == 200  # the endpoint still works
    assert [m.text for m in rig.intake.got] == ["a real one"]


async def test_no_authorization_header_is_refused(rig: Rig, fake: FakeTeams) -> None:
    await rig.start()
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.endpoint_url or "", json=fake.activity(ALICE, "hi")) as r:
            assert r.status == 401
        async with s.post(fake.endpoint_url or "", json=fake.activity(ALICE, "hi"),
                          headers={"Authorization": "Basic abc"}) as r:
            assert r.status == 401
    assert rig.intake.got == []


async def test_bad_payloads_with_a_good_token_are_400_and_harmless(rig: Rig,
                                                                   fake: FakeTeams) -> None:
    await rig.start()
    headers = {"Authorization": f"Bearer {fake.token_for()}"}
    bodies = [b"{not json", b"[1, 2]", b'{"type": "message"}', b"[" * 5000 + b"]" * 5000,
              b'{"type": "message", "serviceUrl": "' + fake.service_url.encode() + b'"}',
              b"\xff\xfe"]
    async with aiohttp.ClientSession() as s:
        for body in bodies:
            async with s.post(fake.endpoint_url or "", data=body, headers=headers) as r:
                assert r.status == 400, body[:40]
                assert "Traceback" not in await r.text()
    assert rig.intake.got == []
    odd = {**fake.activity(ALICE, "odd but readable"), "entities": 5, "attachments": "x",
           "from": {"id": ["not", "a", "string"]}, "timestamp": [1]}
    assert (await fake.post_activity(odd, wait=True)).statuses == [400]  # no sender id
    odd["from"] = {"id": "29:1odd"}
    assert (await fake.post_activity(odd, wait=True)).statuses == [200]
    assert [m.text for m in rig.intake.got] == ["odd but readable"]
    assert await says(fake, ALICE, "still here?") == 200


def key_fetches(fake: FakeTeams) -> int:
    return len([c for c in fake.calls if c.path == "keys"])


async def test_keys_are_fetched_again_when_the_bot_framework_rotates_them(
        rig: Rig, fake: FakeTeams) -> None:
    await rig.start(key_refresh_min_seconds=0)
    fetched = key_fetches(fake)
    fake.kid = "rotated-key"  # the same key published under a new kid
    assert await says(fake, ALICE, "after the rotation") == 200
    assert key_fetches(fake) == fetched + 1
    assert await says(fake, ALICE, "and again") == 200  # known now: not fetched again
    assert key_fetches(fake) == fetched + 1
    assert [m.text for m in rig.intake.got] == ["after the rotation", "and again"]


async def test_tokens_with_unknown_keys_cannot_make_it_fetch_keys_without_end(
        rig: Rig, fake: FakeTeams) -> None:
    await rig.start()  # just fetched: an unknown kid waits key_refresh_min_seconds (30)
    fetched = key_fetches(fake)
    for n in range(20):
        token = fake.token_for(kid=f"made-up-{n}")
        delivery = await fake.post_activity(fake.activity(ALICE, "x"), token=token, wait=True)
        assert delivery.statuses == [401]
    assert key_fetches(fake) == fetched


# what is taken -----------------------------------------------------------------------------

async def test_a_personal_message_is_direct(rig: Rig, fake: FakeTeams) -> None:
    await rig.start()
    assert await says(fake, ALICE, "hello") == 200
    [msg] = rig.intake.got
    assert (msg.chat_id, msg.is_direct, msg.mentions_bot, msg.thread_id) == (ALICE, True, True,
                                                                             None)
    assert msg.user_name == "Alice" and msg.message_id and msg.message_id.endswith(
        fake.deliveries[-1].activity["id"])


async def test_groups_take_mentions_only_and_strip_the_at_tag(rig: Rig,
                                                                 fake: FakeTeams) -> None:
    await rig.start()
    assert await says(fake, GROUP, "among ourselves") == 200  # acknowledged, not taken
    assert await says(fake, GROUP, "what is up?", mention=True) == 200
    [msg] = rig.intake.got
    assert msg.text == "what is up?" and "<at>" not in msg.text
    assert (msg.chat_id, msg.is_direct, msg.mentions_bot) == (GROUP, False, True)


async def test_a_quoted_reply_to_the_bot_counts_as_addressing_it(rig: Rig,
                                                                   fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, GROUP, "hi", mention=True)  # the conversation's serviceUrl is learned
    sent_id = await provider.send(OutgoingMessage(chat_id=GROUP, text="Hello from the bot"))
    [sent] = [s for s in fake.bot_messages(GROUP) if s.id == sent_id]
    assert await says(fake, GROUP, "tell me more", reply_to=sent) == 200
    assert [(m.text, m.mentions_bot, m.reply_to_id) for m in rig.intake.got][1:] == [
        ("tell me more", True, sent_id)]


async def test_a_channel_thread_is_the_channel_with_a_thread(rig: Rig, fake: FakeTeams) -> None:
    provider = await rig.start()
    thread = f"{CHANNEL};messageid=1700000000001"
    assert await says(fake, thread, "in the thread", mention=True) == 200
    [msg] = rig.intake.got
    assert (msg.chat_id, msg.thread_id, msg.is_direct) == (CHANNEL, "1700000000001", False)
    await provider.send(OutgoingMessage(chat_id=CHANNEL, thread_id="1700000000001",
                                        text="the answer"))
    [sent] = fake.bot_messages(CHANNEL)
    assert sent.conversation == thread and sent.reply_to == "1700000000001"


async def test_other_activity_types_are_acknowledged_and_not_taken(rig: Rig,
                                                                    fake: FakeTeams) -> None:
    await rig.start()
    update = {**fake.activity(ALICE, ""), "type": "conversationUpdate"}
    assert (await fake.post_activity(update, wait=True)).statuses == [200]
    assert rig.intake.got == []


async def test_a_full_intake_is_503_and_the_connector_delivers_again(rig: Rig,
                                                                      fake: FakeTeams) -> None:
    await rig.start()
    rig.intake.full = True
    said = await fake.user_says(ALICE, "are you there?")
    await fake.wait_until(lambda: len(said.delivery.statuses) >= 2, 5, "a redelivery")
    rig.intake.full = False
    await said.delivery.done.wait()
    assert said.delivery.statuses[0] == 503 and said.delivery.statuses[-1] == 200
    assert [m.text for m in rig.intake.got] == ["are you there?"]


async def test_a_file_and_a_pasted_image_are_downloaded(rig: Rig, fake: FakeTeams,
                                                        tmp_path: Path) -> None:
    await rig.start()
    await says(fake, ALICE, "look", document=("data.csv", b"a,b\n1,2\n"), image=b"\x89PNGxx")
    [msg] = rig.intake.got
    files = {a.filename: a for a in msg.attachments}
    assert files["data.csv"].path is not None and files["data.csv"].path.read_bytes() == \
        b"a,b\n1,2\n"
    [image] = [a for a in msg.attachments if a.kind == "image"]
    assert image.path is not None and image.path.read_bytes() == b"\x89PNGxx"
    assert all(a.path is not None and a.path.is_relative_to(tmp_path / "uploads")
               for a in msg.attachments)


async def test_a_file_over_the_cap_is_refused_with_a_notice(rig: Rig, fake: FakeTeams) -> None:
    await rig.start(max_download_mb=0.001)
    await says(fake, ALICE, "big one", document=("big.csv", b"x" * 5000))
    [msg] = rig.intake.got
    assert msg.attachments == () and msg.text == "big one"
    [notice] = fake.bot_messages(ALICE)
    assert "too large" in notice.text


# sending -----------------------------------------------------------------------------------

async def test_a_table_goes_out_as_an_adaptive_card(rig: Rig, fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    text = "Totals:\n\n| city | people |\n| ---- | -----: |\n| Oslo | 700000 |"
    await provider.send(OutgoingMessage(chat_id=ALICE, text=text, markup="teams"))
    [sent] = fake.bot_messages(ALICE)
    assert sent.text == "Totals:"
    [card] = sent.attachments
    assert card["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert shown_of(sent).text == "Totals:\ncity | people\nOslo | 700000"


async def test_streaming_updates_the_message_and_delete_removes_it(rig: Rig,
                                                                   fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    sent_id = await provider.send(OutgoingMessage(chat_id=ALICE, text="Hel"))
    assert sent_id is not None
    await provider.edit(OutgoingMessage(chat_id=ALICE, text="Hello", edit_of=sent_id))
    [sent] = fake.bot_messages(ALICE)
    assert (sent.text, sent.edits) == ("Hello", 1)
    assert await provider.delete(ALICE, sent_id) and fake.bot_messages(ALICE) == []
    assert await provider.delete(ALICE, sent_id)  # already gone counts


async def test_typing_is_a_typing_activity(rig: Rig, fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    await provider.typing(ALICE)
    assert [t.payload["type"] for t in fake.typing(ALICE)] == ["typing"]


async def test_429_is_rate_limited_with_the_retry_after(rig: Rig, fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    fake.throttle(ALICE, 3)
    with pytest.raises(RateLimited) as e:
        await provider.send(OutgoingMessage(chat_id=ALICE, text="too soon"))
    assert e.value.retry_after == 3


async def test_a_message_over_28_kb_is_refused_for_good(rig: Rig, fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    with pytest.raises(DeliveryRefused, match="MessageSizeTooBig"):
        await provider.send(OutgoingMessage(chat_id=ALICE, text="é" * 30_000))


async def test_an_access_token_that_stops_working_is_replaced_once(rig: Rig,
                                                                   fake: FakeTeams) -> None:
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    fake.expire_tokens()
    issued = len(fake.token_requests)
    await provider.send(OutgoingMessage(chat_id=ALICE, text="still sent"))
    assert len(fake.token_requests) == issued + 1
    assert [s.text for s in fake.bot_messages(ALICE)] == ["still sent"]


async def test_a_wrong_app_password_stops_the_provider_for_good(rig: Rig, fake: FakeTeams,
                                                                monkeypatch: Any) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    provider, _ = rig.build()
    with pytest.raises(ProviderUnusable, match="invalid_client"):
        await provider.run(RecordingIntake())  # type: ignore[arg-type]
    await provider.close()


async def test_proactive_messages_reach_a_conversation_after_a_restart(
        rig: Rig, fake: FakeTeams, tmp_path: Path) -> None:
    await rig.start()
    await says(fake, ALICE, "remind me tomorrow")
    await rig.stop()
    later, _ = Rig(fake, tmp_path).build()  # a new process: only the data dir remains
    try:
        await later.send(OutgoingMessage(chat_id=ALICE, text="your reminder"))
        with pytest.raises(DeliveryRefused, match="no serviceUrl"):
            await later.send(OutgoingMessage(chat_id=GROUP, text="never seen"))
    finally:
        await later.close()
    assert [s.text for s in fake.bot_messages(ALICE)] == ["your reminder"]


async def test_secrets_never_reach_the_log(rig: Rig, fake: FakeTeams,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    provider = await rig.start()
    await says(fake, ALICE, "hi")
    await fake.post_activity(fake.activity(ALICE, "x"), token=fake.token_for(aud="x"), wait=True)
    await provider.send(OutgoingMessage(chat_id=ALICE, text="hello"))
    fake.throttle(ALICE, 1)
    await provider.typing(ALICE)  # refused: logged at debug
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert APP_PASSWORD not in logged
    assert not [t for t in fake.tokens if t in logged]
    assert "refused" in caplog.text  # the 401 is logged, without the token


# settings ----------------------------------------------------------------------------------

def test_settings_name_what_is_missing(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "x" * 20)
    app = web.Application()

    def build(**config: Any) -> None:
        ctx = provider_context(ProviderConfig(enabled=True, app_password_env=PASSWORD_ENV,
                                              **config), tmp_path, app, name="teams")
        TeamsProvider.from_context(ctx)

    with pytest.raises(ConfigError, match="providers.teams.app_id"):
        build()
    with pytest.raises(ConfigError, match="providers.teams.token_url"):
        build(app_id="abc", token_url="ftp://x")
    with pytest.raises(ConfigError, match="providers.teams.group_messages"):
        build(app_id="abc", group_messages="sometimes")
    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(ConfigError, match=PASSWORD_ENV):
        build(app_id="abc")


# tables ------------------------------------------------------------------------------------

def test_tables_are_lifted_out_of_the_text_but_not_out_of_code() -> None:
    from pluto.providers.teams.markup import lift_tables

    text = ("Before\n\n```\n| not | a table |\n| --- | --- |\n```\n\n| a \\| b | c |\n"
            "| --- | --- |\n| 1 | 2 |\n\nAfter\n\n| lone row |")
    lifted = lift_tables(text)
    assert lifted.text == ("Before\n\n```\n| not | a table |\n| --- | --- |\n```\n\nAfter\n\n"
                           "| lone row |")
    assert lifted.tables == (((("a | b", "c"), ("1", "2")), True),)


def test_a_table_split_over_two_messages_is_two_cards() -> None:
    from pluto.gateway.delivery.render import render_chunks
    from pluto.providers.teams.markup import TEAMS, lift_tables

    rows = "\n".join(f"| city {n} | {n * 1000} |" for n in range(200))
    chunks = render_chunks(f"| city | people |\n|---|---|\n{rows}\n", TEAMS, 4000)
    assert len(chunks) >= 2
    lifted = [lift_tables(chunk) for chunk in chunks]
    assert all(part.text == "" and len(part.tables) == 1 for part in lifted)
    assert lifted[0].tables[0][1] is True  # the header row, on the first card
    cells = [row for part in lifted for row in part.tables[0][0]]
    assert cells[0] == ("city", "people") and len(cells) == 201
