"""One IMAP connection (aioimaplib): log in, select the folder, list unseen mail, fetch it
without marking it (``BODY.PEEK[]``), mark it ``\\Seen`` once recorded, and wait for news
with IDLE (or a NOOP poll where the server has no IDLE).

Every call races the connection: when the server drops it, the call fails at once with
:class:`MailboxLost` instead of waiting for a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Awaitable
from typing import Any, TypeVar

import aioimaplib  # type: ignore[import-untyped]

from pluto.errors import ProviderError, ProviderUnusable
from pluto.providers.email.settings import EmailSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
_SIZE = re.compile(rb"RFC822\.SIZE (\d+)")


class MailboxLost(ProviderError):
    """The IMAP connection failed or was closed; the provider connects again."""


def _ok(response: Any, what: str) -> Any:
    if getattr(response, "result", None) != "OK":
        lines = getattr(response, "lines", None) or [b""]
        said = bytes(lines[-1])[:200].decode("utf-8", "replace")
        raise MailboxLost(f"the IMAP server refused {what}: {said}")
    return response


class Mailbox:
    def __init__(self, settings: EmailSettings, password: str):
        self.settings = settings
        self._password = password
        self._lost = asyncio.Event()
        self._client: Any = None
        self._idling = False  # an IDLE was started and DONE not sent yet

    async def open(self) -> None:
        s = self.settings
        context = ssl.create_default_context() if s.imap_security == "ssl" else None
        self._client = aioimaplib.IMAP4(host=s.imap_host, port=s.imap_port,
                                        timeout=s.timeout_seconds, ssl_context=context,
                                        conn_lost_cb=lambda exc: self._lost.set())
        try:
            await self._call(self._client.wait_hello_from_server())
        except (OSError, asyncio.TimeoutError, aioimaplib.AioImapException) as e:
            raise MailboxLost(f"could not connect to {s.imap_host}:{s.imap_port} "
                              f"({type(e).__name__})") from None
        response = await self._call(self._client.login(s.username, self._password))
        if response.result != "OK":
            said = b" ".join(bytes(x) for x in response.lines)[:300].upper()
            if b"UNAVAILABLE" in said or b"LIMIT" in said:
                raise MailboxLost("the IMAP server cannot log in now")
            raise ProviderUnusable(f"the IMAP server refused the login of {s.username} "
                                   f"(check {s.password_env})")
        try:
            _ok(await self._call(self._client.select(s.folder)), f"the folder {s.folder}")
        except MailboxLost as e:
            raise ProviderUnusable(f"{e} (check providers.email.folder)") from None

    async def unseen(self) -> list[int]:
        response = _ok(await self._call(self._client.uid_search("UNSEEN", charset=None)),
                       "a search")
        uids: list[int] = []
        for line in response.lines[:-1]:
            uids += [int(w) for w in bytes(line).split() if w.isdigit()]
        return sorted(set(uids))

    async def size(self, uid: int) -> int | None:
        response = _ok(await self._call(self._client.uid("fetch", str(uid), "(RFC822.SIZE)")),
                       "a fetch")
        for line in response.lines:
            if (found := _SIZE.search(bytes(line))) is not None:
                return int(found.group(1))
        return None  # gone meanwhile

    async def fetch(self, uid: int, part: str = "BODY.PEEK[]") -> bytes | None:
        """The mail (or ``part`` of it), without marking it seen; None when it is gone."""
        response = _ok(await self._call(self._client.uid("fetch", str(uid), f"({part})")),
                       "a fetch")
        for line in response.lines:
            if isinstance(line, bytearray):
                return bytes(line)
        return None

    async def mark_seen(self, uid: int) -> None:
        _ok(await self._call(self._client.uid("store", str(uid), "+FLAGS", "(\\Seen)")),
            "marking mail seen")

    async def wait_news(self, seconds: float) -> None:
        """Return when the server reports a change (IDLE), or after ``seconds``."""
        client = self._client
        if not client.has_capability("IDLE"):
            await self._call(asyncio.sleep(min(seconds, self.settings.poll_seconds)))
            _ok(await self._call(client.noop()), "NOOP")
            return
        self._idling = True
        try:
            idle = await self._call(asyncio.wait_for(client.idle_start(timeout=seconds),
                                                     self.settings.timeout_seconds))
            await self._call(asyncio.wait_for(client.wait_server_push(seconds + 5),
                                              seconds + self.settings.timeout_seconds))
        finally:
            self._end_idle()
        _ok(await self._call(asyncio.wait_for(idle, self.settings.timeout_seconds)),
            "ending IDLE")

    async def close(self) -> None:
        if self._client is None:
            return
        try:
            if not self._lost.is_set():
                self._end_idle()  # an IDLE cut short by a cancellation
                await asyncio.wait_for(self._client.logout(), 2)
        except (OSError, asyncio.TimeoutError, aioimaplib.AioImapException) as e:
            log.debug("email: logging out: %s", type(e).__name__)
        finally:
            transport = getattr(self._client.protocol, "transport", None)
            if transport is not None:
                transport.close()
            self._client = None

    def _end_idle(self) -> None:
        """Send DONE once for an IDLE the server took (and not after the connection died)."""
        if self._idling and not self._lost.is_set() and self._client.has_pending_idle():
            self._client.idle_done()
        self._idling = False

    async def _call(self, aw: Awaitable[T]) -> T:
        """``aw``, unless the connection is lost first (then :class:`MailboxLost`)."""
        task = asyncio.ensure_future(aw)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            raise MailboxLost("the IMAP server closed the connection")
        try:
            return task.result()
        except (OSError, asyncio.TimeoutError, aioimaplib.AioImapException) as e:
            raise MailboxLost(f"the IMAP connection failed ({type(e).__name__})") from None
