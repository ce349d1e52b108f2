"""The walk from IR to a token stream, shared by every dialect.

:class:`Emitter` renders each construct in a neutral way (it is the ``plain`` dialect); a
dialect's emitter subclasses it and overrides only the hooks where its syntax differs: escaping,
spans, code, links, quotes. The renderer's own ``markdown`` emitter is in ``dialects.py``; a
platform's emitter lives with its provider (:attr:`pluto.types.Dialect.emitter`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from .ir import (
    Block,
    Break,
    Code,
    CodeBlock,
    Heading,
    Inline,
    Link,
    ListBlock,
    Paragraph,
    Quote,
    Rule,
    Span,
    Table,
    Text,
    plain_text,
)
from .stream import Open, Token, prefix_lines, wrap
from .stream import Text as Out

__all__ = ["Emitter", "display_width", "pad", "table_cells", "table_lines"]


class Emitter:
    """Plain text: no markup at all. Subclasses add a dialect's markup."""

    bullet = "- "
    rule_text = "----------"
    spans: dict[str, tuple[str, str]] = {}
    hard_break = "\n"

    def __init__(self) -> None:
        self.quote_depth = 0  # how many quotes / lists the block being emitted is inside
        self.list_depth = 0

    # --- hooks a dialect overrides ---------------------------------------------------------------

    def escape(self, text: str, line_start: bool = False) -> str:
        """Make raw text safe in the dialect. The renderer's fallback (a reply sent unformatted
        when rendering fails) escapes the whole text with it too."""
        return text

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        return [Out(self.escape(text))]

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        return [*self.inlines(children, in_span=True), Out(f" ({self.escape(url)})")]

    def bare_url(self, url: str) -> list[Token]:
        return [Out(self.escape(url.removeprefix("mailto:")))]

    def code_block(self, lang: str, text: str) -> list[Token]:
        return wrap(Open("", "", verbatim=True), [Out(text)])

    def quoted(self, inner: list[Token]) -> list[Token]:
        return prefix_lines(inner, "> ", "> ", ">")

    def heading(self, level: int, inlines: Sequence[Inline]) -> list[Token]:
        bold = self.spans.get("bold")
        inner = self.inlines(inlines, in_span=True)
        return wrap(Open(*bold), inner) if bold and inner else inner

    def table(self, table: Table) -> list[Token]:
        return self.code_block("", "\n".join(table_lines(table)))

    # --- the walk --------------------------------------------------------------------------------

    def blocks(self, blocks: Sequence[Block], sep: str = "\n\n") -> list[Token]:
        out: list[Token] = []
        for block in blocks:
            rendered = self.block(block)
            if rendered:
                if out:
                    out.append(Out(sep))
                out.extend(rendered)
        return out

    def block(self, block: Block) -> list[Token]:
        match block:
            case Paragraph(inlines):
                return self.inlines(inlines)
            case Heading(level, inlines):
                return self.heading(level, inlines)
            case CodeBlock(lang, text):
                return self.code_block(lang, text)
            case ListBlock():
                return self.list_block(block)
            case Quote(blocks):
                self.quote_depth += 1
                try:
                    inner = self.blocks(blocks)
                finally:
                    self.quote_depth -= 1
                return self.quoted(inner) if inner else []
            case Table():
                return self.table(block) if block.rows else []
            case Rule():
                return [Out(self.rule_text)]
        return []

    def list_block(self, block: ListBlock) -> list[Token]:
        sep = "\n" if block.tight else "\n\n"
        out: list[Token] = []
        self.list_depth += 1
        try:
            for k, item in enumerate(block.items):
                marker = f"{block.start + k}. " if block.ordered else self.bullet
                if out:
                    out.append(Out(sep))
                out.extend(prefix_lines(self.blocks(item, sep), marker, " " * len(marker)))
        finally:
            self.list_depth -= 1
        return out

    def inlines(self, nodes: Sequence[Inline], in_span: bool = False) -> list[Token]:
        out: list[Token] = []
        line_start = True
        for node in nodes:
            match node:
                case Text(text):
                    out.append(Out(self.escape(text, line_start)))
                case Code(text) if text:
                    out.extend(self.inline_code(text, in_span))
                case Span(kind, children):
                    inner = self.inlines(children, in_span=True)
                    pair = self.spans.get(kind)
                    out.extend(wrap(Open(*pair), inner) if pair and inner else inner)
                case Link(url, children):
                    out.extend(self._link(url, children))
                case Break(hard):
                    out.append(Out(self.hard_break if hard else "\n"))
            line_start = isinstance(node, Break)
        return out

    def _link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        text = plain_text(children)
        if not url:
            return self.inlines(children, in_span=True)
        if not text.strip() or text in (url, url.removeprefix("mailto:")):
            return self.bare_url(url)
        return self.link(url, children)


def display_width(text: str) -> int:
    """Columns a string takes in a monospaced font (wide East Asian characters count 2)."""
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def pad(text: str, width: int, align: str) -> str:
    gap = max(0, width - display_width(text))
    if align == "right":
        return " " * gap + text
    if align == "center":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def table_cells(table: Table) -> tuple[list[list[str]], list[str]]:
    """Cell texts (one line each) padded to a rectangle, and the column alignments."""
    rows = [[" ".join(plain_text(cell).split()) for cell in row] for row in table.rows]
    ncols = max(len(row) for row in rows)
    rows = [row + [""] * (ncols - len(row)) for row in rows]
    aligns: list[str] = [*table.aligns[:ncols], *["left"] * (ncols - len(table.aligns))]
    return rows, aligns


def table_lines(table: Table) -> list[str]:
    """A column-aligned, monospaced table: header, a ``-+-`` rule, then the body rows."""
    rows, aligns = table_cells(table)
    widths = [max(display_width(row[c]) for row in rows) for c in range(len(aligns))]

    def line(row: list[str]) -> str:
        padded = (pad(cell, w, a) for cell, w, a in zip(row, widths, aligns, strict=True))
        return " | ".join(padded).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return [line(rows[0]), rule, *(line(row) for row in rows[1:])]
