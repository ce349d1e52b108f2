"""The Mattermost provider against the fake server: what only Mattermost has (mention gating
and threads by ``root_id``, the WebSocket's ``seq`` and the ``since`` catch-up after a
reconnect or a restart, its error answers and 429 windows, files both ways), bad payloads
logged and dropped, the token never logged, and its settings."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pluto.errors import ConfigError, DeliveryRefused, ProviderUnusable, RateLimited
from pluto.gateway.delivery.render import render_chunks
from pluto.gateway.ports import Ticket
from pluto.providers.mattermost import MattermostProvider
from pluto.providers.mattermost.markup import MATTERMOST
from pluto.settings import ProviderConfig
from pluto.types import Attachment, IncomingMessage, OutgoingMessage
from tests.conformance.mattermost_harness import TOKEN_ENV
from tests.fakes.mattermost_server import ApiFailure, FakeMattermost
from tests.helpers.gateway import RecordingIntake, provider_context


class FlakyIntake(RecordingIntake):
    """Its storage fails for the first ``failures`` hand-overs."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def submit(self, msg: IncomingMessage) -> Ticket:
        if self.failures:
            self.failures -= 1
            raise OSError("database or disk is full")
        return await super().submit(msg)


class Rig:
    """The provider reading the fake into a recording intake; restartable."""

    def __init__(self, fake: FakeMattermost, data_dir: Path):
        self.fake, self.data_dir = fake, data_dir
        self.intake: RecordingIntake = RecordingIntake()
        self.provider: MattermostProvider | None = None
        self.task: asyncio.Task[None] | None = None

    def build(self, **extra: Any) -> MattermostProvider:
        config = {"enabled": True, "url": self.fake.url, "token_env": TOKEN_ENV, **extra}
        return MattermostProvider.from_context(provider_context(ProviderConfig(**config),
                                                                self.data_dir))

    async def start(self, **extra: Any) -> MattermostProvider:
        opened = self.fake.sockets_opened
        self.provider = self.build(**extra)
        self.task = asyncio.create_task(self.provider.run(self.intake))  # type: ignore[arg-type]
        await self.fake.wait_until(lambda: self.fake.sockets_opened > opened or self.task.done(),
                                   10, "the provider to connect")
        return self.provider

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.provider is not None:
            await self.provider.close()

    def texts(self) -> list[str]:
        return [m.text for m in self.intake.got]

    async def handed(self, *texts: str) -> list[IncomingMessage]:
        await self.fake.wait_until(lambda: len(self.intake.got) >= len(texts), 10,
                                   f"{texts} to be handed over")
        assert self.texts() == list(texts)
        return self.intake.got


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeMattermost]:
    async with FakeMattermost() as f:
        monkeypatch.setenv(TOKEN_ENV, f.token)
        yield f


@pytest.fixture
async def rig(fake: FakeMattermost, data_dir: Path) -> AsyncIterator[Rig]:
    r = Rig(fake, data_dir)
    try:
        yield r
    finally:
        await r.stop()


async def test_channels_answer_mentions_and_threads_the_bot_is_in(
        fake: FakeMattermost, rig: Rig) -> None:
    town = fake.add_channel("town", [fake.alice, fake.bob, fake.bot])
    provider = await rig.start()
    await fake.user_says(town, "just us here")
    asked = await fake.user_says(town, "what is up?", mention=True)
    [msg] = await rig.handed("what is up?")
    assert (msg.is_direct, msg.mentions_bot, msg.thread_id) == (False, True, asked["id"])
    assert msg.user_name == "alice"
    answer = await provider.send(OutgoingMessage(chat_id=town, text="all good",
                                                 thread_id=msg.thread_id))
    assert answer is not None and fake.posts[answer]["root_id"] == asked["id"]
    await fake.user_says(town, "someone else's thread", root_id=(await fake.user_says(
        town, "a new topic"))["id"])
    await fake.user_says(town, "and more?", root_id=asked["id"], sender=fake.bob)
    [_, more] = await rig.handed("what is up?", "and more?")
    assert (more.thread_id, more.mentions_bot, more.user_name) == (asked["id"], True, "bob")


async def test_a_group_message_needs_a_mention_too(fake: FakeMattermost, rig: Rig) -> None:
    group = fake.add_channel("alice-bob-pluto", [fake.alice, fake.bob, fake.bot], kind="G")
    await rig.start()
    await fake.user_says(group, "between the two of us")
    await fake.user_says(group, "you there?", mention=True)  # "@pluto you there?"
    [msg] = await rig.handed("you there?")
    assert (msg.is_direct, msg.mentions_bot, msg.guild_id) == (False, True, None)


async def test_a_direct_message_is_always_for_the_bot(fake: FakeMattermost, rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    await rig.start()
    await fake.user_says(dm, "hi there")
    [msg] = await rig.handed("hi there")
    assert (msg.chat_id, msg.is_direct, msg.thread_id, msg.provider) == (dm, True, None,
                                                                          "mattermost")


async def test_channel_messages_all_and_thread_replies_off(fake: FakeMattermost,
                                                           rig: Rig) -> None:
    town = fake.add_channel("town", [fake.alice, fake.bot])
    await rig.start(channel_messages="all", reply_in_thread=False)
    await fake.user_says(town, "to everyone")
    [msg] = await rig.handed("to everyone")
    assert (msg.mentions_bot, msg.thread_id) == (False, None)


async def test_its_own_posts_and_other_bots_are_never_answered(fake: FakeMattermost,
                                                               rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    helper = fake._user("helperbot", is_bot=True)  # noqa: SLF001 - another bot account
    fake.users[helper["id"]] = helper
    fake.channels[dm].members.append(helper["id"])
    provider = await rig.start()
    await provider.send(OutgoingMessage(chat_id=dm, text="I said this"))
    await fake.user_says(dm, "beep", sender=helper)
    await fake.user_says(dm, "a person")
    await rig.handed("a person")


async def test_bad_payloads_are_logged_and_dropped(fake: FakeMattermost, rig: Rig,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pluto.providers.mattermost")
    dm = fake.add_direct(fake.alice)
    await rig.start()
    [sock] = fake.sockets
    await sock.ws.send_str("this is not JSON")
    await sock.ws.send_json(["not", "an", "object"])
    await sock.send("posted", {"post": "{broken"}, {})
    await sock.send("posted", {"post": json.dumps([1, 2])}, {})
    await sock.send("posted", "not a dict", {})  # type: ignore[arg-type]
    await sock.send("posted", {"post": json.dumps({"message": "no id"})}, {})

    def warned() -> str:
        return " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    await fake.wait_until(lambda: "no id" in warned(), 10, "the last bad event to be read")
    await fake.user_says(dm, "still listening?")
    await rig.handed("still listening?")
    assert rig.task is not None and not rig.task.done()
    assert fake.sockets_opened == 1  # read past, not a reconnect
    assert "not JSON" in warned() and "not an object" in warned()
    assert "Traceback" not in caplog.text


async def test_missed_posts_are_fetched_after_a_reconnect_once(fake: FakeMattermost,
                                                               rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    await rig.start()
    await fake.user_says(dm, "one")
    await rig.handed("one")
    opened = fake.sockets_opened
    await fake.disconnect()
    await fake.user_says(dm, "two")  # nobody is connected: only since brings it
    fake.touch(rig.intake.got[0].message_id or "")  # "one" changed: since returns it again
    await fake.wait_until(lambda: fake.sockets_opened > opened, 10, "a reconnect")
    await fake.user_says(dm, "three")
    await rig.handed("one", "two", "three")
    assert any(c.path == f"channels/{dm}/posts" and c.query.get("since") for c in fake.calls)


async def test_a_gap_in_seq_fetches_what_was_lost(fake: FakeMattermost, rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    await rig.start()
    teams = len([c for c in fake.calls if c.path == "users/me/teams"])
    [sock] = fake.sockets
    sock.seq += 3  # three events never reached the provider
    await fake.user_says(dm, "after the gap")
    await rig.handed("after the gap")
    assert len([c for c in fake.calls if c.path == "users/me/teams"]) == teams + 1


async def test_a_restart_resumes_where_it_stopped(fake: FakeMattermost, rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    await fake.user_says(dm, "before the bot ever started")
    await rig.start()
    await fake.user_says(dm, "first")
    await rig.handed("first")
    await rig.stop()
    await fake.user_says(dm, "while it was down")
    await rig.start()
    await fake.wait_until(lambda: "while it was down" in rig.texts(), 10, "the missed post")
    # at least once: a post handed just before the stop may come again (the gateway's dedupe
    # drops it by its id); never one from before the first start
    assert list(dict.fromkeys(rig.texts())) == ["first", "while it was down"]
    assert len({m.message_id for m in rig.intake.got}) == 2


async def test_a_post_not_recorded_is_fetched_again_in_order(fake: FakeMattermost,
                                                             rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    rig.intake = FlakyIntake(failures=2)
    await rig.start()
    await fake.user_says(dm, "one")
    await fake.user_says(dm, "two")
    await rig.handed("one", "two")


async def test_files_in_are_downloaded_with_a_cap(fake: FakeMattermost, rig: Rig,
                                                  data_dir: Path) -> None:
    dm = fake.add_direct(fake.alice)
    await rig.start(max_download_mb=0.001)
    await fake.user_says(dm, "small", file=("a.csv", b"x,y\n1,2\n", "text/csv"))
    await fake.user_says(dm, "big", file=("b.csv", b"x" * 5000, "text/csv"))
    [small, big] = await rig.handed("small", "big")
    [attachment] = small.attachments
    assert attachment.path is not None and attachment.path.read_bytes() == b"x,y\n1,2\n"
    assert attachment.path.is_relative_to(data_dir / "uploads" / "mattermost")
    assert not big.attachments
    [notice] = fake.bot_posts(dm)
    assert "too large" in notice["message"]


async def test_sending_files_edits_deletes_and_typing(fake: FakeMattermost, rig: Rig,
                                                      tmp_path: Path) -> None:
    dm = fake.add_direct(fake.alice)
    provider = await rig.start()
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG fake")
    sent = await provider.send(OutgoingMessage(chat_id=dm, attachments=(Attachment(
        filename="chart.png", mime_type="image/png", path=chart, kind="image"),)))
    assert sent is not None
    [file_id] = fake.posts[sent]["file_ids"]
    assert fake.file_bytes(file_id) == b"\x89PNG fake"
    text = await provider.send(OutgoingMessage(chat_id=dm, text="draft"))
    assert text is not None
    await provider.edit(OutgoingMessage(chat_id=dm, text="final", edit_of=text))
    assert fake.posts[text]["message"] == "final"
    assert await provider.delete(dm, text) and fake.posts[text]["delete_at"]
    assert await provider.delete(dm, "nosuchpost00000000000000aa")  # already gone
    await provider.typing(dm, "root")
    await fake.wait_until(lambda: fake.typing, 5, "the typing action")
    assert fake.typing == [(dm, "root")]


async def test_errors_become_provider_errors(fake: FakeMattermost, rig: Rig) -> None:
    dm = fake.add_direct(fake.alice)
    provider = rig.build()
    fake.fail_next(ApiFailure.too_many(2))
    with pytest.raises(RateLimited) as limited:
        await provider.send(OutgoingMessage(chat_id=dm, text="hi"))
    assert limited.value.retry_after == 2
    secret = fake.add_channel("secret", [fake.alice], kind="P")
    with pytest.raises(DeliveryRefused, match="not a member"):
        await provider.send(OutgoingMessage(chat_id=secret, text="hi"))
    with pytest.raises(DeliveryRefused, match="not a Mattermost id"):
        await provider.edit(OutgoingMessage(chat_id=dm, text="hi", edit_of="../users/me"))
    with pytest.raises(DeliveryRefused, match="16383"):
        await provider.send(OutgoingMessage(chat_id=dm, text="x" * 16384))
    fake.fail_next(ApiFailure(401, "api.context.session_expired.app_error", "expired"))
    with pytest.raises(ProviderUnusable, match=TOKEN_ENV):
        await provider.send(OutgoingMessage(chat_id=dm, text="hi"))
    await provider.close()


async def test_the_token_is_never_logged(fake: FakeMattermost, rig: Rig,
                                         monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    dm = fake.add_direct(fake.alice)
    await rig.start()
    await fake.user_says(dm, f"my token is {fake.token}")  # even when a user pastes it
    await rig.handed(f"my token is {fake.token}")
    await fake.disconnect()
    await fake.wait_until(lambda: fake.sockets_opened > 1, 10, "a reconnect")
    await rig.stop()
    monkeypatch.setenv(TOKEN_ENV, "wrong-token-0123456789")
    wrong = rig.build()
    with pytest.raises(ProviderUnusable) as refused:
        await wrong.run(RecordingIntake())  # type: ignore[arg-type]
    await wrong.close()
    assert "wrong-token" not in str(refused.value)
    assert "connected" in caplog.text and "reconnecting" in caplog.text  # the logs were read
    assert fake.token not in caplog.text and "wrong-token-0123456789" not in caplog.text


def test_a_model_cannot_mention_anyone() -> None:
    [out] = render_chunks("Hello @all and @channel, ask `@here`", MATTERMOST, 4000)
    assert "@all" not in out and "@channel" not in out and "@\u200ball" in out
    assert "`@here`" in out  # code is never a mention


def test_settings_are_checked(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MATTERMOST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="providers.mattermost.token_env"):
        MattermostProvider.from_context(provider_context(ProviderConfig(enabled=True),
                                                         data_dir))
    monkeypatch.setenv("MATTERMOST_TOKEN", "abcdefgh")
    with pytest.raises(ConfigError, match="providers.mattermost.url"):
        MattermostProvider.from_context(provider_context(
            ProviderConfig(enabled=True, url="chat.example.com"), data_dir))
    provider = MattermostProvider.from_context(provider_context(
        ProviderConfig(enabled=True, url="https://chat.example.com/api/v4/"), data_dir))
    assert provider.settings.websocket_url == "wss://chat.example.com/api/v4/websocket"


def test_mentions_are_words_of_their_own() -> None:
    from pluto.providers.mattermost.inbound import mentions, post_of, without_mention

    def post(text: str) -> Any:
        return post_of({"id": "p" * 26, "channel_id": "c" * 26, "user_id": "u" * 26,
                        "message": text})
    assert mentions(post("@Pluto: hi"), "pluto") and mentions(post("hey @pluto."), "pluto")
    assert not mentions(post("@plutonium hi"), "pluto")
    assert not mentions(post("@pluto.bot hi"), "pluto") and not mentions(post("a@pluto"), "pluto")
    assert without_mention("@pluto: what now?", "pluto") == "what now?"
    assert without_mention("so @pluto what now?", "pluto") == "so what now?"
