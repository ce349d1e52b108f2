"""``pluto admin add|list|remove``: the console's local accounts, on the data dir or the shared
database, with or without a running gateway (docs/console.md).

``pluto admin add ana --role owner`` asks for the password twice on the terminal;
``--password-stdin`` reads it from standard input instead (scripts, containers)."""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.gateway.cli.exits import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from pluto.settings import PlutoConfig


def add_parser(subs: Any) -> list[argparse.ArgumentParser]:
    admin = subs.add_parser("admin", help="the admin console's accounts: add, list, remove")
    acts = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    add = acts.add_parser("add", help="create an account (or set its role and password)")
    add.add_argument("name")
    add.add_argument("--role", default="owner",
                     choices=["viewer", "operator", "admin", "owner"])
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from standard input")
    listed = acts.add_parser("list", help="the accounts and their roles")
    remove = acts.add_parser("remove", help="delete an account and sign it out everywhere")
    remove.add_argument("name")
    return [add, listed, remove]


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the two passwords differ")
    return first


async def admin_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    from pluto.gateway.console.accounts import (AccountError, check_name, check_role,
                                                hash_password)
    from pluto.storage import store_for

    store = store_for(data_dir, config.storage.url())
    await store.open()
    try:
        console = store.console
        match args.admin_command:
            case "add":
                try:
                    name, role = check_name(args.name), check_role(args.role)
                    hashed = await hash_password(_password(args))
                except (AccountError, ValueError) as e:
                    print(f"pluto admin add: {e}", file=sys.stderr)
                    return EXIT_FAILED
                existed = await console.account(name) is not None
                await console.put_account(name, role, password_hash=hashed)
                await console.audit(f"cli:{_whoami()}", "owner", "pluto admin add",
                                    f"account {name}", diff=f"role: {role} (password set)")
                print(f"{'updated' if existed else 'added'} {name} ({role}); sign in at "
                      "/console/")
            case "list":
                accounts = await console.accounts()
                for a in accounts:
                    print(f"{a.username}\t{a.role}\t{a.source}"
                          + ("\tdisabled" if a.disabled else ""))
                if not accounts:
                    print("no accounts: pluto admin add NAME --role owner")
            case "remove":
                if not await console.remove_account(args.name):
                    print(f"pluto admin remove: no account {args.name!r}", file=sys.stderr)
                    return EXIT_FAILED
                await console.audit(f"cli:{_whoami()}", "owner", "pluto admin remove",
                                    f"account {args.name}", diff="removed")
                print(f"removed {args.name}")
    finally:
        await store.close()
    return EXIT_OK


def _whoami() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"
