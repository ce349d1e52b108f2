"""The email harness: the real provider (aioimaplib reading, aiosmtplib sending) against the
fake mail server (tests/fakes/mail_server.py).

A chat is a thread: the user's first mail in it is its root (its Message-ID is the chat id),
later mails reply to the bot's latest mail there. What the user is shown is each mail of the
bot in the thread as a mail client shows it: its HTML part as text (code from its ``<code>``
elements), its plain part as ``raw`` (the Markdown the provider sent), its files.
"""

from __future__ import annotations

import html.parser
import os
import re
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from pluto.gateway.ports import Provider
from pluto.providers.email import EmailProvider
from pluto.settings import ProviderConfig
from tests.conformance.harness import Harness, Shown, UserMessage
from tests.fakes.mail_server import PASSWORD, USER, FakeMail, Sent, Stored
from tests.helpers.gateway import provider_context

PASSWORD_ENV = "PLUTO_CONFORMANCE_EMAIL_PASSWORD"
ALICE = "alice@example.org"


class MailView(html.parser.HTMLParser):
    """An HTML mail body as a reader sees it: block elements on lines of their own, table
    cells side by side, whitespace between tags ignored; and the text of its code."""

    BREAKS = {"p", "br", "tr", "li", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote",
              "table", "div"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = [""]
        self.code: list[str] = []
        self._code: list[str] | None = None
        self._pre = 0
        self._cells = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.BREAKS:
            self._break()
        if tag == "pre":
            self._pre += 1
        elif tag == "code":
            self._code = []
        elif tag in ("td", "th"):
            if self._cells:
                self.lines[-1] += " | "
            self._cells += 1
        if tag == "tr":
            self._cells = 0

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag == "code" and self._code is not None:
            self.code.append("".join(self._code).rstrip("\n"))
            self._code = None
        if tag in self.BREAKS:
            self._break()

    def handle_data(self, data: str) -> None:
        if not self._pre and not data.strip() and "\n" in data:
            return  # the source's line breaks between tags
        if self._code is not None:
            self._code.append(data)
        if self._pre:
            parts = data.rstrip("\n").split("\n")
            self.lines[-1] += parts[0]
            self.lines.extend(parts[1:])
        else:
            self.lines[-1] += re.sub(r"\s+", " ", data)

    def _break(self) -> None:
        if self.lines[-1]:
            self.lines.append("")

    def text(self) -> str:
        return "\n".join(line.strip() for line in self.lines if line.strip())


def read_mail(msg: EmailMessage) -> tuple[str, str, tuple[str, ...], str, bytes | None]:
    """(text, raw, code, kind, data) of a bot's mail."""
    plain = msg.get_body(preferencelist=("plain",))
    rich = msg.get_body(preferencelist=("html",))
    raw = str(plain.get_content()).replace("\r\n", "\n").rstrip("\n") if plain else ""
    view = MailView()
    if rich is not None:
        view.feed(str(rich.get_content()).replace("\r\n", "\n"))
        view.close()
    files = list(msg.iter_attachments())
    if files:
        part = files[0]
        kind = "image" if part.get_content_disposition() == "inline" else "file"
        data = part.get_payload(decode=True)
        return "", raw, (), kind, data if isinstance(data, bytes) else None
    return view.text() if rich is not None else raw, raw, tuple(view.code), "text", None


@dataclass
class EmailHarness(Harness):
    name: str = "email"
    caps: Any = EmailProvider.capabilities
    features: frozenset[str] = frozenset({"redelivery", "flood_control", "files_in", "serve"})
    direct_chat: str = "thread-1@example.org"
    fake: FakeMail = field(default_factory=FakeMail)
    sent: dict[str, Stored] = field(default_factory=dict)  # uid → the user's stored mail
    started: set[str] = field(default_factory=set)  # threads the user began
    settings: dict[str, Any] = field(default_factory=dict)  # more of providers.email
    _idles: int = 0
    _ids: int = 0

    async def open(self) -> None:
        await self.fake.start()
        os.environ[PASSWORD_ENV] = PASSWORD

    async def close(self) -> None:
        await super().close()
        await self.fake.stop()
        os.environ.pop(PASSWORD_ENV, None)

    def provider_config(self) -> dict[str, Any]:
        return {"enabled": True, "username": USER, "password_env": PASSWORD_ENV,
                "imap_host": "127.0.0.1", "imap_port": self.fake.imap_port,
                "imap_security": "none", "smtp_host": "127.0.0.1",
                "smtp_port": self.fake.smtp_port, "smtp_security": "none",
                "idle_seconds": 30, **self.settings}

    def serve_config(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"email": self.provider_config()}, {PASSWORD_ENV: PASSWORD}

    async def make_provider(self) -> Provider:
        self.expect_connection()
        ctx = provider_context(ProviderConfig(**self.provider_config()), self.data_dir, None)
        return EmailProvider.from_context(ctx)

    def _waits(self) -> int:
        """How often a client waited for mail: IDLEs, or NOOP polls without IDLE."""
        return self.fake.idles + self.fake.commands.count("NOOP")

    def expect_connection(self) -> None:
        self._idles = self._waits()

    async def connected(self, timeout: float = 10) -> None:
        await self.fake.wait_until(lambda: self._waits() > self._idles, timeout,
                                   "the provider to wait for mail (IDLE, or a NOOP poll)")

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        chat = chat or self.direct_chat
        files = ((document[0], document[1], "text/csv"),) if document else ()
        if chat not in self.started:  # the thread's first mail: its root
            self.started.add(chat)
            stored = self.fake.user_sends(text, sender=ALICE, message_id=chat, files=files)
        else:
            self._ids += 1
            mine = self.fake.in_thread(chat)
            parent = reply_to.id if reply_to else (
                _id(mine[-1]) if mine else chat)
            stored = self.fake.user_sends(
                text, sender=ALICE, subject="Re: A question",
                message_id=f"m{self._ids}.{chat}", in_reply_to=parent,
                references=[chat] + ([parent] if parent != chat else []), files=files)
        self.sent[str(stored.uid)] = stored
        return UserMessage(chat, stored.uid)

    async def redeliver(self, message: UserMessage) -> None:
        """The same mail arrives again (a duplicate delivery: a new UID, the same
        Message-ID)."""
        self.fake.deliver(self.sent[str(message.ref)].raw)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: the mail is marked \\Seen in the mailbox."""
        return self.sent[str(message.ref)].seen

    def shown(self, chat: str | None = None) -> list[Shown]:
        out = []
        for sent in self.fake.in_thread(chat or self.direct_chat):
            text, raw, code, kind, data = read_mail(sent.message)
            out.append(Shown(id=_id(sent), text=text, raw=raw, code=code, kind=kind,
                             data=data))
        return out

    def rate_limit_sends(self, chat: str, *, after: int, retry_after: int) -> None:
        self.fake.hold(chat, after=after, retry_after=retry_after)

    def refused_sends(self) -> list[float]:
        return list(self.fake.refused)

    def accepted_sends(self, chat: str | None = None) -> list[float]:
        return [s.time for s in self.fake.in_thread(chat or self.direct_chat)]

    async def changed(self) -> None:
        await self.fake.wait_change(0.5)


def _id(sent: Sent) -> str:
    return str(sent.message.get("Message-ID", "")).strip().strip("<>")
