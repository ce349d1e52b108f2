"""The Matrix provider against the fake homeserver: what only Matrix has (the stored sync
position across restarts, gaps in a cut timeline, invitations, encrypted rooms, threads, edits,
its error codes), and its settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pluto.errors import (ConfigError, DeliveryRefused, ProviderUnusable, RateLimited,
                          StorageError)
from pluto.gateway.delivery.render import render_chunks
from pluto.providers.matrix import MatrixProvider
from pluto.providers.matrix.markup import MATRIX_HTML, to_event_content
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import ProviderConfig
from pluto.types import Attachment, OutgoingMessage
from tests.conformance.matrix_harness import TOKEN_ENV, MatrixHarness
from tests.fakes.matrix_server import SERVER, FakeMatrix, MatrixFailure
from tests.helpers.gateway import RecordingIntake, provider_context

DM = f"!dm:{SERVER}"
TEAM = f"!team:{SERVER}"
BOB = f"@bob:{SERVER}"


class Rig:
    """The provider syncing from the fake into a recording intake; restartable."""

    def __init__(self, fake: FakeMatrix, data_dir: Path):
        self.fake, self.data_dir = fake, data_dir
        self.intake = RecordingIntake()
        self.provider: MatrixProvider | None = None
        self.task: asyncio.Task[None] | None = None

    def build(self, **extra: Any) -> MatrixProvider:
        config = {"enabled": True, "homeserver": self.fake.url, "access_token_env": TOKEN_ENV,
                  "sync_timeout_seconds": 5, **extra}
        return MatrixProvider.from_context(provider_context(ProviderConfig(**config),
                                                            self.data_dir))

    async def start(self, **extra: Any) -> MatrixProvider:
        polls = self.long_polls()
        self.provider = self.build(**extra)
        self.task = asyncio.create_task(self.provider.run(self.intake))  # type: ignore[arg-type]
        await self.fake.wait_until(lambda: self.long_polls() > polls or self.task.done(), 10,
                                   "the provider to sync")
        return self.provider

    def long_polls(self) -> int:
        return len([c for c in self.fake.calls if c.path == "client/v3/sync"
                    and c.query.get("since")])

    async def synced(self) -> None:
        """Until the provider handled everything and is waiting again."""
        polls = self.long_polls()
        await self.fake.wait_until(lambda: self.long_polls() > polls, 10, "the next sync")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.provider is not None:
            await self.provider.close()

    def texts(self) -> list[str]:
        return [m.text for m in self.intake.got]


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeMatrix]:
    async with FakeMatrix() as f:
        f.add_user(BOB, "Bob")
        f.add_room(DM, members=[f.alice, f.bot_id])
        f.add_room(TEAM, members=[f.alice, BOB, f.bot_id])
        monkeypatch.setenv(TOKEN_ENV, f.token)
        yield f


@pytest.fixture
async def rig(fake: FakeMatrix, data_dir: Path) -> AsyncIterator[Rig]:
    r = Rig(fake, data_dir)
    try:
        yield r
    finally:
        await r.stop()


# settings and identity -------------------------------------------------------------------------

def test_settings_name_the_field(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "syt_x")
    with pytest.raises(ConfigError, match="providers.matrix.homeserver"):
        MatrixProvider.from_context(provider_context(ProviderConfig(
            enabled=True, homeserver="matrix.example.org", access_token_env=TOKEN_ENV), data_dir))
    with pytest.raises(ConfigError, match="providers.matrix.access_token_env.*NOPE_UNSET"):
        MatrixProvider.from_context(provider_context(ProviderConfig(
            enabled=True, access_token_env="NOPE_UNSET"), data_dir))
    with pytest.raises(ConfigError, match="providers.matrix.user_id"):
        MatrixProvider.from_context(provider_context(ProviderConfig(
            enabled=True, access_token_env=TOKEN_ENV, user_id="pluto"), data_dir))


async def test_a_rejected_token_or_the_wrong_account_stops_the_provider(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(TOKEN_ENV, "syt_not_the_right_token_000")
    provider = rig.build()
    with pytest.raises(ProviderUnusable, match=TOKEN_ENV):
        await provider.run(rig.intake)  # type: ignore[arg-type]
    await provider.close()
    assert "syt_not_the_right_token_000" not in caplog.text
    monkeypatch.setenv(TOKEN_ENV, rig.fake.token)
    provider = rig.build(user_id=f"@someone:{SERVER}")
    with pytest.raises(ProviderUnusable, match="belongs to @pluto"):
        await provider.run(rig.intake)  # type: ignore[arg-type]
    await provider.close()


# receiving -------------------------------------------------------------------------------------

async def test_direct_chats_and_rooms(rig: Rig) -> None:
    await rig.start()
    rig.fake.user_says(DM, "hello")
    rig.fake.user_says(TEAM, "among ourselves", sender=BOB)
    rig.fake.user_says(TEAM, "what now?", sender=BOB, mention=True)
    await rig.synced()
    dm, team = rig.intake.got
    assert (dm.chat_id, dm.user_id, dm.text, dm.is_direct) == (DM, rig.fake.alice, "hello", True)
    assert (team.chat_id, team.text, team.is_direct, team.mentions_bot) == (
        TEAM, "what now?", False, True)


async def test_threads_are_sessions_and_replies_stay_in_them(rig: Rig) -> None:
    provider = await rig.start()
    root = rig.fake.user_says(TEAM, "a question", sender=BOB, mention=True)
    await rig.synced()
    in_thread = rig.fake.user_says(TEAM, "more on it", sender=BOB, thread=root["event_id"])
    rig.fake.user_says(TEAM, "other thread", sender=BOB, thread="$elsewhere")
    await rig.synced()
    first, second = rig.intake.got  # the bot takes part in the first thread only
    assert first.thread_id is None and second.thread_id == root["event_id"]
    assert second.text == "more on it" and second.mentions_bot
    await provider.send(OutgoingMessage(chat_id=TEAM, text="answer", thread_id=root["event_id"],
                                        answers=in_thread["event_id"]))
    [sent] = rig.fake.bot_messages(TEAM)
    assert sent["content"]["m.relates_to"] == {
        "rel_type": "m.thread", "event_id": root["event_id"], "is_falling_back": True,
        "m.in_reply_to": {"event_id": in_thread["event_id"]}}
    assert sent["content"]["m.mentions"] == {}


async def test_a_restart_neither_misses_nor_repeats(rig: Rig) -> None:
    await rig.start()
    rig.fake.user_says(DM, "before")
    await rig.synced()
    await rig.stop()
    rig.fake.user_says(DM, "while away")
    await rig.start()
    await rig.synced()
    assert rig.texts() == ["before", "while away"]
    assert (rig.data_dir / "matrix" / f"pluto_{SERVER}.json").is_file()


async def test_a_message_intake_could_not_record_comes_again(rig: Rig) -> None:
    class Broken(RecordingIntake):
        broken, tries = True, 0

        async def submit(self, msg):  # type: ignore[no-untyped-def]
            if self.broken:
                self.tries += 1
                raise StorageError("the database is gone")
            return await super().submit(msg)

    rig.intake = broken = Broken()
    await rig.start()
    rig.fake.user_says(DM, "do not lose me")
    await rig.fake.wait_until(lambda: broken.tries >= 2)  # the same batch, synced again
    assert rig.task is not None and not rig.task.done()  # no crash, no restart
    assert rig.texts() == []
    broken.broken = False  # storage works again
    await rig.fake.wait_until(lambda: rig.texts() == ["do not lose me"])
    await rig.synced()
    assert rig.texts() == ["do not lose me"]


async def test_the_first_start_does_not_answer_history(rig: Rig) -> None:
    rig.fake.user_says(DM, "old news")
    await rig.start()
    rig.fake.user_says(DM, "new")
    await rig.synced()
    assert rig.texts() == ["new"]


async def test_a_cut_timeline_is_filled_from_the_room_history(rig: Rig) -> None:
    await rig.start()
    await rig.stop()
    for i in range(130):  # more than a sync's timeline holds (100)
        rig.fake.user_says(DM, f"m{i}")
    await rig.start()
    await rig.synced()
    assert rig.texts() == [f"m{i}" for i in range(130)]


async def test_an_invitation_is_accepted(rig: Rig) -> None:
    room = rig.fake.add_room(members=[rig.fake.alice], invite_bot=True)
    await rig.start()
    await rig.fake.wait_until(lambda: rig.fake.bot_id in rig.fake.rooms[room].members, 10,
                              "the bot to join")
    rig.fake.user_says(room, "hi, new room")
    await rig.synced()
    assert rig.texts() == ["hi, new room"]


async def test_an_encrypted_room_is_said_to_be_unsupported(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    secret_room = rig.fake.add_room(members=[rig.fake.alice, rig.fake.bot_id], encrypted=True)
    with caplog.at_level(logging.WARNING, logger="pluto.providers.matrix"):
        await rig.start()
        rig.fake.user_says(secret_room, "can you read this?")
        rig.fake.user_says(secret_room, "and this?")
        await rig.synced()
    assert rig.intake.got == []
    said = [r for r in caplog.records if "encrypted rooms are not supported" in r.getMessage()]
    assert len(said) == 1 and secret_room in said[0].getMessage()


async def test_edits_notices_own_messages_and_a_redelivery_are_not_new_messages(rig: Rig) -> None:
    provider = await rig.start()
    first = rig.fake.user_says(DM, "hello")
    await rig.synced()
    rig.fake.user_says(DM, "hello again", edit_of=first["event_id"])
    notice = rig.fake.user_says(DM, "I am another bot")
    notice["content"]["msgtype"] = "m.notice"  # bots write notices: never answered
    await provider.send(OutgoingMessage(chat_id=DM, text="my own words"))
    rig.fake.replay(first["event_id"])
    await rig.synced()
    assert rig.texts() == ["hello"]


async def test_a_file_is_downloaded_and_a_too_large_one_refused(rig: Rig) -> None:
    await rig.start(max_download_mb=0.001)
    rig.fake.user_says(DM, "look", file=("a.csv", b"x,y\n1,2\n", "text/csv"))
    rig.fake.user_says(DM, "", file=("big.csv", b"x" * 5000, "text/csv"))
    await rig.synced()
    await rig.fake.wait_until(lambda: rig.fake.bot_messages(DM), 5, "the notice")
    small, *_ = rig.intake.got
    [attachment] = small.attachments
    assert small.text == "look" and attachment.filename == "a.csv"
    assert attachment.path is not None and attachment.path.read_bytes() == b"x,y\n1,2\n"
    [notice] = rig.fake.bot_messages(DM)
    assert notice["content"]["msgtype"] == "m.notice" and "too large" in notice["content"]["body"]
    assert len(rig.intake.got) == 1


# sending ---------------------------------------------------------------------------------------

async def test_html_with_its_plain_body_and_safe_links() -> None:
    text = ("**bold** and [docs](https://example.org) and [me](https://matrix.to/#/@x:y)\n\n"
            "```\nx = 1 < 2\n```")
    [chunk] = render_chunks(text, MATRIX_HTML, 4000)
    content = to_event_content(chunk, MATRIX_HTML.name)
    assert content["formatted_body"] == (
        '<strong>bold</strong> and <a href="https://example.org">docs</a> and me<br><br>'
        "<pre><code>x = 1 &lt; 2</code></pre>")
    assert content["body"] == "bold and docs and me\n\nx = 1 < 2"
    assert to_event_content("plain", "plain") == {"msgtype": "m.text", "body": "plain"}


async def test_an_edit_replaces_the_message(rig: Rig) -> None:
    provider = await rig.start()
    event_id = await provider.send(OutgoingMessage(chat_id=DM, text="Hel"))
    await provider.edit(OutgoingMessage(chat_id=DM, text="<strong>Hello</strong>",
                                        markup=MATRIX_HTML.name, edit_of=event_id))
    [original] = rig.fake.bot_messages(DM)
    assert rig.fake.current(original)["formatted_body"] == "<strong>Hello</strong>"
    [edit] = rig.fake.edits[event_id]
    assert edit["content"]["body"] == "* Hello"


async def test_images_and_files_go_out_uploaded(rig: Rig, tmp_path: Path) -> None:
    provider = await rig.start()
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    await provider.send(OutgoingMessage(chat_id=DM, attachments=(
        Attachment(filename="chart.png", mime_type="image/png", path=chart, kind="image"),
        Attachment(filename="t.csv", mime_type="text/csv", path=chart))))
    image, document = (rig.fake.current(e) for e in rig.fake.bot_messages(DM))
    assert image["msgtype"] == "m.image" and document["msgtype"] == "m.file"
    assert rig.fake.media_bytes(image["url"]) == chart.read_bytes()
    assert image["info"] == {"mimetype": "image/png", "size": len(chart.read_bytes())}
    with pytest.raises(DeliveryRefused, match="can no longer be read"):
        await provider.send(OutgoingMessage(chat_id=DM, attachments=(
            Attachment(filename="gone.png", path=tmp_path / "gone.png", kind="image"),)))


async def test_errors_are_typed(rig: Rig) -> None:
    provider = await rig.start()
    msg = OutgoingMessage(chat_id=DM, text="hi")
    rig.fake.fail_next(MatrixFailure("M_LIMIT_EXCEEDED", "Too many", 429, retry_after_ms=2500))
    with pytest.raises(RateLimited) as limited:
        await provider.send(msg)
    assert limited.value.retry_after == 2.5
    rig.fake.fail_next(MatrixFailure("M_LIMIT_EXCEEDED", "Too many", 429))
    with pytest.raises(RateLimited) as unnamed:
        await provider.send(msg)
    assert unnamed.value.retry_after == 1.0
    with pytest.raises(DeliveryRefused, match="not in the room"):
        await provider.send(OutgoingMessage(chat_id=f"!nowhere:{SERVER}", text="hi"))
    with pytest.raises(DeliveryRefused, match="not a Matrix room"):
        await provider.send(OutgoingMessage(chat_id="general", text="hi"))
    rig.fake.fail_next(MatrixFailure("M_UNKNOWN_TOKEN", "gone", 401))
    with pytest.raises(ProviderUnusable):
        await provider.send(msg)
    rig.fake.fail_next(MatrixFailure("M_UNKNOWN", "oops", 500))
    with pytest.raises(Exception) as server:
        await provider.send(msg)
    assert not isinstance(server.value, (DeliveryRefused, ProviderUnusable))
    assert await provider.send(msg)


async def test_a_rate_limited_sync_waits_as_asked(rig: Rig) -> None:
    await rig.start()
    rig.fake.fail_next(MatrixFailure("M_LIMIT_EXCEEDED", "slow down", 429, retry_after_ms=300),
                       when=lambda c: c.path == "client/v3/sync")
    rig.fake.user_says(DM, "hi")
    await rig.fake.wait_until(lambda: rig.intake.got, 10, "the message after the wait")
    assert rig.texts() == ["hi"]


async def test_typing_until_the_answer(rig: Rig) -> None:
    provider = await rig.start()
    await provider.typing(DM)
    await provider.send(OutgoingMessage(chat_id=DM, text="preview", kind="delta"))
    assert rig.fake.typing == [(DM, True)]
    await provider.send(OutgoingMessage(chat_id=DM, text="the answer"))
    await provider.send(OutgoingMessage(chat_id=DM, text="more"))
    assert rig.fake.typing == [(DM, True), (DM, False)]


# through the gateway -----------------------------------------------------------------------------

async def test_secrets_never_reach_the_log(config_dir: Path, data_dir: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    h = MatrixHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        with caplog.at_level(logging.DEBUG):
            await h.start(ScriptedModel(Scripted(text="fine")))
            await h.user_says("hello")
            await h.wait_texts(["fine"])
    finally:
        await h.close()
    assert h.fake.token not in caplog.text
