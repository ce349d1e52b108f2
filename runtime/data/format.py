"""Query results as text: a compact table for the model, a Markdown table for people, CSV."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from .child import cell_text, csv_cell
from .sandbox import QueryResult

__all__ = ["cell_text", "counted", "format_table", "is_numeric_type", "markdown_table",
           "model_text", "people_text", "result_markdown", "write_csv"]

_NUMERIC = re.compile(r"^(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|DECIMAL.*|DOUBLE|FLOAT|REAL|"
                      r"NUMERIC.*|U?HUGEINT)$")
# Markdown punctuation that would turn a value into markup; '_' only where it is not inside
# a word (snake_case stays readable in a terminal, which shows the Markdown as it is).
_MARKUP = re.compile(r"[\\`*~\[\]|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def counted(n: int, word: str) -> str:
    """'1 row', '2,000 rows'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def is_numeric_type(duckdb_type: str) -> bool:
    return bool(_NUMERIC.match(duckdb_type.upper()))


def people_text(value: object) -> str:
    """A value for people: floats rounded to what a person reads (12.6391, 1,234.57, 3.2e-07);
    everything else as `cell_text` (exact decimals stay exact; the CSV keeps every digit)."""
    if isinstance(value, float) and math.isfinite(value):
        size = abs(value)
        if size == 0 or size >= 1e15 or size < 1e-4:
            return f"{value:.4g}"
        decimals = 2 if size >= 100 else 4 if size >= 0.01 else 6
        text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
        return text if text not in ("-0", "") else "0"
    return cell_text(value)


def model_text(value: object) -> str:
    """A value for the model: floats to 10 significant digits (no 0.30000000000000004)."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.10g}"
    return cell_text(value)


def format_table(result: QueryResult, max_bytes: int = 4000, *, max_cell: int = 200) -> str:
    """A compact ' | '-separated table for the model, never longer than max_bytes."""
    def line(values: Sequence[str]) -> str:
        cells = (v if len(v) <= max_cell else v[: max_cell - 1] + "…" for v in values)
        return " | ".join(c.replace("\n", "\\n").replace("|", "\\|") for c in cells)

    lines = [line(result.columns)]
    used = len(lines[0].encode()) + 1
    budget = max_bytes - 100  # room for the footer
    for row in result.rows:
        text = line([model_text(v) for v in row])
        if used + len(text.encode()) + 1 > budget:
            break
        lines.append(text)
        used += len(text.encode()) + 1
    shown = len(lines) - 1
    total = result.total_rows
    if shown == total:
        lines.append(f"({total} row{'s' if total != 1 else ''})")
    else:
        of = f"{total}" if total is not None else f"more than {len(result.rows)}"
        lines.append(f"(showing {shown} of {of} rows; aggregate or add LIMIT to see the rest)")
    return "\n".join(lines).encode()[:max_bytes].decode("utf-8", "ignore")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]],
                   right: Sequence[bool] = (), *, max_cell: int = 60) -> str:
    """An aligned GitHub-style table of text cells, escaped so no value turns into markup."""
    def cell(text: str) -> str:
        text = " ".join(text.split()) if "\n" in text or "\r" in text else text
        if len(text) > max_cell:
            text = text[: max_cell - 1] + "…"
        return _MARKUP.sub(lambda m: "\\" + m.group(0), text)

    head = [cell(c) for c in columns]
    body = [[cell(v) for v in row] for row in rows]
    widths = [max([len(head[i]), 3, *(len(r[i]) for r in body)]) for i in range(len(head))]
    align = [bool(right[i]) if i < len(right) else False for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if a else c.ljust(w)
                                 for c, w, a in zip(cells, widths, align)) + " |"

    rule = "| " + " | ".join("-" * (w - 1) + ":" if a else "-" * w
                             for w, a in zip(widths, align)) + " |"
    return "\n".join([line(head), rule, *(line(r) for r in body)])


def result_markdown(result: QueryResult, *, max_rows: int = 25, max_chars: int = 3000,
                    saved: str | None = None) -> str:
    """A query result for people: a Markdown table of the first rows, how many there are, and
    (``saved``) where the whole result is kept as CSV."""
    if not result.columns:
        return "The query returned no columns."
    right = [is_numeric_type(t) for t in result.column_types]
    rows = [[people_text(v) for v in row] for row in result.rows[:max_rows]]
    table = markdown_table(result.columns, rows, right)
    while len(table) > max_chars and len(rows) > 1:
        rows = rows[: max(1, len(rows) // 2)]
        table = markdown_table(result.columns, rows, right)
    total = result.total_rows
    if total == 0:
        return table + "\n\n(no rows)"
    if total is not None and total == len(rows):
        return table + f"\n\n({total:,} row{'s' if total != 1 else ''})"
    of = f"{total:,}" if total is not None else f"more than {len(result.rows):,}"
    where = f"; all of them are in {saved}" if saved else ""
    return table + f"\n\n(showing {len(rows):,} of {of} rows{where})"


def write_csv(result: QueryResult, path: Path) -> Path:
    """Write the rows a result holds as CSV, atomically (for the full result of a query,
    pass csv_path to run_query instead)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow([csv_cell(c) for c in result.columns])
            writer.writerows([csv_cell(v) for v in row] for row in result.rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
