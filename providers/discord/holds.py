"""Discord's 429s on sends go to the gateway's flood control instead of a sleep inside a call.

discord.py waits out a 429 inside ``HTTPClient.request`` (``asyncio.sleep(retry_after)``, up to
``max_ratelimit_timeout``, at least 30 s): the call simply takes longer, so the gateway's shared,
persisted per-chat flood state never learns of the hold, and the chat's sender sits in a call
nobody can see. The only check discord.py makes before that sleep is
``retry_after > self.max_ratelimit_timeout`` → raise :class:`discord.RateLimited`.

:class:`SendingHTTPClient` makes that limit depend on who calls: inside :func:`sending` (message
create, edit, typing — ``outbound.py``) it is a microsecond, so a 429 raises
``discord.RateLimited(retry_after)`` at once, which becomes :class:`pluto.errors.RateLimited`
for the outbox (it holds the chat, keeps the hold in storage, and retries after it). Everywhere
else (login, the gateway, downloads) discord.py keeps waiting as before. The per-route buckets
keep the library's limit, so discord.py's own pacing from ``X-RateLimit-*`` headers is
unchanged. A *global* 429 met while sending holds that chat too (discord.py cannot tell us
before it decides); other chats meet it on their own next call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import discord
import discord.http

NO_WAIT = 1e-6  # seconds: any 429 is longer than this

_sending: ContextVar[bool] = ContextVar("pluto_discord_sending", default=False)


@contextlib.contextmanager
def sending() -> Iterator[None]:
    """Calls made in this block report a 429 (``discord.RateLimited``) instead of waiting."""
    token = _sending.set(True)
    try:
        yield
    finally:
        _sending.reset(token)


class SendingHTTPClient(discord.http.HTTPClient):
    """discord.py's HTTP client whose 429 wait limit is :data:`NO_WAIT` inside :func:`sending`."""

    @property
    def max_ratelimit_timeout(self) -> float | None:
        if _sending.get():
            return NO_WAIT
        return self.__dict__.get("max_ratelimit_timeout")

    @max_ratelimit_timeout.setter
    def max_ratelimit_timeout(self, value: float | None) -> None:
        self.__dict__["max_ratelimit_timeout"] = value

    def get_ratelimit(self, key: str) -> discord.http.Ratelimit:
        """A bucket made during a send gets the library's limit, not :data:`NO_WAIT` (its
        pre-emptive pacing stays discord.py's)."""
        token = _sending.set(False)
        try:
            return super().get_ratelimit(key)
        finally:
            _sending.reset(token)


def adopt(client: discord.Client) -> None:
    """Give ``client`` this HTTP client. discord.py builds its ``HTTPClient`` inside
    ``Client.__init__`` and hands the same object to its connection state, so the object's class
    is changed in place (same attributes, one overridden property and method)."""
    http = client.http
    if not isinstance(http, SendingHTTPClient):
        http.__class__ = SendingHTTPClient
