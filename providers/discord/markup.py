"""Discord's markup dialect: its Markdown, written by :class:`DiscordEmitter`; the provider
declares :data:`DISCORD` in its capabilities.

Links carry only http(s) and mailto targets; ``<@id>``, ``<@&id>`` and ``<#id>`` in model text are
escaped (shown, never mentions), and the provider sends with ``allowed_mentions`` that ping
nobody but the replied-to user."""

from __future__ import annotations

from collections.abc import Sequence

from pluto.gateway.delivery.render.dialects import MarkdownEmitter
from pluto.gateway.delivery.render.emit import Emitter
from pluto.gateway.delivery.render.ir import Inline, Table
from pluto.gateway.delivery.render.links import link_allowed
from pluto.gateway.delivery.render.stream import Token
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.types import Dialect

__all__ = ["DISCORD", "DiscordEmitter"]


class DiscordEmitter(MarkdownEmitter):
    """Discord markdown: headings up to ``###``, tables as code blocks, ``||`` is a spoiler."""

    rule_text = "──────────"
    hard_break = "\n"
    max_heading = 3
    extra_escape = r"\|(?=\|)|(?<=\|)\|" r"|<(?=[@#])"  # "<@id>", "<#id>": mentions

    def table(self, table: Table) -> list[Token]:
        return Emitter.table(self, table)

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        if not link_allowed(url):
            return self.inlines(children, in_span=True)
        return super().link(url, children)

    def bare_url(self, url: str) -> list[Token]:
        if not link_allowed(url):
            return [Out(self.escape(url))]
        return [Out(url)]  # Discord links bare URLs itself (and "<url>" would hide the preview)


DISCORD = Dialect("discord", DiscordEmitter)
