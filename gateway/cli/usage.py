"""``pluto usage``: what the models cost, from the usage ledger (one row per model call).

    pluto usage [--by agent|user|chat|model|route|provider|origin|day] [--since 7d|24h|today|month|DATE]
    pluto usage --budgets            each budget in pluto.yaml and who spent what of it
    pluto usage --reset user:web:42   an admin's reset of that user's budgets

Works on the data dir (or the shared database), with or without a running gateway.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from pluto.storage.sql.usage import GROUPS

if TYPE_CHECKING:
    from pluto.settings import PlutoConfig

SCOPES = ("agent", "route", "user", "chat")


def add_parser(subs: Any) -> list[argparse.ArgumentParser]:
    usage = subs.add_parser("usage", help="tokens and cost of the model calls, grouped; budgets")
    usage.add_argument("--by", choices=GROUPS, default="agent",
                       help="group by this (default: agent; user and chat are provider:id)")
    usage.add_argument("--since", metavar="WHEN",
                       help="only calls since: 30m, 24h, 7d, today, month (UTC) or a date "
                            "YYYY-MM-DD[THH:MM] in UTC (default: all)")
    usage.add_argument("--json", action="store_true", help="print it as JSON")
    usage.add_argument("--budgets", action="store_true",
                       help="the budgets of pluto.yaml and what each has spent this period")
    usage.add_argument("--reset", metavar="SCOPE:KEY",
                       help="reset the budgets of one agent, route, user or chat, e.g. "
                            "user:web:42 (what it spent so far stops counting)")
    return [usage]


async def usage_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    from pluto.runtime.usage import Prices, UsageMeter, parse_since
    from pluto.storage import store_for

    try:
        since = parse_since(args.since, time.time()) if args.since else None
    except ValueError as e:
        print(f"pluto usage: --since {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.reset is not None:
        scope, _, key = args.reset.partition(":")
        if scope not in SCOPES or not key:
            print(f"pluto usage: --reset takes SCOPE:KEY with SCOPE one of {', '.join(SCOPES)} "
                  f"(e.g. user:web:42, agent:default)", file=sys.stderr)
            return EXIT_CONFIG
    store = store_for(data_dir, config.storage.url())
    await store.open()
    try:
        meter = UsageMeter(store.usage, prices=Prices(config.usage.prices),
                           budgets=lambda: config.usage.budgets)
        if args.reset is not None:
            await meter.reset(scope, key)
            print(f"reset the budgets of {scope} {key}: what it spent until now no longer "
                  "counts")
            return EXIT_OK
        if args.budgets:
            status = await meter.status()
            print(json.dumps(status, indent=2) if args.json else _budgets_table(status))
            return EXIT_OK
        totals = await store.usage.totals(args.by, since=since)
    except Exception as e:  # a database that cannot be read: one sentence, no traceback
        print(f"pluto usage: could not read the usage ledger: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"by": args.by, "since": since,
                          "rows": [t.as_dict() for t in totals]}, indent=2))
    else:
        print(usage_table(args.by, totals))
    return EXIT_OK


def usage_table(by: str, totals: list[Any]) -> str:
    """The ledger's sums as a plain-text table, with a total line."""
    if not totals:
        return "no model calls recorded (in this period)"
    head = (by.upper(), "CALLS", "INPUT", "OUTPUT", "CACHED", "TOTAL", "COST (USD)")
    rows = [(t.key or "-", f"{t.calls:,}", f"{t.input_tokens:,}", f"{t.output_tokens:,}",
             f"{t.cached_tokens:,}", f"{t.total_tokens:,}", _cost(t.cost, t.unpriced_calls))
            for t in totals]
    rows.append(("total", f"{sum(t.calls for t in totals):,}",
                 f"{sum(t.input_tokens for t in totals):,}",
                 f"{sum(t.output_tokens for t in totals):,}",
                 f"{sum(t.cached_tokens for t in totals):,}",
                 f"{sum(t.total_tokens for t in totals):,}",
                 _cost(sum(t.cost for t in totals), sum(t.unpriced_calls for t in totals))))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in (head, *rows)]
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)


def _cost(cost: float, unpriced: int) -> str:
    text = f"${cost:,.6f}"
    return f"{text} (+{unpriced} unpriced)" if unpriced else text


def _budgets_table(status: list[dict[str, Any]]) -> str:
    if not status:
        return "no budgets (usage.budgets in pluto.yaml)"
    lines = []
    for b in status:
        limits = " / ".join(([f"{b['tokens']:,} tokens"] if b["tokens"] else [])
                            + ([f"${b['cost']:,.2f}"] if b["cost"] else []))
        only = f" (only {b['only']})" if b["only"] else ""
        lines.append(f"per {b['per']}{only}, per {b['period']}: {limits}")
        for s in b["spent"] or []:
            mark = "  OVER" if s["over"] else ""
            lines.append(f"  {s['key']}: {s['total_tokens']:,} tokens, ${s['cost']:,.6f}{mark}")
        if not b["spent"]:
            lines.append("  nothing spent this period")
    return "\n".join(lines)
