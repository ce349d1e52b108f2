"""Telegram's errors as :class:`ProviderError`s, and a bot token that never reaches a log line.

python-telegram-bot puts the token into request URLs (which httpx logs) and into the message of
:class:`telegram.error.InvalidToken`; the errors made here never carry it, and
:func:`redact_token_in_logs` masks it in every record of the libraries' loggers.
"""

from __future__ import annotations

import datetime as dtm
import logging
import warnings

from telegram.error import (BadRequest, ChatMigrated, Conflict, Forbidden, InvalidToken,
                            NetworkError, RetryAfter, TelegramError, TimedOut)

from pluto.gateway.logs import MaskSecrets
from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable, RateLimited

# PTB 22 warns whenever a RetryAfter is built (its int becomes a timedelta in a future major);
# retry_seconds below reads either.
warnings.filterwarnings("ignore", message=r".*`retry_after` will be of type",
                        category=DeprecationWarning)

NOT_MODIFIED = "message is not modified"
GONE = "message to delete not found"
CANT_PARSE = "can't parse entities"


def retry_seconds(exc: RetryAfter) -> float:
    """``retry_after`` is an int in PTB 22 (a timedelta later); it warns when read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dtm.timedelta) else float(value)


def provider_error(exc: TelegramError) -> ProviderError:
    """One plain sentence, and whether retrying can help."""
    match exc:
        case RetryAfter():
            seconds = retry_seconds(exc)
            return RateLimited(f"Telegram asked to slow down for {seconds:g}s", retry_after=seconds)
        case Forbidden():
            return DeliveryRefused(f"Telegram refused: {_reason(exc)}")
        case InvalidToken():
            return ProviderUnusable("Telegram rejected the bot token")
        case ChatMigrated():
            return DeliveryRefused("the group became a supergroup with a new chat id "
                                   f"({exc.new_chat_id})")
        case BadRequest():
            return DeliveryRefused(f"Telegram rejected the request: {_reason(exc)}")
        case TimedOut():
            return ProviderError(timed_out(exc), unsent=_never_left(exc))
        case Conflict():
            return ProviderError(f"Telegram reported a conflict: {_reason(exc)}")
        case NetworkError():
            return ProviderError(f"could not reach Telegram ({_reason(exc)})",
                                 unsent=_never_left(exc))
    return ProviderError(f"Telegram error: {_reason(exc)}")


def timed_out(exc: TimedOut) -> str:
    """What timed out, in the library's words: a pool timeout means the request never left
    (every connection was busy — or lost, see ``request.py``); otherwise the httpx timeout that
    fired (connect, write, read)."""
    text = _reason(exc)
    if _pool_timeout(exc):
        detail = text.split(":", 1)[1].strip() if ":" in text else ""
        detail = detail.split(". ")[0].rstrip(".")
        detail = detail[:1].lower() + detail[1:]
        return f"Telegram request not sent: pool timeout ({detail or 'no free connection'})"
    cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else None
    if cause == "ConnectTimeout":
        return "could not connect to Telegram in time (httpx.ConnectTimeout)"
    if cause == "WriteTimeout":
        return "Telegram did not take the request in time (httpx.WriteTimeout)"
    return f"Telegram did not answer in time ({f'httpx.{cause}' if cause else text})"


def _never_left(exc: TelegramError) -> bool:
    """Whether the request certainly never reached Telegram: no free connection in the pool,
    or no connection made (httpx's connect errors); a read or write that failed may have."""
    if _pool_timeout(exc):
        return True
    cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else ""
    return cause in ("PoolTimeout", "ConnectTimeout", "ConnectError")


def _pool_timeout(exc: TelegramError) -> bool:
    """No free connection in httpx's pool: the request never left."""
    return _reason(exc).lower().startswith("pool timeout")


def _reason(exc: TelegramError) -> str:
    text = _scrub(exc.message.strip().rstrip("."))
    for prefix in ("Forbidden: ", "Bad Request: "):
        text = text.removeprefix(prefix)
    return text or type(exc).__name__


def _scrub(text: str) -> str:
    """A library's text with the bot token masked (URLs in httpx errors carry it)."""
    for secret in _MASK.secrets:
        text = text.replace(secret, _MASK.placeholder)
    return text


_MASK = MaskSecrets(placeholder="<token>")
_LIBRARIES = ("httpx", "httpcore", "telegram")


def redact_token_in_logs(token: str) -> None:
    """Mask ``token`` in records of httpx and every python-telegram-bot logger."""
    _MASK.add(token)
    _MASK.attach(*_LIBRARIES)
    logging.getLogger("httpx").setLevel(max(logging.getLogger("httpx").level, logging.WARNING))
