"""The renderer's own dialects and the escaping helpers every dialect may share.

``plain`` is the base :class:`~.emit.Emitter`, ``markdown`` is :class:`MarkdownEmitter`; they are
the only dialects the renderer knows by name (:data:`BUILTIN`). Any other dialect is brought by
the provider that reads it, as :attr:`pluto.types.Dialect.emitter`: a subclass of ``Emitter``
(or of ``MarkdownEmitter``) that overrides the hooks where its syntax differs, and may use the
helpers here (:func:`escape_html`, :func:`escape_attr`, :func:`escape_markdown`) and the table
helpers in ``emit.py``. An emitter is cheap and made fresh for every render.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote

from .emit import Emitter, display_width, pad, table_cells
from .ir import Inline, Table
from .stream import Open, Token, wrap
from .stream import Text as Out

__all__ = ["BUILTIN", "MarkdownEmitter", "escape_attr", "escape_html", "escape_markdown"]


def escape_html(text: str) -> str:
    """Escape ``&``, ``<``, ``>`` (HTML text, and any dialect that reads entities)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_attr(text: str) -> str:
    """Escape text for a double-quoted HTML attribute value."""
    return escape_html(text).replace('"', "&quot;")


_URL = re.compile(r"(?:https?|ftp)://\S+|www\.\S+")
_MD_INLINE = re.compile(
    r"\\(?=[!-/:-@\[-`{-~]|$)"         # a backslash that would escape what follows
    r"|`"
    r"|\*(?!\s)|(?<!\s)\*"              # '*' unless spaced on both sides ("2 * 3")
    r"|(?<![^\W_])_|_(?![^\W_])"        # '_' unless inside a word (snake_case)
    r"|~(?=~)|(?<=~)~"                  # only '~~' strikes
    r"|<(?=[A-Za-z/!?])"                # could open an HTML tag or an autolink
    r"|&(?=#?\w+;)"                     # could be read as an entity
    r"|\](?=\()"                        # "[x](y)" that was literal text
)
_MD_LINE_START = re.compile(
    r"^(\s*)(#{1,6}(?=\s|$)|>|[-+](?=\s|$)|-#(?=\s)|\d{1,9}(?=[.)](?:\s|$)))"
)


def escape_markdown(text: str, line_start: bool = False, extra: str = "") -> str:
    """Backslash-escape what Markdown would read as syntax, and nothing else (URLs untouched)."""
    parts: list[str] = []
    pos = 0
    pattern = re.compile(f"{_MD_INLINE.pattern}|{extra}") if extra else _MD_INLINE
    for url in _URL.finditer(text):
        parts.append(pattern.sub(r"\\\g<0>", text[pos:url.start()]))
        parts.append(url.group())
        pos = url.end()
    parts.append(pattern.sub(r"\\\g<0>", text[pos:]))
    escaped = "".join(parts)
    if line_start and (match := _MD_LINE_START.match(escaped)):
        lead, mark = match.group(1), match.group(2)
        if mark[0].isdigit():  # "1. " → "1\. "
            return f"{lead}{mark}\\{escaped[match.end():]}"
        return f"{lead}\\{escaped[len(lead):]}"
    return escaped


def _md_url(url: str) -> str:
    return re.sub(r"[\s()<>]", lambda m: quote(m.group()), url)


def _longest_run(text: str, char: str) -> int:
    return max((len(run) for run in re.findall(f"{re.escape(char)}+", text)), default=0)


class MarkdownEmitter(Emitter):
    """Normalised CommonMark/GFM, for the terminal and the web widget."""

    bullet = "- "
    rule_text = "---"
    spans = {"bold": ("**", "**"), "italic": ("*", "*"), "strike": ("~~", "~~")}
    hard_break = "\\\n"
    max_heading = 6
    extra_escape = ""

    def escape(self, text: str, line_start: bool = False) -> str:
        return escape_markdown(text, line_start, self.extra_escape)

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        fence = "`" * (_longest_run(text, "`") + 1)
        spaced = text.startswith(" ") and text.endswith(" ") and text.strip()
        padding = " " if text.startswith("`") or text.endswith("`") or spaced else ""
        return wrap(Open(fence + padding, padding + fence, verbatim=True), [Out(text)])

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
        inner = self.inlines(children, in_span=True)
        return wrap(Open("[", f"]({_md_url(url)})", fallback=f" ({url})"), inner)

    def bare_url(self, url: str) -> list[Token]:
        return [Out("<" + re.sub(r"[\s<>]", lambda m: quote(m.group()), url) + ">")]

    def code_block(self, lang: str, text: str) -> list[Token]:
        fence = "`" * max(3, _longest_run(text, "`") + 1)
        return wrap(Open(f"{fence}{lang}\n", f"\n{fence}", verbatim=True), [Out(text)])

    def heading(self, level: int, inlines: Sequence[Inline]) -> list[Token]:
        if level > self.max_heading:
            return super().heading(level, inlines)
        return [Out("#" * level + " "), *self.inlines(inlines)]

    def table(self, table: Table) -> list[Token]:
        """A GFM pipe table, padded so it is aligned as raw text too."""
        rows, aligns = table_cells(table)
        rows = [[self.escape(cell).replace("|", "\\|") for cell in row] for row in rows]
        widths = [max(3, *(display_width(row[c]) for row in rows)) for c in range(len(aligns))]
        rule = [{"right": "-" * (w - 1) + ":", "center": ":" + "-" * (w - 2) + ":"}
                .get(a, "-" * w) for w, a in zip(widths, aligns, strict=True)]

        def line(cells: list[str]) -> str:
            padded = (pad(c, w, a) for c, w, a in zip(cells, widths, aligns, strict=True))
            return "| " + " | ".join(padded) + " |"

        return [Out("\n".join([line(rows[0]), "| " + " | ".join(rule) + " |",
                               *(line(row) for row in rows[1:])]))]


BUILTIN: dict[str, type[Emitter]] = {
    "plain": Emitter,
    "markdown": MarkdownEmitter,
}
