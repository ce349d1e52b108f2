"""``pluto routes check`` and ``pluto routes explain``: the routing table, read offline."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from pluto.agents.registry import AgentRegistry
from pluto.errors import ConfigError
from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from pluto.gateway.pipeline.explain import explain, message_from, unreachable
from pluto.gateway.reload import load_routes
from pluto.gateway.schedules.config import load_schedules
from pluto.runtime.catalog import standard_tools
from pluto.settings import PlutoConfig
from pluto.storage.sql.pairing import approved_sync


def routes_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    registry = AgentRegistry(args.config / "agents", data_dir / "agents",
                             key_envs=config.agents.api_key_envs,
                             known_tools=standard_tools().keys())
    try:
        table = load_routes(args.config, registry)
    except ConfigError as e:
        _print_problems(e.problems)
        return EXIT_CONFIG
    if args.routes_command == "check":
        problems = [p for e in registry.check_all() for p in e.problems]
        try:  # schedules.yaml too: its agents, expressions and zones
            load_schedules(args.config, set(registry.names()))
        except ConfigError as e:
            problems += e.problems
        if problems:
            _print_problems(problems)
            return EXIT_CONFIG
        for warning in unreachable(table):
            print(f"warning: {warning}", file=sys.stderr)
        default = f"default agent '{table.spec.default}'" if table.spec.default else "no default"
        print(f"ok: {table.source}: {len(table.spec.routes)} rule(s), {default}; "
              f"{len(registry.names())} agent(s) checked")
        return EXIT_OK
    if unknown := _unknown_provider(args.provider, config):
        print(f"warning: {unknown}", file=sys.stderr)
    m = message_from(args.provider, args.chat, args.user, group=args.group, mention=args.mention,
                     thread=args.thread, guild=args.guild, text=args.text)
    result = explain(table, m)
    approved = None
    if result.decision.policy.access == "pairing":
        approved = approved_sync(data_dir / "pluto.db", m.provider, m.user_id)
    print(result.text(approved=approved, refusal=config.access.refusal))
    return EXIT_OK if result.answered else EXIT_FAILED


def _unknown_provider(name: str, config: PlutoConfig) -> str | None:
    """A provider that is neither in pluto.yaml nor the terminal (a typo, most likely)."""
    from pluto.gateway.provider_registry import declared

    known = sorted({"cli", *config.providers})
    if name in known:
        return None
    if name in declared():  # installed, just not set up here
        return (f"the provider '{name}' is not in pluto.yaml (configured: "
                f"{', '.join(known)}). Explaining it anyway.")
    close = difflib.get_close_matches(name, sorted({*known, *declared()}), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return (f"no provider named '{name}' in pluto.yaml (configured: {', '.join(known)}){hint} "
            "Explaining it anyway.")


def _print_problems(problems: list[tuple[str, int | None, str, str]]) -> None:
    print("pluto: the configuration has errors:", file=sys.stderr)
    for line in str(ConfigError(problems)).splitlines():
        print(f"  {line}", file=sys.stderr)
