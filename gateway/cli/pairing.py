"""``pluto pairing approve|list|revoke``: works on the data dir, with or without a gateway."""

from __future__ import annotations

import argparse
import datetime
import getpass
import sys
from pathlib import Path

from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from pluto.settings import PlutoConfig
from pluto.storage import store_for
from pluto.storage.rows import PairingError, format_code


async def pairing_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    """The ``pluto pairing`` command: works on the data dir, with or without a running gateway."""
    store = store_for(data_dir)
    await store.open()
    try:
        pairing = store.pairing
        match args.pairing_command:
            case "approve":
                try:
                    a = await pairing.approve(args.code, by=f"cli:{_whoami()}")
                except PairingError as e:
                    print(f"pluto pairing approve: {e}", file=sys.stderr)
                    return EXIT_FAILED
                name = f" ({a.user_name})" if a.user_name else ""
                print(f"approved {a.provider} user {a.user_id}{name}")
            case "revoke":
                if not await pairing.revoke(args.provider, args.user):
                    print(f"pluto pairing revoke: {args.provider} user {args.user} was not "
                          "approved", file=sys.stderr)
                    return EXIT_FAILED
                print(f"revoked {args.provider} user {args.user}")
            case "list":
                _print_pairing(await pairing.pending(), await pairing.approved())
            case _:
                return EXIT_CONFIG
    finally:
        await store.close()
    return EXIT_OK


def _print_pairing(pending: list, approved: list) -> None:
    print("pending:" if pending else "pending: none")
    for r in pending:
        print(f"  {format_code(r.code)}\t{r.provider}\tuser {r.user_id}\t{r.user_name or ''}"
              f"\texpires {_when(r.expires_at)}")
    print("approved:" if approved else "approved: none")
    for a in approved:
        print(f"  {a.provider}\tuser {a.user_id}\t{a.user_name or ''}\t{_when(a.approved_at)}"
              f"\tby {a.approved_by}")


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _whoami() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"
