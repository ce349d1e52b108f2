"""The data tools: list the datasets, describe one, run read-only SQL, draw a chart.

They work through the gateway's :class:`runtime.data.DataService` (``ctx.services["data"]``)
within the run's scope: the datasets the agent lists (``ctx.datasets``) plus the files sent
in this conversation. A query the sandbox refuses or DuckDB rejects comes back as an error
result with DuckDB's message, so the model can correct itself. DuckDB and matplotlib are
imported on first use, in a worker thread (as the chart is drawn there): never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Literal

from pluto.runtime.data import preload
from pluto.runtime.tools import Tool, ToolContext, ToolError, ToolResult, tool

if TYPE_CHECKING:
    from pluto.runtime.data import DataService, QueryResult, Scope

MODEL_ROWS = 100  # rows fetched for the model's table (which is also capped in bytes)
MODEL_BYTES = 4000
PEOPLE_ROWS = 50  # rows in `details["table"]`
CHART_ROWS = 10_000  # rows a chart may plot


async def _service(ctx: ToolContext, *modules: str) -> tuple[DataService, Scope]:
    """The gateway's data, once DuckDB and the data modules a tool uses (``modules`` besides
    the common ones) are imported, in a worker thread."""
    service = ctx.services.get("data")
    if service is None:
        raise ToolError("data tools are not available in this gateway")
    await preload("child", "sandbox", "format", "warehouse", *modules)
    return service, service.scope(ctx.session_key, ctx.datasets)


def table_details(result: QueryResult, rows: int = PEOPLE_ROWS) -> dict[str, Any]:
    """A result as JSON-safe text cells, for people."""
    from pluto.runtime.data.format import is_numeric_type, people_text

    return {"columns": list(result.columns),
            "rows": [[people_text(v) for v in row] for row in result.rows[:rows]],
            "numeric": [is_numeric_type(t) for t in result.column_types],
            **({"total_rows": result.total_rows} if result.total_rows is not None else {}),
            "truncated": result.truncated or len(result.rows) > rows}


def _failed(error: Exception, what: str) -> ToolResult:
    from pluto.runtime.data import QueryRefused

    lead = "The query was refused" if isinstance(error, QueryRefused) else f"{what} failed"
    return ToolResult(f"{lead}: {error}", is_error=True)


@tool
async def list_datasets(ctx: ToolContext) -> ToolResult:
    """List the datasets you can query with run_sql (each is a table of the same name), with
    their rows and columns. Files the user sends in this chat appear here too."""
    service, scope = await _service(ctx)
    from pluto.runtime.data import counted, sql_name

    found = await service.visible(scope)
    if not found:
        return ToolResult("No datasets are available. The user can send a CSV, TSV, Parquet or "
                          "JSON file in this chat to add one.", details={"datasets": []})
    lines = [f"{len(found)} dataset(s); query each as the table of the same name:"]
    for d in found:
        mine = " (sent in this chat)" if d.owner is not None else ""
        if sql_name(d.name) != d.name:
            mine += f" (an SQL keyword: write it {sql_name(d.name)} in queries)"
        columns = ", ".join(f"{c.name} {c.type}" for c in d.columns[:40])
        more = f", … {len(d.columns) - 40} more" if len(d.columns) > 40 else ""
        lines.append(f"- {d.name}{mine}: {counted(d.rows, 'row')}; columns: {columns}{more}")
    details = [{"name": d.name, "rows": d.rows, "columns": [c.name for c in d.columns],
                "owner": "global" if d.owner is None else "this chat"} for d in found]
    return ToolResult("\n".join(lines), details={"datasets": details})


@tool
async def describe_dataset(ctx: ToolContext, name: str) -> ToolResult:
    """Describe one dataset: its columns and types, row count, simple statistics per column
    (min, max, distinct values, mean, nulls) and a few sample rows.

    Args:
        name: The dataset's name, as list_datasets shows it.
    """
    service, scope = await _service(ctx, "describe")
    from pluto.runtime.data import DataError
    from pluto.runtime.data.describe import STATS, describe, description_text

    try:
        info = await service.get(name.strip(), scope)
    except DataError as e:
        return ToolResult(str(e), is_error=True)
    desc = await describe(info, service.limits)
    stats = [[c.name, c.type, *(desc.stats.get(c.name, {}).get(key, "") for key, _ in STATS)]
             for c in info.columns]
    return ToolResult(description_text(desc), details={
        "dataset": info.name, "rows": info.rows,
        "table": {"columns": ["column", "type", *(label for _, label in STATS)],
                  "rows": stats, "truncated": False}})


@tool
async def run_sql(ctx: ToolContext, sql: str) -> ToolResult:
    """Run one read-only SQL query (DuckDB dialect) over the datasets; each dataset is a table
    of the same name. One SELECT only (WITH, VALUES, DESCRIBE and SUMMARIZE are fine); files
    and changes are not allowed. You see at most 100 rows: aggregate (GROUP BY) or add a
    LIMIT for big results.

    Args:
        sql: The query, e.g. SELECT region, sum(amount) AS total FROM sales GROUP BY 1.
    """
    service, scope = await _service(ctx)
    from pluto.runtime.data import DataError, format_table

    csv_path = service.artifact(ctx.run_id, "result", ".csv")
    try:
        result = await service.query(sql, scope, max_rows=MODEL_ROWS, csv_path=csv_path)
    except DataError as e:
        with contextlib.suppress(OSError):
            csv_path.parent.rmdir()  # only when empty: no half-made artifacts
        return _failed(e, "The query")
    await service.publish(csv_path)  # so that every instance serves it (logged if it cannot)
    return ToolResult(format_table(result, MODEL_BYTES), details={
        "table": table_details(result), "csv": str(csv_path), "sql": sql,
        "row_count": result.total_rows})


@tool
async def make_chart(ctx: ToolContext, sql: str,
                     kind: Literal["bar", "line", "scatter", "histogram", "pie"],
                     x: str | None = None, y: list[str] | None = None,
                     group: str | None = None, title: str = "") -> ToolResult:
    """Draw a chart of a query's result as an image, shown to the user with your answer.
    Write the query so it returns exactly what to draw (aggregate first; order the rows).

    Args:
        sql: One read-only SELECT, as for run_sql.
        kind: bar, line, scatter, histogram (of one numeric column) or pie.
        x: The column for the x axis (or the pie's labels); default: the first text column.
        y: The numeric column(s) to plot; default: every numeric column but x.
        group: A column whose values become separate series (lines, bar groups, colours).
        title: The chart's title.
    """
    service, scope = await _service(ctx, "chart")
    from pluto.runtime.data import DataError, format_table
    from pluto.runtime.data.chart import draw, plan

    try:
        result = await service.query(sql, scope, max_rows=CHART_ROWS)
        chosen = plan(result, kind, x, y, group)
        path = service.artifact(ctx.run_id, "chart", ".png")
        summary = await asyncio.to_thread(draw, result, chosen, path, title.strip(),
                                          service.data_dir / "cache" / "matplotlib")
    except DataError as e:
        return _failed(e, "The chart")
    await service.publish(path)  # so that every instance serves it (logged if it cannot)
    cut = f" Only the first {CHART_ROWS:,} rows were drawn." if result.truncated else ""
    return ToolResult(
        f"Drew a {summary}.{cut} The image is sent to the user with your answer: describe "
        f"what it shows, do not link to it.\nThe data drawn:\n{format_table(result, 2000)}",
        details={"image": str(path), "title": title.strip() or summary})


from pluto.runtime.python.tool import run_python  # noqa: E402 - Python in the sandbox (issue 34)

DATA_TOOLS: dict[str, Tool] = {t.name: t for t in (list_datasets, describe_dataset, run_sql,
                                                    make_chart, run_python)}
