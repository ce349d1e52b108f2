"""The five output dialects: how each one escapes text and spells bold, code, links, quotes.

``plain`` is the base :class:`Emitter`; the others override its hooks. Each class is looked up
by dialect name in :data:`EMITTERS`; an emitter is cheap and made fresh for every render.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from urllib.parse import quote

from .emit import Emitter, display_width, pad, table_cells
from .ir import Inline, Table, plain_text
from .stream import Open, Token, prefix_lines, wrap
from .stream import Text as Out

__all__ = ["EMITTERS", "escape_html", "escape_markdown", "text_escaper"]


def escape_html(text: str) -> str:
    """Escape ``&``, ``<``, ``>`` (Telegram HTML text, Slack mrkdwn)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_attr(text: str) -> str:
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
        markup = Open(f'<a href="{_escape_attr(url)}">', "</a>", fallback=f" ({escape_html(url)})")
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


class SlackEmitter(Emitter):
    """Slack mrkdwn: single-character spans, ``<url|text>`` links, no headings or tables."""

    bullet = "• "
    rule_text = "──────────"
    spans = {"bold": ("*", "*"), "italic": ("_", "_"), "strike": ("~", "~")}

    def escape(self, text: str, line_start: bool = False) -> str:
        return escape_html(text)

    def inline_code(self, text: str, in_span: bool) -> list[Token]:
        return wrap(Open("`", "`", verbatim=True), [Out(escape_html(text))])

    def link(self, url: str, children: Sequence[Inline]) -> list[Token]:
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


EMITTERS: dict[str, type[Emitter]] = {
    "plain": Emitter,
    "markdown": MarkdownEmitter,
    "telegram_html": TelegramEmitter,
    "slack_mrkdwn": SlackEmitter,
    "discord": DiscordEmitter,
}


def text_escaper(dialect: str) -> Callable[[str], str]:
    """How raw text is made safe in a dialect when it is sent without any formatting."""
    if dialect in ("telegram_html", "slack_mrkdwn"):
        return escape_html
    if dialect in ("markdown", "discord"):
        return escape_markdown
    return str
