"""Discord's errors as :class:`ProviderError`s, and a bot token that never reaches a log line.

Rate limits: a 429 on a send (message create, edit, typing) raises :class:`discord.RateLimited`
at once (``holds.py``), which becomes :class:`RateLimited` with its ``retry_after``, so that the
outbox holds the chat in the shared, persisted flood state instead of a request held open in
memory. Elsewhere discord.py waits out 429s of at most :data:`LIBRARY_WAIT` seconds by itself;
it also paces pre-emptively when a bucket's ``X-RateLimit-Remaining`` reaches 0.

discord.py sends the token only in headers and the IDENTIFY/RESUME frames, which it does not log;
:func:`redact_token_in_logs` masks it in its loggers anyway, in case an error ever quotes it.
"""

from __future__ import annotations

import logging

import discord

from pluto.gateway.logs import MaskSecrets
from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable, RateLimited
from pluto.providers.kit.errors import retry_after_header, transport_error

LIBRARY_WAIT = 30.0  # discord.py's documented minimum for max_ratelimit_timeout

# Discord's JSON error codes that no retry can fix
# (https://discord.com/developers/docs/topics/opcodes-and-status-codes#json)
PERMANENT_CODES = {
    10003: "the channel no longer exists",
    10008: "the message no longer exists",
    50001: "the bot has no access to the channel",
    50007: "Discord does not let the bot message this user (their DMs may be closed)",
    50013: "the bot lacks the permission to post there",
    50083: "the thread is archived",
    40005: "the file is too large for Discord",
}


def provider_error(exc: BaseException) -> ProviderError:
    """One plain sentence, and whether retrying can help."""
    match exc:
        case discord.RateLimited():
            return RateLimited(f"Discord asked to slow down for {exc.retry_after:.3g}s",
                               retry_after=exc.retry_after)
        case discord.HTTPException():
            return _http_error(exc)
        case discord.LoginFailure():
            return ProviderUnusable("Discord rejected the bot token")
        case discord.PrivilegedIntentsRequired():
            return ProviderUnusable(
                "Discord refused the Message Content intent: turn on \"Message Content Intent\" "
                "under Bot → Privileged Gateway Intents in the developer portal, or set "
                "providers.discord.message_content_intent: false")
        case discord.ConnectionClosed():
            if exc.code == 4004:
                return ProviderUnusable("Discord rejected the bot token")
            return ProviderError(f"the Discord gateway closed the connection ({exc.code})")
        case discord.GatewayNotFound():
            return ProviderError("the Discord gateway could not be found")
    return transport_error(exc, "Discord") or ProviderError(f"Discord error: {type(exc).__name__}")


def _http_error(exc: discord.HTTPException) -> ProviderError:
    reason = _reason(exc)
    if exc.status == 429:  # no Via header: Cloudflare, not Discord's rate limiter
        retry = retry_after_header(getattr(exc.response, "headers", None)) or 60.0
        return RateLimited(f"Discord's edge refused too many requests; retry in {retry:g}s",
                           retry_after=retry)
    if exc.code in PERMANENT_CODES:
        return DeliveryRefused(PERMANENT_CODES[exc.code])
    if exc.status == 401:
        return ProviderUnusable("Discord rejected the bot token")
    if exc.status >= 500:
        return ProviderError(f"Discord had a server error ({exc.status})")
    if 400 <= exc.status < 500:
        return DeliveryRefused(f"Discord refused the message: {reason}")
    return ProviderError(f"Discord error {exc.status}: {reason}")


def _reason(exc: discord.HTTPException) -> str:
    text = " ".join(line.strip() for line in (exc.text or "").splitlines() if line.strip())
    return text.rstrip(".") or f"HTTP {exc.status}"


RECONNECTING = "Attempting a reconnect in %.2fs"  # discord.Client.connect's log line
RATE_LIMITED_RAISED = ("We are being rate limited. %s %s responded with 429. Timeout of %.2f "
                       "was too long, erroring instead.")  # discord.http's


class _MaskToken(MaskSecrets):
    """Masks the token; drops the voice-support notes discord.py logs when a client is made
    (this bot never joins voice); turns its reconnect tracebacks into one line."""

    def __init__(self) -> None:
        super().__init__(placeholder="<token>")

    def filter(self, record: logging.LogRecord) -> bool:
        if "voice will NOT be supported" in record.getMessage():
            return False
        if record.msg == RATE_LIMITED_RAISED:  # a send's 429, raised for the outbox on purpose
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"  # (which logs it)
        if record.msg == RECONNECTING and record.exc_info and record.exc_info[1] is not None:
            # discord.py logs each failed reconnect with a traceback; one line says it all
            record.msg = (f"discord: the gateway connection failed "
                          f"({type(record.exc_info[1]).__name__}); reconnecting in %.2fs")
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return super().filter(record)


_MASK = _MaskToken()


def redact_token_in_logs(token: str) -> None:
    """Mask ``token`` in the records of every discord.py logger."""
    _MASK.add(token)
    _MASK.attach("discord", "discord.client", "discord.http", "discord.gateway", "discord.state")
