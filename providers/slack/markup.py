"""Slack's markup dialect: mrkdwn (``chat.postMessage`` with ``mrkdwn=True``), written by
:class:`SlackEmitter`; the provider declares :data:`SLACK_MRKDWN` in its capabilities.

Model text never makes a special mention (``<!here>``, ``<!channel>``, ``<!everyone>``), a user
or channel reference (``<@U…>``, ``<#C…>``): ``<`` and ``>`` in text are escaped, and a link is
written as ``<url|text>`` only for http(s) and mailto targets (see ``render/links.py``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote

from pluto.gateway.delivery.render.dialects import escape_html
from pluto.gateway.delivery.render.ir import Inline, plain_text
from pluto.gateway.delivery.render.links import link_allowed
from pluto.gateway.delivery.render.stream import Open, Token, prefix_lines, wrap
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.providers.kit.markup import HtmlEscaped
from pluto.types import Dialect

__all__ = ["SLACK_MRKDWN", "SlackEmitter"]


class SlackEmitter(HtmlEscaped):
    """Slack mrkdwn: single-character spans, ``<url|text>`` links, no headings or tables.
    Its control characters are ``&``, ``<`` and ``>``, escaped as in HTML."""

    spans = {"bold": ("*", "*"), "italic": ("_", "_"), "strike": ("~", "~")}

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        return wrap(Open("`", "`", verbatim=True), [Out(escape_html(text))])

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        if not link_allowed(url):  # "<!here|x>", "<@U…|x>", "<#C…|x>" would ping or mention
            return self.inlines(children, in_span=True)
        target = escape_html(re.sub(r"[\s|<>]", lambda m: quote(m.group()), url))
        markup = Open(f"<{target}|", ">", fallback=f" ({escape_html(url)})")
        return wrap(markup, [Out(escape_html(" ".join(plain_text(children).split())))])

    def heading(self, level: int, inlines: Sequence[Inline]) -> list[Token]:
        return wrap(Open("*", "*"), [Out(escape_html(plain_text(inlines)))])

    def quoted(self, inner: list[Token]) -> list[Token]:
        if self.quote_depth or self.list_depth:  # Slack quotes only start a line: mark with '>'
            return prefix_lines(inner, "&gt; ", "&gt; ", "&gt;")
        return super().quoted(inner)

    def code_block(self, lang: str, text: str) -> list[Token]:
        return wrap(Open("```\n", "\n```", verbatim=True), [Out(escape_html(text))])


SLACK_MRKDWN = Dialect("slack_mrkdwn", SlackEmitter)
