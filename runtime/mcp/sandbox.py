"""Where a stdio MCP server runs: inside bubblewrap, out of the gateway's reach.

A stdio server is a program of the agent author's choosing that runs as the gateway's own user.
Unconfined, it could read ``/proc/<gateway pid>/environ`` (the admin key, API keys, bot tokens)
— root can even when the gateway made itself undumpable (:mod:`pluto.gateway.secrecy`). So
each one is started through ``bwrap`` (Debian's ``bubblewrap``) in PID, IPC and UTS namespaces
of its own with a fresh ``/proc``: the gateway's process is not there to read. Its environment
is only what the MCP SDK passes on (a few safe variables: PATH, HOME, LANG…) plus the variables
its ``env:`` names; the filesystem is the user's as before (``--bind / /``).

Without bwrap (:func:`bwrap_path` is None) a server runs as a plain child, with a warning in the
log and a line from ``pluto doctor``; ``sandbox: false`` in agent.yaml asks for that on purpose.
"""

from __future__ import annotations

import functools
import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

MISSING = ("bubblewrap (bwrap) is not installed, so stdio MCP servers run unconfined and could "
           "read the gateway's secrets as root: apt-get install bubblewrap")


@functools.cache
def bwrap_path() -> str | None:
    """The bwrap executable, if installed (looked up once per process)."""
    return shutil.which("bwrap")


def sandboxed(command: str, args: list[str], cwd: Path | None) -> tuple[str, list[str]]:
    """The command line that runs ``command args`` inside bwrap (bwrap must be installed)."""
    bwrap = bwrap_path()
    assert bwrap is not None
    options = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    if cwd is not None:
        options += ["--chdir", str(cwd)]
    return bwrap, [*options, "--", command, *args]


_warned: set[str] = set()


def warn_unconfined(name: str) -> None:
    """Once per server and process: it runs without the sandbox because bwrap is missing."""
    if name not in _warned:
        _warned.add(name)
        log.warning("mcp %s: %s", name, MISSING)
