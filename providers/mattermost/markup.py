"""Mattermost's markup: its Markdown (CommonMark with GFM tables, strikethrough and autolinks),
written by :class:`MattermostEmitter`; the provider declares :data:`MATTERMOST` in its
capabilities. It is Markdown by name: the text is what a Markdown reader expects, tables stay
tables.

Mattermost reads ``@name``, ``@channel``, ``@all`` and ``@here`` in a post as mentions (its
mention parser ignores backslashes), so a model's text never pings anyone: a zero-width space
after each ``@`` keeps it from being read as a mention and looks the same. Mentions come from
code, never from a model. Links carry only http(s) and mailto targets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pluto.gateway.delivery.render.dialects import MarkdownEmitter
from pluto.gateway.delivery.render.ir import Inline
from pluto.gateway.delivery.render.links import link_allowed
from pluto.gateway.delivery.render.stream import Token
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.types import Dialect

__all__ = ["MATTERMOST", "MattermostEmitter", "no_mentions"]

ZWSP = "\u200b"
_MENTION = re.compile(r"@(?=[A-Za-z0-9_])")


def no_mentions(text: str) -> str:
    """``@all`` → ``@\u200ball``: shown the same, never a mention."""
    return _MENTION.sub("@" + ZWSP, text)


class MattermostEmitter(MarkdownEmitter):
    """Mattermost Markdown: a newline is a line break, tables as GFM pipe tables."""

    hard_break = "\n"

    def escape(self, text: str, line_start: bool = False) -> str:
        return no_mentions(super().escape(text, line_start))

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        if not link_allowed(url):
            return self.inlines(children, in_span=True)
        return super().link(url, children)

    def bare_url(self, url: str) -> list[Token]:
        if not link_allowed(url):
            return [Out(self.escape(url))]
        return [Out(url)]  # Mattermost links bare URLs itself


MATTERMOST = Dialect("markdown", MattermostEmitter)
