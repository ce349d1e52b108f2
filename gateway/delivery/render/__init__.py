"""One renderer from the Markdown a model writes to every chat platform's dialect.

    render(markdown, dialect)               the whole reply as one string
    render_chunks(markdown, dialect, limit)  split to fit a platform's message length; never raises
    render_preview(markdown, dialect, limit) a still-streaming reply, closed and truncated

Markdown is parsed once into a small IR (``ir.py``), a dialect emits it as a stream of text and
balanced markup (``emit.py``, ``dialects.py``, ``stream.py``) and the splitter cuts that stream
where it reads best, closing and reopening markup at every cut (``split.py``).
Dialects: ``plain``, ``markdown``, ``telegram_html``, ``slack_mrkdwn``, ``discord``.
"""

from __future__ import annotations

import logging

from .dialects import EMITTERS, text_escaper
from .ir import parse
from .preview import close_open_markup
from .split import split
from .stream import Text, Token, concat

__all__ = ["DIALECTS", "MIN_LIMIT", "render", "render_chunks", "render_preview"]

log = logging.getLogger(__name__)

DIALECTS: tuple[str, ...] = tuple(EMITTERS)
MIN_LIMIT = 16          # below this, even one escaped character and its markup may not fit
ELLIPSIS = "…"


def _tokens(markdown: str, dialect: str) -> list[Token]:
    emitter_class = EMITTERS.get(dialect)
    if emitter_class is None:
        raise ValueError(f"unknown markup dialect {dialect!r}; expected one of {DIALECTS}")
    return emitter_class().blocks(parse(markdown))


def render(markdown: str, dialect: str) -> str:
    """Render Markdown in a dialect as one string. Raises ValueError for an unknown dialect."""
    return concat(_tokens(markdown, dialect)).lstrip("\n").rstrip()


def render_chunks(markdown: str, dialect: str, limit: int) -> list[str]:
    """Render and split into chunks of at most ``limit`` characters, each valid on its own.

    Never raises: if rendering fails, the text goes out unformatted (escaped for the dialect).
    Empty or blank input gives ``[]``. Limits below :data:`MIN_LIMIT` are raised to it.
    """
    if not markdown or not markdown.strip():
        return []
    if limit < MIN_LIMIT:
        log.warning("render limit %d is below %d; using %d", limit, MIN_LIMIT, MIN_LIMIT)
        limit = MIN_LIMIT
    try:
        return split(_tokens(markdown, dialect), limit)
    except Exception:
        log.warning("rendering %d chars as %r failed; sending plain text", len(markdown), dialect,
                    exc_info=True)
    return _plain_chunks(markdown, dialect, limit)


def render_preview(markdown: str, dialect: str, limit: int) -> str:
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
        log.warning("preview of %d chars as %r failed", len(markdown), dialect, exc_info=True)
        chunks = _plain_chunks(markdown, dialect, max(MIN_LIMIT, limit))
        return chunks[0] if chunks else ""


def _plain_chunks(markdown: str, dialect: str, limit: int) -> list[str]:
    """The unformatted text, escaped for the dialect, split (used when rendering fails)."""
    escaped = text_escaper(dialect)(markdown.strip())
    try:
        return split([Text(escaped)], limit)
    except Exception:
        log.warning("splitting plain text failed; cutting it hard", exc_info=True)
    return _hard_chunks(escaped, limit)


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
