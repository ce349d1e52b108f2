"""Types are checked (issue 37): mypy over the installed package, seen as ``pluto.*``, with zero
errors — strict on the shared core (the pluto/ folder) and the two ports.

The folders are mapped into the package by pyproject's ``package-dir``, which mypy cannot
follow through an editable install, so the package is laid out here as it is installed (links
to the folders the installed package resolves to) and mypy runs on that."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
STRICT_PORTS = {"pluto.storage.ports", "pluto.gateway.ports"}


def _location(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def installed_layout(dest: Path) -> Path:
    """A folder holding ``pluto/`` as installed: the package's own folder, with each mapped
    subpackage linked in at its place. Returns the folder to give mypy as its path."""
    top = _location("pluto")
    if (top / "gateway" / "__init__.py").is_file():  # a wheel: already one tree
        return top.parent
    package = dest / "pluto"
    package.mkdir(parents=True)
    for entry in top.iterdir():
        if entry.suffix in (".py", ".pyi") or entry.name == "py.typed":
            (package / entry.name).symlink_to(entry)
    for name in PYPROJECT["tool"]["setuptools"]["package-dir"]:
        if name != "pluto":
            (package / name.split(".", 1)[1]).symlink_to(_location(name),
                                                        target_is_directory=True)
    return dest


def _strict_modules() -> set[str]:
    for override in PYPROJECT["tool"]["mypy"]["overrides"]:
        if override.get("disallow_untyped_defs"):
            return set(override["module"])
    return set()


def test_the_strict_list_names_every_module_of_the_core_and_the_ports() -> None:
    core = {"pluto"} | {f"pluto.{p.stem}" for p in (ROOT / "pluto").glob("*.py")
                        if p.stem != "__init__"}
    assert _strict_modules() == core | STRICT_PORTS


def test_the_layout_maps_every_installed_subpackage(tmp_path: Path) -> None:
    base = installed_layout(tmp_path / "tree")
    for name in PYPROJECT["tool"]["setuptools"]["packages"]:
        folder = base.joinpath(*name.split("."))
        assert folder.is_dir(), name  # (pluto.config holds data only: no __init__.py)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a cold mypy over ~210 modules, on a busy machine
def test_mypy_finds_no_errors(tmp_path: Path) -> None:
    base = installed_layout(tmp_path / "tree")
    cache = ROOT / "build" / "mypy-cache"  # build/ is ignored by git; warm runs take seconds
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"} | {"MYPYPATH": str(base)}
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(cache), "--no-color-output", "--no-error-summary", "-p", "pluto"],
        cwd=base, env=env, capture_output=True, text=True, timeout=880)
    # name the files as they are in the repository: pluto/gateway/x.py is gateway/x.py
    mapped = [n.split(".", 1)[1] for n in PYPROJECT["tool"]["setuptools"]["package-dir"]
              if n != "pluto"]
    report = re.sub(rf"^pluto/(?=(?:{'|'.join(mapped)})/)", "", out.stdout, flags=re.M)
    errors = [line for line in report.splitlines() if ": error:" in line]
    assert out.returncode == 0 and not errors, (
        f"mypy: {len(errors)} error(s)\n{report}{out.stderr}")
