"""Which link targets a dialect may render: web pages and mail addresses, nothing else.

A model's text is not trusted (a prompt can be injected through a dataset or a web page), and
in several chat platforms a link's target is more than an address: ``<!here|x>`` pings a whole
Slack channel, ``<@U…>`` and ``<#C…>`` mention a user or a channel, ``tg://user?id=…`` mentions
a Telegram user, ``javascript:`` runs in a browser. So every dialect renders a link only when
:func:`link_allowed` says so, and otherwise shows its text alone. Mentions and special links
come only from the code that knows it wants them, never from rendered Markdown.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["LINK_SCHEMES", "link_allowed"]

LINK_SCHEMES = ("http", "https", "mailto")


def link_allowed(url: str) -> bool:
    """An absolute ``http(s)://host…`` or ``mailto:`` address, without control characters."""
    if not url or any(ord(c) < 32 or ord(c) == 127 for c in url) or url != url.strip():
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    scheme = parts.scheme.lower()
    if scheme == "mailto":
        return bool(parts.path) and not parts.path.startswith(("/", "!", "@", "#"))
    return scheme in ("http", "https") and bool(parts.hostname) and url[len(scheme):][:3] == "://"
