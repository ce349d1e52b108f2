"""What a dataset holds: columns and types, rows, a few sample rows and simple statistics
(DuckDB's SUMMARIZE), as text for the model and as Markdown for people."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .child import DataError, cell_text, sql_name
from .format import counted, format_table, markdown_table, result_markdown
from .sandbox import QueryResult, run_query
from .service import QueryLimits
from .warehouse import DatasetInfo

SAMPLE_ROWS = 5
# SUMMARIZE's columns worth showing, and how to call them
STATS = (("min", "min"), ("max", "max"), ("approx_unique", "distinct≈"), ("avg", "mean"),
         ("null_percentage", "null %"))


@dataclass(frozen=True, slots=True)
class Description:
    info: DatasetInfo
    sample: QueryResult | None
    stats: dict[str, dict[str, str]]  # column -> {stat: text}
    problem: str | None = None  # why the sample or the statistics are missing


async def describe(info: DatasetInfo, limits: QueryLimits = QueryLimits()) -> Description:
    """Sample rows and statistics of one dataset, each from a sandboxed query of its own."""
    options: dict[str, Any] = {"timeout": limits.timeout, "memory_limit": limits.memory_limit,
                               "threads": limits.threads}
    sample, stats = await asyncio.gather(
        run_query(f'SELECT * FROM "{info.name}" LIMIT {SAMPLE_ROWS}', [info], **options),
        run_query(f'SUMMARIZE "{info.name}"', [info], max_rows=10_000, **options),
        return_exceptions=True)
    problems = [str(r) for r in (sample, stats) if isinstance(r, DataError)]
    for result in (sample, stats):
        if isinstance(result, BaseException) and not isinstance(result, DataError):
            raise result
    return Description(info, sample if isinstance(sample, QueryResult) else None,
                       _stats(stats) if isinstance(stats, QueryResult) else {},
                       problems[0] if problems else None)


def _stats(result: QueryResult) -> dict[str, dict[str, str]]:
    index = {name: i for i, name in enumerate(result.columns)}
    out: dict[str, dict[str, str]] = {}
    for row in result.rows:
        column = str(row[index["column_name"]])
        out[column] = {key: _short(row[index[key]]) for key, _ in STATS if key in index}
    return out


def _short(value: Any) -> str:
    text = cell_text(value, null="")
    try:
        number = float(text)
    except ValueError:
        return text if len(text) <= 40 else text[:39] + "…"
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.6g}"


def _columns_rows(desc: Description) -> list[list[str]]:
    return [[c.name, c.type, *(desc.stats.get(c.name, {}).get(key, "") for key, _ in STATS)]
            for c in desc.info.columns]


def description_text(desc: Description) -> str:
    """For the model: compact, every column, its statistics and a few rows."""
    info = desc.info
    lines = [f"Dataset {info.name}: {counted(info.rows, 'row')}, "
             f"{counted(len(info.columns), 'column')} "
             f"(from {info.source}). Query it as the table {sql_name(info.name)}.",
             "column | type | " + " | ".join(label for _, label in STATS)]
    lines += [" | ".join(row) for row in _columns_rows(desc)]
    if desc.sample is not None:
        lines += ["", "Sample rows:", format_table(desc.sample, max_bytes=2000)]
    if desc.problem:
        lines += ["", f"(Part of the description is missing: {desc.problem})"]
    return "\n".join(lines)


def description_markdown(desc: Description) -> str:
    """For people: a heading line, the columns with statistics, then sample rows."""
    info = desc.info
    head = [f"**{info.name}**: {counted(info.rows, 'row')} × "
            f"{counted(len(info.columns), 'column')}, "
            f"from `{info.source}`", ""]
    right = [False, False, *(key != "min" and key != "max" for key, _ in STATS)]
    table = markdown_table(["column", "type", *(label for _, label in STATS)],
                           _columns_rows(desc), right)
    parts = [*head, table]
    if desc.sample is not None and desc.sample.rows:
        sample = result_markdown(desc.sample, max_rows=SAMPLE_ROWS).rsplit("\n\n", 1)[0]
        parts += ["", "Sample rows:", "", sample]
    if desc.problem:
        parts += ["", f"(Part of the description is missing: {desc.problem})"]
    return "\n".join(parts)
