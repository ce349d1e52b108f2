"""The Telegram provider against the fake Bot API: receiving, sending, errors, webhook, config.

End-to-end behaviour through the gateway (streaming, outbox, groups...) is in
tests/conformance; here each part of the provider is checked on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pluto.errors import ConfigError
from tests.helpers.gateway import RecordingIntake, permanent, provider_context
from pluto.settings import ProviderConfig
from pluto.errors import ProviderError

from pluto.types import Attachment, IncomingMessage, OutgoingMessage
from pluto.providers.telegram import TelegramProvider, TelegramSettings
from pluto.providers.telegram.inbound import safe_filename
from pluto.providers.telegram.provider import SECRET_HEADER
from tests.conformance.test_scenarios import png
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

DM = 4242
GROUP = -1001234567890
BOT = 123456789  # the fake's bot id (from its token)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        server.add_chat(DM, first_name="Alice")
        server.add_chat(GROUP, title="Team")
        yield server


def make(fake: FakeTelegram, data_dir: Path, **options: Any) -> TelegramProvider:
    settings = TelegramSettings(enabled=True, base_url=fake.url, poll_timeout=5, **options)
    return TelegramProvider(settings, fake.token, data_dir=data_dir)


class Running:
    """A provider receiving in the background; ``got`` is what it handed to the gateway."""

    def __init__(self, provider: TelegramProvider, fake: FakeTelegram):
        self.provider, self.fake = provider, fake
        self.intake = RecordingIntake()
        self.got: list[IncomingMessage] = self.intake.got
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        before = len(self.fake.calls_to("getUpdates"))
        self.task = asyncio.create_task(self.provider.run(self.intake))
        await self.fake.wait_for_calls("getUpdates", before + 1, answered=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.provider.close()

    async def wait(self, n: int) -> list[IncomingMessage]:
        await self.fake.wait_until(lambda: len(self.got) >= n, what=f"{n} message(s)")
        return self.got


# receiving ---------------------------------------------------------------------------------

async def test_private_and_group_messages_become_incoming_messages(fake, data_dir):
    async with Running(make(fake, data_dir), fake) as r:
        fake.inject_message(DM, "hello")
        fake.inject_message(GROUP, "@pluto_test_bot what now?", user_id=77,
                            message_thread_id=9)
        dm, group = await r.wait(2)
    assert (dm.provider, dm.chat_id, dm.user_id, dm.text) == ("telegram", str(DM), str(DM),
                                                              "hello")
    assert dm.is_direct and dm.mentions_bot and dm.message_id == f"{DM}:1"
    assert (group.chat_id, group.user_id, group.text) == (str(GROUP), "77", "what now?")
    assert not group.is_direct and group.mentions_bot
    assert group.thread_id is None  # a reply thread in a group that is not a forum


async def test_group_gating_is_decided_by_ids_not_display_names(fake, data_dir):
    async with Running(make(fake, data_dir), fake) as r:
        fake.inject_message(GROUP, "Pluto Test Bot, are you there?", user_id=77)  # the name
        fake.inject_message(GROUP, "hey @pluto_test_bot_fan", user_id=77)  # another account
        fake.inject_message(GROUP, "/help@other_bot", user_id=77)  # a command for another bot
        by_id = [{"type": "text_mention", "offset": 0, "length": 5,
                  "user": {"id": BOT, "is_bot": True, "first_name": "Pluto"}}]
        fake.inject_message(GROUP, "Pluto: by id", user_id=77, entities=by_id)
        fake.inject_message(GROUP, "/help", user_id=77)  # a bare command is for every bot
        # a barrier: the chat's updates are handed over in order, so once this one is,
        # every one before it was decided
        fake.inject_message(GROUP, "Pluto: the last", user_id=77, entities=by_id)
        got = await r.wait(3)
    assert [m.text for m in got] == ["Pluto: by id", "/help", "Pluto: the last"]
    assert all(m.mentions_bot for m in got)


async def test_replies_to_the_bot_count_as_addressed(fake, data_dir):
    provider = make(fake, data_dir)
    async with Running(provider, fake) as r:
        mine = await provider.send(OutgoingMessage(chat_id=str(GROUP), text="ask me"))
        assert mine is not None
        other = fake.inject_message(GROUP, "someone else's words", user_id=78)
        fake.inject_message(GROUP, "to the human", user_id=77,
                            reply_to_message_id=other["message"]["message_id"])
        fake.inject_message(GROUP, "to the bot", user_id=77, reply_to_message_id=int(mine))
        # a barrier: handed over after every update before it was decided
        fake.inject_message(GROUP, "/help", user_id=77)
        got, last = await r.wait(2)
    assert got.text == "to the bot" and got.reply_to_id == f"{GROUP}:{mine}"
    assert last.text == "/help" and len(r.got) == 2


async def test_group_messages_all_lets_the_routing_table_decide(fake, data_dir):
    async with Running(make(fake, data_dir, group_messages="all"), fake) as r:
        fake.inject_message(GROUP, "just chatting", user_id=77)
        [got] = await r.wait(1)
    assert not got.mentions_bot and not got.is_direct


async def test_documents_are_downloaded_into_the_data_dir(fake, data_dir):
    async with Running(make(fake, data_dir), fake) as r:
        fake.inject_message(DM, document=b"a,b\n1,2\n", file_name="../../etc/pass wd.csv",
                            mime_type="text/csv", caption="numbers")
        fake.inject_message(DM, photo=png(), caption=None)
        doc, photo = await r.wait(2)
    [a] = doc.attachments
    assert a.path is not None and a.path.read_bytes() == b"a,b\n1,2\n"
    assert a.path.parent == data_dir / "uploads" / "telegram" / str(DM)
    assert a.path.name.endswith("pass wd.csv") and ".." not in a.path.name
    assert (a.filename, a.mime_type, a.kind, doc.text) == ("../../etc/pass wd.csv", "text/csv",
                                                           "file", "numbers")
    [p] = photo.attachments
    assert p.kind == "image" and p.path is not None and p.path.read_bytes() == png()


async def test_a_file_too_large_is_refused_politely(fake, data_dir):
    async with Running(make(fake, data_dir, max_download_mb=0.0001), fake) as r:
        fake.inject_message(DM, document=b"x" * 200, file_name="big.bin")
        fake.inject_message(DM, "still there?")
        [got] = await r.wait(1)
        [notice] = await fake.wait_for_messages(DM, 1)
    assert notice.text == "The file big.bin is too large for me to read (the limit is 0.0001 MB)."
    assert got.text == "still there?" and not (data_dir / "uploads").exists()


def test_safe_filename_keeps_files_in_their_folder():
    assert safe_filename("../../etc/passwd") == "passwd"
    assert safe_filename("..\\..\\win.ini") == "win.ini"
    assert safe_filename("...") == "file" and safe_filename("a/b/ö.csv") == "_.csv"


# sending -----------------------------------------------------------------------------------

async def test_html_is_sent_with_parse_mode_and_bad_html_falls_back_to_plain(fake, data_dir):
    provider = make(fake, data_dir)
    first = await provider.send(OutgoingMessage(chat_id=str(DM), text="<b>Total</b>: 1 &lt; 2",
                                                markup="telegram_html"))
    await provider.send(OutgoingMessage(chat_id=str(DM), text="<p>oops</p> &amp; more",
                                        markup="telegram_html"))
    await provider.send(OutgoingMessage(chat_id=str(DM), text="<b>not markup</b>"))
    texts = [(s.text, s.parse_mode) for s in fake.messages(DM)]
    assert texts == [("Total: 1 < 2", "HTML"), ("oops & more", None),
                     ("<b>not markup</b>", None)]
    assert first == "1"
    await provider.close()


async def test_edits_and_not_modified(fake, data_dir):
    provider = make(fake, data_dir)
    mid = await provider.send(OutgoingMessage(chat_id=str(DM), text="draft"))
    edit = OutgoingMessage(chat_id=str(DM), text="<i>final</i>", markup="telegram_html",
                           edit_of=f"{DM}:{mid}")
    await provider.edit(edit)
    await provider.edit(edit)  # the same again: "message is not modified" is not an error
    assert fake.message(DM, int(mid or 0))["text"] == "final" and len(fake.edits(DM)) == 1
    with pytest.raises(ProviderError) as info:
        await provider.edit(OutgoingMessage(chat_id=str(DM), text="x", edit_of="999"))
    assert permanent(info.value) and "message to edit not found" in str(info.value).lower()
    await provider.close()


async def test_errors_become_provider_errors(fake, data_dir):
    provider = make(fake, data_dir)
    msg = OutgoingMessage(chat_id=str(DM), text="hi")
    cases = [(dict(error_code=429, retry_after=7), False, 7.0),
             (dict(error_code=500), False, None),
             (dict(error_code=403), True, None),
             (dict(error_code=400, description="Bad Request: chat not found"), True, None)]
    for failure, is_permanent, retry_after in cases:
        fake.fail_next("sendMessage", **failure)
        with pytest.raises(ProviderError) as info:
            await provider.send(msg)
        assert (permanent(info.value), info.value.retry_after) == (is_permanent, retry_after)
    fake.drop_next("sendMessage")
    with pytest.raises(ProviderError) as info:
        await provider.send(msg)
    assert not permanent(info.value)
    assert str(info.value).startswith("could not reach Telegram")
    fake.set_blocked(DM)
    with pytest.raises(ProviderError, match="bot was blocked by the user") as info:
        await provider.send(msg)
    assert permanent(info.value)
    with pytest.raises(ProviderError, match="not a Telegram chat id"):
        await provider.send(OutgoingMessage(chat_id="general", text="hi"))
    with pytest.raises(ProviderError, match="(?i)message is too long"):
        await provider.send(OutgoingMessage(chat_id=str(GROUP), text="a" * 4097))
    await provider.close()


async def test_images_and_files_go_out_as_photos_and_documents(fake, data_dir, tmp_path):
    provider = make(fake, data_dir)
    chart = tmp_path / "chart.png"
    chart.write_bytes(png())
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"some notes")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    for path, kind in ((chart, "image"), (notes, "file"), (broken, "image")):
        await provider.send(OutgoingMessage(chat_id=str(DM), attachments=(
            Attachment(filename=path.name, path=path, kind=kind),)))  # type: ignore[arg-type]
    await provider.send(OutgoingMessage(chat_id=str(DM), text="c" * 1500, attachments=(
        Attachment(filename="chart.png", path=chart, kind="image"),)))
    sent = [(s.kind, s.file_bytes, s.file_name) for s in fake.messages(DM)]
    assert sent[0][:2] == ("photo", png())
    assert sent[1] == ("document", b"some notes", "notes.txt")
    assert sent[2] == ("document", b"not an image", "broken.png")  # not an image: a file
    assert [s.kind for s in fake.messages(DM)[3:]] == ["message", "photo"]  # long caption
    missing = OutgoingMessage(chat_id=str(DM), attachments=(
        Attachment(filename="gone.png", path=tmp_path / "gone.png", kind="image"),))
    with pytest.raises(ProviderError, match="can no longer be read") as info:
        await provider.send(missing)
    assert permanent(info.value)
    await provider.close()


async def test_typing_threads_and_replies(fake, data_dir):
    provider = make(fake, data_dir)
    question = fake.inject_message(GROUP, "@pluto_test_bot q", user_id=77)["message"]
    await provider.typing(str(GROUP), "9")
    await provider.send(OutgoingMessage(chat_id=str(GROUP), text="a", thread_id="9",
                                        reply_to=f"{GROUP}:{question['message_id']}"))
    await provider.send(OutgoingMessage(chat_id=str(GROUP), text="b", reply_to=f"{GROUP}:999"))
    assert fake.chat_actions == [(GROUP, "typing")]
    first, second = fake.messages(GROUP)
    assert (first.message_thread_id, first.reply_to_message_id) == (9, question["message_id"])
    assert second.text == "b"  # the quoted message is gone: sent without the quote
    await provider.close()


# polling and webhooks ------------------------------------------------------------------------

async def test_polling_survives_errors_and_confirms_updates(fake, data_dir):
    async with Running(make(fake, data_dir), fake) as r:
        fake.fail_next("getUpdates", error_code=500)
        fake.inject_message(DM, "one")  # answers the long poll in progress
        await r.wait(1)
        fake.inject_message(DM, "two")  # the next poll fails, the one after gets it
        await r.wait(2)
        await fake.wait_until_confirmed()
    assert [m.text for m in r.got] == ["one", "two"]
    assert fake.webhook_url is None  # polling deleted any webhook first
    assert [c["command"] for c in fake.commands] == ["help", "new", "stop"]  # the menu


async def test_a_rejected_token_is_reported_without_the_token(fake, data_dir, caplog):
    caplog.set_level(logging.DEBUG)
    settings = TelegramSettings(enabled=True, base_url=fake.url)
    bad_token = "987654:WrongTokenWrongTokenWrongToken"
    provider = TelegramProvider(settings, bad_token, data_dir=data_dir)
    with pytest.raises(ProviderError) as info:
        await provider.run(lambda m: asyncio.sleep(0))  # type: ignore[arg-type,return-value]
    assert permanent(info.value) and "TELEGRAM_BOT_TOKEN" in str(info.value)
    assert bad_token not in str(info.value) and info.value.__suppress_context__
    good = make(fake, data_dir)
    await good.send(OutgoingMessage(chat_id=str(DM), text="hi"))
    assert caplog.records and bad_token not in caplog.text and fake.token not in caplog.text
    await good.close()


@pytest.fixture
async def http_server() -> AsyncIterator[tuple[web.Application, web.AppRunner]]:
    """An aiohttp app like the gateway's: routes are mounted first, then it serves."""
    app = web.Application()
    runner = web.AppRunner(app)
    yield app, runner
    await runner.cleanup()


async def serve(runner: web.AppRunner) -> str:
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore


async def test_webhook_mode_checks_the_secret(fake, data_dir, http_server):
    app, runner = http_server
    settings = TelegramSettings(enabled=True, base_url=fake.url, mode="webhook",
                                public_url="http://127.0.0.1:1")  # the port is known below
    provider = TelegramProvider(settings, fake.token, data_dir=data_dir,
                                webhook_secret="s3cret", http_app=app)
    base = await serve(runner)
    provider.settings = settings.model_copy(update={"public_url": base})
    intake = RecordingIntake()
    got: list[IncomingMessage] = intake.got

    async with aiohttp.ClientSession() as http:
        url = base + "/telegram/webhook"
        async with http.post(url, json={}, headers={SECRET_HEADER: "s3cret"}) as resp:
            assert resp.status == 503  # not receiving yet: Telegram will retry
        task = asyncio.create_task(provider.run(intake))
        await fake.wait_until(lambda: fake.webhook_url == url, what="the webhook")
        fake.inject_message(DM, "via webhook")
        await fake.wait_until(lambda: got, what="the update")
        for headers, body, status in (({}, {}, 401), ({SECRET_HEADER: "nope"}, {}, 401),
                                      ({SECRET_HEADER: "s3crét"}, {}, 401),
                                      ({SECRET_HEADER: "s3cret"}, None, 400),
                                      ({SECRET_HEADER: "s3cret"}, [1], 400)):
            async with http.post(url, json=body, headers=headers) as resp:
                assert resp.status == status
        deep = '{"update_id": 1, "message": ' + "[" * 5000 + "]" * 5000 + "}"  # too deep: 400
        async with http.post(url, data=deep, headers={SECRET_HEADER: "s3cret"}) as resp:
            assert resp.status == 400
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [m.text for m in got] == ["via webhook"]
    assert fake.webhook_deliveries[-1]["status"] == 200
    assert fake.calls_to("setWebhook")[0].params["secret_token"] == "s3cret"
    await provider.close()


# configuration -----------------------------------------------------------------------------

def ctx(data_dir: Path, http: Any = None, **fields: Any) -> ProviderContext:
    return provider_context(ProviderConfig(enabled=True, **fields), data_dir, http)


def test_config_errors_name_the_field(data_dir, monkeypatch):
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    cases = [({}, "providers.telegram.token_env: the environment variable TELEGRAM_BOT_TOKEN"),
             ({"mode": "push"}, "providers.telegram.mode: Input should be 'polling' or "
                                "'webhook'"),
             ({"base_url": "ftp://x"}, "providers.telegram.base_url: Value error, must be an "
                                       "http:// or https:// URL"),
             ({"tokn_env": "X"}, "providers.telegram.tokn_env: Extra inputs are not permitted")]
    for fields, message in cases:
        with pytest.raises(ConfigError) as info:
            TelegramProvider.from_context(ctx(data_dir, **fields))
        assert message in str(info.value)
    monkeypatch.setenv("MY_TG", "1:abcdef")
    with pytest.raises(ConfigError, match="public_url: webhook mode needs the public URL"):
        TelegramProvider.from_context(ctx(data_dir, token_env="MY_TG", mode="webhook"))
    provider = TelegramProvider.from_context(ctx(data_dir, token_env="MY_TG",
                                                 base_url="http://127.0.0.1:9/bot"))
    assert provider.bot.base_url == "http://127.0.0.1:9/bot1:abcdef"
    assert provider.bot.base_file_url == "http://127.0.0.1:9/file/bot1:abcdef"
