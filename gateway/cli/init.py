"""``pluto init [DIR]``: a working configuration from the example the package carries.

It never overwrites: a directory that holds a configuration already is left alone. The model
comes from ``--model``/``--api-base`` or, on a terminal, from a question; the key is never a
flag (it would show in ``ps`` and the shell's history): on a terminal it is asked for and kept in
``DIR/.env`` (mode 600, read by every ``pluto`` command for variables not set already),
otherwise it is read from ``PLUTO_API_KEY`` when the gateway runs.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from pluto.gateway.cli.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK

ENV_FILE = ".env"
CONFIG_FILES = ("pluto.yaml", "routes.yaml")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def add_parser(subs: Any) -> argparse.ArgumentParser:
    init = subs.add_parser("init", help="write a working configuration (never overwrites)")
    init.add_argument("dir", nargs="?", type=Path, default=None, metavar="DIR",
                      help="where (default: --config, $PLUTO_CONFIG or ./config)")
    init.add_argument("--model", help="a litellm model string, e.g. openai/gpt-4o-mini "
                      "(default: asked on a terminal, else offline)")
    init.add_argument("--api-base", metavar="URL",
                      help="an OpenAI-compatible server, e.g. http://127.0.0.1:11434/v1")
    return init


def example_dir() -> Path:
    """The example configuration: in the installed package, or in a source checkout."""
    import pluto

    here = Path(pluto.__file__).resolve().parent
    for candidate in (here / "config", here.parent / "config"):
        if (candidate / "pluto.yaml").is_file():
            return candidate
    raise FileNotFoundError("the example configuration is missing from this installation")


def init_command(args: argparse.Namespace) -> int:
    target: Path = args.dir or args.config
    taken = [name for name in CONFIG_FILES if (target / name).exists()]
    if taken:
        print(f"pluto init: {target} already holds a configuration ({', '.join(taken)}); "
              "nothing was changed. Edit it, or choose another directory.", file=sys.stderr)
        return EXIT_CONFIG
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    model, api_base = args.model, args.api_base
    key = None
    if interactive and model is None:
        model, api_base, key = _ask(api_base)
    try:
        source = example_dir()
        target.mkdir(parents=True, exist_ok=True)
        _copy(source, target)
        _choose_model(target / "pluto.yaml", model or "offline", api_base)
        if key:
            _write_env(target / ENV_FILE, {"PLUTO_API_KEY": key})
    except OSError as e:
        print(f"pluto init: could not write {target}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    flag = "" if target == Path("config") else f" --config {target}"
    print(f"Wrote {target}/: pluto.yaml, routes.yaml and agents/ (model: {model or 'offline'}"
          f"{f' at {api_base}' if api_base else ''}).")
    if key:
        print(f"The API key is in {target / ENV_FILE} (readable by you only).")
    elif (model or "offline") != "offline":
        print("Set the model's key before starting: export PLUTO_API_KEY=...")
    print(f"Next: pluto doctor{flag}   (checks everything), then pluto chat{flag}")
    return EXIT_OK


def _ask(api_base: str | None) -> tuple[str, str | None, str | None]:
    print("Which model? A litellm model string such as openai/gpt-4o-mini or "
          "anthropic/claude-sonnet-4-5, openai/<name> for an OpenAI-compatible server, or "
          "'offline' (no model: the data commands still work).")
    model = input("model [offline]: ").strip() or "offline"
    key = None
    if model != "offline":
        if model.startswith("openai/") and api_base is None:
            api_base = input("API base URL (empty: the provider's own) []: ").strip() or None
        key = getpass.getpass("API key (empty: set PLUTO_API_KEY yourself) []: ").strip() or None
    return model, api_base, key


def _copy(source: Path, target: Path) -> None:
    """The example's files that are not in `target` yet (never one that is)."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if "__pycache__" in relative.parts or path.name == "__init__.py":
            continue
        dest = target / relative
        if path.is_dir():
            dest.mkdir(exist_ok=True)
        elif not dest.exists():
            shutil.copyfile(path, dest)


def _choose_model(pluto_yaml: Path, model: str, api_base: str | None) -> None:
    """Make `model` (and `api_base`) the defaults in the example's ``${PLUTO_MODEL:-…}``, so the
    environment can still override them."""
    text = pluto_yaml.read_text(encoding="utf-8")
    text = text.replace("${PLUTO_MODEL:-offline}", "${PLUTO_MODEL:-" + _plain(model) + "}", 1)
    if api_base:
        text = text.replace("${PLUTO_API_BASE:-}", "${PLUTO_API_BASE:-" + _plain(api_base) + "}",
                            1)
    pluto_yaml.write_text(text, encoding="utf-8")


def _plain(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_./:@+\-]+", value):
        raise OSError(f"{value!r} has characters that cannot go in pluto.yaml as they are")
    return value


def _write_env(path: Path, values: dict[str, str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("# Secrets for this configuration; every pluto command reads them.\n")
        for name, value in values.items():
            f.write(f"{name}={value}\n")


def load_env_file(config_dir: Path) -> list[str]:
    """Set the variables of ``config_dir/.env`` that the environment does not set already;
    the names set."""
    path = config_dir / ENV_FILE
    try:
        if not path.is_file() or path.stat().st_size > 64 * 1024:
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    added = []
    for line in lines:
        m = _ENV_LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        name, value = m.group(1), m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if name not in os.environ:
            os.environ[name] = value
            added.append(name)
    return added
