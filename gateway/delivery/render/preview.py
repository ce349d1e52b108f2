"""Make a still-streaming Markdown text well-formed: close its open fence, code span, emphasis.

A model's reply arrives in pieces; a preview of ``"```py\\nx = 1"`` or ``"it is **very"`` must
render as a code block and as bold, not as stray backticks and asterisks.
"""

from __future__ import annotations

import re

__all__ = ["close_open_markup"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)(?<!`)\1(?!`)", re.DOTALL)
_DELIMS = re.compile(r"\*\*|__|~~")


def close_open_markup(markdown: str) -> str:
    """Append what closes an unclosed code fence, code span, ``**``, ``__`` or ``~~``."""
    fence = _open_fence(markdown)
    if fence:
        return markdown.rstrip("\n") + "\n" + fence
    text = markdown.rstrip()
    paragraph = _CODE_SPAN.sub("", text[text.rfind("\n\n") + 1:])
    ticks = re.search(r"`+", paragraph)  # an unclosed code span: no markup after it
    opened: list[str] = []
    for delim in _DELIMS.finditer(paragraph[: ticks.start()] if ticks else paragraph):
        if delim.group() in opened:
            del opened[len(opened) - 1 - opened[::-1].index(delim.group()):]
        else:
            opened.append(delim.group())
    if ticks:
        return text + ticks.group() + "".join(reversed(opened))
    for closer in reversed(opened):
        if text.endswith(closer):  # opened with nothing after it yet: drop it
            text = text[: -len(closer)].rstrip()
        else:
            text += closer
    return text


def _open_fence(markdown: str) -> str:
    """The fence that closes the code block still open at the end of the text, if any."""
    fence = ""
    for line in markdown.split("\n"):
        match = _FENCE.match(line)
        if not match:
            continue
        marks, rest = match.group(1), match.group(2)
        if not fence:
            if not (marks[0] == "`" and "`" in rest):
                fence = marks
        elif marks[0] == fence[0] and len(marks) >= len(fence) and not rest.strip():
            fence = ""
    return fence
