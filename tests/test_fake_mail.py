"""The fake mail server behaves as a mail provider does, seen from real clients: aioimaplib on
its IMAP side, aiosmtplib on its SMTP side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from email.message import EmailMessage
from typing import Any

import aioimaplib  # type: ignore[import-untyped]
import aiosmtplib
import pytest

from tests.fakes.mail_server import PASSWORD, USER, FakeMail


@pytest.fixture
async def fake() -> AsyncIterator[FakeMail]:
    async with FakeMail() as server:
        yield server


async def imap(fake: FakeMail, password: str = PASSWORD, lost: Any = None) -> Any:
    client = aioimaplib.IMAP4(host="127.0.0.1", port=fake.imap_port, timeout=5,
                              conn_lost_cb=lost)
    await client.wait_hello_from_server()
    response = await client.login(USER, password)
    if response.result == "OK":
        assert (await client.select("INBOX")).result == "OK"
    return client


def literal(response: Any) -> bytes | None:
    return next((bytes(x) for x in response.lines if isinstance(x, bytearray)), None)


def mail(to: str = "alice@example.org") -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = USER, to, "Re: hello"
    msg["References"] = "<thread-9@example.org>"
    msg.set_content("an answer")
    return msg


async def send(fake: FakeMail, msg: EmailMessage, password: str = PASSWORD) -> Any:
    return await aiosmtplib.send(msg, hostname="127.0.0.1", port=fake.smtp_port,
                                 username=USER, password=password, start_tls=False,
                                 timeout=5)


async def test_wrong_credentials_are_refused(fake: FakeMail) -> None:
    client = await imap(fake, password="not-the-password")
    assert fake.failed_logins == 1 and fake.logins == 0
    assert client.protocol.state == "NONAUTH"
    with pytest.raises(aiosmtplib.SMTPAuthenticationError):
        await send(fake, mail(), password="not-the-password")
    assert not fake.sent


async def test_unseen_mail_is_fetched_without_being_marked_until_stored(fake: FakeMail) -> None:
    first = fake.user_sends("one")
    second = fake.user_sends("two")
    client = await imap(fake)
    search = await client.uid_search("UNSEEN", charset=None)
    assert search.lines[0].split() == [b"1", b"2"]
    size = await client.uid("fetch", "1", "(RFC822.SIZE)")
    assert f"RFC822.SIZE {len(first.raw)}".encode() in size.lines[0]
    body = await client.uid("fetch", "1", "(BODY.PEEK[])")
    assert literal(body) == first.raw and not first.seen  # PEEK leaves it unseen
    head = await client.uid("fetch", "2", "(BODY.PEEK[HEADER])")
    assert (literal(head) or b"").endswith(b"\r\n\r\n") and b"two" not in (literal(head) or b"")
    assert (await client.uid("store", "1", "+FLAGS", "(\\Seen)")).result == "OK"
    assert first.seen
    await client.uid("fetch", "2", "(BODY[])")  # a plain BODY[] marks it, as servers do
    assert second.seen
    search = await client.uid_search("UNSEEN", charset=None)
    assert search.lines[0].split() == []
    await client.logout()


async def test_idle_pushes_new_mail_and_ends_with_done(fake: FakeMail) -> None:
    client = await imap(fake)
    idle = await client.idle_start(timeout=30)
    assert fake.idles == 1
    fake.user_sends("news")
    push = await client.wait_server_push(5)
    assert b"1 EXISTS" in push
    client.idle_done()
    assert (await asyncio.wait_for(idle, 5)).result == "OK"
    await client.logout()


async def test_mail_between_commands_is_told_with_the_next_answer(fake: FakeMail) -> None:
    client = await imap(fake)
    fake.user_sends("arrived while the client was busy")
    response = await client.noop()
    assert any(b"1 EXISTS" in bytes(line) for line in response.lines)
    await client.logout()


async def test_the_server_can_drop_a_connection_before_a_command(fake: FakeMail) -> None:
    stored = fake.user_sends("hello")
    lost = asyncio.Event()
    client = await imap(fake, lost=lambda exc: lost.set())
    fake.drop_on("STORE")
    store = asyncio.ensure_future(client.uid("store", "1", "+FLAGS", "(\\Seen)"))
    await asyncio.wait_for(lost.wait(), 5)
    store.cancel()
    assert not stored.seen  # the command was never carried out
    again = await imap(fake, lost=lambda exc: lost.set())
    lost.clear()
    fake.drop_connections()
    await asyncio.wait_for(lost.wait(), 5)
    assert again.protocol.transport.is_closing() or lost.is_set()


async def test_smtp_takes_mail_and_defers_and_refuses_like_a_server(fake: FakeMail) -> None:
    await send(fake, mail())
    [sent] = fake.sent
    assert sent.rcpt_tos == ["alice@example.org"] and sent.thread == "thread-9@example.org"
    fake.bad_addresses.add("nobody@example.org")
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused) as refused:
        await send(fake, mail("nobody@example.org"))
    assert refused.value.recipients[0].code == 550
    fake.defer_for(30, code=421)
    with pytest.raises(aiosmtplib.SMTPResponseException) as deferred:
        await send(fake, mail())
    assert deferred.value.code == 421 and "again in 30 seconds" in deferred.value.message
    fake.deferred_until = 0.0
    fake.hold("thread-9@example.org", after=1, retry_after=2)
    with pytest.raises(aiosmtplib.SMTPResponseException) as held:
        await send(fake, mail())
    assert held.value.code == 451 and "again in 2 seconds" in held.value.message
    await send(fake, mail())  # once
    assert len(fake.sent) == 2 and len(fake.refused) == 2
