"""Matrix's markup dialect: the HTML subset of ``format: org.matrix.custom.html``, written by
:class:`MatrixEmitter`; the provider declares :data:`MATRIX_HTML` in its capabilities.

Line breaks become ``<br>`` when a message is sent (outside ``<pre>``), and the plain ``body``
every event also carries is the same text without tags (:func:`to_event_content`). Links carry
only http(s) and mailto targets, and never ``matrix.to`` (a link there is a mention, a "pill"):
any other target shows the link's text alone. Mentions come from code, never from a model.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pluto.gateway.delivery.render.dialects import escape_html
from pluto.gateway.delivery.render.ir import Inline, plain_text
from pluto.gateway.delivery.render.stream import Open, Token, wrap
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.providers.kit.markup import HtmlEscaped, code_language, html_link
from pluto.types import Dialect

__all__ = ["MATRIX_HTML", "MatrixEmitter", "html_to_plain", "to_event_content"]


class MatrixEmitter(HtmlEscaped):
    spans = {"bold": ("<strong>", "</strong>"), "italic": ("<em>", "</em>"),
             "strike": ("<del>", "</del>")}

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        return wrap(Open("<code>", "</code>", verbatim=True), [Out(escape_html(text))])

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        return html_link(self, url, children, link_allowed)

    def bare_url(self, url: str) -> list[Token]:
        return [Out(escape_html(url))]  # clients link bare URLs themselves

    def heading(self, level: int, inlines: Sequence[Inline]) -> list[Token]:
        tag = f"h{min(max(level, 1), 6)}"
        return wrap(Open(f"<{tag}>", f"</{tag}>"), [Out(escape_html(plain_text(inlines)))])

    def code_block(self, lang: str, text: str) -> list[Token]:
        lang = code_language(lang)
        opener = f'<pre><code class="language-{lang}">' if lang else "<pre><code>"
        return wrap(Open(opener, "</code></pre>", verbatim=True), [Out(escape_html(text))])

    def quoted(self, inner: list[Token]) -> list[Token]:
        return wrap(Open("<blockquote>", "</blockquote>"), inner)


MATRIX_HTML = Dialect("matrix_html", MatrixEmitter)


def link_allowed(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if any(ord(c) < 32 for c in url) or parts.hostname in ("matrix.to",):
        return False
    if parts.scheme.lower() == "mailto":
        return bool(parts.path)
    return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)


_PRE = re.compile(r"(<pre>.*?</pre>)", re.S)
_TAG = re.compile(r"<[^>]+>")


def newlines_to_br(text: str) -> str:
    """HTML ignores newlines: outside ``<pre>``, each becomes ``<br>``."""
    parts = _PRE.split(text)
    return "".join(p if p.startswith("<pre>") else p.replace("\n", "<br>") for p in parts)


def html_to_plain(text: str) -> str:
    """What the HTML says, without the markup (the ``body`` of an event)."""
    return html.unescape(_TAG.sub("", text.replace("<br>", "\n")))


def to_event_content(text: str, markup: str) -> dict[str, Any]:
    """The ``m.text`` content of ``text``: HTML with its plain ``body``, or plain text."""
    if markup != MATRIX_HTML.name:
        return {"msgtype": "m.text", "body": text}
    return {"msgtype": "m.text", "body": html_to_plain(text),
            "format": "org.matrix.custom.html", "formatted_body": newlines_to_br(text)}
