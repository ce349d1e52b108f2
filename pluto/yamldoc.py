"""YAML files that admins edit: loaded with line numbers, validated into pydantic models, and
every error reported as ``file:line: field: what was expected``.

Environment interpolation: a string value may contain ``${NAME}`` or ``${NAME:-default}``; it is
replaced from the environment when the file is loaded. Secrets are never interpolated into
models (they are named by ``*_env`` fields and read when needed), so they never sit in config
objects that could be logged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from pluto.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: str, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env

    def sub(m: re.Match[str]) -> str:
        return env.get(m.group(1)) or (m.group(2) or "")

    return _ENV_REF.sub(sub, value)


class YamlDoc:
    """A parsed YAML document that remembers where each value was written."""

    def __init__(self, path: Path, text: str | None = None):
        self.path = path
        self.name = str(path)
        try:
            text = path.read_text(encoding="utf-8") if text is None else text
        except FileNotFoundError:
            raise ConfigError([(self.name, None, "", "file not found")]) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError([(self.name, None, "", f"cannot read the file ({e})")]) from None
        try:
            self.node = yaml.compose(text, Loader=yaml.SafeLoader)
            if self.node is not None:
                _expanded_size(self.node, {}, set())
            self.data = _construct(self.node)
        except RecursionError:
            raise ConfigError([(self.name, None, "", "the YAML is nested too deeply")]) from None
        except _TooBig as e:
            raise ConfigError([(self.name, e.line, "", str(e))]) from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            reason = getattr(e, "problem", None) or str(e)
            context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
            if context and cmark is not None:
                reason = f"{reason} ({context} started on line {cmark.line + 1})"
            raise ConfigError([(self.name, line, "", f"invalid YAML: {reason}")]) from None

    def line_of(self, loc: tuple[Any, ...]) -> int | None:
        """The line of the value at ``loc`` (a pydantic error location), or of its nearest parent."""
        node, line = self.node, None
        if node is not None:
            line = node.start_mark.line + 1
        for key in loc:
            if isinstance(node, yaml.MappingNode):
                nxt = next((v for k, v in node.value if k.value == str(key)), None)
                if nxt is None:
                    break
                line = next(k for k, v in node.value if v is nxt).start_mark.line + 1
                node = nxt
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
                if key >= len(node.value):
                    break
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def validate(self, model: type[M], *, data: Any = None, context: dict | None = None) -> M:
        data = self.data if data is None else data
        if data is None:
            data = {}
        try:
            return model.model_validate(_interpolate_tree(data), context=context)
        except ValidationError as e:
            raise self.error_from(e) from None

    def error_from(self, e: ValidationError) -> ConfigError:
        problems = []
        for err in e.errors():
            loc = tuple(err["loc"])
            field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc)
            field = field.replace(".[", "[")
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling)"
            elif err["type"] == "missing":
                msg = "required field is missing"
            problems.append((self.name, self.line_of(loc), field, msg))
        return ConfigError(problems)

    def problem(self, loc: tuple[Any, ...], message: str) -> ConfigError:
        field = ".".join(str(p) for p in loc)
        return ConfigError([(self.name, self.line_of(loc), field, message)])


MAX_VALUES = 100_000  # YAML aliases can multiply a small file into a huge document


class _TooBig(Exception):
    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


def _expanded_size(node: yaml.Node, sizes: dict[int, int], active: set[int]) -> int:
    """How many values the document expands to; refuses self-containing aliases."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in active:
        raise _TooBig("a YAML alias (*name) refers to a value that contains it",
                      node.start_mark.line + 1)
    active.add(id(node))
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(n, sizes, active) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes, active) + _expanded_size(v, sizes, active)
                    for k, v in node.value)
    if size > MAX_VALUES:
        raise _TooBig(f"the file expands to more than {MAX_VALUES} values (YAML aliases?)",
                      node.start_mark.line + 1)
    active.discard(id(node))
    sizes[id(node)] = size
    return size


def _construct(node: yaml.Node | None) -> Any:
    """Python values from an already composed (and checked) node: the text is parsed once."""
    if node is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _interpolate_tree(value: Any) -> Any:
    if isinstance(value, str):
        return interpolate(value)
    if isinstance(value, dict):
        return {k: _interpolate_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate_tree(v) for v in value]
    return value


def load_model(path: Path, model: type[M], *, context: dict | None = None) -> M:
    return YamlDoc(path).validate(model, context=context)
