"""Example secrets left in place: accepted on a loopback address (trying things out), refused
by ``pluto serve`` anywhere else and reported by ``pluto doctor``.

A deployment file or a guide shows values like ``change-me-to-32-or-more-characters-please``;
one that reaches a public gateway signs every visitor's session (and chart links) with a key
anyone can read on GitHub. The secrets looked at are those pluto.yaml names (``*_env``) and
the well-known ones whose names it may leave to their defaults.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import TYPE_CHECKING

from pluto.errors import ConfigError

if TYPE_CHECKING:
    from pluto.settings import PlutoConfig

# the defaults of providers.web.session_secret_env, providers.api.keys_env, admin.api_key_env
WELL_KNOWN = ("PLUTO_WEB_SECRET", "PLUTO_API_KEYS", "PLUTO_ADMIN_KEY")
_PLACEHOLDER = re.compile(r"change.?me|replace.?me|your.?secret|placeholder|x{8,}", re.I)


def looks_like_placeholder(value: str) -> bool:
    """Whether a secret's value is an example from a file or a guide, not a real secret."""
    return bool(_PLACEHOLDER.search(value))


def loopback(host: str) -> bool:
    """Whether a bind address reaches only this machine (``localhost``, 127.0.0.0/8, ::1)."""
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or 0.0.0.0 / :: as ""): reachable from elsewhere


def placeholder_secrets(config: PlutoConfig) -> list[str]:
    """The names of the secret variables that hold an example value."""
    names = dict.fromkeys([*config.secret_names(), *WELL_KNOWN])
    names.pop(config.storage.url_env, None)  # a URL, whose password may read like anything
    return [n for n in names if looks_like_placeholder(os.environ.get(n, ""))]


def refusal(config: PlutoConfig, host: str) -> str | None:
    """One sentence when the gateway would listen on ``host`` with an example secret, else None."""
    found = placeholder_secrets(config)
    if not found or loopback(host):
        return None
    which = ", ".join(f"${n}" for n in found)
    return (f"{which} {'holds an example value' if len(found) == 1 else 'hold example values'} "
            f"and the gateway would listen on {host or 'every address'}: set "
            f"{'it' if len(found) == 1 else 'each'} to a random secret (openssl rand -hex 32), "
            "as example values are accepted only on 127.0.0.1")


def refuse_off_loopback(config: PlutoConfig, host: str) -> None:
    """Raise a :class:`ConfigError` (``pluto serve`` exits 2) for :func:`refusal`."""
    if (why := refusal(config, host)) is not None:
        raise ConfigError([("environment", None, "", why)])
