"""The gateway's secrets kept from other processes (docs/security.md).

At ``pluto serve`` and ``pluto chat`` start, :func:`protect` does two things:

- ``prctl(PR_SET_DUMPABLE, 0)`` (through ctypes): the gateway's ``/proc/<pid>/environ``,
  ``mem`` and ``maps`` become unreadable to the other processes of its user, and they cannot
  ptrace it. Root (CAP_SYS_PTRACE) still can: stdio MCP servers therefore also run inside
  bubblewrap (:mod:`pluto.runtime.mcp.sandbox`).
- every secret variable (those pluto.yaml names, and any ``*_KEY``, ``*_KEYS``, ``*_TOKEN``,
  ``*_SECRET``, ``*_PASSWORD`` or ``DATABASE_URL``) is removed from the process environment
  that children inherit (``os.unsetenv``). The gateway keeps reading them from its own copy
  (``os.environ``, a Python dict filled at start), so nothing else changes; a child started
  without an explicit environment (most already get one) inherits none of them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Iterable

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
SECRET_SUFFIXES = ("_KEY", "_KEYS", "_TOKEN", "_SECRET", "_PASSWORD")


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``; False where there is no prctl (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError) as e:
        log.warning("the gateway could not make its /proc entries private (prctl: %s)", e)
        return False


def secret_names(configured: Iterable[str] = ()) -> list[str]:
    """The variables treated as secrets: those named by pluto.yaml and the well-known kinds."""
    names = {n for n in configured if n}
    names |= {n for n in os.environ if n.endswith(SECRET_SUFFIXES) or n == "DATABASE_URL"}
    return sorted(names)


def hide_from_children(names: Iterable[str]) -> list[str]:
    """Remove ``names`` from the environment children inherit, keeping them in ``os.environ``
    for the gateway itself; the names removed."""
    hidden = []
    for name in names:
        if name in os.environ:
            os.unsetenv(name)  # the C environment only: os.environ keeps its copy
            hidden.append(name)
    return hidden


def protect(configured: Iterable[str] = ()) -> None:
    """Both protections, at the start of a serving command."""
    private = make_undumpable()
    hidden = hide_from_children(secret_names(configured))
    log.debug("secrets: /proc entries private: %s; %d variables hidden from children",
              private, len(hidden))
