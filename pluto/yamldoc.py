"""YAML files that admins edit: loaded with line numbers, validated into pydantic models, and
every error reported as ``file:line: field: what was expected``.

Environment interpolation: a string value may contain ``${NAME}`` or ``${NAME:-default}``; it is
replaced from the environment when the file is loaded. Secrets are never interpolated into
models (they are named by ``*_env`` fields and read when needed), so they never sit in config
objects that could be logged.

Only a regular file of at most :data:`MAX_CONFIG_BYTES` is read (a FIFO, a device or a huge file
is refused at once, never waited on), and parsing is blocking work: async code runs it in a
worker thread.
"""

from __future__ import annotations

import gc
import os
import re
import stat
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from pluto.errors import ConfigError, PlutoError

M = TypeVar("M", bound=BaseModel)

MAX_CONFIG_BYTES = 2**20  # a config file larger than this is refused unread
_MAX_CONFIG_TEXT = "1 MiB"


class FileRefused(PlutoError, OSError):
    """A file that is not read: not a regular file, or larger than allowed (``str``: why)."""


def read_regular_file(path: Path, max_bytes: int = MAX_CONFIG_BYTES,
                      max_text: str = _MAX_CONFIG_TEXT) -> bytes:
    """The bytes of a regular file (symlinks followed) of at most ``max_bytes``.

    Opened non-blocking, so a FIFO never waits for a writer; the kind and size are checked on
    the open descriptor (no race with a rename) before anything is read. Raises
    :class:`FileRefused` (``"is not a regular file (a FIFO)"``, ``"is larger than 1 MiB"``) or
    the ``OSError`` of the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > max_bytes:
            raise FileRefused(f"is larger than {max_text}")
        chunks, size = [], 0
        while chunk := os.read(fd, max_bytes + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # it grew after the check
                raise FileRefused(f"is larger than {max_text}")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "of an unknown kind"


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_resume = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (process-wide; nestable, from any thread) while
    a worker thread builds many objects: parsing a large file, importing litellm. Otherwise the
    allocations set off full collections over the whole heap, each of which holds the GIL for
    0.1–0.3 s — a stall of the event loop as long as if the work ran on it. Reference counting
    still frees what is dropped meanwhile; cycles wait for the collector, which resumes after
    the last pause ends."""
    global _gc_pauses, _gc_resume
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(Composer, CParser, SafeConstructor, Resolver):
        """libyaml's parser (C, fast) under PyYAML's own composer: Python recursion, so a
        document nested too deeply raises RecursionError where libyaml's recursive composer
        would overflow the C stack and crash the process."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    # (Any: PyYAML's stubs accept only PyYAML's own loader classes as ``Loader``)
    _Loader: Any = _CLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader


def _compose(text: str) -> yaml.Node | None:
    """The document's node tree, by libyaml when there (4x faster). A text it refuses is read
    again by PyYAML's own parser (the error path only): its messages are clearer, and its line
    numbers never point past the end of a half-written file."""
    try:
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        if _Loader is yaml.SafeLoader:
            raise
    return yaml.compose(text, Loader=yaml.SafeLoader)

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
            text = read_regular_file(path).decode("utf-8") if text is None else text
        except FileNotFoundError:
            raise ConfigError([(self.name, None, "", "file not found")]) from None
        except FileRefused as e:
            raise ConfigError([(self.name, None, "", str(e))]) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError([(self.name, None, "", f"cannot read the file ({e})")]) from None
        if len(text) > MAX_CONFIG_BYTES:  # given as text: at least this many bytes
            raise ConfigError([(self.name, None, "", f"is larger than {_MAX_CONFIG_TEXT}")])
        try:
            with paused_gc():
                self.node = _compose(text)
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

    def validate(self, model: type[M], *, data: Any = None,
                 context: dict[str, Any] | None = None) -> M:
        data = self.data if data is None else data
        if data is None:
            data = {}
        try:
            with paused_gc():
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


class _TooBig(PlutoError):
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


def load_model(path: Path, model: type[M], *, context: dict[str, Any] | None = None) -> M:
    return YamlDoc(path).validate(model, context=context)
