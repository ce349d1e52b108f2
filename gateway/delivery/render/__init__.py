"""One renderer from the Markdown a model writes to every chat platform's dialect.

    render(markdown, dialect)               the whole reply as one string
    render_chunks(markdown, dialect, limit)  split to fit a platform's message length; never raises
    render_preview(markdown, dialect, limit) a still-streaming reply, closed and truncated

``dialect`` is a :class:`pluto.types.Dialect`, declared by the provider in its capabilities.
Markdown is parsed once into a small IR (``ir.py``), the dialect's emitter emits it as a stream of
text and balanced markup (``emit.py``, ``stream.py``) and the splitter cuts that stream where it
reads best, closing and reopening markup at every cut (``split.py``).

The emitter is ``dialect.emitter`` when the provider brings one (its own package, e.g.
``providers/<platform>/markup.py``); else one of the renderer's own, by name: ``plain`` (the
base :class:`~.emit.Emitter`) and ``markdown`` (see ``dialects.py``). The renderer knows no
platform. When rendering fails, the text goes out unformatted, escaped by the emitter's
``escape``.
"""

from __future__ import annotations

import logging

from pluto.types import MARKDOWN, PLAIN, Dialect

from .dialects import BUILTIN
from .emit import Emitter
from .ir import parse
from .preview import close_open_markup
from .split import split
from .stream import Text, Token, concat

__all__ = ["BUILTIN_DIALECTS", "MIN_LIMIT", "render", "render_chunks", "render_preview",
           "split_text"]

log = logging.getLogger(__name__)

BUILTIN_DIALECTS: tuple[Dialect, ...] = (PLAIN, MARKDOWN)  # the ones that need no emitter
MIN_LIMIT = 16          # below this, even one escaped character and its markup may not fit
ELLIPSIS = "…"


def _emitter(dialect: Dialect) -> Emitter:
    """A fresh emitter for the dialect: the one it brings, else a built-in one by its name."""
    emitter_class = dialect.emitter or BUILTIN.get(dialect.name)
    if emitter_class is None:
        raise ValueError(f"unknown markup dialect {dialect.name!r}: it brings no emitter and "
                         f"the renderer's own are {tuple(BUILTIN)}")
    if not (isinstance(emitter_class, type) and issubclass(emitter_class, Emitter)):
        raise TypeError(f"the emitter of markup dialect {dialect.name!r} is {emitter_class!r}, "
                        "not a subclass of Emitter")
    return emitter_class()


def _tokens(markdown: str, dialect: Dialect) -> list[Token]:
    return _emitter(dialect).blocks(parse(markdown))


def render(markdown: str, dialect: Dialect) -> str:
    """Render Markdown in a dialect as one string.

    Raises ValueError for a dialect that brings no emitter and is not a built-in one, and
    TypeError for one whose emitter is not an :class:`~.emit.Emitter` subclass.
    """
    return concat(_tokens(markdown, dialect)).lstrip("\n").rstrip()


def render_chunks(markdown: str, dialect: Dialect, limit: int) -> list[str]:
    """Render and split into chunks of at most ``limit`` characters, each valid on its own.

    Never raises: if rendering fails (an unknown dialect too), the text goes out unformatted,
    escaped by the dialect's emitter. Empty or blank input gives ``[]``. Limits below
    :data:`MIN_LIMIT` are raised to it.
    """
    if not markdown or not markdown.strip():
        return []
    if limit < MIN_LIMIT:
        log.warning("render limit %d is below %d; using %d", limit, MIN_LIMIT, MIN_LIMIT)
        limit = MIN_LIMIT
    try:
        return split(_tokens(markdown, dialect), limit)
    except Exception:
        log.warning("rendering %d chars as %r failed; sending plain text", len(markdown),
                    _name(dialect), exc_info=True)
    return _plain_chunks(markdown, dialect, limit)


def render_preview(markdown: str, dialect: Dialect, limit: int) -> str:
    """Render a partial, still-streaming reply: close what is open, fit in ``limit`` with "…".

    Never raises; blank input gives ``""``.
    """
    try:
        # Only the head can be shown: rendering it alone keeps each streamed edit cheap.
        budget = 4 * limit + 256
        truncated = len(markdown) > budget
        text = close_open_markup(markdown[:budget] if truncated else markdown)
        chunks = render_chunks(text, dialect, limit)
        if len(chunks) <= 1 and not truncated:
            return chunks[0] if chunks else ""
        head = render_chunks(text, dialect, max(MIN_LIMIT, limit - 2))
        if not head:
            return ""
        joint = "\n" if head[0].endswith(("```", "~~~")) else ""
        return (head[0] + joint + ELLIPSIS)[:max(limit, 0)] if limit > 0 else ""
    except Exception:
        log.warning("preview of %d chars as %r failed", len(markdown), _name(dialect),
                    exc_info=True)
        chunks = _plain_chunks(markdown, dialect, max(MIN_LIMIT, limit))
        return chunks[0] if chunks else ""


def split_text(text: str, limit: int) -> list[str]:
    """Text exactly as it is (for a front-end that renders the model's Markdown itself), cut
    where it reads best only when it is longer than ``limit``. Never raises."""
    text = text.strip()
    if not text:
        return []
    if len(text) <= limit:
        return [text]
    try:
        return split([Text(text)], max(limit, MIN_LIMIT))
    except Exception:
        log.warning("splitting text failed; cutting it hard", exc_info=True)
    return _hard_chunks(text, max(limit, MIN_LIMIT))


def _plain_chunks(markdown: str, dialect: Dialect, limit: int) -> list[str]:
    """The unformatted text, escaped for the dialect, split (used when rendering fails)."""
    escaped = _escape(markdown.strip(), dialect)
    try:
        return split([Text(escaped)], limit)
    except Exception:
        log.warning("splitting plain text failed; cutting it hard", exc_info=True)
    return _hard_chunks(escaped, limit)


def _escape(text: str, dialect: Dialect) -> str:
    """Raw text made safe in the dialect by its emitter's ``escape``. An unknown dialect, or an
    emitter that fails, leaves the text as it is (plain): the fallback must not raise."""
    try:
        return _emitter(dialect).escape(text)
    except Exception:
        log.warning("escaping text as %r failed; sending it as it is", _name(dialect),
                    exc_info=True)
    return text


def _name(dialect: Dialect) -> str:
    return str(getattr(dialect, "name", dialect))  # for logs, whatever a caller passed


def _hard_chunks(text: str, limit: int) -> list[str]:
    """Fixed-size pieces, never cutting an ``&…;`` entity: the fallback of the fallback."""
    chunks: list[str] = []
    pos = 0
    while pos < len(text):
        end = min(len(text), pos + limit)
        amp = text.rfind("&", pos, end)
        if end < len(text) and amp > pos and ";" not in text[amp:end]:
            end = amp
        chunks.append(text[pos:end])
        pos = end
    return [chunk for chunk in chunks if chunk.strip()]
