"""Discord's markup dialect: its Markdown, written by :class:`DiscordEmitter`; the provider
declares :data:`DISCORD` in its capabilities."""

from __future__ import annotations

from pluto.gateway.delivery.render.dialects import MarkdownEmitter
from pluto.gateway.delivery.render.emit import Emitter
from pluto.gateway.delivery.render.ir import Table
from pluto.gateway.delivery.render.stream import Token
from pluto.gateway.delivery.render.stream import Text as Out
from pluto.types import Dialect

__all__ = ["DISCORD", "DiscordEmitter"]


class DiscordEmitter(MarkdownEmitter):
    """Discord markdown: headings up to ``###``, tables as code blocks, ``||`` is a spoiler."""

    rule_text = "──────────"
    hard_break = "\n"
    max_heading = 3
    extra_escape = r"\|(?=\|)|(?<=\|)\|"

    def table(self, table: Table) -> list[Token]:
        return Emitter.table(self, table)

    def bare_url(self, url: str) -> list[Token]:
        return [Out(url)]  # Discord links bare URLs itself (and "<url>" would hide the preview)


DISCORD = Dialect("discord", DiscordEmitter)
