"""The Discord provider against the fake Discord (REST and the gateway websocket).

Receiving, sending, errors and configuration are checked on the provider alone; reconnects,
resumes and replays run through a whole gateway (the conformance harness), where a duplicate
reply would show. The scenarios every provider shares are in tests/conformance.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import discord.gateway
import discord.http
import pytest

from pluto.errors import ConfigError
from tests.helpers.gateway import RecordingIntake, permanent, provider_context
from pluto.settings import ProviderConfig
from pluto.errors import ProviderError

from pluto.gateway.pipeline.routing import session_key
from pluto.types import Attachment, IncomingMessage, OutgoingMessage
from pluto.providers.discord import DiscordProvider, DiscordSettings
from pluto.providers.discord.inbound import safe_filename
from pluto.providers.discord.outbound import nonce_for
from tests.conformance.discord_harness import DiscordHarness
from tests.conformance.test_scenarios import png
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.discord_state import INTENT_MESSAGE_CONTENT, PRIVILEGED_INTENTS


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
    guild = fake.add_guild(name="Pluto Lab", members=[bob["id"]])
    general = fake.add_channel(guild["id"], name="general")
    thread = fake.add_thread(int(general["id"]), name="a thread")
    dm = fake.add_dm(fake.default_user)
    return {"guild": guild["id"], "general": int(general["id"]), "thread": int(thread["id"]),
            "dm": int(dm["id"]), "bob": int(bob["id"]), "alice": int(fake.default_user["id"])}


def make(fake: FakeDiscord, data_dir: Path, **options: Any) -> DiscordProvider:
    settings = DiscordSettings(enabled=True, api_base=fake.api_base, gateway_url=fake.gateway_url,
                               guild_ready_timeout=0.1, **options)
    return DiscordProvider(settings, fake.token, data_dir=data_dir)


class Running:
    """A provider receiving in the background; ``got`` is what it handed to the gateway."""

    def __init__(self, provider: DiscordProvider, fake: FakeDiscord):
        self.provider, self.fake = provider, fake
        self.intake = RecordingIntake()
        self.got: list[IncomingMessage] = self.intake.got
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        before = len([i for i in self.fake.identifies if i.accepted])
        self.task = asyncio.create_task(self.provider.run(self.intake))
        await self.fake.wait_for_identifies(before + 1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.provider.close()

    async def wait(self, n: int) -> list[IncomingMessage]:
        await self.fake.wait_until(lambda: len(self.got) >= n, what=f"{n} message(s)")
        return self.got

    async def after_marker(self, dm: int) -> list[IncomingMessage]:
        """What was handed over before a direct message sent last: the provider hands messages
        over one at a time in the order they came, so once that one is here every earlier
        event has been handled (taken or ignored)."""
        marker = self.fake.inject_message(dm, "a last message, to know the others were handled")
        await self.fake.wait_until(lambda: any(m.message_id == marker["id"] for m in self.got),
                                   what="the last message")
        *before, last = self.got
        assert last.message_id == marker["id"], [m.text for m in self.got]
        return before


# receiving ---------------------------------------------------------------------------------

async def test_dm_guild_and_thread_messages(fake, world, data_dir):
    async with Running(make(fake, data_dir), fake) as r:
        dm = fake.inject_message(world["dm"], "hello")
        guild = fake.inject_message(world["general"], f"{fake.bot_mention} what now?",
                                    author=world["bob"])
        thread = fake.inject_message(world["thread"], f"<@!{fake.bot_id}>, in the thread")
        got = await r.wait(3)
    assert [(m.chat_id, m.user_id, m.text, m.message_id) for m in got] == [
        (str(world["dm"]), str(world["alice"]), "hello", dm["id"]),
        (str(world["general"]), str(world["bob"]), "what now?", guild["id"]),
        (str(world["thread"]), str(world["alice"]), "in the thread", thread["id"])]
    assert [(m.is_direct, m.mentions_bot, m.guild_id, m.thread_id) for m in got] == [
        (True, True, None, None), (False, True, str(world["guild"]), None),
        (False, True, str(world["guild"]), str(world["thread"]))]
    assert got[1].user_name == "Bob" and got[0].provider == "discord"


async def test_in_servers_mentions_and_replies_by_id_count(fake, world, data_dir):
    provider = make(fake, data_dir)
    async with Running(provider, fake) as r:
        mine = await provider.send(OutgoingMessage(chat_id=str(world["general"]), text="ask me"))
        assert mine is not None
        other = fake.inject_message(world["general"], "someone else's words", author=world["bob"])
        for text, kwargs in [
            ("Pluto Test Bot, are you there?", {}),  # the bot's name is not a mention
            ("@everyone listen", {"mention_everyone": True}),
            (f"<@{world['bob']}> for bob", {}),
            ("to the human", {"reply_to": int(other["id"])}),
            ("mentioned in the array", {"mentions": ["bot"]}),
            (f"hey <@{world['bob']}>, ask <@{fake.bot_id}>", {}),
            ("a reply without a ping", {"reply_to": int(mine), "reply_mention": False}),
        ]:
            fake.inject_message(world["general"], text, author=world["alice"], **kwargs)
        await r.wait(3)
        got = await r.after_marker(world["dm"])
    assert [m.text for m in got] == ["mentioned in the array", "hey @Bob, ask",
                                     "a reply without a ping"]
    assert all(m.mentions_bot and not m.is_direct for m in got)
    assert got[2].reply_to_id == mine


async def test_guild_messages_all_lets_the_routing_table_decide(fake, world, data_dir):
    async with Running(make(fake, data_dir, guild_messages="all"), fake) as r:
        fake.inject_message(world["general"], "just chatting", author=world["bob"])
        [got] = await r.wait(1)
    assert not got.mentions_bot and not got.is_direct and got.text == "just chatting"


async def test_own_and_other_bots_messages_and_empty_ones_are_ignored(fake, world, data_dir):
    provider = make(fake, data_dir)
    robot = fake.add_user(username="robot", bot=True)
    async with Running(provider, fake) as r:
        await provider.send(OutgoingMessage(chat_id=str(world["dm"]), text="from the bot"))
        fake.inject_message(world["general"], f"{fake.bot_mention} beep", author=robot["id"])
        fake.inject_message(world["general"], fake.bot_mention)  # a mention and nothing else
        fake.inject_message(world["dm"], "a real one")
        await r.wait(1)
        [got] = await r.after_marker(world["dm"])
    assert got.text == "a real one"


async def test_without_the_content_intent_mentions_and_dms_still_arrive(fake, world, data_dir):
    async with Running(make(fake, data_dir, message_content_intent=False,
                            guild_messages="all"), fake) as r:
        fake.inject_message(world["general"], "unreadable without the intent")
        fake.inject_message(world["general"], f"{fake.bot_mention} readable")
        fake.inject_message(world["dm"], "private")
        await r.wait(2)
        got = await r.after_marker(world["dm"])
    assert [m.text for m in got] == ["readable", "private"]
    assert not fake.identifies[-1].intents & INTENT_MESSAGE_CONTENT


async def test_a_thread_is_its_own_conversation_and_replies_stay_in_it(fake, world, data_dir):
    provider = make(fake, data_dir)
    async with Running(provider, fake) as r:
        fake.inject_message(world["general"], f"{fake.bot_mention} in the channel")
        fake.inject_message(world["thread"], f"{fake.bot_mention} in the thread")
        channel, thread = await r.wait(2)
        await provider.send(OutgoingMessage(chat_id=thread.chat_id, thread_id=thread.thread_id,
                                            text="answer", reply_to=thread.message_id))
    for scope in ("chat", "thread"):  # the default, and a rule with `session: thread`
        assert session_key("a", scope, channel) != session_key("a", scope, thread)
    [sent] = fake.messages(world["thread"])
    assert sent.reply_to == int(thread.message_id or 0) and not fake.messages(world["general"])


async def test_files_are_downloaded_into_the_data_dir(fake, world, data_dir):
    async with Running(make(fake, data_dir), fake) as r:
        fake.inject_message(world["dm"], "numbers",
                            attachments=[("..\\..\\pass wd.csv", b"a,b\n1,2\n")])
        fake.inject_message(world["dm"], "", attachments=[("chart.png", png())])
        doc, image = await r.wait(2)
    [a] = doc.attachments
    assert a.path is not None and a.path.read_bytes() == b"a,b\n1,2\n"
    assert a.path.parent == data_dir / "uploads" / "discord" / str(world["dm"])
    assert a.path.name.endswith("pass wd.csv") and ".." not in a.path.name
    assert (a.mime_type, a.kind, doc.text) == ("text/csv", "file", "numbers")
    [p] = image.attachments
    assert (p.kind, p.mime_type, image.text) == ("image", "image/png", "")
    assert p.path is not None and p.path.read_bytes() == png()


async def test_files_too_large_or_gone_are_refused_politely(fake, world, data_dir):
    async with Running(make(fake, data_dir, max_download_mb=0.0001), fake) as r:
        fake.inject_message(world["dm"], "look", attachments=[("big.bin", b"x" * 200)])
        [got] = await r.wait(1)
        [notice] = await fake.wait_for_messages(world["dm"], 1)
    assert notice.content == ("The file big.bin is too large for me to read (the limit is "
                              "0.0001 MB).")
    assert got.text == "look" and not got.attachments and not (data_dir / "uploads").exists()
    async with Running(make(fake, data_dir), fake) as r:
        msg = fake.inject_message(world["general"], f"{fake.bot_mention} this",
                                  attachments=[("gone.csv", b"a\n1\n")])
        fake._files.clear()  # noqa: SLF001 - the CDN lost the file: its URL answers 404
        [got] = await r.wait(1)
        notices = await fake.wait_for_messages(world["general"], 1)
    assert "could not download the file gone" in notices[0].content
    assert notices[0].reply_to == int(msg["id"]) and not got.attachments


def test_safe_filename_keeps_files_in_their_folder():
    assert safe_filename("../../etc/passwd") == "passwd"
    assert safe_filename("..\\..\\win.ini") == "win.ini"
    assert safe_filename("...") == "file" and safe_filename("a/b/ö.csv") == "_.csv"


# sending -----------------------------------------------------------------------------------

async def test_send_edit_typing_and_markup(fake, world, data_dir):
    provider = make(fake, data_dir)
    chat = str(world["general"])
    first = await provider.send(OutgoingMessage(chat_id=chat, text="**bold** @everyone",
                                                markup="discord"))
    await provider.send(OutgoingMessage(chat_id=chat, text="snake_case *not bold*"))  # plain
    await provider.send(OutgoingMessage(chat_id=chat, text="| a |\n|---|\n| 1 |",
                                        markup="markdown"))
    await provider.edit(OutgoingMessage(chat_id=chat, text="final", edit_of=first))
    await provider.typing(chat)
    await provider.send(OutgoingMessage(chat_id=chat, text="gone", reply_to="999"))
    await provider.send(OutgoingMessage(chat_id=chat, text="odd", reply_to="not-an-id"))
    sent = fake.messages(world["general"])
    assert [s.current_content for s in sent] == ["final", "snake_case \\*not bold\\*",
                                                 "```\na\n-\n1\n```", "gone", "odd"]
    assert [s.reply_to for s in sent[3:]] == [None, None]  # a quote of nothing: sent plainly
    assert sent[0].content == "**bold** @everyone" and len(sent[0].edits) == 1
    assert sent[0].payload["allowed_mentions"] == {"parse": [], "replied_user": True}
    assert [t.channel_id for t in fake.typing] == [world["general"]]
    await provider.close()


async def test_a_run_chunk_sent_twice_is_posted_once(fake, world, data_dir):
    provider = make(fake, data_dir)
    chunk = OutgoingMessage(chat_id=str(world["dm"]), text="chunk one", run_id="run-1")
    notice = OutgoingMessage(chat_id=str(world["dm"]), text="a notice")
    first, again = await provider.send(chunk), await provider.send(chunk)
    await provider.send(notice)
    await provider.send(notice)
    assert first == again
    assert [s.content for s in fake.messages(world["dm"])] == ["chunk one", "a notice",
                                                               "a notice"]
    other = OutgoingMessage(chat_id=str(world["dm"]), text="chunk two", run_id="run-1")
    assert nonce_for(chunk) != nonce_for(other) and len(nonce_for(chunk) or "") <= 25
    assert nonce_for(notice) is None
    await provider.close()


async def test_images_and_files_go_out_as_uploads(fake, world, data_dir, tmp_path):
    provider = make(fake, data_dir)
    chart, notes = tmp_path / "chart.png", tmp_path / "notes.csv"
    chart.write_bytes(png())
    notes.write_bytes(b"a,b\n")
    await provider.send(OutgoingMessage(chat_id=str(world["dm"]), text="two files", attachments=(
        Attachment(filename="chart.png", path=chart, kind="image"),
        Attachment(filename="notes.csv", path=notes))))
    [sent] = fake.messages(world["dm"])
    assert sent.content == "two files"
    assert [(a.filename, a.content_type, a.data) for a in sent.attachments] == [
        ("chart.png", "image/png", png()), ("notes.csv", "text/csv; charset=utf-8", b"a,b\n")]
    missing = OutgoingMessage(chat_id=str(world["dm"]), attachments=(
        Attachment(filename="gone.png", path=tmp_path / "gone.png", kind="image"),))
    with pytest.raises(ProviderError, match="can no longer be read") as info:
        await provider.send(missing)
    assert permanent(info.value)
    await provider.close()


async def test_errors_become_provider_errors(fake, world, data_dir):
    provider = make(fake, data_dir)
    dm, general = str(world["dm"]), str(world["general"])
    fake.forbid(world["dm"], 50007)
    fake.fail_next("send_message", 403, 50013, channel_id=world["general"])
    cases = [(OutgoingMessage(chat_id=dm, text="hi"), "DMs may be closed"),
             (OutgoingMessage(chat_id=general, text="hi"), "lacks the permission"),
             (OutgoingMessage(chat_id="123456789012345678", text="hi"), "no longer exists"),
             (OutgoingMessage(chat_id="general", text="hi"), "not a Discord channel id"),
             (OutgoingMessage(chat_id=general, text="x" * 2001), "Must be 2000 or fewer")]
    for message, words in cases:
        with pytest.raises(ProviderError, match=words) as info:
            await provider.send(message)
        assert permanent(info.value) and info.value.retry_after is None
    for edit_of, words in (("42", "no longer exists"), ("x", "not a Discord message id")):
        with pytest.raises(ProviderError, match=words) as info:
            await provider.edit(OutgoingMessage(chat_id=general, text="x", edit_of=edit_of))
        assert permanent(info.value)
    fake.fail_next("send_message", 503)
    fake.drop_next("send_message", channel_id=world["general"])
    for words in ("server error", "could not reach Discord"):
        with pytest.raises(ProviderError, match=words) as info:
            await provider.send(OutgoingMessage(chat_id=general, text="hi"))
        assert not permanent(info.value)
    await provider.close()


async def test_a_429_on_a_send_is_raised_for_flood_control_elsewhere_discord_py_waits(
        fake, world, data_dir):
    provider = make(fake, data_dir)
    fake.rate_limit_next("me", 0.2)                          # logging in: discord.py waits
    await provider.probe()
    assert [c.status for c in fake.calls_to("me")] == [429, 200]
    general = OutgoingMessage(chat_id=str(world["general"]), text="hi")
    fake.fail_next("send_message", 500)                      # discord.py retries a 500
    first = await provider.send(general)
    assert [c.status for c in fake.calls_to("send_message")] == [500, 200]
    calls = {"send_message": lambda: provider.send(general),  # sends: the outbox holds the chat
             "edit_message": lambda: provider.edit(replace(general, edit_of=first)),
             "typing": lambda: provider.typing(str(world["general"]))}
    for route, call in calls.items():
        fake.rate_limit_next(route, 0.2)
        with pytest.raises(ProviderError, match="slow down for 0.2s") as info:
            await call()
        assert info.value.retry_after == 0.2 and not permanent(info.value)
        await call()  # the next call goes out: nothing waited in discord.py
    fake.rate_limit_next("send_message", 7, via=False)      # Cloudflare, not Discord
    with pytest.raises(ProviderError, match="retry in 7s") as info:
        await provider.send(general)
    assert info.value.retry_after == 7 and not permanent(info.value)
    fake.rate_limit_next("typing", 5, global_=True)  # global, met while sending: held too
    with pytest.raises(ProviderError, match="slow down for 5s") as info:
        await provider.typing(str(world["general"]))
    assert info.value.retry_after == 5
    assert len(fake.messages(world["general"])) == 2
    await provider.close()


# connecting --------------------------------------------------------------------------------

async def test_a_rejected_token_is_reported_without_the_token(fake, world, data_dir, caplog):
    caplog.set_level(logging.DEBUG)
    settings = DiscordSettings(enabled=True, api_base=fake.api_base,
                               gateway_url=fake.gateway_url)
    bad_token = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.Wrong0.wrong_token_wrong_token_wrong_token"
    provider = DiscordProvider(settings, bad_token, data_dir=data_dir)
    with pytest.raises(ProviderError) as info:
        await provider.run(Running(provider, fake).intake)
    assert "rejected the bot token (check DISCORD_BOT_TOKEN)" in str(info.value)
    assert bad_token not in str(info.value) and info.value.__suppress_context__
    async with Running(make(fake, data_dir), fake) as r:
        fake.inject_message(world["dm"], "hello")
        await r.wait(1)
        fake.disconnect(4004)  # the gateway refuses the token later: run ends, it is reported
        assert r.task is not None
        with pytest.raises(ProviderError, match="check DISCORD_BOT_TOKEN"):
            await asyncio.wait_for(asyncio.shield(r.task), 10)
    assert caplog.records and bad_token not in caplog.text and fake.token not in caplog.text


async def test_a_lost_gateway_is_retried_and_logged_in_one_line(data_dir, caplog):
    caplog.set_level(logging.INFO)
    fake = await FakeDiscord().start()
    provider = make(fake, data_dir)
    task = asyncio.create_task(provider.run(lambda m: asyncio.sleep(0)))  # type: ignore
    await fake.wait_for_identifies(1)
    await fake.stop()  # Discord is gone: discord.py reconnects with backoff
    await fake.wait_until(lambda: "reconnecting in" in caplog.text, timeout=10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await provider.close()
    line = next(r for r in caplog.records if "reconnecting in" in r.getMessage())
    assert line.levelname == "WARNING" and line.exc_info is None
    assert "gateway connection failed (" in line.getMessage()
    assert "Traceback" not in caplog.text


async def test_a_missing_content_intent_says_where_to_turn_it_on(world, data_dir):
    async with FakeDiscord(privileged_intents=PRIVILEGED_INTENTS & ~INTENT_MESSAGE_CONTENT) as f:
        with pytest.raises(ProviderError, match="Message Content Intent") as info:
            await asyncio.wait_for(make(f, data_dir).run(lambda m: asyncio.sleep(0)), 10)
    assert "developer portal" in str(info.value)


# through the gateway: disconnects, resumes and replays ---------------------------------------

@pytest.fixture
async def harness(config_dir: Path, data_dir: Path) -> AsyncIterator[DiscordHarness]:
    h = DiscordHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


def texts(h: DiscordHarness, chat: str | None = None) -> list[str]:
    return [s.text for s in h.shown(chat)]


async def test_a_resume_replays_missed_events_without_a_second_reply(harness, caplog):
    caplog.set_level(logging.DEBUG)
    fake = harness.fake
    await harness.start()
    one = await harness.user_says("one")
    await harness.wait_texts(["echo: one"])
    fake.resend_on_resume = 50  # Discord may re-send events the bot already had
    assert fake.disconnect(4000) == 1
    await harness.user_says("two")  # while the bot is away: replayed by the RESUME
    [resume] = await fake.wait_for_resumes(1)
    await harness.wait_texts(["echo: one", "echo: two"])
    assert fake.disconnect(None) == 1  # the TCP connection drops: RESUME again
    await fake.wait_for_resumes(2)
    await harness.user_says("three")  # after the replays: any duplicate reply comes first
    await harness.wait_texts(["echo: one", "echo: two", "echo: three"])
    await harness.settled()
    assert texts(harness) == ["echo: one", "echo: two", "echo: three"]
    assert [call[-1]["content"] for call in harness.model.calls] == ["one", "two", "three"]
    [seq] = [f["s"] for f in fake.sessions[0].log
             if f["t"] == "MESSAGE_CREATE" and f["d"]["id"] == str(one.ref)]
    assert seq in resume.replayed and len(fake.resumes) == 2  # "one" came again, unanswered
    assert [m.text for m in harness.received] == ["one", "two", "three"]
    assert len([i for i in fake.identifies if i.accepted]) == 1  # resumed, never re-identified
    assert fake.token not in caplog.text


async def test_op7_reconnect_resumes_without_a_second_reply(harness):
    fake = harness.fake
    await harness.start()
    await harness.user_says("one")
    await harness.wait_texts(["echo: one"])
    fake.resend_on_resume = 50
    assert fake.send_reconnect() == 1
    await harness.user_says("two")
    await fake.wait_for_resumes(1)
    await harness.wait_texts(["echo: one", "echo: two"])
    await harness.user_says("three")
    await harness.wait_texts(["echo: one", "echo: two", "echo: three"])
    await harness.settled()
    assert len(harness.model.calls) == 3 and len(harness.shown()) == 3


async def test_an_invalid_session_identifies_anew_without_a_second_reply(harness):
    fake = harness.fake
    await harness.start()
    await harness.user_says("one")
    await harness.wait_texts(["echo: one"])
    fake.resend_on_resume = 50
    assert fake.invalidate_session(resumable=False) == 1
    await fake.wait_for_identifies(2, timeout=20)  # discord.py waits 5 s before IDENTIFY
    await harness.user_says("two")
    await harness.wait_texts(["echo: one", "echo: two"])
    await harness.settled()
    assert texts(harness) == ["echo: one", "echo: two"] and len(harness.model.calls) == 2


async def test_a_replay_after_a_restart_is_caught_by_the_gateway(harness):
    await harness.start()
    first = await harness.user_says("once")
    await harness.wait_texts(["echo: once"])
    await harness.restart()  # a new process would forget what the provider itself saw
    await harness.redeliver(first)
    await harness.user_says("and again")
    await harness.wait_texts(["echo: once", "echo: and again"])
    await harness.settled()
    # the gateway's inbox recognised it: it never reached the pipeline a second time
    assert [m.message_id for m in harness.received].count(str(first.ref)) == 1
    assert texts(harness) == ["echo: once", "echo: and again"]
    assert len(harness.model.calls) == 2


async def test_threads_answer_in_the_thread_in_a_conversation_of_their_own(harness):
    fake = harness.fake
    thread = int(fake.add_thread(int(harness.group_chat), name="ideas")["id"])
    await harness.start()
    await harness.user_says("remember the word apple", chat=harness.group_chat, mention=True)
    await harness.wait_texts(["echo: remember the word apple"], chat=harness.group_chat)
    asked = fake.inject_message(thread, f"{fake.bot_mention} which word?",
                                author=int(harness.member))
    [answer] = await harness.wait_texts(["echo: which word?"], chat=str(thread))
    assert fake.sent_message(int(answer.id)).reply_to == int(asked["id"])
    assert len(harness.shown(harness.group_chat)) == 1
    history = " ".join(m["content"] for m in harness.model.calls[1] if m.get("content"))
    assert "apple" not in history  # the thread did not join the channel's conversation


# configuration -----------------------------------------------------------------------------

def ctx(data_dir: Path, **fields: Any) -> ProviderContext:
    return provider_context(ProviderConfig(enabled=True, **fields), data_dir, None)


def test_config_errors_name_the_field(data_dir, monkeypatch):
    monkeypatch.delenv("DISCORD_BOT_TOKEN", raising=False)
    cases = [({}, "providers.discord.token_env: the environment variable DISCORD_BOT_TOKEN"),
             ({"guild_messages": "some"},
              "providers.discord.guild_messages: Input should be 'mentions' or 'all'"),
             ({"api_base": "ftp://x"},
              "providers.discord.api_base: Value error, must be an http:// or https:// URL"),
             ({"gateway_url": "http://x"},
              "providers.discord.gateway_url: Value error, must be a ws:// or wss:// URL"),
             ({"tokn_env": "X"}, "providers.discord.tokn_env: Extra inputs are not permitted")]
    for fields, message in cases:
        with pytest.raises(ConfigError) as info:
            DiscordProvider.from_context(ctx(data_dir, **fields))
        assert message in str(info.value)


def test_api_base_and_gateway_url_point_discord_py_elsewhere(data_dir, monkeypatch):
    from pluto.gateway.provider_registry import build_provider

    monkeypatch.setenv("MY_DISCORD", "abc.def.ghi")
    before = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    assert isinstance(build_provider("discord", ctx(data_dir, token_env="MY_DISCORD")),
                      DiscordProvider)
    assert (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == before
    DiscordProvider.from_context(ctx(data_dir, token_env="MY_DISCORD",
                                     api_base="http://127.0.0.1:9/",
                                     gateway_url="ws://127.0.0.1:9/gw"))
    assert discord.http.Route.BASE == "http://127.0.0.1:9/api/v10"
    assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == "ws://127.0.0.1:9/gw/"
