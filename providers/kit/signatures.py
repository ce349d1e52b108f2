"""Webhook signatures and shared secrets, compared in constant time.

Platforms sign what they post with an HMAC-SHA256 of the raw body (WhatsApp's
``X-Hub-Signature-256: sha256=<hex>``), of a base string with a timestamp (Slack's
``v0:<ts>:<body>``), or send a shared secret back in a header (Telegram's
``X-Telegram-Bot-Api-Secret-Token``). Check the raw bytes before parsing anything.
"""

from __future__ import annotations

import hashlib
import hmac
import time


def hmac_sha256_hex(secret: str | bytes, message: bytes) -> str:
    """The hex HMAC-SHA256 of ``message`` under ``secret``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def same_secret(given: str | bytes | None, expected: str | bytes) -> bool:
    """Whether ``given`` (a header, perhaps absent) equals ``expected``, in constant time."""
    if given is None:
        return False
    a = given.encode("utf-8", "surrogateescape") if isinstance(given, str) else given
    b = expected.encode("utf-8", "surrogateescape") if isinstance(expected, str) else expected
    return hmac.compare_digest(a, b)


def body_signature_ok(secret: str, body: bytes, header: str | None,
                      prefix: str = "sha256=") -> bool:
    """Whether ``header`` is ``<prefix><hex HMAC-SHA256 of body>`` (surrounding spaces
    ignored)."""
    if header is None:
        return False
    return same_secret(header.strip(), prefix + hmac_sha256_hex(secret, body))


def fresh(timestamp: str | float | None, max_age: float = 300.0,
          now: float | None = None) -> bool:
    """Whether a signed timestamp (Unix seconds) is within ``max_age`` seconds of now, either
    way: an old signed request replayed is refused."""
    if timestamp is None:
        return False
    try:
        when = float(timestamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    return abs(current - when) <= max_age


def timestamped_signature_ok(secret: str, timestamp: str, body: bytes, header: str | None,
                             version: str = "v0", max_age: float = 300.0,
                             now: float | None = None) -> bool:
    """Slack's scheme: ``header`` is ``<version>=<hex HMAC of "<version>:<timestamp>:<body>">``
    and ``timestamp`` is fresh."""
    if not fresh(timestamp, max_age, now):
        return False
    base = f"{version}:{timestamp}:".encode() + body
    return body_signature_ok(secret, base, header, prefix=f"{version}=")
