"""The parts markup emitters share. A platform's dialect stays its own emitter (see
``gateway/delivery/render``); these are the pieces that are the same in several.

- :class:`HtmlEscaped`: text escaped as HTML entities (``&``, ``<``, ``>``) — Telegram's HTML,
  Matrix's HTML, and Slack's mrkdwn, whose control characters are the same three;
- :func:`code_language`: a code block's language, safe inside a ``class`` attribute;
- :func:`html_link`: ``<a href>`` around a link's text when its target is allowed, else the
  text alone (a ``tg://`` or ``matrix.to`` target would mention someone).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from pluto.gateway.delivery.render.dialects import escape_attr, escape_html
from pluto.gateway.delivery.render.emit import Emitter
from pluto.gateway.delivery.render.ir import Inline
from pluto.gateway.delivery.render.stream import Open, Token, wrap

RULE = "──────────"  # a horizontal rule, drawn (no platform here has one of its own)
BULLET = "• "


class HtmlEscaped(Emitter):
    """An emitter whose text is escaped as HTML entities, with round bullets and a drawn rule."""

    bullet = BULLET
    rule_text = RULE

    def escape(self, text: str, line_start: bool = False) -> str:
        return escape_html(text)


def code_language(lang: str) -> str:
    """A code block's language reduced to word characters and ``+#.-``, at most 32."""
    return re.sub(r"[^\w+#.-]", "", lang)[:32]


def html_link(emitter: Emitter, url: str, children: Sequence[Inline],
              allowed: Callable[[str], bool]) -> list[Token]:
    """``<a href="url">text</a>`` (``text (url)`` where the anchor cannot open), or the link's
    text alone when ``allowed(url)`` is false."""
    inner = emitter.inlines(children, in_span=True)
    if not allowed(url):
        return inner
    markup = Open(f'<a href="{escape_attr(url)}">', "</a>", fallback=f" ({escape_html(url)})")
    return wrap(markup, inner)
