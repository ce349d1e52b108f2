"""The WhatsApp provider against the fake Cloud API: what only WhatsApp has (the verify
handshake, signed webhook posts and their retries, the 24-hour window, its error codes, read
receipts with the typing indicator), and its settings."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pluto.errors import (ConfigError, DeliveryRefused, ProviderUnusable, RateLimited,
                          StorageError)
from pluto.gateway.delivery.render import render_chunks
from pluto.providers.whatsapp import WhatsAppProvider
from pluto.providers.whatsapp.markup import WHATSAPP
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import ProviderConfig
from pluto.types import Attachment, OutgoingMessage
from tests.conformance.whatsapp_harness import (PATH, SECRET_ENV, TOKEN_ENV, VERIFY_ENV,
                                                WhatsAppHarness, read_whatsapp)
from tests.fakes.whatsapp_server import FakeWhatsApp, sign
from tests.helpers.gateway import RecordingIntake, provider_context

ALICE = "4915100000001"
ADMIN = "4915100000099"


class Rig:
    """The provider on its own aiohttp server, the fake posting to it, a recording intake."""

    def __init__(self, fake: FakeWhatsApp, data_dir: Path):
        self.fake, self.data_dir = fake, data_dir
        self.intake = RecordingIntake()
        self.app = web.Application()
        self.provider: WhatsAppProvider | None = None
        self.task: asyncio.Task[None] | None = None
        self.runner: web.AppRunner | None = None

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"enabled": True, "phone_number_id": self.fake.phone_number_id,
                "api_base": self.fake.url, "token_env": TOKEN_ENV, "app_secret_env": SECRET_ENV,
                "verify_token_env": VERIFY_ENV, "webhook_path": PATH, **extra}

    async def start(self, **extra: Any) -> WhatsAppProvider:
        ctx = provider_context(ProviderConfig(**self.config(**extra)), self.data_dir, self.app,
                               name="whatsapp")
        self.provider = WhatsAppProvider.from_context(ctx)
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.fake.webhook_url = f"http://127.0.0.1:{port}{PATH}"
        self.task = asyncio.create_task(self.provider.run(self.intake))  # type: ignore[arg-type]
        await self.fake.wait_until(lambda: self.provider._intake is not None, 5, "the provider")
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
async def fake() -> AsyncIterator[FakeWhatsApp]:
    async with FakeWhatsApp() as f:
        f.add_user(ALICE, "Alice")
        env = {TOKEN_ENV: f.token, SECRET_ENV: f.app_secret, VERIFY_ENV: f.verify_token}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            yield f


@pytest.fixture
async def rig(fake: FakeWhatsApp, data_dir: Path) -> AsyncIterator[Rig]:
    r = Rig(fake, data_dir)
    try:
        yield r
    finally:
        await r.stop()


async def settled(fake: FakeWhatsApp) -> None:
    await fake.wait_until(lambda: all(d.done.is_set() for d in fake.deliveries), 10, "deliveries")


# settings ----------------------------------------------------------------------------------

def test_settings_name_the_field(fake: FakeWhatsApp, data_dir: Path) -> None:
    app = web.Application()
    base = {"enabled": True, "token_env": TOKEN_ENV, "app_secret_env": SECRET_ENV,
            "verify_token_env": VERIFY_ENV}
    with pytest.raises(ConfigError, match="providers.whatsapp.phone_number_id"):
        WhatsAppProvider.from_context(provider_context(ProviderConfig(**base), data_dir, app))
    with pytest.raises(ConfigError, match="providers.whatsapp.api_base"):
        WhatsAppProvider.from_context(provider_context(ProviderConfig(
            **base, phone_number_id="1", api_base="ftp://x"), data_dir, app))
    with pytest.raises(ConfigError, match="providers.whatsapp.token_env.*NOPE_UNSET"):
        WhatsAppProvider.from_context(provider_context(ProviderConfig(
            **{**base, "token_env": "NOPE_UNSET"}, phone_number_id="1"), data_dir, app))
    with pytest.raises(ConfigError, match="HTTP server"):
        WhatsAppProvider.from_context(provider_context(ProviderConfig(
            **base, phone_number_id=106540352242922), data_dir, None))


# receiving ---------------------------------------------------------------------------------

async def test_verify_handshake(rig: Rig) -> None:
    await rig.start()
    assert await rig.fake.verify("8461") == (200, "8461")
    status, _ = await rig.fake.verify("8461", token="not-the-token")
    assert status == 403


async def test_a_forged_or_malformed_post_is_refused_and_nothing_is_taken(rig: Rig) -> None:
    await rig.start()
    body = json.dumps({"object": "whatsapp_business_account", "entry": []}).encode()
    async with aiohttp.ClientSession() as s:
        async with s.post(rig.fake.webhook_url, data=body,
                          headers={"X-Hub-Signature-256": sign("wrong-secret", body)}) as r:
            assert r.status == 401
        async with s.post(rig.fake.webhook_url, data=body) as r:
            assert r.status == 401
        junk = b"{not json"
        async with s.post(rig.fake.webhook_url, data=junk,
                          headers={"X-Hub-Signature-256": sign(rig.fake.app_secret, junk)}) as r:
            assert r.status == 400
        deep = b"[" * 5000 + b"]" * 5000  # signed, but nested past any webhook's shape
        async with s.post(rig.fake.webhook_url, data=deep,
                          headers={"X-Hub-Signature-256": sign(rig.fake.app_secret, deep)}) as r:
            assert r.status == 400
    assert rig.intake.got == []


async def test_a_message_becomes_an_incoming_message(rig: Rig) -> None:
    await rig.start()
    said = await rig.fake.user_says(ALICE, "  hello there ")
    [msg] = rig.intake.got
    assert (msg.provider, msg.chat_id, msg.user_id, msg.text) == ("whatsapp", ALICE, ALICE,
                                                                 "hello there")
    assert msg.message_id == said.id and msg.is_direct and msg.user_name == "Alice"


async def test_a_full_intake_answers_503_and_whatsapp_delivers_again(rig: Rig) -> None:
    await rig.start()
    rig.intake.full = True
    said = await rig.fake.user_says(ALICE, "are you there?")
    assert said.delivery.statuses == [503]
    rig.intake.full = False
    await said.delivery.done.wait()
    assert said.delivery.statuses[-1] == 200
    assert [m.text for m in rig.intake.got] == ["are you there?"]


async def test_a_message_intake_could_not_record_is_delivered_again(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    await rig.start()
    got = rig.intake.got
    failures = [StorageError("the database is gone")]

    async def offer(msg: Any) -> Any:
        if failures:
            raise failures.pop()
        got.append(msg)
        return msg

    rig.intake.offer = offer  # type: ignore[method-assign]
    said = await rig.fake.user_says(ALICE, "do not lose me")
    await said.delivery.done.wait()
    assert said.delivery.statuses == [503, 200]
    assert [m.text for m in got] == ["do not lose me"]
    assert "Traceback" not in caplog.text


async def test_a_redelivery_is_taken_once(rig: Rig) -> None:
    await rig.start()
    said = await rig.fake.user_says(ALICE, "once")
    again = await rig.fake.redeliver(said)
    assert again.statuses == [200]
    assert [m.text for m in rig.intake.got] == ["once"]


async def test_a_message_it_cannot_read_gets_a_notice(rig: Rig) -> None:
    await rig.start()
    await rig.fake.user_says(ALICE, kind="sticker")
    await rig.fake.user_says(ALICE, kind="reaction")  # no answer to a reaction
    await settled(rig.fake)
    assert rig.intake.got == []
    assert [s.text for s in rig.fake.messages_to(ALICE)] == [
        "I can read text, documents, images and voice notes; please send your question as one "
        "of those."]


async def test_a_document_is_downloaded_and_a_too_large_one_refused(rig: Rig) -> None:
    await rig.start(max_download_mb=0.001)
    await rig.fake.user_says(ALICE, "small", document=("a.csv", b"x,y\n1,2\n"))
    await rig.fake.user_says(ALICE, "big", document=("big.csv", b"x" * 5000))
    await settled(rig.fake)
    first, second = rig.intake.got
    [attachment] = first.attachments
    assert attachment.path is not None and attachment.path.read_bytes() == b"x,y\n1,2\n"
    assert attachment.mime_type == "text/csv"
    assert second.text == "big" and second.attachments == ()
    assert "too large" in rig.fake.messages_to(ALICE)[0].text


async def test_statuses_are_not_messages(rig: Rig) -> None:
    provider = await rig.start()
    await rig.fake.user_says(ALICE, "hi")
    await provider.send(OutgoingMessage(chat_id=ALICE, text="hello"))
    await settled(rig.fake)  # its sent and delivered statuses were posted and taken
    assert [m.text for m in rig.intake.got] == ["hi"]
    assert all(d.statuses == [200] for d in rig.fake.deliveries)


# sending -----------------------------------------------------------------------------------

async def test_markdown_becomes_whatsapp_formatting(rig: Rig) -> None:
    provider = await rig.start()
    await rig.fake.user_says(ALICE, "hi")
    text = "# Title\n\n**bold**, _it_, ~~gone~~ and `x < 1`\n\n- one\n- two\n\n```\ncode\n```"
    [chunk] = render_chunks(text, WHATSAPP, 4096)
    await provider.send(OutgoingMessage(chat_id=ALICE, text=chunk, markup=WHATSAPP.name))
    [sent] = rig.fake.messages_to(ALICE)
    assert sent.text == ("*Title*\n\n*bold*, _it_, ~gone~ and `x < 1`\n\n- one\n- two\n\n"
                         "```\ncode\n```")
    assert read_whatsapp(sent.text)[1] == ("code", "x < 1")


async def test_rate_limits_and_refusals_are_typed(rig: Rig) -> None:
    provider = await rig.start(pair_rate_wait_seconds=7, throughput_wait_seconds=2)
    await rig.fake.user_says(ALICE, "hi")
    msg = OutgoingMessage(chat_id=ALICE, text="hello")
    rig.fake.fail_next(131056)
    with pytest.raises(RateLimited) as pair:
        await provider.send(msg)
    assert pair.value.retry_after == 7
    rig.fake.fail_next(130429)
    with pytest.raises(RateLimited) as throughput:
        await provider.send(msg)
    assert throughput.value.retry_after == 2
    rig.fake.fail_next(130429, headers={"Retry-After": "11"})
    with pytest.raises(RateLimited) as told:
        await provider.send(msg)
    assert told.value.retry_after == 11
    rig.fake.fail_next(131026)
    with pytest.raises(DeliveryRefused, match="cannot be delivered"):
        await provider.send(msg)
    with pytest.raises(DeliveryRefused, match="not a WhatsApp number"):
        await provider.send(OutgoingMessage(chat_id="alice@example", text="x"))
    rig.fake.fail_next(190)
    with pytest.raises(ProviderUnusable):
        await provider.send(msg)
    assert await provider.send(msg)  # and the next one goes


async def test_a_rejected_token_stops_the_provider(rig: Rig, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(TOKEN_ENV, "EAAG-not-the-right-token-000")
    with pytest.raises(ProviderUnusable, match=TOKEN_ENV):
        ctx = provider_context(ProviderConfig(**rig.config()), rig.data_dir, rig.app)
        provider = WhatsAppProvider.from_context(ctx)
        try:
            await provider.run(rig.intake)  # type: ignore[arg-type]
        finally:
            await provider.close()
    assert "EAAG-not-the-right-token-000" not in caplog.text


async def test_images_and_documents_go_out_uploaded(rig: Rig, tmp_path: Path) -> None:
    provider = await rig.start()
    await rig.fake.user_says(ALICE, "hi")
    chart, table = tmp_path / "chart.png", tmp_path / "t.csv"
    chart.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    table.write_bytes(b"a,b\n")
    await provider.send(OutgoingMessage(chat_id=ALICE, text="the chart", attachments=(
        Attachment(filename="chart.png", mime_type="image/png", path=chart, kind="image"),
        Attachment(filename="t.csv", mime_type="text/csv", path=table))))
    image, document = rig.fake.messages_to(ALICE)
    assert (image.type, image.text, image.file_bytes) == ("image", "the chart", chart.read_bytes())
    assert (document.type, document.filename, document.file_bytes) == ("document", "t.csv",
                                                                         b"a,b\n")
    with pytest.raises(DeliveryRefused, match="can no longer be read"):
        await provider.send(OutgoingMessage(chat_id=ALICE, attachments=(
            Attachment(filename="gone.png", path=tmp_path / "gone.png", kind="image"),)))


async def test_typing_marks_the_last_message_read_once(rig: Rig) -> None:
    provider = await rig.start()
    said = await rig.fake.user_says(ALICE, "hi")
    await provider.typing(ALICE)
    await provider.typing(ALICE)  # the indicator is still showing: not asked again
    await provider.typing("4915100000777")  # nobody wrote from there: nothing to mark
    assert rig.fake.reads == [(said.id, True)]


# the 24-hour window ----------------------------------------------------------------------------

async def test_outside_the_window_the_log_and_the_admin_are_told(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    provider = await rig.start(admin_number=ADMIN)
    await rig.fake.user_says(ADMIN, "I am the admin")
    await rig.fake.user_says(ALICE, "hi")
    rig.fake.age_window(ALICE, 25 * 3600)  # WhatsApp: Alice last wrote 25 hours ago
    with caplog.at_level(logging.WARNING, logger="pluto.providers.whatsapp"):
        assert await provider.send(OutgoingMessage(chat_id=ALICE, text="late answer"))
        await rig.fake.wait_until(lambda: rig.fake.messages_to(ADMIN), 5, "the admin's notice")
    [notice] = rig.fake.messages_to(ADMIN)
    assert ALICE in notice.text and "24-hour" in notice.text
    assert "more than 24 hours" in caplog.text and ALICE in caplog.text
    # known outside the window: refused at once, logged, the admin not told twice
    provider._last_in[ALICE] = (0.0, "wamid.old")  # noqa: SLF001
    with pytest.raises(DeliveryRefused, match="24-hour"):
        await provider.send(OutgoingMessage(chat_id=ALICE, text="later still"))
    assert len(rig.fake.messages_to(ADMIN)) == 1
    assert [s.text for s in rig.fake.messages_to(ALICE)] == ["late answer"]


async def test_a_refused_131047_is_permanent_and_logged_without_an_admin(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    provider = await rig.start()
    await rig.fake.user_says(ALICE, "hi")
    rig.fake.fail_next(131047)
    with caplog.at_level(logging.WARNING, logger="pluto.providers.whatsapp"):
        with pytest.raises(DeliveryRefused, match="24 hours"):
            await provider.send(OutgoingMessage(chat_id=ALICE, text="x"))
    assert "no admin_number is set" in caplog.text


async def test_outside_the_window_a_reply_goes_out_as_the_window_template(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """A scheduled answer days after the person last wrote: with providers.whatsapp.
    window_template set, it reaches them as that approved template, the reply on one line in
    its variable — known outside the window here, or refused by WhatsApp after the fact."""
    provider = await rig.start(admin_number=ADMIN,
                               window_template={"name": "pluto_update", "language": "en"})
    await rig.fake.user_says(ADMIN, "I am the admin")
    await rig.fake.user_says(ALICE, "hi")
    rig.fake.age_window(ALICE, 25 * 3600)
    provider._last_in[ALICE] = (0.0, "wamid.old")  # noqa: SLF001 - known closed here
    with caplog.at_level(logging.INFO, logger="pluto.providers.whatsapp"):
        assert await provider.send(OutgoingMessage(chat_id=ALICE,
                                                   text="Sales summary:\n\n- up 4%\tweek"))
    [sent] = rig.fake.messages_to(ALICE)
    assert (sent.type, sent.text) == ("template", "Sales summary: - up 4% week")
    assert sent.payload["template"]["name"] == "pluto_update"
    assert "as the template pluto_update" in caplog.text
    # not known here (a restart forgot when Alice wrote): sent as text, refused afterwards by a
    # status (131047), then sent again as the template — the admin is not bothered
    del provider._last_in[ALICE]  # noqa: SLF001
    assert await provider.send(OutgoingMessage(chat_id=ALICE, text="x" * 2000))
    await rig.fake.wait_until(lambda: len(rig.fake.messages_to(ALICE)) == 3, 5,
                              "the template after the refused text")
    text, again = rig.fake.messages_to(ALICE)[1:]
    assert (text.type, again.type) == ("text", "template")
    assert len(again.text) == 1024 and again.text.endswith("…")  # its variable's cap
    assert rig.fake.messages_to(ADMIN) == []
    # a template WhatsApp does not know: refused in one sentence, logged, never a crash
    rig.fake.templates.clear()
    provider._last_in[ALICE] = (0.0, "wamid.old")  # noqa: SLF001
    with pytest.raises(DeliveryRefused, match="[Tt]emplate"):
        await provider.send(OutgoingMessage(chat_id=ALICE, text="later"))


def test_a_window_template_is_checked_when_loaded(fake: FakeWhatsApp, data_dir: Path) -> None:
    app = web.Application()
    for bad in ({"name": "Pluto Update"}, {"name": "ok", "language": "english"},
                {"name": "ok", "max_chars": 5000}, {"language": "en"}):
        config = {"enabled": True, "token_env": TOKEN_ENV, "app_secret_env": SECRET_ENV,
                  "verify_token_env": VERIFY_ENV, "phone_number_id": "1",
                  "window_template": bad}
        with pytest.raises(ConfigError, match="providers.whatsapp.window_template"):
            WhatsAppProvider.from_context(provider_context(ProviderConfig(**config), data_dir,
                                                           app, name="whatsapp"))


# through the gateway -----------------------------------------------------------------------------

async def test_secrets_never_reach_the_log(config_dir: Path, data_dir: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    h = WhatsAppHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        with caplog.at_level(logging.DEBUG):
            await h.start(ScriptedModel(Scripted(text="fine")))
            await h.user_says("hello")
            await h.wait_texts(["fine"])
    finally:
        await h.close()
    for secret in h.secrets().values():
        assert secret not in caplog.text
