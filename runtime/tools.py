"""The tool interface: a name, a description, a JSON schema derived from type hints and the
docstring, and an async call that returns ``content`` for the model and ``details`` for people.

```python
@tool
async def current_time(ctx: ToolContext, timezone: str = "UTC") -> str:
    \"\"\"The current date and time.

    Args:
        timezone: An IANA time zone name, e.g. Europe/Paris.
    \"\"\"
```
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, get_origin
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
from pluto.errors import PlutoError


class ToolError(PlutoError):
    """Raised by a tool for an error the model should read and can act on."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str  # what the model reads
    details: dict[str, Any] | None = None  # what people see: a table, a chart, a file
    is_error: bool = False


class Progress(Protocol):
    """How far a long call got (``tool.progress`` events); the parameters are named as MCP's
    progress callback names them, so one is handed to an MCP server's call as it is."""

    async def __call__(self, progress: float, total: float | None = None,
                       message: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class ToolContext:
    run_id: str
    session_id: str
    session_key: str
    agent: str
    data_dir: Path
    services: dict[str, Any] = field(default_factory=dict)  # e.g. the data warehouse
    datasets: tuple[str, ...] | str = ()  # global datasets the agent may query ("*": all)
    # a long call tells how far it got: await ctx.progress(done, total, "message")
    progress: Progress | None = None
    # who wrote the message the run answers, and where (a runtime.memory.Speaker; None when
    # the run answers no chat message): tools that act for that person (schedule) read it
    speaker: Any = None
    # the model's call this context serves, and (``ask_<name>``) the id reserved for the run
    # that answers it, announced by the call's tool.start
    call_id: str = ""
    child_run_id: str | None = None


ToolFn = Callable[..., Awaitable[ToolResult | str]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments
    fn: ToolFn
    _schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # built once: every model call sends it
        object.__setattr__(self, "_schema", {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}})

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function declaration."""
        return self._schema

    async def __call__(self, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        problem = check_arguments(self.parameters, arguments)
        if problem:
            return ToolResult(f"Invalid arguments for {self.name}: {problem}", is_error=True)
        required = self.parameters.get("required", [])
        arguments = {k: v for k, v in arguments.items() if v is not None or k in required}
        out = await self.fn(ctx, **arguments)
        return out if isinstance(out, ToolResult) else ToolResult(str(out))


def tool(fn: ToolFn | None = None, *, name: str | None = None) -> Any:
    """Make a :class:`Tool` from an async function whose first parameter is the context."""

    def wrap(f: ToolFn) -> Tool:
        description, arg_docs = _parse_docstring(inspect.getdoc(f) or "")
        return Tool(name or f.__name__, description, _schema_of(f, arg_docs), f)

    return wrap(fn) if fn is not None else wrap


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _type_schema(inner[0]) if len(inner) == 1 else {}
    if origin in (list, tuple):
        args = get_args(tp)
        return {"type": "array", "items": _type_schema(args[0]) if args else {}}
    if origin is dict or tp is dict:
        return {"type": "object"}
    return {"type": _JSON_TYPES[tp]} if tp in _JSON_TYPES else {}


def _schema_of(fn: ToolFn, arg_docs: dict[str, str]) -> dict[str, Any]:
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required = []
    for i, (pname, param) in enumerate(inspect.signature(fn).parameters.items()):
        if i == 0:
            continue  # the ToolContext
        prop = _type_schema(hints.get(pname, str))
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        elif param.default is not None:
            prop["default"] = param.default
        props[pname] = prop
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    head, _, rest = doc.partition("Args:")
    args: dict[str, str] = {}
    for m in re.finditer(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+(?:\n\s{8,}.+)*)", rest, re.M):
        args[m.group(1)] = " ".join(m.group(2).split())
    return " ".join(head.split()), args


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def check_arguments(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """A plain sentence about what is wrong with the arguments, or None when they fit."""
    props = schema.get("properties", {})
    missing = [p for p in schema.get("required", []) if p not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [a for a in args if a not in props]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(props) or 'none'}"
    for key, value in args.items():
        prop = props[key]
        if value is None and key not in schema.get("required", []):
            continue  # null for an optional argument: not given
        if "enum" in prop and value not in prop["enum"]:
            return f"{key} must be one of {prop['enum']}"
        check = _CHECKS.get(prop.get("type", ""))
        if check and not check(value):
            return f"{key} must be of type {prop['type']}"
    return None


# built-in tools -------------------------------------------------------------------------------

@tool
async def current_time(ctx: ToolContext, timezone: str = "UTC") -> ToolResult:
    """The current date and time.

    Args:
        timezone: An IANA time zone name such as Europe/Paris; UTC when not given.
    """
    try:
        now = datetime.now(ZoneInfo(timezone))
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone '{timezone}'; use an IANA name like Europe/Paris")
    return ToolResult(now.isoformat(timespec="seconds"), details={"text": now.strftime("%c %Z")})


BUILTIN_TOOLS: dict[str, Tool] = {t.name: t for t in (current_time,)}
