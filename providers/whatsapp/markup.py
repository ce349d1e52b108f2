"""WhatsApp's own formatting, written by :class:`WhatsAppEmitter`; the provider declares
:data:`WHATSAPP` in its capabilities.

WhatsApp reads ``*bold*``, ``_italic_``, ``~strike~``, ```` ```monospace``` ```` blocks,
`` `inline code` ``, ``> quotes`` and ``-``/``1.`` lists; it has no links with a text (a URL is
shown as it is), no headings and no tables (a table becomes a monospaced block). It has no
escape character either: text is sent as written.
"""

from __future__ import annotations

from pluto.gateway.delivery.render.emit import Emitter
from pluto.gateway.delivery.render.stream import Open, Token, wrap
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.types import Dialect

__all__ = ["WHATSAPP", "WhatsAppEmitter"]


class WhatsAppEmitter(Emitter):
    bullet = "- "
    rule_text = "──────────"
    spans = {"bold": ("*", "*"), "italic": ("_", "_"), "strike": ("~", "~")}

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        if in_span or "`" in text:  # WhatsApp: no code inside bold/italic, no backtick inside
            return [Out(text)]
        return wrap(Open("`", "`", verbatim=True), [Out(text)])

    def code_block(self, lang: str, text: str) -> list[Token]:
        return wrap(Open("```\n", "\n```", verbatim=True), [Out(text.replace("```", "'''"))])


WHATSAPP = Dialect("whatsapp", WhatsAppEmitter)
