"""Telegram's markup dialect: the Bot API's HTML (``parse_mode=HTML``), written by
:class:`TelegramEmitter`; the provider declares :data:`TELEGRAM_HTML` in its capabilities.

Links carry only http(s) and mailto targets (``tg://user?id=…`` would mention a user); any other
target shows the link's text alone (see ``render/links.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from pluto.gateway.delivery.render.dialects import escape_html
from pluto.gateway.delivery.render.ir import Inline
from pluto.gateway.delivery.render.links import link_allowed
from pluto.gateway.delivery.render.stream import Open, Token, prefix_lines, wrap
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.providers.kit.markup import HtmlEscaped, code_language, html_link
from pluto.types import Dialect

__all__ = ["TELEGRAM_HTML", "TelegramEmitter"]


class TelegramEmitter(HtmlEscaped):
    """Telegram Bot API HTML: b, i, s, code, pre, a, blockquote; everything else is text."""

    spans = {"bold": ("<b>", "</b>"), "italic": ("<i>", "</i>"), "strike": ("<s>", "</s>")}

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        if in_span:  # Telegram: code can't be part of bold/italic/link entities
            return [Out(escape_html(text))]
        return wrap(Open("<code>", "</code>", verbatim=True), [Out(escape_html(text))])

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        return html_link(self, url, children, link_allowed)  # "tg://user?id=…" would mention

    def code_block(self, lang: str, text: str) -> list[Token]:
        lang = code_language(lang)
        opener = f'<pre><code class="language-{lang}">' if lang else "<pre>"
        closer = "</code></pre>" if lang else "</pre>"
        return wrap(Open(opener, closer, verbatim=True), [Out(escape_html(text))])

    def quoted(self, inner: list[Token]) -> list[Token]:
        if self.quote_depth:  # blockquotes can't nest in Telegram
            return prefix_lines(inner, "&gt; ", "&gt; ", "&gt;")
        return wrap(Open("<blockquote>", "</blockquote>"), inner)


TELEGRAM_HTML = Dialect("telegram_html", TelegramEmitter)
