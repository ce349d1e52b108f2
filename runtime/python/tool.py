"""``run_python``: model-written Python over the conversation's datasets, in the sandbox.

The agent gets it when its agent.yaml lists it in ``tools:`` (like the data tools). What the
code gives back becomes what run_sql and make_chart give: DataFrames as tables (the same text
for the model, capped at 4,000 bytes, and cells for people), figures as PNG images sent with the
answer, files written to the work dir as downloads. ``/py`` (the chat command) uses `run_code`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.runtime.tools import ToolContext, ToolError, ToolResult, tool

if TYPE_CHECKING:
    from pluto.runtime.data import DataService, QueryResult, Scope

    from .sandbox import Outcome, Table

MODEL_BYTES = 4000  # as run_sql: the model's table, in bytes
PEOPLE_ROWS = 50  # as run_sql: rows in details["table"]
OUTPUT_CHARS = 4000  # of stdout (and of stderr) the model reads


@dataclass(slots=True)
class Saved:
    """A run's outcome with its figures, files and CSVs kept as artifacts."""

    outcome: Outcome
    images: list[Path] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    csvs: list[Path | None] = field(default_factory=list)


async def run_code(service: DataService, scope: Scope, run_id: str, code: str) -> Saved:
    """Run ``code`` with the datasets ``scope`` sees; figures, files and tables' CSVs saved
    under ``artifacts/<run_id>/`` and published. Raises SandboxError (a sentence)."""
    from pluto.runtime.data import preload

    from .sandbox import pool

    await preload("child", "sandbox", "format", "warehouse")
    datasets = [(d.name, d.path) for d in await service.visible(scope)]
    outcome = await pool().run(code, datasets)
    saved = Saved(outcome)
    made: list[Path] = []

    def write() -> None:
        for figure in outcome.figures:
            path = service.artifact(run_id, "figure", ".png")
            path.write_bytes(figure.png)
            saved.images.append(path)
        for name, data in outcome.files:
            stem, suffix = _safe_name(name)
            path = service.artifact(run_id, stem, suffix)
            path.write_bytes(data)
            saved.files.append(path)
        for table in outcome.tables:
            csv = service.artifact(run_id, "table", ".csv") if table.csv is not None else None
            if csv is not None and table.csv is not None:
                csv.write_bytes(table.csv)
            saved.csvs.append(csv)
        made.extend([*saved.images, *saved.files, *(p for p in saved.csvs if p)])

    await asyncio.to_thread(write)
    for path in made:
        await service.publish(path)  # every instance can serve it (logged if it cannot)
    return saved


def _safe_name(name: str) -> tuple[str, str]:
    base = Path(name.replace("\\", "/")).name
    stem, dot, suffix = base.rpartition(".")
    if not dot:
        stem, suffix = base, ""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", stem)[:60].strip("_") or "file"
    suffix = re.sub(r"[^A-Za-z0-9]+", "", suffix)[:10]
    return stem, f".{suffix}" if suffix else ""


def query_result(table: Table) -> QueryResult:
    """A table the code returned, as run_sql's result type (for the same formatting)."""
    from pluto.runtime.data import QueryResult

    rows = tuple(tuple(r) for r in table.rows)
    return QueryResult(tuple(table.columns), tuple(table.types), rows, table.total_rows,
                       table.total_rows > len(rows), 0.0)


def table_details(result: QueryResult, rows: int = PEOPLE_ROWS) -> dict[str, Any]:
    """As run_sql's ``details["table"]``: JSON-safe text cells for people."""
    from pluto.runtime.data.format import is_numeric_type, people_text

    return {"columns": list(result.columns),
            "rows": [[people_text(v) for v in row] for row in result.rows[:rows]],
            "numeric": [is_numeric_type(t) for t in result.column_types],
            **({"total_rows": result.total_rows} if result.total_rows is not None else {}),
            "truncated": result.truncated or len(result.rows) > rows}


def _capped(text: str, dropped: int = 0) -> str:
    if len(text) > OUTPUT_CHARS:
        dropped += len(text) - OUTPUT_CHARS
        text = text[:OUTPUT_CHARS]
    return text + (f"\n[… {dropped:,} more characters not shown]" if dropped else "")


def model_text(saved: Saved) -> str:
    """What the model reads of a run."""
    from pluto.runtime.data import format_table

    out = saved.outcome
    parts = []
    if out.stdout:
        parts.append("Printed:\n" + _capped(out.stdout, out.dropped))
    if out.stderr:
        parts.append("Standard error:\n" + _capped(out.stderr))
    for table in out.tables:
        parts.append(f"Table {table.name}:\n"
                     + format_table(query_result(table), MODEL_BYTES // max(1, len(out.tables))))
    if out.value is not None:
        parts.append(f"Value of the last line: {out.value}")
    if saved.images:
        parts.append(f"{len(saved.images)} figure(s) drawn: sent to the user with your answer "
                     "as images; describe what they show, do not link to them.")
    if saved.files:
        names = ", ".join(p.name for p in saved.files)
        parts.append(f"File(s) offered to the user as downloads: {names}.")
    parts += [f"Note: {n}" for n in out.notes]
    if out.error:
        parts.append(("The code ran out of memory" if out.memory else "The code failed")
                     + f":\n{out.error}")
    return "\n\n".join(parts) or "The code ran and printed nothing (end with an expression, " \
        "e.g. a DataFrame, to see its value)."


@tool
async def run_python(ctx: ToolContext, code: str) -> ToolResult:
    """Run Python code in a sandbox for analysis run_sql cannot do (regressions, pivots,
    cleaning, custom plots). pandas is pd, numpy np, matplotlib.pyplot plt. Read the datasets
    with load("sales") (a DataFrame) or sql("SELECT ... FROM sales") (DuckDB SQL, a
    DataFrame); the name list is in datasets. A DataFrame or Series on the last line comes
    back as a table (show(df, "name") for more); figures you draw are sent to the user as
    images; files written to the current folder are offered as downloads. No network, no
    subprocesses, no packages beyond these, 30 s and 1 GB per run; nothing is kept between
    runs.

    Args:
        code: The Python code, e.g. df = load("sales"); df.groupby("region")["amount"].sum()
    """
    service = ctx.services.get("data")
    if service is None:
        raise ToolError("data tools are not available in this gateway")
    from .sandbox import SandboxError

    scope = service.scope(ctx.session_key, ctx.datasets)
    try:
        saved = await run_code(service, scope, ctx.run_id, code)
    except SandboxError as e:
        return ToolResult(str(e), is_error=True)
    out = saved.outcome
    details: dict[str, Any] = {"code": code}
    if out.tables:
        details["table"] = table_details(query_result(out.tables[0]))
        if saved.csvs and saved.csvs[0] is not None:
            details["csv"] = str(saved.csvs[0])
        details["row_count"] = out.tables[0].total_rows
    attachments = [{"path": str(p), "kind": "image"} for p in saved.images]
    attachments += [{"path": str(p), "kind": "file"} for p in saved.files]
    if attachments:
        details["attachments"] = attachments
    if saved.images:
        details["image"] = str(saved.images[0])
    return ToolResult(model_text(saved), details=details, is_error=out.error is not None)
