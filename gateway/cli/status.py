"""``pluto status`` (is a gateway running here: its providers, sessions, runs in progress, the
last errors) and ``pluto logs`` (``pluto.log`` in the data dir, ``-f`` to follow)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.gateway.cli.doctor import PROBE_TIMEOUT, _short
from pluto.gateway.cli.exits import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from pluto.settings import PlutoConfig

LOG_FILE = "pluto.log"


def status_command(args: argparse.Namespace, config: PlutoConfig, data_dir: Path) -> int:
    host = getattr(args, "host", None) or config.http.host
    port = config.http.port if getattr(args, "port", None) is None else args.port
    report: dict[str, Any] = {"gateway": _ready(host, port), "data_dir": str(data_dir)}
    report |= asyncio.run(_activity(config, data_dir))
    report["last_errors"] = last_errors(data_dir / LOG_FILE)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return EXIT_OK
    gw = report["gateway"]
    if gw.get("running"):
        providers = ", ".join(f"{n} ({s})" for n, s in gw.get("providers", {}).items()) or "none"
        print(f"gateway: running at {gw['url']} ({gw.get('status')}); providers: {providers}")
    else:
        elsewhere = "" if getattr(args, "port", None) is not None else (
            " (started with --port? then: pluto status --port N)")
        print(f"gateway: not running at {gw['url']} ({gw.get('why')}){elsewhere}; start it "
              "with pluto serve")
    print(f"data dir: {data_dir}")
    if "storage_error" in report:
        print(f"storage: {report['storage_error']}")
    else:
        print(f"sessions: {report['sessions']:,}; runs: {report['runs']:,}, in progress: "
              f"{len(report['running'])}")
        for run in report["running"][:10]:
            print(f"  {run['id']}  {run['agent']}  {run['session_key']}  since "
                  f"{run['started_at']}")
    errors = report["last_errors"]
    print(f"last errors ({len(errors)}):" if errors else "last errors: none in pluto.log")
    for line in errors:
        print(f"  {line}")
    return EXIT_OK


def _ready(host: str, port: int) -> dict[str, Any]:
    if host in ("0.0.0.0", "::", ""):  # every address: this machine's is one of them
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address in a URL
    url = f"http://{host}:{port}"
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=3) as answer:
            body = json.loads(answer.read(1 << 20))
    except urllib.error.HTTPError as e:  # 503: running, not ready
        try:
            body = json.loads(e.read(1 << 20))
        except ValueError:
            return {"running": True, "url": url, "status": f"HTTP {e.code}"}
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return {"running": False, "url": url, "why": _short(reason) if not isinstance(
            reason, ConnectionRefusedError) else "nothing listens there"}
    checks = body.get("checks", {}) if isinstance(body, dict) else {}
    return {"running": True, "url": url, "status": body.get("status"),
            "instance": body.get("instance"), "providers": checks.get("providers", {})}


async def _activity(config: PlutoConfig, data_dir: Path) -> dict[str, Any]:
    from pluto.storage import store_for

    if not config.storage.url() and not (data_dir / "pluto.db").exists():
        return {"sessions": 0, "runs": 0, "running": []}
    try:
        async with asyncio.timeout(PROBE_TIMEOUT), store_for(data_dir,
                                                             config.storage.url()) as store:
            stats = await store.conversations.stats()
            running = await store.conversations.recent_runs(limit=50, status="running")
    except Exception as e:
        return {"storage_error": f"could not be read ({_short(e)}); see pluto doctor"}
    return {"sessions": stats.get("sessions", 0), "runs": stats.get("runs", 0),
            "running": running}


def last_errors(log_file: Path, count: int = 5, scan_bytes: int = 2 * 2**20) -> list[str]:
    """The last ERROR/CRITICAL lines of the log (its last ``scan_bytes`` only)."""
    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - scan_bytes))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    found = [line for line in tail if " ERROR " in line or " CRITICAL " in line]
    return [line[:300] for line in found[-count:]]


# ---- logs --------------------------------------------------------------------------------


def _rotated(path: Path, f: Any) -> bool:
    """Whether ``path`` is now another file than the one ``f`` reads (the log was rotated)."""
    try:
        return os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
    except FileNotFoundError:  # (between the rename and the new file)
        return False


def logs_command(args: argparse.Namespace, data_dir: Path) -> int:
    path = data_dir / LOG_FILE
    if not path.is_file():
        print(f"pluto logs: no {path} yet (it is written once pluto runs with this data dir)",
              file=sys.stderr)
        return EXIT_FAILED
    with open(path, "rb") as f:
        for line in deque(f, maxlen=max(0, args.lines)):
            sys.stdout.write(line.decode("utf-8", "replace"))
        sys.stdout.flush()
        if not args.follow:
            return EXIT_OK
        try:
            while True:
                line = f.readline()
                if line:
                    sys.stdout.write(line.decode("utf-8", "replace"))
                    sys.stdout.flush()
                    continue
                if _rotated(path, f):  # pluto.log -> pluto.log.1: follow the new pluto.log
                    f.close()
                    f = open(path, "rb")  # noqa: SIM115 - (closed at exit, as the first)
                elif path.stat().st_size < f.tell():  # truncated: start over
                    f.seek(0)
                time.sleep(0.25)
        except (KeyboardInterrupt, BrokenPipeError):
            return EXIT_OK
