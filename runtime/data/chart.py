"""Charts of a query result, drawn to PNG with matplotlib (imported on first use, Agg backend,
no pyplot: safe to call from a worker thread)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from .child import DataError, cell_text
from .format import is_numeric_type
from .sandbox import QueryResult

ChartKind = Literal["bar", "line", "scatter", "histogram", "pie"]
KINDS: tuple[str, ...] = ("bar", "line", "scatter", "histogram", "pie")
MAX_BARS = 60
MAX_SLICES = 20
MAX_SERIES = 12
SIZE = (9.0, 5.0)  # inches, at 100 dpi: 900 x 500 pixels
DPI = 100


class ChartError(DataError):
    """The result cannot be drawn as asked (the message says what to change)."""


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str
    x: str | None
    ys: tuple[str, ...]
    group: str | None


def plan(result: QueryResult, kind: str, x: str | None = None,
         y: Sequence[str] | None = None, group: str | None = None) -> Plan:
    """Which columns go where; an error the model can act on when they do not fit."""
    if kind not in KINDS:
        raise ChartError(f"Unknown chart kind {kind!r}; use one of {', '.join(KINDS)}.")
    if not result.rows:
        raise ChartError("The query returned no rows, so there is nothing to draw.")
    names = list(result.columns)
    for column in [x, group, *(y or [])]:
        if column is not None and column not in names:
            raise ChartError(f"There is no column {column!r} in the result; its columns are: "
                             f"{', '.join(names)}.")
    numeric = [n for n, t in zip(names, result.column_types) if is_numeric_type(t)]
    if kind == "histogram":
        value = (y[0] if y else None) or (x if x in numeric else None) or next(iter(numeric), None)
        if value is None or value not in numeric:
            raise ChartError("A histogram needs a numeric column; "
                             f"{value or 'the result has none'} is not one.")
        return Plan(kind, None, (value,), None)
    x = x or next((n for n in names if n not in numeric), names[0])
    ys = tuple(y or [n for n in numeric if n not in (x, group)])
    if kind == "pie" or group:
        ys = ys[:1]
    if not ys:
        raise ChartError(f"There is no numeric column to plot against {x}; the columns are: "
                         f"{', '.join(f'{n} ({t})' for n, t in zip(names, result.column_types))}.")
    if bad := [c for c in ys if c not in numeric]:
        raise ChartError(f"Column {bad[0]} is not numeric; cast it in SQL or choose another.")
    return Plan(kind, x, ys, group)


def draw(result: QueryResult, chosen: Plan, path: Path, title: str = "",
         config_dir: Path | None = None) -> str:
    """Draw the chart to `path` (PNG); returns one line saying what was drawn."""
    if config_dir is not None:  # matplotlib's font cache, where the gateway may write
        os.environ.setdefault("MPLCONFIGDIR", str(config_dir))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    column = {n: i for i, n in enumerate(result.columns)}
    rows = result.rows
    match chosen.kind:
        case "histogram":
            summary = _histogram(ax, rows, column[chosen.ys[0]], chosen.ys[0])
        case "pie":
            summary = _pie(ax, rows, column[chosen.x], column[chosen.ys[0]])  # type: ignore[index]
        case _:
            summary = _series(ax, fig, chosen, rows, column)
    if title:
        ax.set_title(_safe(title))
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    except OSError as e:  # the model hears why, never where: no server path
        tmp.unlink(missing_ok=True)
        raise ChartError(f"The chart could not be saved on the server "
                         f"({e.strerror or type(e).__name__}); try again later.") from None
    return summary


def _series(ax: Any, fig: Any, chosen: Plan, rows: Sequence[Sequence[Any]],
            column: dict[str, int]) -> str:
    xi = column[chosen.x]  # type: ignore[index]
    lines: dict[str, tuple[list[Any], list[float]]] = {}
    for row in rows:
        for y in chosen.ys:
            value = _number(row[column[y]])
            if value is None or row[xi] is None:
                continue
            label = cell_text(row[column[chosen.group]]) if chosen.group else y
            xs, vs = lines.setdefault(label, ([], []))
            xs.append(row[xi] if chosen.kind != "bar" else cell_text(row[xi]))
            vs.append(value)
    if not lines:
        raise ChartError("Every value to plot is NULL; there is nothing to draw.")
    if len(lines) > MAX_SERIES:
        raise ChartError(f"That makes {len(lines)} series; at most {MAX_SERIES} can be read. "
                         "Group fewer values or filter.")
    if chosen.kind == "bar":
        return _bars(ax, lines, chosen)
    for label, (xs, vs) in lines.items():
        xs = [_plain_x(v) for v in xs]
        if chosen.kind == "line":
            ax.plot(xs, vs, marker="o" if len(xs) <= 40 else None, label=_safe(label))
        else:
            ax.scatter(xs, vs, s=14, alpha=0.75, label=_safe(label))
    _axes(ax, chosen, len(lines))
    if any(isinstance(v, date) for xs, _ in lines.values() for v in xs[:1]):
        fig.autofmt_xdate()
    points = sum(len(vs) for _, vs in lines.values())
    return f"{chosen.kind} chart of {', '.join(lines)} by {chosen.x} ({points} points)"


def _bars(ax: Any, lines: dict[str, tuple[list[Any], list[float]]],
          chosen: Plan) -> str:
    categories = list(dict.fromkeys(c for xs, _ in lines.values() for c in xs))
    if len(categories) > MAX_BARS:
        raise ChartError(f"That makes {len(categories)} bars; at most {MAX_BARS} can be read. "
                         "Aggregate, filter or add a LIMIT.")
    width = 0.8 / len(lines)
    for n, (label, (xs, vs)) in enumerate(lines.items()):
        at = {c: v for c, v in zip(xs, vs)}
        offsets = [i - 0.4 + width * (n + 0.5) for i in range(len(categories))]
        ax.bar(offsets, [at.get(c, 0.0) for c in categories], width, label=_safe(label))
    ax.set_xticks(range(len(categories)), [_safe(c) for c in categories])
    if len(categories) > 8 or max(len(c) for c in categories) > 10:
        for tick in ax.get_xticklabels():
            tick.set_rotation(45)
            tick.set_horizontalalignment("right")
    _axes(ax, chosen, len(lines))
    return f"bar chart of {', '.join(lines)} by {chosen.x} ({len(categories)} bars)"


def _axes(ax: Any, chosen: Plan, series: int) -> None:
    ax.set_xlabel(_safe(chosen.x or ""))
    ax.set_ylabel(_safe(chosen.ys[0] if len(chosen.ys) == 1 else ""))
    ax.grid(True, alpha=0.3)
    if series > 1:
        ax.legend(title=_safe(chosen.group) if chosen.group else None)


def _histogram(ax: Any, rows: Sequence[Sequence[Any]], index: int, name: str) -> str:
    values = [v for v in (_number(r[index]) for r in rows) if v is not None]
    if not values:
        raise ChartError(f"Every value of {name} is NULL; there is nothing to draw.")
    bins = max(5, min(40, int(len(values) ** 0.5)))
    ax.hist(values, bins=bins, edgecolor="white")
    ax.set_xlabel(_safe(name))
    ax.set_ylabel("count")
    ax.grid(True, alpha=0.3)
    return f"histogram of {name} ({len(values)} values, {bins} bins)"


def _pie(ax: Any, rows: Sequence[Sequence[Any]], label_index: int, value_index: int) -> str:
    read = [(cell_text(r[label_index]), _number(r[value_index])) for r in rows]
    pairs = [(label, v) for label, v in read if v is not None]
    if len(pairs) > MAX_SLICES:
        raise ChartError(f"That makes {len(pairs)} slices; at most {MAX_SLICES} can be read. "
                         "Keep the largest and group the rest.")
    if not pairs or any(v < 0 for _, v in pairs) or sum(v for _, v in pairs) <= 0:
        raise ChartError("A pie chart needs positive values.")
    ax.pie([v for _, v in pairs], labels=[_safe(label) for label, _ in pairs],
           autopct="%1.0f%%", startangle=90, counterclock=False)
    ax.axis("equal")
    return f"pie chart of {len(pairs)} slices"


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float, Decimal)):
        return float(value)
    return None


def _plain_x(value: Any) -> Any:
    """What matplotlib can place on an axis: numbers and dates as they are, else text."""
    if isinstance(value, Decimal):
        return float(value)
    return value if isinstance(value, (int, float, date)) else cell_text(value)


def _safe(text: str) -> str:
    """Text matplotlib shows as it is: '$' would start mathtext."""
    return str(text).replace("$", r"\$")
