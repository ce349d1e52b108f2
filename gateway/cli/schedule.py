"""``pluto schedule``: the admins' side of schedules, on the data dir or the shared database.

    pluto schedule list [--all] [--json]
    pluto schedule add --agent A --to PROVIDER:CHAT (--at WHEN | --cron EXPR | --every DUR)
                       [--tz ZONE] [--thread ID] [--group] "prompt"
    pluto schedule rm ID
    pluto schedule run-now ID
    pluto schedule history [ID] [--limit N] [--json]

``WHEN`` is an ISO time (``2026-12-01 09:00``, in ``--tz``) or ``+5s``/``+2h``. A running gateway
picks a change up within 15 s (it looks at least that often); ``run-now`` makes a schedule due at
once. Schedules written in schedules.yaml are changed there, not here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from pluto.settings import PlutoConfig


def add_parser(subs: Any) -> list[argparse.ArgumentParser]:
    schedule = subs.add_parser("schedule", help="list, add, remove and run schedules; their "
                               "firings")
    acts = schedule.add_subparsers(dest="schedule_command", metavar="ACTION", required=True)
    listed = acts.add_parser("list", help="the schedules, soonest first")
    listed.add_argument("--all", action="store_true", help="also those done or cancelled")
    listed.add_argument("--json", action="store_true", help="print them as JSON")
    add = acts.add_parser("add", help="schedule an agent to speak in a chat")
    add.add_argument("--agent", required=True, metavar="NAME", help="the agent that answers")
    add.add_argument("--to", required=True, metavar="PROVIDER:CHAT",
                     help="where the answer goes: a provider of pluto.yaml and a chat id")
    add.add_argument("--thread", metavar="ID", help="a thread of that chat")
    add.add_argument("--group", action="store_true", help="the chat is a group (not direct)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", metavar="WHEN", help="once: 2026-12-01 09:00, or +5s / +2h")
    when.add_argument("--cron", metavar="EXPR", help="a cron expression, e.g. '0 9 * * 1-5'")
    when.add_argument("--every", metavar="DURATION", help="an interval, e.g. 30m or 2h")
    add.add_argument("--tz", metavar="ZONE", help="IANA time zone (default: schedules.yaml's "
                     "settings.default_tz, UTC)")
    add.add_argument("prompt", help="what the agent is asked each time")
    rm = acts.add_parser("rm", help="remove a schedule and its history")
    rm.add_argument("id")
    now = acts.add_parser("run-now", help="make a schedule due at once")
    now.add_argument("id")
    history = acts.add_parser("history", help="firings: due, fired, outcome, run")
    history.add_argument("id", nargs="?", help="one schedule's (default: all)")
    history.add_argument("--limit", type=int, default=50, help="newest N (default 50)")
    history.add_argument("--json", action="store_true", help="print them as JSON")
    return [listed, add, rm, now, history]


def _fail(message: str, code: int = EXIT_CONFIG) -> int:
    print(f"pluto schedule: {message}", file=sys.stderr)
    return code


async def schedule_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    from pluto.storage import store_for

    store = store_for(data_dir, config.storage.url())
    await store.open()
    try:
        schedules = store.schedules
        match args.schedule_command:
            case "list":
                return await _list(schedules, args)
            case "add":
                return await _add(schedules, args, config, data_dir)
            case "rm":
                if not await schedules.remove(args.id):
                    return _fail(f"there is no schedule '{args.id}' (pluto schedule list)",
                                 EXIT_FAILED)
                print(f"removed {args.id}")
                return EXIT_OK
            case "run-now":
                if not await schedules.due_now(args.id):
                    return _fail(f"there is no schedule '{args.id}' (pluto schedule list)",
                                 EXIT_FAILED)
                print(f"{args.id} is due now: a running gateway fires it within 15 s")
                return EXIT_OK
            case "history":
                return await _history(schedules, args)
    finally:
        await store.close()
    return EXIT_CONFIG


async def _list(schedules: Any, args: argparse.Namespace) -> int:
    from pluto.gateway.schedules.commands import when_text
    from pluto.gateway.schedules.recurrence import When

    rows = await schedules.list(active=not args.all)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        print("no schedules" + ("" if args.all else " (--all shows those done or cancelled)"))
        return EXIT_OK
    for r in rows:
        state = "" if r.active else "  [done]"
        print(f"{r.id}  {r.agent} -> {r.provider}:{r.chat_id}  "
              f"{When(r.kind, r.expr, r.tz).describe()}  next {when_text(r.next_due, r.tz)}"
              f"{state}\n    {r.prompt[:100]}")
    return EXIT_OK


async def _add(schedules: Any, args: argparse.Namespace, config: PlutoConfig,
               data_dir: Path) -> int:
    from pluto.agents.registry import AgentRegistry
    from pluto.errors import ConfigError
    from pluto.gateway.schedules.config import _when, load_schedules
    from pluto.gateway.schedules.recurrence import BadTime, When, parse_at, zone
    from pluto.gateway.schedules.scheduler import add_schedule
    from pluto.gateway.schedules.commands import when_text

    registry = AgentRegistry(args.config / "agents", data_dir / "agents",
                             key_envs=config.agents.api_key_envs)
    if args.agent not in registry:
        known = ", ".join(registry.names()) or "none"
        return _fail(f"--agent: unknown agent '{args.agent}' (known: {known})")
    provider, _, chat = args.to.partition(":")
    if not provider or not chat:
        return _fail(f"--to: '{args.to}' is not PROVIDER:CHAT (a provider of pluto.yaml, a "
                     "colon, a chat id)")
    try:
        tz = args.tz or load_schedules(args.config).settings.default_tz
    except ConfigError as e:
        return _fail(f"schedules.yaml has errors: {e}")
    try:
        zone(tz)
        if args.at is not None:
            when = When("at", str(parse_at(args.at, tz, await schedules.now())), tz)
        else:
            when = _when("cron" if args.cron is not None else "every",
                         args.cron if args.cron is not None else args.every, tz, 0.0)
        made = await add_schedule(
            schedules, source="admin", owner=None, provider=provider, chat_id=chat,
            thread_id=args.thread, is_direct=not args.group, agent=args.agent,
            prompt=args.prompt, when=when, created_by="cli")
    except BadTime as e:
        flag = "--tz" if "time zone" in str(e) else \
            f"--{'at' if args.at else 'cron' if args.cron else 'every'}"
        return _fail(f"{flag}: {e}")
    print(f"added {made.id}: {when.describe()}, next {when_text(made.next_due, tz)}")
    return EXIT_OK


async def _history(schedules: Any, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    firings = await schedules.history(args.id, limit=max(1, args.limit))
    if args.json:
        print(json.dumps([asdict(f) for f in firings], indent=2))
        return EXIT_OK
    if not firings:
        print("no firings yet")
        return EXIT_OK
    for f in firings:
        due = datetime.fromtimestamp(f.due, UTC).strftime("%Y-%m-%d %H:%M:%S")
        late = f.fired_at - f.due
        print(f"{f.schedule_id}  due {due} UTC  fired {late:+.1f}s  {f.outcome}"
              f"{'  run ' + f.run_id if f.run_id else ''}"
              f"{'  (' + f.detail + ')' if f.detail else ''}")
    return EXIT_OK
