"""The ``pluto`` command. Only argparse is imported up front, so ``pluto --help`` is fast."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path
from typing import Any

from pluto import __version__

from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "build_parser", "main"]

# Starting, a command makes some 10^5 objects that live as long as the process (modules,
# pydantic's schemas, the gateway), and CPython's cycle collector, at its default threshold
# (700), walks them over and over: ~140 collections, ~0.1 s of `pluto serve`'s start-up. Until
# the command has started, young collections come this rarely (`serve` then settles the
# collector for good, see pluto.gateway.gcpolicy; the others get the default back).
START_YOUNG = 100_000


def _common(sub: argparse.ArgumentParser, top: bool = False) -> None:
    default: Any = None if top else argparse.SUPPRESS
    sub.add_argument("--config", metavar="DIR", type=Path, default=default,
                     help="configuration directory (default: $PLUTO_CONFIG or ./config)")
    sub.add_argument("--data-dir", metavar="DIR", type=Path, default=default,
                     help="state directory (default: data_dir in pluto.yaml, ./.pluto)")
    sub.add_argument("-v", "--verbose", action="store_true", default=False if top else default,
                     help="log more (to stderr)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pluto", description="Pluto: a chat gateway for LLM agents.",
        epilog="New here? 'pluto init', then 'pluto doctor' and 'pluto chat'. Each command "
               "takes --config DIR and --data-dir DIR.")
    p.add_argument("--version", action="version", version=f"pluto {__version__}")
    _common(p, top=True)
    subs = p.add_subparsers(dest="command", metavar="COMMAND")

    chat = subs.add_parser("chat", help="chat with an agent in this terminal")
    chat.add_argument("--agent", metavar="NAME", help="talk to this agent (default: routes.yaml)")

    run = subs.add_parser("run", help="send one message, print the reply, exit (0 = answered)")
    run.add_argument("message", help="the message, or - to read it from stdin")
    run.add_argument("--agent", metavar="NAME", help="the agent to ask (default: routes.yaml)")
    run.add_argument("--session", metavar="NAME",
                     help="continue a named conversation (default: a fresh one each time)")

    serve = subs.add_parser("serve", help="run the gateway with every enabled provider")
    serve.add_argument("--host", help="HTTP bind address (default: http.host in pluto.yaml)")
    serve.add_argument("--port", type=int, help="HTTP port (default: http.port in pluto.yaml)")

    subs.add_parser("agents", help="list the agents and check their configuration")
    from pluto.gateway.cli.admin import add_parser as admin_parser  # argparse only
    from pluto.gateway.cli.data import add_parser as data_parser
    from pluto.gateway.cli.doctor import add_parsers as doctor_parsers
    from pluto.gateway.cli.init import add_parser as init_parser
    from pluto.gateway.cli.memory import add_parser as memory_parser
    from pluto.gateway.cli.schedule import add_parser as schedule_parser
    from pluto.gateway.cli.usage import add_parser as usage_parser

    for sub in (init_parser(subs), *doctor_parsers(subs), chat, run, serve,
                subs.choices["agents"], *_routes_and_pairing(subs), *data_parser(subs),
                *usage_parser(subs), *memory_parser(subs), *schedule_parser(subs),
                *admin_parser(subs)):
        _common(sub)
    return p


def _routes_and_pairing(subs: Any) -> list[argparse.ArgumentParser]:
    routes = subs.add_parser("routes", help="check routes.yaml, or explain where a message goes")
    actions = routes.add_subparsers(dest="routes_command", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate routes.yaml and the agents (exit 2 on "
                               "errors)")
    ex = actions.add_parser("explain", help="which rule, agent and session a message gets, and "
                            "why (exit 1 when it gets nothing)")
    ex.add_argument("--provider", required=True, help="the provider's name in pluto.yaml (or cli)")
    ex.add_argument("--chat", required=True, help="the chat / channel id")
    ex.add_argument("--user", required=True, help="the user id")
    ex.add_argument("--group", action="store_true", help="a group message (default: direct)")
    ex.add_argument("--mention", action="store_true", help="the message mentions the bot")
    ex.add_argument("--thread", metavar="ID", help="the thread id")
    ex.add_argument("--guild", metavar="ID",
                    help="the workspace, server or team id the platform gives")
    ex.add_argument("--text", default="", help="the message text (for text_prefix/text_regex)")
    pairing = subs.add_parser("pairing", help="approve users who asked for access by DM")
    acts = pairing.add_subparsers(dest="pairing_command", metavar="ACTION", required=True)
    approve = acts.add_parser("approve", help="approve the user who was given CODE")
    approve.add_argument("code", help="the pairing code, e.g. ABCD-2345")
    listed = acts.add_parser("list", help="pending codes and approved users")
    revoke = acts.add_parser("revoke", help="withdraw a user's approval")
    revoke.add_argument("--provider", required=True)
    revoke.add_argument("--user", required=True)
    return [check, ex, approve, listed, revoke]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return EXIT_OK
    args.config = args.config or Path(os.environ.get("PLUTO_CONFIG", "config"))
    from pluto.gateway.cli.init import init_command, load_env_file

    if args.command == "init":
        return init_command(args)
    load_env_file(args.config)  # secrets `pluto init` kept beside the configuration
    threshold = gc.get_threshold()
    gc.set_threshold(START_YOUNG, *threshold[1:])
    try:
        from pluto.gateway.cli import commands as cli_commands  # the heavy imports start here

        if args.command != "serve":  # (serve: until gcpolicy.settle(), once it is up)
            gc.set_threshold(*threshold)
        return cli_commands.dispatch(args)
    except KeyboardInterrupt:
        return 130
    finally:
        if gc.get_threshold()[0] == START_YOUNG:  # serve did not get as far as settling
            gc.set_threshold(*threshold)


if __name__ == "__main__":
    sys.exit(main())
