"""Telegram's markup dialect: the Bot API's HTML (``parse_mode=HTML``), written by
:class:`TelegramEmitter`; the provider declares :data:`TELEGRAM_HTML` in its capabilities.

Links carry only http(s) and mailto targets (``tg://user?id=…`` would mention a user); any other
target shows the link's text alone (see ``render/links.py``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pluto.gateway.delivery.render.dialects import escape_attr, escape_html
from pluto.gateway.delivery.render.emit import Emitter
from pluto.gateway.delivery.render.ir import Inline
from pluto.gateway.delivery.render.links import link_allowed
from pluto.gateway.delivery.render.stream import Open, Token, prefix_lines, wrap
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.types import Dialect

__all__ = ["TELEGRAM_HTML", "TelegramEmitter"]


class TelegramEmitter(Emitter):
    """Telegram Bot API HTML: b, i, s, code, pre, a, blockquote; everything else is text."""

    bullet = "• "
    rule_text = "──────────"
    spans = {"bold": ("<b>", "</b>"), "italic": ("<i>", "</i>"), "strike": ("<s>", "</s>")}

    def escape(self, text: str, line_start: bool = False) -> str:
        return escape_html(text)

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        if in_span:  # Telegram: code can't be part of bold/italic/link entities
            return [Out(escape_html(text))]
        return wrap(Open("<code>", "</code>", verbatim=True), [Out(escape_html(text))])

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        if not link_allowed(url):  # "tg://user?id=…" would mention a user
            return self.inlines(children, in_span=True)
        markup = Open(f'<a href="{escape_attr(url)}">', "</a>", fallback=f" ({escape_html(url)})")
        return wrap(markup, self.inlines(children, in_span=True))

    def code_block(self, lang: str, text: str) -> list[Token]:
        lang = re.sub(r"[^\w+#.-]", "", lang)[:32]
        opener = f'<pre><code class="language-{lang}">' if lang else "<pre>"
        closer = "</code></pre>" if lang else "</pre>"
        return wrap(Open(opener, closer, verbatim=True), [Out(escape_html(text))])

    def quoted(self, inner: list[Token]) -> list[Token]:
        if self.quote_depth:  # blockquotes can't nest in Telegram
            return prefix_lines(inner, "&gt; ", "&gt; ", "&gt;")
        return wrap(Open("<blockquote>", "</blockquote>"), inner)


TELEGRAM_HTML = Dialect("telegram_html", TelegramEmitter)
