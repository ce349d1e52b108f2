"""What Teams reads: Markdown in a message's ``text`` (``textFormat: markdown``), and Adaptive
Cards for what Markdown in Teams shows badly — tables.

:data:`TEAMS` is the dialect the provider declares: the renderer's Markdown (bold, italic,
strike, code blocks, inline code, links, lists, quotes), tables as GFM pipe tables. Before a
message goes out, :func:`lift_tables` takes each pipe table out of the text and makes it an
Adaptive Card ``Table`` (with the table as monospaced lines for clients that show no cards).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pluto.gateway.delivery.render.dialects import MarkdownEmitter
from pluto.types import Dialect

__all__ = ["TEAMS", "TeamsEmitter", "Lifted", "lift_tables", "table_card"]

CARD = "application/vnd.microsoft.card.adaptive"
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_ROW = re.compile(r"^\s*\|.*\|\s*$")
_RULE = re.compile(r"^\s*\|(\s*:?-+:?\s*\|)+\s*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


class TeamsEmitter(MarkdownEmitter):
    hard_break = "\n"
    max_heading = 3


TEAMS = Dialect("teams", TeamsEmitter)


@dataclass(frozen=True, slots=True)
class Lifted:
    """A message's text without its tables, and the tables (rows of cells; header or not)."""

    text: str
    tables: tuple[tuple[tuple[tuple[str, ...], ...], bool], ...]


def lift_tables(text: str) -> Lifted:
    kept: list[str] = []
    tables: list[tuple[tuple[tuple[str, ...], ...], bool]] = []
    run: list[str] = []
    fence: str | None = None

    def flush() -> None:
        if len(run) >= 2:  # one lone row stays text
            tables.append(_table(run))
        else:
            kept.extend(run)
        run.clear()

    for line in text.split("\n"):
        opened = _FENCE.match(line)
        if fence is None and _ROW.match(line):
            run.append(line)
            continue
        flush()
        if opened and (fence is None or opened.group(1).startswith(fence)):
            fence = opened.group(1) if fence is None else None
        kept.append(line)
    flush()
    joined = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    return Lifted(joined, tuple(tables))


def _table(lines: list[str]) -> tuple[tuple[tuple[str, ...], ...], bool]:
    header = len(lines) >= 2 and _RULE.match(lines[1]) is not None
    rows = [line for line in lines if _RULE.match(line) is None]
    return tuple(_cells(line) for line in rows), header


def _cells(line: str) -> tuple[str, ...]:
    inner = line.strip()[1:-1]
    return tuple(re.sub(r"\\(.)", r"\1", cell.strip()) for cell in _CELL_SPLIT.split(inner))


def table_card(rows: tuple[tuple[str, ...], ...], header: bool) -> dict[str, Any]:
    """An Adaptive Card (1.5) holding one table; its fallback text the table monospaced."""
    ncols = max((len(r) for r in rows), default=1)
    grid = [list(r) + [""] * (ncols - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in grid) for c in range(ncols)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in grid]
    body = {"type": "Table", "firstRowAsHeader": header, "showGridLines": True,
            "columns": [{"width": 1} for _ in range(ncols)],
            "rows": [{"type": "TableRow", "cells": [
                {"type": "TableCell", "items": [{"type": "TextBlock", "text": cell,
                                                  "wrap": True}]} for cell in r]} for r in grid]}
    return {"contentType": CARD, "content": {
        "type": "AdaptiveCard", "version": "1.5",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "body": [body], "fallbackText": "```\n" + "\n".join(lines) + "\n```"}}
