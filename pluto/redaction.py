"""Credentials out of every URL and connection string shown (/readyz, start-up errors, logs).

:func:`redact_urls` masks, anywhere in a text, the password of a URL's ``user:password@``
(the user name is kept), the values of query parameters that carry credentials
(``?password=…``, ``&sslpassword=…``, ``token``, ``api_key``, ``secret``, ``sig``…) and
libpq's ``password=…`` in a key/value connection string.
"""

from __future__ import annotations

import re

MASK = "***"
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:?#]*):[^/@\s?#]*@")
_PARAM = re.compile(
    r"(?i)([?&;]\s*(?:password|passwd|pass|pwd|sslpassword|secret|client_secret|token|"
    r"access_token|auth|api[_-]?key|apikey|key|sig|signature)=)[^&#;\s'\"]*")
_DSN = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"&;]+)")


def redact_urls(text: str) -> str:
    """``text`` with every credential in a URL or connection string masked."""
    if "=" not in text and "@" not in text:
        return text
    text = _USERINFO.sub(rf"\1:{MASK}@", text)
    text = _PARAM.sub(rf"\1{MASK}", text)
    return _DSN.sub(lambda m: m.group(1) + MASK if m.group(2) != MASK else m.group(0), text)
