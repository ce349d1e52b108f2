"""The email provider: a mailbox read over IMAP (IDLE), replies sent over SMTP.

Receiving: one IMAP connection (reconnected with backoff when it drops). Unseen mail is
fetched without marking it (``BODY.PEEK[]``), read off the event loop, and handed to intake;
only once intake recorded it is it marked ``\\Seen`` — so mail that was not recorded (storage
failed, the connection dropped) is fetched again, and the gateway's dedupe (by Message-ID)
keeps a mail fetched twice from being answered twice. Mail that must not be answered
(auto-generated, bounces, an unauthenticated sender under ``require_authenticated``, mail
that cannot be read) is logged and marked seen, never answered.

A thread is a chat: its chat id is the root of the ``References`` chain (else the mail's own
Message-ID), so each thread is one conversation. The user id is the sender's address and the
"guild" its domain, for ``routes.yaml`` (an allowlist is a rule on ``user`` or ``guild``).

Sending: one mail per message (no edits, no streaming), text and HTML, threaded; files as
attachments. SMTP 4xx waits and tries again (a flood hold), 5xx is a permanent refusal.

Approvals (no buttons): a request's mail ends with "Reply `/approve <id>` or `/deny <id>`";
a reply whose new text (above the quoted mail) is that command decides it. A reply to the
request mail whose new text is just ``approve`` or ``deny`` (a reason may follow ``deny``) is
taken as that command too: the provider keeps the Message-IDs of the request mails it sent
(bounded, in memory: after a restart the full command is needed).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from pathlib import Path

from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable
from pluto.gateway.logs import MaskSecrets
from pluto.gateway.ports import ChatDirectory, Intake, Provider, ProviderContext, Ticket
from pluto.providers.email.imap import Mailbox, MailboxLost
from pluto.providers.email.inbound import File, Mail, MalformedMail, Reading, \
    auto_generated, authenticated, domain_of, read
from pluto.providers.email.outbound import compose, read_files, submit
from pluto.providers.email.settings import EmailSettings, load_settings
from pluto.providers.email.threads import Origin, ThreadBook, thread_key
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.files import safe_filename, save_bytes, too_large
from pluto.providers.kit.loops import Backoff
from pluto.types import MARKDOWN, Attachment, Capabilities, IncomingMessage, OutgoingMessage

log = logging.getLogger(__name__)

PROVIDER = "email"
MAX_REPLY = 5000  # characters of one mail; a longer reply goes out as several mails
SENDS = 4  # SMTP connections at once
FIRST_DELAY, MAX_DELAY = 0.5, 60.0  # reconnecting
READ_SECONDS = 30.0  # reading one mail (parsing, decoding its files)
REQUESTS = 1024  # request mails remembered (Message-ID → approval id)
_REQUEST = re.compile(r"/approve ([a-z2-9]{6,16})\b")
_WORD = re.compile(r"(approve|deny)\b[\s.,:;!-]*(.*)", re.I | re.S)
UNREADABLE = ("I could not read your email (its structure is broken); please send it again "
              "as plain text.")
_MASK = MaskSecrets(placeholder="<password>")


class EmailProvider(Provider):
    name = PROVIDER
    capabilities = Capabilities(max_message_length=MAX_REPLY, markup=MARKDOWN,
                                can_send_images=True, can_send_files=True)

    def __init__(self, settings: EmailSettings, password: str, smtp_password: str, *,
                 data_dir: Path, chats: ChatDirectory | None = None):
        _MASK.add(password, smtp_password, password.replace("\\", "\\\\").replace('"', '\\"'))
        _MASK.attach("aioimaplib", "aiosmtplib", "pluto.providers.email")
        quiet = logging.getLogger("aioimaplib")  # its debug lines carry whole mails
        quiet.setLevel(max(quiet.level, logging.WARNING))
        self.settings = settings
        self._password, self._smtp_password = password, smtp_password
        self.threads = ThreadBook(data_dir / "email" / "threads")
        self.uploads = data_dir / "uploads" / PROVIDER
        self.handover = HandOver(PROVIDER)
        self._sending = asyncio.Semaphore(SENDS)
        self._backoff = Backoff(first=FIRST_DELAY, cap=MAX_DELAY)  # reconnecting
        self._chats = chats  # routing: who may be told anything at all
        self._requests: OrderedDict[str, str] = OrderedDict()  # request mail → approval id

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> EmailProvider:
        settings, password, smtp_password = load_settings(ctx)
        return cls(settings, password, smtp_password, data_dir=ctx.data_dir, chats=ctx.chats)

    def single_owner(self) -> bool:
        return True  # one reader of the mailbox

    async def probe(self) -> str:
        box = Mailbox(self.settings, self._password)
        try:
            await box.open()
        finally:
            await box.close()
        return f"logged in to {self.settings.imap_host} and opened {self.settings.folder}"

    # receiving ---------------------------------------------------------------------------

    async def run(self, intake: Intake) -> None:
        while True:
            try:
                await self._session(intake)
            except ProviderUnusable:
                raise
            except ProviderError as e:
                delay = self._backoff.next()
                log.warning("email: %s; connecting again in %.1fs", e, delay)
                await asyncio.sleep(delay)

    async def _session(self, intake: Intake) -> None:
        box = Mailbox(self.settings, self._password)
        try:
            await box.open()
            self._backoff.reset()
            log.info("email: reading %s on %s as %s", self.settings.folder,
                     self.settings.imap_host, self.settings.username)
            while True:
                if await self._drain(box, intake):
                    await box.wait_news(self.settings.idle_seconds)
                else:  # not recorded: the same mail is taken again, later
                    await self.handover.pause()
        finally:
            await box.close()

    async def _drain(self, box: Mailbox, intake: Intake) -> bool:
        """Take every unseen mail, oldest first; False when one could not be recorded."""
        for uid in await box.unseen():
            if not await self._take(box, uid, intake):
                return False
        return True

    async def _take(self, box: Mailbox, uid: int, intake: Intake) -> bool:
        size = await box.size(uid)
        if size is None:
            return True  # gone meanwhile
        try:
            if size > self.settings.max_message_bytes:
                await self._too_large(box, uid, size)
            else:
                raw = await box.fetch(uid)
                if raw is not None:
                    await self._receive(raw, intake)
        except NotRecorded:
            return False
        except (asyncio.CancelledError, MailboxLost):
            raise
        except Exception as e:  # noqa: BLE001 - one mail never stops the mailbox
            log.error("email: mail %d could not be handled (%s: %s); it is marked seen and "
                      "left alone", uid, type(e).__name__, str(e)[:200])
        await box.mark_seen(uid)
        return True

    async def _receive(self, raw: bytes, intake: Intake) -> None:
        reading = await self._read(raw)
        if reading is None:
            return
        mail = reading.mail
        message_id = mail.message_id or _synthetic_id(raw)
        chat = await self._chat_of(mail.references, message_id)
        refs = mail.references if mail.references[:1] in ((), (chat,)) else (
            chat, *mail.references)  # a reply to the bot's mail by In-Reply-To alone
        origin = Origin(message_id=message_id, to=mail.reply_to, subject=mail.subject,
                        references=refs)
        if reading.text is None:
            log.warning("email: the mail %s from %s cannot be decoded; answering with one "
                        "line", message_id, mail.sender)
            await self._notice(chat, origin, UNREADABLE, mail)
            return
        attachments, problems = await self._save(reading.files, chat, message_id)
        text = reading.text or ("" if attachments else mail.subject)
        text = self._decision(mail, text)
        if text or attachments:
            async def hand(msg: IncomingMessage) -> Ticket:
                await self.threads.note(chat, origin)  # what its reply needs, kept first
                return await intake.submit(msg)
            await self.handover(hand, _incoming(mail, chat, message_id, text, attachments))
        for problem in problems:
            await self._notice(chat, origin, problem, mail)

    async def _read(self, raw: bytes) -> Reading | None:
        """The mail, if it may be answered; else None (logged)."""
        try:
            reading = await asyncio.wait_for(asyncio.to_thread(
                read, raw, self.settings.max_attachment_bytes), READ_SECONDS)
        except MalformedMail as e:
            log.warning("email: dropped a mail that cannot be read: %s", e)
            return None
        mail = reading.mail
        why = auto_generated(mail, self.settings.from_address)
        if why is not None:
            log.info("email: not answering %s from %s: %s", mail.message_id, mail.sender, why)
            return None
        age = time.time() - (mail.timestamp or time.time())
        if self.settings.max_age_days and age > self.settings.max_age_days * 86400:
            log.info("email: not answering %s from %s: written %.0f days ago", mail.message_id,
                     mail.sender, age / 86400)
            return None
        if self.settings.require_authenticated and not authenticated(
                mail, self.settings.authserv_ids):
            log.warning("email: refused mail %s from %s: the sender is not authenticated (no "
                        "dkim, spf or dmarc pass for its domain)", mail.message_id, mail.sender)
            return None
        return reading

    def _decision(self, mail: Mail, text: str) -> str:
        """A bare ``approve`` / ``deny [reason]`` answering a request mail, as its command
        (the gateway checks who may decide, as for any command); any other text as it is."""
        approval = self._requests.get(mail.in_reply_to or "")
        found = _WORD.fullmatch(" ".join(text.split())) if approval else None
        if approval is None or found is None:
            return text
        verdict, reason = found.group(1).lower(), found.group(2).strip()[:500]
        return f"/{verdict} {approval}" + (f" {reason}" if verdict == "deny" and reason else "")

    async def _chat_of(self, references: tuple[str, ...], own: str | None) -> str:
        """The thread's root: the first of References (or In-Reply-To), mapped back to its
        thread when it is one of the bot's own mails; else the mail itself."""
        if references:
            return await self.threads.chat_of(references[0]) or references[0]
        return own or "unknown"

    async def _save(self, files: tuple[File, ...], chat: str,
                    message_id: str) -> tuple[tuple[Attachment, ...], list[str]]:
        saved: list[Attachment] = []
        problems: list[str] = []
        folder = self.uploads / thread_key(chat)
        prefix = hashlib.sha256(message_id.encode()).hexdigest()[:12]
        for f in files:
            if f.data is None:
                problems.append(too_large(f.name, self.settings.max_attachment_mb))
                continue
            path = folder / f"{prefix}-{safe_filename(f.name)}"
            try:
                await save_bytes(path, f.data)
            except OSError as e:
                log.warning("email: saving %s failed: %s", f.name, e)
                problems.append(f"I could not keep the file {f.name}; please send it again.")
                continue
            saved.append(Attachment(filename=f.name, mime_type=f.mime_type, size=f.size,
                                    path=path, kind=f.kind))
        return tuple(saved), problems

    async def _too_large(self, box: Mailbox, uid: int, size: int) -> None:
        head = await box.fetch(uid, "BODY.PEEK[HEADER]")
        reading = await self._read(head) if head else None
        log.warning("email: mail %d is too large (%.1f MB); not downloaded", uid, size / 2**20)
        if reading is not None:
            mail = reading.mail
            chat = await self._chat_of(mail.references, mail.message_id)
            origin = Origin(message_id=mail.message_id or f"uid-{uid}", to=mail.reply_to,
                            subject=mail.subject, references=mail.references)
            await self._notice(chat, origin, f"Your email is too large for me to read (the "
                                             f"limit is {self.settings.max_message_mb:g} MB).",
                               mail)

    async def _notice(self, chat: str, origin: Origin, text: str, mail: Mail) -> None:
        """Tell the sender something (a file too large, a mail unreadable) — only a sender
        the routing table answers: a forged From must not make the bot write to anyone."""
        probe = _incoming(mail, chat, origin.message_id, "", ())
        if self._chats is not None and self._chats.route(probe) is None:
            log.info("email: not telling %s (no route answers them): %s", mail.sender, text)
            return
        try:
            await self._mail(chat, origin, text)
        except ProviderError as e:
            log.warning("email: could not tell %s: %s", origin.to, e)

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        origin = await self.threads.origin(message.chat_id, message.answers)
        if origin is None:
            raise DeliveryRefused(f"no mail of the thread {message.chat_id} is known here")
        return await self._mail(message.chat_id, origin, message.text, message.attachments)

    async def _mail(self, chat: str, origin: Origin, text: str,
                    attachments: tuple[Attachment, ...] = ()) -> str:
        """Send one mail in ``chat`` answering ``origin``; its Message-ID."""
        files = await read_files(attachments, self.settings.max_attachment_bytes)
        domain = domain_of(self.settings.from_address) or "pluto.invalid"
        message_id = self.threads.new_message_id(chat, domain)
        mail = compose(self.settings, origin, message_id, text, files)
        async with self._sending:
            await submit(self.settings, self._smtp_password, mail)
        request = _REQUEST.search(text)
        if request is not None:
            remember(self._requests, message_id, request.group(1), REQUESTS)
        return message_id


def _incoming(mail: Mail, chat: str, message_id: str, text: str,
              attachments: tuple[Attachment, ...]) -> IncomingMessage:
    return IncomingMessage(
        provider=PROVIDER, chat_id=chat, user_id=mail.sender, user_name=mail.sender_name,
        text=text, message_id=message_id, attachments=attachments,
        reply_to_id=mail.in_reply_to, is_direct=True, mentions_bot=True,
        guild_id=domain_of(mail.sender), timestamp=mail.timestamp or time.time())


def _synthetic_id(raw: bytes) -> str:
    """For mail without a Message-ID: the same bytes fetched again get the same id."""
    return f"{hashlib.sha256(raw).hexdigest()[:32]}@pluto.invalid"
