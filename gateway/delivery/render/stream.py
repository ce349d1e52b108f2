"""The rendered form: a flat stream of text and balanced open/close markup.

A dialect emitter turns the IR into this stream; ``render`` just concatenates it, and the
splitter cuts it anywhere in text, closing the markup open at the cut and reopening it after.
``Text`` holds output that is already escaped for its dialect.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["Close", "Open", "Text", "Token", "concat", "merge", "prefix_lines", "wrap"]


@dataclass(frozen=True, slots=True)
class Text:
    s: str


@dataclass(frozen=True, slots=True, eq=False)
class Open:
    """Markup that spans text: ``<b>``/``</b>``, ``**``/``**``, a code fence and its end.

    ``verbatim`` marks code (whitespace inside is content, line prefixes don't apply).
    ``fallback`` is text shown after the content if the splitter must drop this markup because
    it cannot fit in a chunk (a link whose URL is longer than the limit keeps the URL visible).
    """

    opener: str
    closer: str
    verbatim: bool = False
    fallback: str = ""

    @property
    def cost(self) -> int:
        return len(self.opener) + len(self.closer)


@dataclass(frozen=True, slots=True)
class Close:
    """Closes the innermost :class:`Open`."""


Token = Text | Open | Close



def wrap(markup: Open, inner: Iterable[Token]) -> list[Token]:
    return [markup, *inner, Close()]


def concat(tokens: Iterable[Token]) -> str:
    """The full rendered string of a stream (what a platform is sent when nothing is split)."""
    out: list[str] = []
    stack: list[Open] = []
    for token in tokens:
        match token:
            case Text(s):
                out.append(s)
            case Open() as markup:
                stack.append(markup)
                out.append(markup.opener)
            case Close() if stack:
                out.append(stack.pop().closer)
    out.extend(markup.closer for markup in reversed(stack))
    return "".join(out)


def merge(tokens: Iterable[Token]) -> Iterator[Token]:
    """Join adjacent Text tokens and drop empty ones."""
    pending: list[str] = []
    for token in tokens:
        if isinstance(token, Text):
            pending.append(token.s)
            continue
        if any(pending):
            yield Text("".join(pending))
        pending = []
        yield token
    if any(pending):
        yield Text("".join(pending))


def prefix_lines(tokens: Iterable[Token], first: str, rest: str, blank: str = "") -> list[Token]:
    """Prefix the first line with ``first``, later ones with ``rest``, blank ones with ``blank``.

    Used for list indentation and ``> `` quotes. Verbatim (code) content is left untouched.
    """
    out: list[Token] = [Text(first)]
    depth = 0
    for token in merge(tokens):
        match token:
            case Text(s) if depth == 0:
                out.append(Text(_prefix_text(s, rest, blank)))
            case Open(verbatim=True) as markup:
                depth += 1
                out.append(markup)
            case Open() as markup:
                depth += 1 if depth else 0
                out.append(markup)
            case Close():
                depth -= 1 if depth else 0
                out.append(token)
            case _:
                out.append(token)
    return out


def _prefix_text(s: str, rest: str, blank: str) -> str:
    lines = s.split("\n")
    last = len(lines) - 1
    return "\n".join([lines[0]] + [
        (blank if not line and k < last else rest) + line for k, line in enumerate(lines[1:], 1)
    ])
