"""Pluto: a chat gateway for LLM agents.

Installed, Pluto claims this one import name: ``pluto.gateway``, ``pluto.providers``,
``pluto.agents``, ``pluto.runtime`` and ``pluto.storage`` are its layers (folders at the root of
the repository, mapped under ``pluto`` by ``pyproject.toml``), and the modules here are what
every layer shares: the core types (:mod:`pluto.types`, :mod:`pluto.events`), the errors
(:mod:`pluto.errors`) and the configuration files (:mod:`pluto.settings`, :mod:`pluto.yamldoc`).
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.2.0"


def _checkout_layers() -> None:
    """In a source checkout without an install, find the layers next to this folder.

    An editable or wheel install maps them itself; this only helps ``python -c`` in a checkout,
    and never looks outside a directory that holds Pluto's own ``pyproject.toml``.
    """
    root = Path(__file__).resolve().parent.parent
    here = Path(__file__).resolve().parent
    if (here / "gateway").is_dir() or not (root / "pyproject.toml").is_file():
        return
    if (root / "gateway" / "ports.py").is_file() and str(root) not in __path__:
        __path__.append(str(root))


_checkout_layers()
