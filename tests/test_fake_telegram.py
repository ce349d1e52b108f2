"""The fake Telegram Bot API, driven by the real python-telegram-bot over HTTP."""

from __future__ import annotations

import asyncio
import datetime as dtm
import struct
import time
import warnings
import zlib

import aiohttp
import pytest
from aiohttp import web
from telegram import Bot, ReplyParameters, Update
from telegram.error import BadRequest, Conflict, Forbidden, InvalidToken, NetworkError, RetryAfter
from telegram.ext import ApplicationBuilder, CommandHandler, MessageHandler, filters

from tests.fakes.telegram_server import FakeTelegram

# PTB 22 warns when RetryAfter is built (its retry_after int becomes a timedelta in a future major)
pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

CHAT = 4242          # a private chat: chat id == user id
GROUP = -1001234567890


def png(width: int = 3, height: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x10\x20\x30" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def retry_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():          # PTB 22 warns that the int will become a timedelta
        warnings.simplefilter("ignore")
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dtm.timedelta) else value


@pytest.fixture
async def fake():
    async with FakeTelegram() as server:
        server.add_chat(CHAT, first_name="Alice")
        yield server


@pytest.fixture
async def bot(fake):
    async with Bot(fake.token, base_url=fake.base_url, base_file_url=fake.base_file_url) as client:
        yield client


def build_app(fake: FakeTelegram):
    return (ApplicationBuilder().token(fake.token).base_url(fake.base_url)
            .base_file_url(fake.base_file_url).build())


async def test_get_me_and_wrong_token_or_method(fake, bot):
    me = await bot.get_me()
    assert me.username == "pluto_test_bot" and me.is_bot and me.id == 123456789
    with pytest.raises(InvalidToken):
        async with Bot("999:wrong", base_url=fake.base_url):
            pass
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.base_url}{fake.token}/noSuchMethod") as resp:
            assert resp.status == 404
            assert await resp.json() == {"ok": False, "error_code": 404, "description": "Not Found"}
        async with http.post(f"{fake.base_url}999:bad/getMe") as resp:
            assert (resp.status, (await resp.json())["description"]) == (401, "Unauthorized")
        # method names are case-insensitive and JSON bodies work too, as on the real API
        async with http.post(f"{fake.base_url}{fake.token}/SENDMESSAGE",
                             json={"chat_id": CHAT, "text": "json body"}) as resp:
            assert (await resp.json())["result"]["text"] == "json body"


async def test_long_polling_delivers_confirms_and_redelivers(fake):
    app = build_app(fake)
    seen: list[Update] = []

    async def on_text(update: Update, context) -> None:
        seen.append(update)

    async def on_start(update: Update, context) -> None:
        await update.message.reply_text("welcome")

    app.add_handler(CommandHandler("start", on_start))
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, on_text))
    async with app:
        await app.start()
        await app.updater.start_polling(poll_interval=0, timeout=10)
        try:
            await fake.wait_for_calls("getUpdates", answered=False)
            started = time.monotonic()
            first = fake.inject_message(CHAT, "hello bot")
            await fake.wait_until(lambda: seen, what="the handler")
            assert time.monotonic() - started < 1.5          # the long poll answered at once
            assert seen[0].message.text == "hello bot" and seen[0].effective_user.id == CHAT
            await fake.wait_until_confirmed()                   # the next getUpdates carried offset = id + 1
            assert fake.pending_updates == []
            fake.inject_message(CHAT, "/start")                 # bot_command entity detected, like Telegram
            sent = await fake.wait_for_messages(CHAT, 1)
            assert sent[0].text == "welcome"
            await fake.wait_until_confirmed()                   # /start confirmed too: the bot
                                                                # polls past every update it had
            assert len(seen) == 1                               # confirmed: never delivered again
            fake.redeliver(first["update_id"])                  # ...unless Telegram delivers it twice
            await fake.wait_until(lambda: len(seen) == 2, what="the redelivery")
            assert seen[1].update_id == first["update_id"]
            assert seen[1].message.message_id == seen[0].message.message_id
        finally:
            await app.updater.stop()
            await app.stop()
    offsets = [c.params.get("offset") for c in fake.calls_to("getUpdates")]
    assert first["update_id"] + 1 in offsets


async def test_get_updates_offset_semantics(fake, bot):
    a = fake.inject_message(CHAT, "one")
    b = fake.inject_message(CHAT, "two")
    assert [u.update_id for u in await bot.get_updates()] == [a["update_id"], b["update_id"]]
    assert len(await bot.get_updates()) == 2                # not confirmed: delivered again
    assert [u.update_id for u in await bot.get_updates(offset=b["update_id"])] == [b["update_id"]]
    assert await bot.get_updates(offset=b["update_id"] + 1) == ()
    assert fake.pending_updates == []
    for text in ("x", "y", "z"):
        fake.inject_message(CHAT, text)
    [last] = await bot.get_updates(offset=-1)               # the rest is forgotten
    assert last.message.text == "z"
    # long polling returns as soon as an update is queued
    polls = len(fake.calls_to("getUpdates"))
    poll = asyncio.create_task(bot.get_updates(offset=last.update_id + 1, timeout=5))
    await fake.wait_for_calls("getUpdates", polls + 1, answered=False)  # the poll is waiting
    fake.inject_message(CHAT, "late")
    started = time.monotonic()
    updates = await asyncio.wait_for(poll, 2)
    assert time.monotonic() - started < 1 and updates[-1].message.text == "late"
    # allowed_updates filters updates created after the call
    await bot.get_updates(offset=updates[-1].update_id + 1, allowed_updates=["callback_query"])
    fake.inject_message(CHAT, "filtered out")
    assert await bot.get_updates() == ()


async def test_second_poller_gets_conflict(fake, bot):
    first = asyncio.create_task(bot.get_updates(timeout=5))
    await fake.wait_for_calls("getUpdates", answered=False)
    # PTB gives getUpdates its own 1-connection pool: a second poller needs a second Bot
    async with Bot(fake.token, base_url=fake.base_url) as other:
        await other.get_updates(timeout=0)
    with pytest.raises(Conflict, match="terminated by other getUpdates request"):
        await asyncio.wait_for(first, 2)


async def test_send_message_html_and_parse_errors(fake, bot):
    msg = await bot.send_message(CHAT, "<b>Total</b>: 3 &lt; 4 <a href='https://x.org'>src</a>", parse_mode="HTML")
    assert msg.text == "Total: 3 < 4 src" and msg.chat.id == CHAT and msg.message_id == 1
    assert [e.type for e in msg.entities] == ["bold", "text_link"]
    record = fake.sent[-1]
    assert (record.kind, record.chat_id, record.message_id, record.parse_mode) == ("message", CHAT, 1, "HTML")
    assert record.raw_text.startswith("<b>Total</b>")
    assert (await bot.send_message(CHAT, "second")).message_id == 2       # ids increase per chat
    for bad_html, error in [("<p>para</p>", 'unsupported start tag "p" at byte offset 0'),
                            ("<b>open", "can't find end tag corresponding to start tag b"),
                            ("<b>x</i>", 'expected "</b>", found "</i>"'),
                            ("a < b", 'unsupported start tag "" at byte offset 2')]:
        with pytest.raises(BadRequest) as info:
            await bot.send_message(CHAT, bad_html, parse_mode="HTML")
        assert error in info.value.message.lower()
    with pytest.raises(BadRequest, match="reserved and must be escaped"):
        await bot.send_message(CHAT, "Version 1.0", parse_mode="MarkdownV2")
    with pytest.raises(BadRequest, match="(?i)chat not found"):
        await bot.send_message(999, "nobody started this bot")
    assert len(fake.messages(CHAT)) == 2                     # failed sends are not recorded


async def test_message_length_limit(fake, bot):
    await bot.send_message(CHAT, "a" * 4096)
    await bot.send_message(CHAT, "<b>" + "a" * 4096 + "</b>", parse_mode="HTML")   # counted after parsing
    with pytest.raises(BadRequest, match="(?i)message is too long"):
        await bot.send_message(CHAT, "a" * 4097)
    with pytest.raises(BadRequest, match="(?i)message text is empty"):
        await bot.send_message(CHAT, "   ")


async def test_edit_message_text(fake, bot):
    msg = await bot.send_message(CHAT, "<i>thinking</i>", parse_mode="HTML")
    with pytest.raises(BadRequest) as info:
        await bot.edit_message_text("<i>thinking</i>", CHAT, msg.message_id, parse_mode="HTML")
    assert "message is not modified" in info.value.message.lower()
    edited = await bot.edit_message_text("thinking", CHAT, msg.message_id)   # entities differ: modified
    assert edited.text == "thinking" and edited.edit_date is not None
    with pytest.raises(BadRequest, match="(?i)message to edit not found"):
        await bot.edit_message_text("x", CHAT, 999)
    assert [s.kind for s in fake.sent] == ["message", "edit"]
    assert fake.message(CHAT, msg.message_id)["text"] == "thinking"


async def test_scripted_errors_retry_after_forbidden_and_drops(fake, bot):
    fake.fail_next("sendMessage", error_code=429, retry_after=7)
    with pytest.raises(RetryAfter) as info:
        await bot.send_message(CHAT, "hi")
    assert retry_seconds(info.value) == 7
    await bot.send_message(CHAT, "hi")                      # only the next call failed
    fake.fail_next("sendMessage", error_code=403)
    with pytest.raises(Forbidden, match="(?i)bot was blocked by the user"):
        await bot.send_message(CHAT, "hi")
    fake.fail_next("*", 2, error_code=400, description="Bad Request: chat not found")
    for _ in range(2):
        with pytest.raises(BadRequest, match="(?i)chat not found"):
            await bot.send_chat_action(CHAT, "typing")
    fake.fail_next("sendMessage", error_code=500)
    with pytest.raises(NetworkError):
        await bot.send_message(CHAT, "hi")
    fake.drop_next("sendMessage")
    with pytest.raises(NetworkError):
        await bot.send_message(CHAT, "hi")
    fake.set_blocked(CHAT)
    with pytest.raises(Forbidden):
        await bot.send_message(CHAT, "hi")


async def test_flood_control_and_latency(fake, bot):
    fake.set_flood_limit(3, retry_after=2)
    for i in range(3):
        await bot.send_message(CHAT, f"burst {i}")
    with pytest.raises(RetryAfter) as info:
        await bot.send_message(CHAT, "one too many")
    assert retry_seconds(info.value) == 2
    fake.set_flood_limit(None)
    fake.set_latency(0.3, "sendChatAction")
    started = time.monotonic()
    assert await bot.send_chat_action(CHAT, "typing") is True
    assert time.monotonic() - started >= 0.3
    assert fake.chat_actions == [(CHAT, "typing")]


async def test_send_photo_and_document_multipart(fake, bot):
    image = png(5, 4)
    msg = await bot.send_photo(CHAT, image, caption="<b>chart</b>", parse_mode="HTML")
    record = fake.sent[-1]
    assert record.kind == "photo" and record.file_bytes == image and record.text == "chart"
    assert (msg.photo[-1].width, msg.photo[-1].height) == (5, 4) and msg.caption == "chart"
    call = fake.calls_to("sendPhoto")[0]                     # multipart: the file part plus form fields
    assert call.files["photo"].data == image and "photo" not in call.params
    assert (call.params["chat_id"], call.params["parse_mode"]) == (CHAT, "HTML")
    again = await bot.send_photo(CHAT, msg.photo[-1].file_id)                  # re-send by file_id
    assert fake.sent[-1].file_bytes == image and again.message_id == msg.message_id + 1
    with pytest.raises(BadRequest, match="(?i)image_process_failed"):
        await bot.send_photo(CHAT, b"not an image")
    doc = await bot.send_document(CHAT, b"a,b\n1,2\n", filename="result.csv")
    assert doc.document.file_name == "result.csv" and fake.sent[-1].file_bytes == b"a,b\n1,2\n"
    with pytest.raises(BadRequest, match="(?i)caption is too long"):
        await bot.send_document(CHAT, b"x", filename="x.txt", caption="c" * 1025)


async def test_user_document_download(fake, bot):
    data = b"city,people\nOslo,700000\n"
    update = fake.inject_message(CHAT, document=data, file_name="cities.csv", mime_type="text/csv",
                                 caption="what is in here?")
    [received] = await bot.get_updates()
    assert received.update_id == update["update_id"] and received.message.caption == "what is in here?"
    file = await received.message.document.get_file()
    assert file.file_path.startswith(fake.base_file_url)
    assert bytes(await file.download_as_bytearray()) == data
    with pytest.raises(BadRequest, match="(?i)invalid file_id"):
        await bot.get_file("nope")


async def test_replies_threads_groups_and_misc_methods(fake, bot):
    update = fake.inject_message(GROUP, "@pluto_test_bot what now?", user_id=77, message_thread_id=9)
    incoming = update["message"]
    assert incoming["chat"]["type"] == "supergroup"
    assert incoming["entities"] == [{"type": "mention", "offset": 0, "length": 15}]
    reply = await bot.send_message(GROUP, "this", reply_parameters=ReplyParameters(incoming["message_id"]),
                                   message_thread_id=9)
    assert reply.reply_to_message.message_id == incoming["message_id"] and reply.message_thread_id == 9
    assert fake.sent[-1].reply_to_message_id == incoming["message_id"] and fake.sent[-1].message_thread_id == 9
    assert reply.message_id == incoming["message_id"] + 1      # one id sequence per chat
    with pytest.raises(BadRequest, match="(?i)message to be replied not found"):
        await bot.send_message(GROUP, "x", reply_to_message_id=12345)
    assert await bot.set_my_commands([("ask", "Ask the agent"), ("reset", "Start over")])
    assert [c.command for c in await bot.get_my_commands()] == ["ask", "reset"]
    with pytest.raises(BadRequest):
        await bot.set_my_commands([("Bad-Command", "x")])
    assert await bot.delete_message(GROUP, reply.message_id)
    with pytest.raises(BadRequest, match="(?i)message to delete not found"):
        await bot.delete_message(GROUP, reply.message_id)
    fake.inject_callback_query(GROUP, incoming["message_id"], "more", user_id=77)
    [*_, click] = await bot.get_updates()
    assert await click.callback_query.answer("ok")
    assert fake.callback_answers[0]["callback_query_id"] == click.callback_query.id


async def test_privacy_mode_in_groups():
    async with FakeTelegram(privacy_mode=True) as fake:
        fake.inject_message(GROUP, "just chatting")
        fake.inject_message(GROUP, "/ask@other_bot hi")
        mention = fake.inject_message(GROUP, "hey @pluto_test_bot")
        command = fake.inject_message(GROUP, "/ask@pluto_test_bot hi")
        private = fake.inject_message(CHAT, "dm")
        assert [u["update_id"] for u in fake.pending_updates] == [
            mention["update_id"], command["update_id"], private["update_id"]]


async def test_webhook_mode(fake, bot):
    received: list[tuple[str | None, dict]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append((request.headers.get("X-Telegram-Bot-Api-Secret-Token"), await request.json()))
        return web.Response(status=500 if len(received) == 1 else 200)   # first attempt fails

    app = web.Application()
    app.router.add_post("/tg", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        fake.webhook_retry_delay = 0.05
        assert await bot.set_webhook(f"http://127.0.0.1:{port}/tg", secret_token="s3cret-token")
        with pytest.raises(Conflict, match="webhook is active"):
            await bot.get_updates()
        update = fake.inject_message(CHAT, "via webhook")
        await fake.wait_until(lambda: len(received) >= 2, what="a retried webhook delivery")
        await fake.wait_until_confirmed()
        assert [secret for secret, _ in received] == ["s3cret-token", "s3cret-token"]
        assert [body["update_id"] for _, body in received] == [update["update_id"]] * 2
        parsed = Update.de_json(received[-1][1], bot)
        assert parsed.message.text == "via webhook"
        info = await bot.get_webhook_info()
        assert info.url.endswith("/tg") and info.pending_update_count == 0
        assert "500" in info.last_error_message
        assert [d["status"] for d in fake.webhook_deliveries] == [500, 200]
        assert await bot.delete_webhook()
        fake.inject_message(CHAT, "polling again")
        assert [u.message.text for u in await bot.get_updates()] == ["polling again"]
    finally:
        await runner.cleanup()
