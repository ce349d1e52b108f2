"""Cut a rendered token stream into chunks of at most ``limit`` characters, each valid alone.

The stream is laid out once as one string plus, for every boundary between two characters,
whether a chunk may end there and which markup is open there. A chunk is then
``reopen(open at start) + text[start:end] + close(open at end)``: markup cut by a split is closed
at the end of one chunk and reopened at the start of the next, so every chunk is balanced.

Cuts go, in order of preference, at a blank line, a line end, a sentence end, a space: the
furthest such boundary that fits and leaves the chunk at least ``MIN_FILL`` full wins; else the
furthest space of any kind; a chunk is cut mid-word only where there is no space at all.
Chunks never end inside a tag (markup strings are never cut), an entity like ``&amp;``, a
backslash escape, or right after an opening tag. Markup whose own open+close text would not
leave room for text (a link with a URL near the limit) is dropped, and its ``fallback`` text
(the URL) is shown instead.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pluto.errors import PlutoError
from .stream import Close, Open, Text, Token, merge

__all__ = ["SplitError", "split"]

MIN_FILL = 0.3          # a preferred break must leave the chunk at least this full
MARKUP_SHARE = 0.75     # markup open at once may take at most this share of a chunk

_ATOMS = re.compile(r"&#?\w+;|\\.", re.DOTALL)  # never cut inside these (nor a "\\\n" break)
_SPACE = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"[.!?…][\"')\]»”’]?$")


class SplitError(PlutoError):
    """No boundary fits within the limit (only possible for absurdly small limits)."""


@dataclass(slots=True)
class _Layout:
    text: list[str] = field(default_factory=list)
    size: int = 0
    cut: bytearray = field(default_factory=lambda: bytearray(1))
    stack_at: list[int] = field(default_factory=lambda: [0])   # boundary -> index in stacks
    stacks: list[tuple[Open, ...]] = field(default_factory=lambda: [()])
    closers_at: dict[int, int] = field(default_factory=dict)   # closer start -> its end
    skippable: bytearray = field(default_factory=bytearray)   # per char: ws a chunk may drop
    visible: bytearray = field(default_factory=bytearray)     # per char: text that shows
    cands: list[tuple[int, int, int]] = field(default_factory=list)    # (end, resume, priority)
    tail: str = ""      # the last two characters of text, to spot sentence ends
    close_len: list[int] = field(default_factory=list)           # per stack: its closers' length

    def append(self, s: str, *, text: bool) -> None:
        start = self.size
        self.text.append(s)
        self.size += len(s)
        self.stack_at.extend([len(self.stacks) - 1] * len(s))
        self.cut.extend([1 if text else 0] * len(s))
        self.skippable.extend(bytes(len(s)))
        self.visible.extend(bytes(0 if not text or ch.isspace() else 1 for ch in s))
        if text:
            for atom in _ATOMS.finditer(s):
                for k in range(atom.start() + 1, atom.end()):
                    self.cut[start + k] = 0

    def push(self, stack: list[Open]) -> None:
        self.stacks.append(tuple(stack))


def _layout(tokens: Iterable[Token], budget: int) -> _Layout:
    lay = _Layout()
    stack: list[Open] = []
    opened: list[tuple[Open, bool]] = []  # every Open seen, and whether it was kept
    for token in merge(tokens):
        match token:
            case Text(s):
                _add_text(lay, s, any(o.verbatim for o in stack))
            case Open() as markup:
                kept = sum(o.cost for o in stack) + markup.cost <= budget
                opened.append((markup, kept))
                if kept:
                    stack.append(markup)
                    lay.push(stack)
                    lay.append(markup.opener, text=False)  # no cut right after an opener
            case Close() if opened:
                markup, kept = opened.pop()
                if not kept:
                    _add_text(lay, markup.fallback, any(o.verbatim for o in stack))
                    continue
                stack.pop()
                lay.push(stack)
                lay.closers_at[lay.size] = lay.size + len(markup.closer)
                lay.append(markup.closer, text=False)
                lay.cut[lay.size] = 1
    return lay


def _add_text(lay: _Layout, s: str, verbatim: bool) -> None:
    if not s:
        return
    start = lay.size
    lay.append(s, text=True)  # the boundary before the text stays as what precedes it set it
    for run in _SPACE.finditer(s):
        lay.cands.append(_candidate(lay, s, start, run, verbatim))
        if not verbatim:
            for k in range(run.start(), run.end()):
                lay.skippable[start + k] = 1
    lay.tail = (lay.tail + s)[-2:]


def _candidate(lay: _Layout, s: str, start: int, run: re.Match[str], verbatim: bool
               ) -> tuple[int, int, int]:
    ws = run.group()
    newlines = ws.count("\n")
    before = (lay.tail + s[:run.start()])[-2:]
    priority = 4 if newlines >= 2 else 3 if newlines else 2 if _SENTENCE_END.search(before) else 1
    if not verbatim:
        return start + run.start(), start + run.end(), priority
    if newlines:  # keep indentation and trailing spaces of code lines; drop only the line breaks
        at = start + run.start()
        return at + ws.index("\n"), at + ws.rindex("\n") + 1, priority
    return start + run.end(), start + run.end(), priority


def split(tokens: Iterable[Token], limit: int) -> list[str]:
    """Split a token stream into balanced chunks of at most ``limit`` characters."""
    lay = _layout(tokens, int(limit * MARKUP_SHARE))
    lay.close_len = [sum(len(o.closer) for o in stack) for stack in lay.stacks]
    full = "".join(lay.text)
    ends = [c[0] for c in lay.cands]
    chunks: list[str] = []
    start = _skip(lay, 0)
    while start < lay.size:
        end, resume = _next_cut(lay, ends, start, limit)
        if any(lay.visible[start:end]):  # not just markup, like an empty code block
            chunks.append(_reopen(lay, start) + full[start:end] + _close(lay, end))
        start = _skip(lay, max(resume, end))
    return chunks


def _reopen(lay: _Layout, pos: int) -> str:
    return "".join(o.opener for o in lay.stacks[lay.stack_at[pos]])


def _close(lay: _Layout, pos: int) -> str:
    return "".join(o.closer for o in reversed(lay.stacks[lay.stack_at[pos]]))


def _skip(lay: _Layout, pos: int) -> int:
    """Move a chunk start past droppable whitespace and past closers (their markup was closed)."""
    while pos < lay.size:
        if pos in lay.closers_at:
            pos = lay.closers_at[pos]
        elif lay.skippable[pos]:
            pos += 1
        else:
            break
    return pos


def _next_cut(lay: _Layout, ends: list[int], start: int, limit: int) -> tuple[int, int]:
    """The (end, resume) of the chunk starting at ``start``."""
    room = limit - len(_reopen(lay, start))

    def fits(end: int) -> bool:
        return end - start + lay.close_len[lay.stack_at[end]] <= room

    if fits(lay.size):
        return lay.size, lay.size
    best: dict[int, tuple[int, int]] = {}
    first, last = bisect.bisect_right(ends, start), bisect.bisect_right(ends, start + room)
    for end, resume, priority in lay.cands[first:last]:
        if lay.cut[end] and fits(end):
            best[priority] = (end, resume)
    for priority in (4, 3, 2):
        if priority in best and best[priority][0] - start >= room * MIN_FILL:
            return best[priority]
    if best:  # any space beats cutting a word in two
        return max(best.values())
    for end in range(min(start + room, lay.size), start, -1):
        if lay.cut[end] and fits(end):
            return end, end
    raise SplitError(f"nothing fits in {limit} characters at offset {start}")
