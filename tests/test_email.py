"""The email provider against the fake mail server: what only email has — threading headers,
loops that must never start (auto-replies, bounces, the bot's own mail), senders that must
prove who they are, mail that cannot be read, SMTP's 4xx/5xx, a connection dropped before a
mail was marked seen — and that the password never reaches a log line."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from email import policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from pluto.errors import ConfigError, DeliveryRefused, ProviderUnusable, RateLimited
from pluto.providers.email import EmailProvider
from pluto.providers.email.inbound import parse, strip_quoted
from pluto.providers.email.outbound import reply_subject, smtp_error
from pluto.providers.email.provider import UNREADABLE
from pluto.settings import ProviderConfig
from pluto.types import Attachment, OutgoingMessage
from tests.conformance.email_harness import ALICE, PASSWORD_ENV, EmailHarness
from tests.fakes.mail_server import BOT, PASSWORD, FakeMail, Stored
from tests.helpers.gateway import RecordingIntake, provider_context

ROOT = "thread-1@example.org"


@pytest.fixture
async def harness(config_dir: Path, data_dir: Path) -> AsyncIterator[EmailHarness]:
    h = EmailHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


def headers(h: EmailHarness, n: int = 0) -> EmailMessage:
    return h.fake.in_thread(ROOT)[n].message


async def seen(fake: FakeMail, *stored: Stored) -> None:
    await fake.wait_until(lambda: all(s.seen for s in stored), 10, "the mail marked seen")


# threading ---------------------------------------------------------------------------------

async def test_a_reply_is_threaded_text_and_html(harness: EmailHarness) -> None:
    harness.settings = {"display_name": "Pluto"}
    await harness.start()
    await harness.user_says("hello **there**")
    await harness.wait_texts(["echo: hello **there**"], raw=True)
    reply = headers(harness)
    assert reply["From"] == f"Pluto <{BOT}>" and reply["To"] == ALICE
    assert reply["Subject"] == "Re: A question"
    assert reply["In-Reply-To"] == f"<{ROOT}>" and reply["References"] == f"<{ROOT}>"
    assert reply["Auto-Submitted"] == "auto-replied"  # RFC 3834: a responder answers it not
    assert reply.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in reply.iter_parts()] == ["text/plain", "text/html"]
    [shown] = harness.shown()
    assert shown.text == "echo: hello there"  # the HTML part: **there** is bold there
    assert "<strong>there</strong>" in reply.get_body(("html",)).get_content()  # type: ignore[union-attr]
    # the user answers by In-Reply-To alone (no References): the same thread, one session
    bot_id = shown.id
    harness.fake.user_sends("and more", sender=ALICE, subject="Re: Re: A question",
                            message_id="m2@example.org", in_reply_to=bot_id)
    await harness.wait_messages(2)
    second = headers(harness, 1)
    assert second["Subject"] == "Re: A question"
    assert second["In-Reply-To"] == "<m2@example.org>"
    assert second["References"] == f"<{ROOT}> <{bot_id}> <m2@example.org>"
    assert {m.chat_id for m in harness.received} == {ROOT}
    assert len(harness.model.calls[1]) > len(harness.model.calls[0])  # it had the history


def test_subjects_and_quoted_text() -> None:
    assert reply_subject("Re: RE: Fwd: plans") == "Re: plans"
    assert reply_subject("") == "Re: (no subject)"
    text = "Sure, do it.\n\nOn Mon, 1 Jan 2026 Bot <bot@x> wrote:\n> earlier\n> text\n"
    assert strip_quoted(text) == "Sure, do it."
    assert strip_quoted("Thanks\n-- \nAlice, Example Ltd") == "Thanks"


# loops cannot start --------------------------------------------------------------------------

def raw_mail(body: str, **fields: str) -> bytes:
    msg = EmailMessage()
    for name, value in fields.items():
        msg[name.replace("_", "-")] = value
    msg.set_content(body)
    return msg.as_bytes(policy=policy.SMTP)


async def test_auto_replies_and_bounces_are_never_answered(harness: EmailHarness,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    caplog.set_level(logging.INFO, "pluto.providers.email")
    await harness.start()
    fake = harness.fake
    machine = [
        fake.user_sends("I am out of office", headers={"Auto-Submitted": "auto-replied"}),
        fake.user_sends("newsletter", headers={"Precedence": "bulk"}),
        fake.user_sends("vacation", headers={"X-Autoreply": "yes"}),
        fake.user_sends("list mail", headers={"List-Id": "<team.lists.example.org>"}),
        fake.deliver(raw_mail("Delivery failed", From="MAILER-DAEMON@mx.example.org",
                              To=BOT, Subject="Undelivered Mail", Return_Path="<>",
                              Message_ID="<bounce-1@mx.example.org>")),
    ]
    await seen(fake, *machine)
    await harness.user_says("a person writes")
    [answer] = await harness.wait_messages(1)
    # the bot's own reply comes back (an auto-forward, a loop through a list): not answered
    echo = fake.deliver(fake.in_thread(ROOT)[0].raw)
    await seen(fake, echo)
    await harness.settled()
    assert [s.text for s in harness.shown()] == ["echo: a person writes"]
    assert len(fake.sent) == 1 and len(harness.model.calls) == 1
    logged = caplog.text
    for reason in ("Auto-Submitted: auto-replied", "Precedence: bulk", "X-Autoreply is set",
                   "mailing list mail", "a bounce", "bot's own address"):
        assert reason in logged, reason


# who may write ---------------------------------------------------------------------------------

AR = "Authentication-Results"


async def test_a_spoofed_sender_is_refused_when_authentication_is_required(
        harness: EmailHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pluto.providers.email")
    harness.settings = {"require_authenticated": True, "authserv_ids": ["mx.pluto.test"]}
    await harness.start()
    fake = harness.fake
    spoofed = [
        fake.user_sends("no results at all", sender=ALICE),
        fake.user_sends("someone else's signature", sender=ALICE, headers={
            AR: "mx.pluto.test; dkim=pass header.d=evil.example; spf=fail "
                "smtp.mailfrom=evil.example"}),
        fake.user_sends("a forged header", sender=ALICE, headers={
            AR: "mx.evil.example; dkim=pass header.d=example.org; dmarc=pass"}),
    ]
    await seen(fake, *spoofed)
    real = fake.user_sends("signed by my domain", sender=ALICE, message_id=ROOT, headers={
        AR: "mx.pluto.test; dkim=pass header.d=example.org header.s=s1; spf=softfail"})
    await harness.wait_texts(["echo: signed by my domain"])
    await seen(fake, real)
    await harness.settled()
    assert len(fake.sent) == 1 and len(harness.model.calls) == 1
    assert caplog.text.count("the sender is not authenticated") == 3


async def test_senders_are_routed_by_address_and_domain(harness: EmailHarness) -> None:
    (harness.config_dir / "routes.yaml").write_text(
        "routes:\n"
        "  - match: {provider: email, guild: example.org}\n    agent: default\n"
        "  - match: {provider: email}\n    deny: true\n"
        "default: null\n")
    await harness.start()
    stranger = harness.fake.user_sends("let me in", sender="mallory@elsewhere.example")
    await seen(harness.fake, stranger)
    await harness.user_says("from the right domain")
    await harness.wait_texts(["echo: from the right domain"])
    await harness.settled()
    assert len(harness.fake.sent) == 1
    assert [(m.user_id, m.guild_id) for m in harness.received][-1] == (ALICE, "example.org")


# mail that cannot be read ----------------------------------------------------------------

async def test_malformed_mail_is_logged_dropped_or_answered_in_one_line(
        harness: EmailHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pluto.providers.email")
    await harness.start()
    fake = harness.fake
    junk = fake.deliver(b"\x00\xff this is not a mail\r\n\r\n\x89PNG")
    broken = fake.deliver(
        b"From: alice@example.org\r\nTo: bot@pluto.test\r\nSubject: hm\r\n"
        b"Message-ID: <" + ROOT.encode() + b">\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=x-no-such-charset\r\n\r\nhello\r\n")
    await seen(fake, junk, broken)
    [notice] = await harness.wait_messages(1)
    assert notice.text == UNREADABLE
    await harness.user_says("a readable one")  # and the mailbox goes on
    await harness.wait_messages(2)
    await harness.settled()
    assert "dropped a mail that cannot be read" in caplog.text
    assert "Traceback" not in caplog.text
    assert len(harness.model.calls) == 1


# SMTP's answers -------------------------------------------------------------------------------

async def test_a_5xx_is_a_permanent_failure_and_the_thread_goes_on(
        harness: EmailHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    harness.fake.bad_addresses.add("gone@example.org")
    await harness.start()
    stored = harness.fake.user_sends("answer me elsewhere", sender=ALICE, message_id=ROOT,
                                     headers={"Reply-To": "gone@example.org"})
    await seen(harness.fake, stored)
    await harness.fake.wait_until(lambda: "gave up on this reply" in caplog.text, 10,
                                  "the reply given up")
    assert not harness.fake.sent and "550" in caplog.text
    harness.started.add(ROOT)
    await harness.user_says("and now?")
    await harness.wait_texts(["echo: and now?"])


def test_smtp_codes_become_typed_errors(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "x")
    settings = build(tmp_path).settings
    greylisted = smtp_error(450, "4.2.0 Greylisted, please retry in 5 minutes", settings)
    assert isinstance(greylisted, RateLimited) and greylisted.retry_after == 300
    closing = smtp_error(421, "4.3.2 Service not available, closing", settings)
    assert isinstance(closing, RateLimited) and closing.retry_after == settings.retry_seconds
    refused = smtp_error(554, "5.7.1 Message rejected", settings)
    assert isinstance(refused, DeliveryRefused) and "554" in str(refused)


# reconnects and redelivery ---------------------------------------------------------------------

async def test_a_dropped_connection_before_seen_fetches_again_and_answers_once(
        harness: EmailHarness) -> None:
    await harness.start()
    harness.fake.drop_on("STORE")  # the mail is recorded, then the server goes away
    said = await harness.user_says("are you there?")
    await harness.wait_texts(["echo: are you there?"])
    await harness.fake.wait_until(lambda: harness.confirmed(said), 15, "the mail marked seen")
    await harness.settled()
    assert harness.fake.logins == 2  # it connected again and took the mail once more
    assert [s.text for s in harness.shown()] == ["echo: are you there?"]
    assert len(harness.model.calls) == 1


async def test_a_connection_dropped_while_idle_is_made_again(harness: EmailHarness) -> None:
    await harness.start()
    harness.expect_connection()
    harness.fake.drop_connections()  # the server restarts, a NAT forgets the connection
    await harness.connected()  # logged in again and waiting (IDLE)
    await harness.user_says("still there?")
    await harness.wait_texts(["echo: still there?"])
    assert harness.fake.logins == 2


# files ------------------------------------------------------------------------------------

async def test_files_over_the_limit_are_refused_both_ways(harness: EmailHarness,
                                                          tmp_path: Path) -> None:
    harness.settings = {"max_attachment_mb": 0.001}  # about 1 KB
    await harness.start()
    harness.fake.user_sends("see attached", sender=ALICE, message_id=ROOT,
                            files=(("big.csv", b"x," * 2000, "text/csv"),))
    shown = await harness.wait_messages(2)
    assert any("big.csv is too large" in s.text for s in shown)
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * 5000)
    provider = harness.gateway.providers["email"]  # type: ignore[union-attr]
    with pytest.raises(DeliveryRefused, match="larger than the platform takes"):
        await provider.send(OutgoingMessage(chat_id=ROOT, answers=ROOT, attachments=(
            Attachment(filename="big.bin", path=big, size=5000),)))


# settings and secrets ------------------------------------------------------------------------

def build(data_dir: Path, **extra: Any) -> EmailProvider:
    config = {"enabled": True, "username": BOT, "password_env": PASSWORD_ENV,
              "imap_host": "127.0.0.1", "smtp_host": "127.0.0.1", **extra}
    return EmailProvider.from_context(provider_context(ProviderConfig(**config), data_dir))


def test_settings_name_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(ConfigError, match="providers.email.password_env"):
        build(tmp_path)
    monkeypatch.setenv(PASSWORD_ENV, "x")
    with pytest.raises(ConfigError, match="providers.email.imap_port"):
        build(tmp_path, imap_port=0)


async def test_the_password_never_reaches_a_log_line(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    tricky = 'p"a\\ss-Word-4711'  # quoted on the wire: \" and \\
    async with FakeMail(password=tricky) as fake:
        monkeypatch.setenv(PASSWORD_ENV, "wrong-password-123")
        ports = {"imap_port": fake.imap_port, "smtp_port": fake.smtp_port,
                 "imap_security": "none", "smtp_security": "none"}
        with pytest.raises(ProviderUnusable, match=PASSWORD_ENV) as refused:
            await build(tmp_path, **ports).run(RecordingIntake())  # type: ignore[arg-type]
        assert "wrong-password-123" not in str(refused.value)
        monkeypatch.setenv(PASSWORD_ENV, tricky)
        provider = build(tmp_path, **ports)
        intake = RecordingIntake()
        task = asyncio.create_task(provider.run(intake))  # type: ignore[arg-type]
        fake.user_sends("hi", message_id=ROOT)
        await fake.wait_until(lambda: intake.got, 10, "the mail handed over")
        await provider.send(OutgoingMessage(chat_id=ROOT, text="hello", answers=ROOT))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert fake.logins == 1 and fake.smtp_logins == 1
    for secret in ("wrong-password-123", tricky, tricky.replace("\\", "\\\\")
                   .replace('"', '\\"')):
        assert secret not in caplog.text


def test_a_mail_without_a_sender_is_malformed() -> None:
    from pluto.providers.email.inbound import MalformedMail
    with pytest.raises(MalformedMail):
        parse(b"Subject: who?\r\n\r\nbody\r\n")


async def test_a_mail_over_the_size_limit_is_not_downloaded_and_its_sender_told(
        harness: EmailHarness) -> None:
    harness.settings = {"max_message_mb": 0.002}  # about 2 KB
    await harness.start()
    big = harness.fake.user_sends("x" * 5000, sender=ALICE, message_id=ROOT)
    [notice] = await harness.wait_messages(1)
    await seen(harness.fake, big)
    assert "too large" in notice.text
    assert not any("BODY.PEEK[]" in c for c in harness.fake.commands)  # only its header
    assert not harness.model.calls


class NoRoutes:
    """The routing table's answer for every sender: no route (a deny rule)."""

    def route(self, probe: Any) -> None:
        return None


async def test_nobody_the_routing_table_refuses_is_told_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pluto.providers.email")
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    async with FakeMail() as fake:
        config = {"enabled": True, "username": BOT, "password_env": PASSWORD_ENV,
                  "imap_host": "127.0.0.1", "imap_port": fake.imap_port,
                  "imap_security": "none", "smtp_host": "127.0.0.1",
                  "smtp_port": fake.smtp_port, "smtp_security": "none"}
        ctx = provider_context(ProviderConfig(**config), tmp_path)
        ctx = type(ctx)(**{**{f: getattr(ctx, f) for f in ctx.__dataclass_fields__},
                           "chats": NoRoutes()})
        provider = EmailProvider.from_context(ctx)
        task = asyncio.create_task(provider.run(RecordingIntake()))  # type: ignore[arg-type]
        forged = fake.deliver(
            b"From: victim@example.net\r\nSubject: x\r\nMessage-ID: <f1@example.net>\r\n"
            b"Content-Type: text/plain; charset=x-no-such-charset\r\n\r\nhello\r\n")
        await seen(fake, forged)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not fake.sent
    assert "not telling victim@example.net" in caplog.text


async def test_a_server_without_idle_is_polled_and_old_mail_left_alone(
        harness: EmailHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pluto.providers.email")
    harness.fake.idle = False
    harness.settings = {"poll_seconds": 0.05}
    old = harness.fake.deliver(raw_mail("from last year", From=ALICE, To=BOT, Subject="old",
                                        Date="Mon, 03 Mar 2025 10:00:00 +0000",
                                        Message_ID="<old-1@example.org>"))
    await harness.start()
    await seen(harness.fake, old)
    await harness.user_says("polled, not pushed")
    await harness.wait_texts(["echo: polled, not pushed"])
    assert "written" in caplog.text and "days ago" in caplog.text
    assert len(harness.model.calls) == 1 and harness.fake.idles == 0


def test_the_text_of_html_and_multipart_mail() -> None:
    from pluto.providers.email.inbound import body_text
    msg = EmailMessage()
    msg["From"] = ALICE
    msg.set_content("<p>Hello <b>there</b></p><table><tr><td>a</td><td>b</td></tr></table>"
                    "<style>p {color: red}</style>", subtype="html")
    assert body_text(msg) == "Hello there\n\na | b"  # no style, a row on its line
    alt = EmailMessage()
    alt["From"] = ALICE
    alt.set_content("the plain part\n\n> quoted\n")
    alt.add_alternative("<p>the html part</p>", subtype="html")
    assert body_text(alt) == "the plain part"


async def test_a_thread_record_that_cannot_be_written_leaves_the_mail_unseen(
        harness: EmailHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pluto.providers.handover")
    blocker = harness.data_dir / "email" / "threads"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")  # the record cannot be written: like a full disk
    await harness.start()
    said = await harness.user_says("keep me")
    await harness.fake.wait_until(lambda: "cannot be recorded" in caplog.text, 10,
                                  "the outage logged")
    assert not harness.confirmed(said) and not harness.received
    blocker.unlink()  # the disk has room again
    await harness.wait_texts(["echo: keep me"])
    await harness.fake.wait_until(lambda: harness.confirmed(said), 10, "the mail marked seen")
    assert caplog.text.count("cannot be recorded") == 1
