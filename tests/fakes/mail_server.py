"""A fake mail provider for tests: an IMAP4rev1 server holding one mailbox and an SMTP server
(aiosmtpd) that takes the bot's mail, both on 127.0.0.1, in the test's event loop.

    async with FakeMail() as fake:
        fake.user_sends("hello", sender="alice@example.org")     # mail arrives in INBOX
        [reply] = await fake.wait_until(lambda: fake.sent)       # what the bot sent by SMTP

IMAP (hand-written, the subset a mail client reading one folder uses): ``CAPABILITY`` (with
``IDLE``), ``LOGIN`` (``NO [AUTHENTICATIONFAILED]`` for wrong credentials), ``SELECT`` (one
folder, ``INBOX``), ``UID SEARCH [CHARSET x] UNSEEN|ALL``, ``UID FETCH`` of ``RFC822.SIZE``,
``FLAGS``, ``BODY.PEEK[]``, ``BODY.PEEK[HEADER]``, ``BODY[]`` and ``RFC822`` (the last two set
``\\Seen``, as a real server does), ``UID STORE +FLAGS/-FLAGS/FLAGS``, ``IDLE``/``DONE`` with
``EXISTS`` pushed when mail arrives (and reported with the next response when it arrived
between commands), ``NOOP``, ``LOGOUT``. Test controls: ``drop_connections()`` (the server
goes away mid-session), ``drop_on("STORE")`` (close the connection when that command comes,
without doing it), ``deliver`` (the same mail again: a duplicate delivery).

SMTP (aiosmtpd): ``AUTH PLAIN/LOGIN`` without TLS (535 for wrong credentials); each mail
taken is recorded (``sent``) with its envelope. It can answer for a while ``421``/``451``
(``defer_for``), once for a thread after N mails (``hold``: "451 4.7.1 Try again in N
seconds"), and ``550`` for an unknown address (``bad_addresses``).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import formatdate, make_msgid
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

from tests.fakes.changes import Changes

__all__ = ["FakeMail", "Stored", "Sent", "USER", "PASSWORD", "BOT"]

USER = "bot@pluto.test"
BOT = USER
PASSWORD = "imap-app-password-7f3a9c"
_ID = re.compile(r"<([^<>\s]+)>")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"|(\([^)]*\))|(\S+)')


@dataclass
class Stored:
    """A mail in the mailbox."""

    uid: int
    raw: bytes
    flags: set[str] = field(default_factory=set)

    @property
    def seen(self) -> bool:
        return "\\Seen" in self.flags


@dataclass
class Sent:
    """A mail the bot handed to the SMTP server."""

    time: float  # monotonic
    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    message: EmailMessage

    @property
    def thread(self) -> str | None:
        """The root of the mail's References chain (its thread), else what it replies to."""
        return thread_of(self.message)


def thread_of(msg: EmailMessage) -> str | None:
    refs = _ID.findall(str(msg.get("References", ""))) or \
        _ID.findall(str(msg.get("In-Reply-To", "")))
    return refs[0] if refs else None


def _args(text: str) -> list[str]:
    """The arguments of a command line: quoted strings unescaped, lists, atoms."""
    return [paren or atom if paren or atom else re.sub(r"\\(.)", r"\1", quoted)
            for quoted, paren, atom in _ARG.findall(text)]


class FakeMail(Changes):

    FAKE = "mail"
    def __init__(self, *, user: str = USER, password: str = PASSWORD, idle: bool = True):
        self.user, self.password, self.idle = user, password, idle
        self.mailbox: list[Stored] = []
        self.uidvalidity = 1700000001
        self._uids = itertools.count(1)
        self.sent: list[Sent] = []
        self.bad_addresses: set[str] = set()
        self.holds: dict[str, tuple[int, int]] = {}  # thread → (after n mails, retry after)
        self.refused: list[float] = []  # when a mail was deferred (monotonic)
        self.deferred_until = 0.0
        self.defer_code = 451
        self.drop_next: set[str] = set()
        self.logins = 0
        self.failed_logins = 0
        self.idles = 0  # IDLE commands taken
        self.commands: list[str] = []
        self.smtp_logins = 0
        self._imap: asyncio.Server | None = None
        self._smtp: asyncio.Server | None = None
        self._sessions: set[_ImapSession] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self.imap_port = self.smtp_port = 0

    async def __aenter__(self) -> FakeMail:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._imap = await asyncio.start_server(self._serve_imap, "127.0.0.1", 0)
        self.imap_port = self._imap.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self._smtp = await loop.create_server(
            lambda: SMTP(_Handler(self), hostname="mail.pluto.test", auth_require_tls=False,
                         authenticator=self._authenticate, loop=loop), "127.0.0.1", 0)
        self.smtp_port = self._smtp.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.drop_connections()
        if self._tasks:  # each session ends once its connection is closed
            await asyncio.wait(set(self._tasks), timeout=5)
        for server in (self._imap, self._smtp):
            if server is not None:
                server.close()
                await server.wait_closed()
        self._imap = self._smtp = None

    # test controls ----------------------------------------------------------------------------

    def user_sends(self, text: str, *, sender: str = "alice@example.org",
                   subject: str = "A question", message_id: str | None = None,
                   in_reply_to: str | None = None, references: list[str] | None = None,
                   headers: dict[str, str] | None = None,
                   files: tuple[tuple[str, bytes, str], ...] = ()) -> Stored:
        """A person's mail arrives in the mailbox (``files``: name, bytes, mime type)."""
        msg = EmailMessage()
        msg["From"] = sender
        msg["To"] = self.user
        msg["Subject"] = subject
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = f"<{message_id}>" if message_id else make_msgid(domain="example.org")
        if in_reply_to:
            msg["In-Reply-To"] = f"<{in_reply_to}>"
        if references:
            msg["References"] = " ".join(f"<{r}>" for r in references)
        for name, value in (headers or {}).items():
            msg[name] = value
        msg.set_content(text)
        for name, data, mime in files:
            main, _, sub = mime.partition("/")
            msg.add_attachment(data, maintype=main, subtype=sub, filename=name)
        return self.deliver(msg.as_bytes(policy=policy.SMTP))

    def deliver(self, raw: bytes) -> Stored:
        """A mail arrives (the same bytes again: a duplicate delivery, with a new UID)."""
        stored = Stored(next(self._uids), raw)
        self.mailbox.append(stored)
        for session in list(self._sessions):
            session.news()
        self._notify()
        return stored

    def message(self, stored: Stored) -> EmailMessage:
        msg = BytesParser(policy=policy.default).parsebytes(stored.raw)
        assert isinstance(msg, EmailMessage)
        return msg

    def drop_connections(self) -> None:
        for session in list(self._sessions):
            session.close()

    def drop_on(self, command: str) -> None:
        """The next time a client sends ``command`` (e.g. ``STORE``), close its connection
        without doing it."""
        self.drop_next.add(command.upper())

    def defer_for(self, seconds: float, code: int = 451) -> None:
        """Every mail is deferred (``code``) for ``seconds`` from now."""
        self.deferred_until, self.defer_code = time.monotonic() + seconds, code

    def hold(self, thread: str, *, after: int, retry_after: int) -> None:
        """Once ``after`` mails of the bot are in ``thread``, defer its next one (once)."""
        self.holds[thread] = (after, retry_after)

    def in_thread(self, thread: str) -> list[Sent]:
        return [s for s in self.sent if s.thread == thread]

    # SMTP -------------------------------------------------------------------------------------

    def _authenticate(self, server: SMTP, session: Any, envelope: Any, mechanism: str,
                      auth_data: Any) -> AuthResult:
        ok = isinstance(auth_data, LoginPassword) and auth_data.login == self.user.encode() \
            and auth_data.password == self.password.encode()
        self.smtp_logins += ok
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    def _take(self, envelope: Any) -> str:
        raw = bytes(envelope.original_content or envelope.content)
        msg = BytesParser(policy=policy.default).parsebytes(raw)
        assert isinstance(msg, EmailMessage)
        now = time.monotonic()
        if now < self.deferred_until:
            self.refused.append(now)
            self._notify()
            wait = max(1, round(self.deferred_until - now))
            return f"{self.defer_code} 4.7.1 Try again in {wait} seconds"
        thread = thread_of(msg)
        rule = self.holds.get(thread or "")
        if rule is not None and len(self.in_thread(thread or "")) >= rule[0]:
            del self.holds[thread or ""]
            self.refused.append(now)
            self._notify()
            return f"451 4.7.1 Too many messages, try again in {rule[1]} seconds"
        self.sent.append(Sent(now, envelope.mail_from, list(envelope.rcpt_tos), raw, msg))
        self._notify()
        return "250 2.0.0 Ok: queued"

    # IMAP -------------------------------------------------------------------------------------

    async def _serve_imap(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        session = _ImapSession(self, reader, writer)
        self._sessions.add(session)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await session.serve()
        finally:
            self._sessions.discard(session)
            session.close()
            self._notify()


class _Handler:
    def __init__(self, fake: FakeMail):
        self.fake = fake

    async def handle_RCPT(self, server: SMTP, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        if address.lower() in self.fake.bad_addresses:
            return f"550 5.1.1 <{address}>: Recipient address rejected: User unknown"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Any, envelope: Any) -> str:
        return self.fake._take(envelope)  # noqa: SLF001 - the fake's own handler


class _ImapSession:
    """One client connection."""

    def __init__(self, fake: FakeMail, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter):
        self.fake, self.reader, self.writer = fake, reader, writer
        self.user: str | None = None
        self.selected = False
        self.reported = 0  # EXISTS the client was told of
        self.idling: str | None = None  # the IDLE command's tag

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()

    def write(self, data: bytes | str) -> None:
        if not self.writer.is_closing():
            self.writer.write(data.encode() if isinstance(data, str) else data)

    def news(self) -> None:
        if self.idling is not None:
            self._exists()

    def _exists(self) -> None:
        if self.selected and len(self.fake.mailbox) != self.reported:
            self.reported = len(self.fake.mailbox)
            self.write(f"* {self.reported} EXISTS\r\n")

    async def serve(self) -> None:
        caps = "IMAP4rev1 UIDPLUS" + (" IDLE" if self.fake.idle else "")
        self.write(f"* OK [CAPABILITY {caps}] fake IMAP ready\r\n")
        while not self.writer.is_closing():
            try:
                line = await self.reader.readline()
            except (ConnectionError, asyncio.IncompleteReadError):
                return
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if self.idling is not None:
                if text.strip().upper() == "DONE":
                    self.write(f"{self.idling} OK IDLE terminated\r\n")
                    self.idling = None
                continue
            tag, _, rest = text.partition(" ")
            name, _, args = rest.partition(" ")
            self.fake.commands.append(f"{name.upper()} {args}".strip())
            if await self._dropped(name.upper(), args):
                return
            self._command(tag, name.upper(), args)
            try:
                await self.writer.drain()
            except ConnectionError:
                return

    async def _dropped(self, name: str, args: str) -> bool:
        word = args.split(" ", 1)[0].upper() if name == "UID" else name
        if word in self.fake.drop_next:
            self.fake.drop_next.discard(word)
            self.close()
            return True
        return False

    def _command(self, tag: str, name: str, args: str) -> None:
        handler = {"CAPABILITY": self._capability, "LOGIN": self._login,
                   "SELECT": self._select, "UID": self._uid, "IDLE": self._idle,
                   "NOOP": self._noop, "LOGOUT": self._logout}.get(name)
        if handler is None:
            self.write(f"{tag} BAD unknown command\r\n")
            return
        if name not in ("CAPABILITY", "LOGIN", "LOGOUT", "NOOP") and self.user is None:
            self.write(f"{tag} BAD log in first\r\n")
            return
        handler(tag, args)

    def _capability(self, tag: str, args: str) -> None:
        caps = "IMAP4rev1 UIDPLUS" + (" IDLE" if self.fake.idle else "")
        self.write(f"* CAPABILITY {caps}\r\n{tag} OK CAPABILITY completed\r\n")

    def _login(self, tag: str, args: str) -> None:
        parts = _args(args)
        if len(parts) == 2 and parts[0] == self.fake.user and parts[1] == self.fake.password:
            self.user = parts[0]
            self.fake.logins += 1
            self.write(f"{tag} OK LOGIN completed\r\n")
        else:
            self.fake.failed_logins += 1
            self.write(f"{tag} NO [AUTHENTICATIONFAILED] Invalid credentials\r\n")

    def _select(self, tag: str, args: str) -> None:
        if _args(args)[:1] != ["INBOX"]:
            self.write(f"{tag} NO [NONEXISTENT] Unknown mailbox\r\n")
            return
        self.selected, self.reported = True, len(self.fake.mailbox)
        nxt = max((m.uid for m in self.fake.mailbox), default=0) + 1
        self.write(f"* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft)\r\n"
                   f"* {self.reported} EXISTS\r\n* 0 RECENT\r\n"
                   f"* OK [UIDVALIDITY {self.fake.uidvalidity}] UIDs valid\r\n"
                   f"* OK [UIDNEXT {nxt}] Predicted next UID\r\n"
                   f"{tag} OK [READ-WRITE] SELECT completed\r\n")

    def _idle(self, tag: str, args: str) -> None:
        if not self.fake.idle:
            self.write(f"{tag} BAD no IDLE here\r\n")
            return
        self.idling = tag
        self.fake.idles += 1
        self.write("+ idling\r\n")
        self._exists()
        self.fake._notify()  # noqa: SLF001

    def _noop(self, tag: str, args: str) -> None:
        self._exists()
        self.write(f"{tag} OK NOOP completed\r\n")

    def _logout(self, tag: str, args: str) -> None:
        self.write(f"* BYE logging out\r\n{tag} OK LOGOUT completed\r\n")
        self.close()

    def _uid(self, tag: str, args: str) -> None:
        command, _, rest = args.partition(" ")
        command = command.upper()
        if command == "SEARCH":
            self._search(tag, rest)
        elif command == "FETCH":
            self._fetch(tag, rest)
        elif command == "STORE":
            self._store(tag, rest)
        else:
            self.write(f"{tag} BAD UID {command} is not supported here\r\n")

    def _search(self, tag: str, rest: str) -> None:
        words = rest.upper().split()
        if words[:1] == ["CHARSET"]:
            words = words[2:]
        if words not in (["UNSEEN"], ["ALL"]):
            self.write(f"{tag} BAD only UNSEEN and ALL are searched here\r\n")
            return
        found = [m.uid for m in self.fake.mailbox if words == ["ALL"] or not m.seen]
        self.write(f"* SEARCH{''.join(f' {u}' for u in found)}\r\n")
        self._exists()
        self.write(f"{tag} OK SEARCH completed\r\n")

    def _messages(self, spec: str) -> list[tuple[int, Stored]]:
        wanted: set[int] = set()
        top = max((m.uid for m in self.fake.mailbox), default=0)
        for piece in spec.split(","):
            low, _, high = piece.partition(":")
            first = top if low == "*" else int(low)
            last = first if not high else (top if high == "*" else int(high))
            wanted.update(range(min(first, last), max(first, last) + 1))
        return [(n, m) for n, m in enumerate(self.fake.mailbox, 1) if m.uid in wanted]

    def _fetch(self, tag: str, rest: str) -> None:
        spec, _, items = rest.partition(" ")
        items = items.strip().strip("()").upper()
        for n, stored in self._messages(spec):
            self.write(self._fetched(n, stored, items))
        self._exists()
        self.write(f"{tag} OK FETCH completed\r\n")

    def _fetched(self, n: int, stored: Stored, items: str) -> bytes:
        parts = [f"UID {stored.uid}"]
        literal: tuple[str, bytes] | None = None
        for item in items.split():
            if item == "RFC822.SIZE":
                parts.append(f"RFC822.SIZE {len(stored.raw)}")
            elif item == "FLAGS":
                parts.append(f"FLAGS ({' '.join(sorted(stored.flags))})")
            elif item in ("BODY.PEEK[]", "BODY[]", "RFC822"):
                literal = ("RFC822" if item == "RFC822" else "BODY[]", stored.raw)
                if item != "BODY.PEEK[]":
                    stored.flags.add("\\Seen")
            elif item == "BODY.PEEK[HEADER]":
                head = stored.raw.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
                literal = ("BODY[HEADER]", head)
        line = f"* {n} FETCH ({' '.join(parts)}"
        if literal is None:
            return f"{line})\r\n".encode()
        name, data = literal
        return f"{line} {name} {{{len(data)}}}\r\n".encode() + data + b")\r\n"

    def _store(self, tag: str, rest: str) -> None:
        spec, _, change = rest.partition(" ")
        mode, _, flags = change.partition(" ")
        names = set(flags.strip().strip("()").split())
        for n, stored in self._messages(spec):
            if mode.upper().startswith("+FLAGS"):
                stored.flags |= names
            elif mode.upper().startswith("-FLAGS"):
                stored.flags -= names
            else:
                stored.flags = set(names)
            if ".SILENT" not in mode.upper():
                self.write(f"* {n} FETCH (UID {stored.uid} FLAGS "
                           f"({' '.join(sorted(stored.flags))}))\r\n")
        self.fake._notify()  # noqa: SLF001
        self.write(f"{tag} OK STORE completed\r\n")
