"""Markdown → a small intermediate form (IR): blocks holding inlines, nothing dialect-specific.

Parsing is markdown-it-py (CommonMark + GFM tables and strikethrough, raw HTML off, so an
``<script>`` the model writes stays text). Its flat token stream is folded here into frozen
dataclasses that each dialect emitter walks with ``match``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token

__all__ = [
    "Block", "Break", "Code", "CodeBlock", "Heading", "Inline", "Link", "ListBlock", "Paragraph",
    "Quote", "Rule", "Span", "Table", "Text", "parse", "plain_text",
]


# --- inlines -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Code:
    text: str


@dataclass(frozen=True, slots=True)
class Span:
    kind: Literal["bold", "italic", "strike"]
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Link:
    url: str
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Break:
    hard: bool


Inline = Text | Code | Span | Link | Break


# --- blocks --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Paragraph:
    inlines: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Heading:
    level: int
    inlines: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class CodeBlock:
    lang: str
    text: str


@dataclass(frozen=True, slots=True)
class ListBlock:
    ordered: bool
    start: int
    tight: bool
    items: tuple[tuple[Block, ...], ...]


@dataclass(frozen=True, slots=True)
class Quote:
    blocks: tuple[Block, ...]


@dataclass(frozen=True, slots=True)
class Table:
    aligns: tuple[Literal["left", "right", "center"], ...]
    rows: tuple[tuple[tuple[Inline, ...], ...], ...]  # rows[0] is the header


@dataclass(frozen=True, slots=True)
class Rule:
    pass


Block = Paragraph | Heading | CodeBlock | ListBlock | Quote | Table | Rule

_SCHEME = re.compile(r"(?:^|[^\w.+-])(https?|ftp)$", re.IGNORECASE)
_URL_REST = re.compile(r"://[^\s<>\"`]+")
_TRAILING = ".,:;!?'\"*_~"


def _bare_url(state: StateInline, silent: bool) -> bool:
    """Inline rule: ``https://…`` in text is a link, so ``_`` or ``*`` inside it is no emphasis.

    Like markdown-it's own linkify rule (which needs linkify-it-py), it fires at the ``:`` after
    a scheme the text rule has already consumed into ``state.pending``.
    """
    if state.linkLevel > 0 or not state.src.startswith("://", state.pos):
        return False
    scheme = _SCHEME.search(state.pending)
    match = _URL_REST.match(state.src, state.pos, state.posMax)
    if not scheme or not match:
        return False
    rest = match.group()
    while rest[-1] in _TRAILING or (rest[-1] == ")" and rest.count("(") < rest.count(")")):
        rest = rest[:-1]
    if len(rest) <= 3:
        return False
    url = scheme.group(1) + rest
    if not silent:
        state.pending = state.pending[: -len(scheme.group(1))]
        state.push("link_open", "a", 1).attrs = {"href": url}
        state.push("text", "", 0).content = url
        state.push("link_close", "a", -1)
    state.pos += len(rest)
    return True


_MAX_NESTING = 40
_MD = MarkdownIt("commonmark", {"html": False, "maxNesting": _MAX_NESTING})
_MD.enable(["table", "strikethrough"])
_MD.inline.ruler.after("text", "bare_url", _bare_url)
MAX_SPAN_DEPTH = 8  # deeper emphasis is flattened (keeps the walk shallow; nobody sees 9 levels)
_SPAN_KINDS: dict[str, Literal["bold", "italic", "strike"]] = {
    "strong": "bold", "em": "italic", "s": "strike",
}


def parse(markdown: str) -> tuple[Block, ...]:
    """Parse Markdown into the IR.

    Raises ValueError for nesting so deep that markdown-it would silently drop what is inside.
    """
    tokens = _MD.parse(markdown)
    if any(token.level >= _MAX_NESTING - 1 for token in tokens):
        raise ValueError(f"Markdown nested more than {_MAX_NESTING - 2} levels deep")
    return _BlockReader(tokens).read_until(None)


def plain_text(inlines: Sequence[Inline]) -> str:
    """The visible text of inlines, markup dropped (links keep their text; breaks become spaces)."""
    parts: list[str] = []
    for node in inlines:
        match node:
            case Text(text) | Code(text):
                parts.append(text)
            case Span(_, children) | Link(_, children):
                parts.append(plain_text(children))
            case Break():
                parts.append(" ")
    return "".join(parts)


class _BlockReader:
    """Folds markdown-it's flat open/close block tokens into nested IR blocks."""

    def __init__(self, tokens: list[Token]) -> None:
        self._tokens = tokens
        self._pos = 0

    def _next(self) -> Token:
        token = self._tokens[self._pos]
        self._pos += 1
        return token

    def read_until(self, close_type: str | None) -> tuple[Block, ...]:
        blocks: list[Block] = []
        while self._pos < len(self._tokens):
            token = self._next()
            if token.type == close_type:
                break
            block = self._block(token)
            if block is not None:
                blocks.append(block)
        return tuple(blocks)

    def _block(self, token: Token) -> Block | None:
        match token.type:
            case "paragraph_open":
                return Paragraph(self._inline_then_close())
            case "heading_open":
                return Heading(int(token.tag[1:] or 1), self._inline_then_close())
            case "fence" | "code_block":
                lang = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
                return CodeBlock(lang, token.content.removesuffix("\n"))
            case "bullet_list_open" | "ordered_list_open":
                return self._list(token)
            case "blockquote_open":
                return Quote(self.read_until("blockquote_close"))
            case "table_open":
                return self._table()
            case "hr":
                return Rule()
            case "inline":
                return Paragraph(_inlines(token.children or []))
            case "html_block":
                return Paragraph((Text(token.content.rstrip("\n")),))
        return None

    def _inline_then_close(self) -> tuple[Inline, ...]:
        inline = self._next()
        self._next()  # the matching *_close
        return _inlines(inline.children or [])

    def _list(self, opener: Token) -> ListBlock:
        ordered = opener.type == "ordered_list_open"
        close = "ordered_list_close" if ordered else "bullet_list_close"
        start = int(opener.attrGet("start") or 1) if ordered else 1
        items: list[tuple[Block, ...]] = []
        tight = True
        while self._pos < len(self._tokens):
            token = self._next()
            if token.type == close:
                break
            if token.type == "list_item_open":
                first = self._tokens[self._pos] if self._pos < len(self._tokens) else None
                if first is not None and first.type == "paragraph_open" and not first.hidden:
                    tight = False
                items.append(self.read_until("list_item_close"))
        return ListBlock(ordered, start, tight, tuple(items))

    def _table(self) -> Table:
        aligns: list[Literal["left", "right", "center"]] = []
        given: list[bool] = []  # the table said how to align that column
        rows: list[tuple[tuple[Inline, ...], ...]] = []
        row: list[tuple[Inline, ...]] = []
        while self._pos < len(self._tokens):
            token = self._next()
            match token.type:
                case "table_close":
                    break
                case "tr_close":
                    rows.append(tuple(row))
                    row = []
                case "th_open":
                    style = str(token.attrGet("style") or "")
                    aligns.append("right" if "right" in style else
                                  "center" if "center" in style else "left")
                    given.append(bool(style))
                case "inline":
                    row.append(_inlines(token.children or []))
        return Table(_numbers_right(aligns, given, rows), tuple(rows))


_NUMBER = re.compile(r"[-+−]?[$€£¥]?(\d{1,3}(,\d{3})+|\d+)?([.]\d+)?(e[-+]?\d+)?%?", re.I)


def _numbers_right(aligns: list[Literal["left", "right", "center"]], given: list[bool],
                   rows: list[tuple[tuple[Inline, ...], ...]]
                   ) -> tuple[Literal["left", "right", "center"], ...]:
    """Columns whose alignment the table left open and whose every body cell is a number are
    aligned right, as people read numbers."""
    out = list(aligns)
    for c, (align, said) in enumerate(zip(aligns, given, strict=True)):
        cells = [plain_text(row[c]).strip() for row in rows[1:] if c < len(row)]
        cells = [cell for cell in cells if cell]
        if not said and cells and all(any(ch.isdigit() for ch in cell)
                                      and _NUMBER.fullmatch(cell) for cell in cells):
            out[c] = "right"
    return tuple(out)


def _inlines(children: list[Token]) -> tuple[Inline, ...]:
    """Fold inline tokens (text, *_open/*_close pairs, code, breaks, links) into IR inlines."""
    stack: list[tuple[str, str, list[Inline]]] = [("root", "", [])]
    flattened = 0  # spans opened beyond MAX_SPAN_DEPTH, kept as plain text
    for token in children:
        out = stack[-1][2]
        kind = token.type.removesuffix("_open").removesuffix("_close")
        match token.type:
            case "text" | "html_inline" | "text_special":
                if token.content:
                    out.append(Text(token.content))
            case "softbreak" | "hardbreak":
                out.append(Break(token.type == "hardbreak"))
            case "code_inline":
                out.append(Code(token.content))
            case "image":
                url = str(token.attrGet("src") or "")
                out.append(Link(url, (Text(token.content or url),)))
            case "strong_open" | "em_open" | "s_open" | "link_open":
                if len(stack) > MAX_SPAN_DEPTH:
                    flattened += 1
                else:
                    stack.append((kind, str(token.attrGet("href") or ""), []))
            case "strong_close" | "em_close" | "s_close" | "link_close":
                if flattened:
                    flattened -= 1
                elif len(stack) > 1:
                    _pop_into(stack)
    while len(stack) > 1:
        _pop_into(stack)
    return _merge_text(stack[0][2])


def _pop_into(stack: list[tuple[str, str, list[Inline]]]) -> None:
    kind, url, nodes = stack.pop()
    children = _merge_text(nodes)
    node: Inline = Link(url, children) if kind == "link" else Span(_SPAN_KINDS[kind], children)
    stack[-1][2].append(node)


def _merge_text(nodes: list[Inline]) -> tuple[Inline, ...]:
    merged: list[Inline] = []
    for node in nodes:
        if isinstance(node, Text) and merged and isinstance(merged[-1], Text):
            merged[-1] = Text(merged[-1].text + node.text)
        else:
            merged.append(node)
    return tuple(merged)
