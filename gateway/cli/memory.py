"""``pluto memory``: what agents remember (the Markdown files under ``<data dir>/memory``), for
admins, with or without a running gateway.

    pluto memory list [--agent NAME]                 every memory file: whose, notes, size
    pluto memory show AGENT [--user P:ID | --chat P:ID]   the file as it is now
    pluto memory diff AGENT [--user P:ID | --chat P:ID] [--rev N]   its revisions, or one's diff
    pluto memory restore AGENT [--user P:ID | --chat P:ID] REV     bring revision REV back

Without ``--user`` or ``--chat`` the agent's own notes (``long_term.scope: agent``) are meant.
A restore is itself a new revision: nothing is lost by one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from pluto.runtime.memory import Owner
    from pluto.settings import PlutoConfig


def add_parser(subs: Any) -> list[argparse.ArgumentParser]:
    memory = subs.add_parser("memory", help="what agents remember: list, show, diff, restore")
    acts = memory.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    listing = acts.add_parser("list", help="every memory file: whose, how many notes, size")
    listing.add_argument("--agent", metavar="NAME", help="only this agent's")
    show = acts.add_parser("show", help="a memory file as it is now")
    diff = acts.add_parser("diff", help="a memory file's revisions, or one revision's diff")
    diff.add_argument("--rev", type=int, metavar="N", help="the diff of revision N")
    restore = acts.add_parser("restore", help="bring an earlier revision back (as a new one)")
    for sub in (show, diff, restore):
        sub.add_argument("agent", help="the agent's name")
        whose = sub.add_mutually_exclusive_group()
        whose.add_argument("--user", metavar="PROVIDER:ID", help="a user's notes, e.g. "
                           "web:42")
        whose.add_argument("--chat", metavar="PROVIDER:ID", help="a chat's notes")
    restore.add_argument("rev", type=int, help="the revision to bring back")
    return [memory, listing, show, diff, restore]


def _owner(args: argparse.Namespace) -> Owner:
    from pluto.runtime.memory import Owner

    which = args.user or args.chat
    if which is None:
        return Owner(args.agent, "agent")
    provider, sep, ident = which.partition(":")
    if not sep or not provider or not ident:
        raise ValueError(f"'{which}' is not PROVIDER:ID (e.g. web:42)")
    return Owner(args.agent, "user" if args.user else "chat", provider, ident)


def _scope(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> str | None:
    """The agent's ``long_term.scope``: "" when it keeps none, None when it cannot be read."""
    from pluto.agents.registry import AgentRegistry
    from pluto.errors import PlutoError

    agent = getattr(args, "agent", None)
    if not agent or getattr(args, "memory_command", "") == "list":
        return None
    try:
        registry = AgentRegistry(args.config / "agents", data_dir / "agents",
                                 key_envs=config.agents.api_key_envs)
        long_term = registry.get(agent).memory.long_term
    except (PlutoError, LookupError, AttributeError):
        return None  # an agent gone or broken: its files can still be shown
    return "" if long_term is None else long_term.scope


async def memory_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    from pluto.runtime.memory import MemoryBook, SharedMemoryBook

    url = config.storage.url()
    if url:  # several instances: the notes are in the shared database
        from pluto.storage import store_for

        store = store_for(data_dir, url)
        await store.open()
        try:
            return await _act(args, SharedMemoryBook(store.notes),
                              _scope(args, config, data_dir))
        finally:
            await store.close()
    return await _act(args, MemoryBook(data_dir / "memory"), _scope(args, config, data_dir))


async def _act(args: argparse.Namespace, book: Any, scope: str | None = None) -> int:
    """``scope``: the agent's ``long_term.scope`` ("" when it keeps no notes, None unknown)."""
    from pluto.runtime.memory import MemoryRefused

    if args.memory_command == "list":
        return await _list(book, args.agent)
    try:
        owner = _owner(args)
    except ValueError as e:
        print(f"pluto memory: {e}", file=sys.stderr)
        return EXIT_CONFIG
    match args.memory_command:
        case "show":
            memory = await book.read(owner)
            if memory.problem:
                print(f"pluto memory: {owner.label()}: {memory.problem}", file=sys.stderr)
                return EXIT_FAILED
            if not memory.text:
                print(f"pluto memory: nothing is remembered for {owner.label()}"
                      f"{await _elsewhere(book, owner, scope)}", file=sys.stderr)
                return EXIT_FAILED
            sys.stdout.write(memory.text)
        case "diff":
            return await _diff(book, owner, args.rev)
        case "restore":
            try:
                memory = await book.restore(owner, args.rev, by="admin (pluto memory restore)")
            except MemoryRefused as e:
                print(f"pluto memory restore: {e}", file=sys.stderr)
                return EXIT_FAILED
            print(f"restored revision {args.rev} of {owner.label()} "
                  f"({len(memory.notes)} notes)")
        case _:
            return EXIT_CONFIG
    return EXIT_OK


async def _elsewhere(book: Any, owner: Owner, scope: str | None) -> str:
    """Where the agent's notes are instead, when the agent's own (no --user, --chat) were
    asked for: the rest of the sentence."""
    if owner.scope != "agent":
        return ""
    if scope == "":
        return f": {owner.agent} keeps no notes (no memory.long_term in its agent.yaml)"
    others = [o for o in await book.owners(owner.agent) if o.scope != "agent"]
    kept = f"it keeps notes per {scope}" if scope in ("user", "chat") else "its notes are kept"
    if not others:
        return (f"; {kept}, and none has any yet" if scope in ("user", "chat") else "")
    flag = {"user": "--user", "chat": "--chat"}
    shown = ", ".join(f"{flag[o.scope]} {o.provider}:{o.id}" for o in others[:5])
    more = f" and {len(others) - 5} more (pluto memory list --agent {owner.agent})" \
        if len(others) > 5 else ""
    return f"; {kept}: give {shown}{more}"


async def _list(book: Any, agent: str | None) -> int:
    owners = await book.owners(agent)
    if not owners:
        print("no memory files" + (f" for agent {agent}" if agent else ""))
        return EXIT_OK
    for owner in owners:
        memory = await book.read(owner)
        state = (f"UNREADABLE: {memory.problem}" if memory.problem
                 else f"{len(memory.notes)} notes, {memory.chars:,} chars")
        print(f"{owner.label()}\t{state}\t{book.where(owner)}")
    return EXIT_OK


async def _diff(book: Any, owner: Owner, rev: int | None) -> int:
    revisions = await book.revisions(owner)
    if not revisions:
        print(f"pluto memory: {owner.label()} has no revisions", file=sys.stderr)
        return EXIT_FAILED
    if rev is None:
        for r in revisions:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.at))
            print(f"{r.rev}\t{when}\t{r.op}\tby {r.by}" + (f"\t{r.why}" if r.why else ""))
        return EXIT_OK
    wanted = next((r for r in revisions if r.rev == rev), None)
    if wanted is None:
        print(f"pluto memory: no revision {rev} (1..{revisions[-1].rev})", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(wanted.diff or "(no change)\n")
    return EXIT_OK
