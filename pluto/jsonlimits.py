"""JSON from outside, with its nesting bounded: every body and frame the gateway parses.

Python's decoder recurses once per ``[`` or ``{``: a few kilobytes of brackets raise
``RecursionError`` (not a ``ValueError``, so it escaped the handlers as a 500 with a traceback),
and a document that does parse but nests a few hundred levels deep can still overflow whatever
walks it next (YAML dumping, validation, logging). :func:`loads` measures the nesting before
parsing, in C-speed passes over the brackets (linear in the input, never recursive), and refuses
anything deeper than :data:`MAX_DEPTH` with :class:`JsonTooDeep` — a ``ValueError``, so every
"not valid JSON" answer (400, an error frame) covers it too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pluto.errors import PlutoError

__all__ = ["MAX_DEPTH", "JsonTooDeep", "loads", "nesting_within"]

MAX_DEPTH = 64  # far beyond what any client, platform or admin sends (Slack's events: ~10)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # unrolled: linear, no backtracking
_LEAF = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


class JsonTooDeep(PlutoError, ValueError):
    """JSON nested deeper than allowed (``str``: one sentence for the sender)."""


def nesting_within(raw: bytes | str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether the JSON text nests at most ``max_depth`` arrays/objects deep.

    Strings are removed, then the brackets alone are peeled one level per pass (each pass
    removes every innermost ``[]``/``{}``); a run of more openers than allowed ends it at
    once. Text that is not balanced JSON is left for the
    parser to refuse."""
    opener, brace = ("[", "{") if isinstance(raw, str) else (b"[", b"{")
    if raw.count(opener) + raw.count(brace) <= max_depth:  # type: ignore[arg-type]
        return True  # (every frame and body of everyday size: no room to nest that deep)
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    too_deep = re.compile(rb"[\[{]{%d}" % (max_depth + 1))  # a run of openers: at once
    for _ in range(max_depth):
        if not brackets:
            return True
        if too_deep.search(brackets):
            return False
        peeled = _LEAF.sub(b"", brackets)
        if len(peeled) == len(brackets):
            return True  # mismatched brackets: not JSON, the parser says so
        brackets = peeled
    return not brackets


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for input from outside; raises ``ValueError`` (``JsonTooDeep`` for a
    document nested deeper than ``max_depth``) and nothing else for bad input."""
    if not nesting_within(raw, max_depth):
        raise JsonTooDeep(f"The JSON is nested more than {max_depth} levels deep.")
    try:
        return json.loads(raw)
    except RecursionError:  # (cannot happen after the check; kept as the last line of defence)
        raise JsonTooDeep(f"The JSON is nested more than {max_depth} levels deep.") from None
