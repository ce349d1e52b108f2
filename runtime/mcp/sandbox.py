"""Where a stdio MCP server runs: inside bubblewrap, out of the gateway's reach.

A stdio server is a program of the agent author's choosing that runs as the gateway's own user.
Unconfined, it could read ``/proc/<gateway pid>/environ`` (the admin key, API keys, bot tokens)
— root can even when the gateway made itself undumpable (:mod:`pluto.gateway.secrecy`). So
each one is started through ``bwrap`` (Debian's ``bubblewrap``) in PID, IPC and UTS namespaces
of its own with a fresh ``/proc``: the gateway's process is not there to read. Its environment
is only what the MCP SDK passes on (a few safe variables: PATH, HOME, LANG…) plus the variables
its ``env:`` names; the filesystem is the user's as before (``--bind / /``).

Without bwrap (:func:`bwrap_path` is None), or where it cannot create its namespaces
(:func:`usable`), a server runs as a plain child, with a warning in the log and a line from
``pluto doctor``; ``sandbox: false`` in agent.yaml asks for that on purpose.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

MISSING = ("bubblewrap (bwrap) is not installed, so stdio MCP servers run unconfined and could "
           "read the gateway's secrets as root: apt-get install bubblewrap")


@functools.cache
def bwrap_path() -> str | None:
    """The bwrap executable, if installed (looked up once per process)."""
    return shutil.which("bwrap")


_OPTIONS = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
_usable: bool | None = None
UNUSABLE = ("bubblewrap (bwrap) is installed but cannot create namespaces here (a container "
            "without them, or unprivileged user namespaces turned off), so stdio MCP servers "
            "run unconfined: allow them, or run the gateway as its own non-root user")


def usable() -> bool:
    """Whether bwrap is installed and can start a process in its namespaces here (tried once
    per process, in a few milliseconds; :meth:`McpHub.warm` tries it off the event loop)."""
    global _usable
    if _usable is None:
        bwrap = bwrap_path()
        try:
            _usable = bwrap is not None and subprocess.run(
                [bwrap, *_OPTIONS, "--", "true"], capture_output=True, timeout=10,
                env={"PATH": os.defpath}).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _usable = False
        if bwrap is not None and not _usable:
            log.warning("mcp: %s", UNUSABLE)
    return _usable


def sandboxed(command: str, args: list[str], cwd: Path | None) -> tuple[str, list[str]]:
    """The command line that runs ``command args`` inside bwrap (bwrap must be installed)."""
    bwrap = bwrap_path()
    assert bwrap is not None
    options = list(_OPTIONS)
    if cwd is not None:
        options += ["--chdir", str(cwd)]
    return bwrap, [*options, "--", command, *args]


_warned: set[str] = set()


def warn_unconfined(name: str) -> None:
    """Once per server and process: it runs without the sandbox (bwrap missing or unusable)."""
    if name not in _warned:
        _warned.add(name)
        log.warning("mcp %s: %s", name, MISSING if bwrap_path() is None else UNUSABLE)
