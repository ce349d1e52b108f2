"""The layout keeps its promises: no import cycles, dependencies point one way, only the
provider registry loads providers, only storage talks to a database, and the core names no
chat platform."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("pluto", "gateway", "providers", "agents", "runtime", "storage")
PLATFORMS = ("telegram", "discord", "slack", "whatsapp", "matrix", "mattermost", "teams")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) if parts[0] == "pluto" else "pluto." + ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            found[module_name(path)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, name: str) -> set[str]:
    """Every module this one imports at run time (lazy imports included; not those only for
    type checkers)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skip.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = {f"{base}.{alias.name}" for alias in node.names}
            out.update(names)
            if not names & MODULES:  # ``from package import module`` needs the module only
                out.add(base)
    return out


MODULES: set[str] = set()


def graph() -> dict[str, set[str]]:
    mods = modules()
    MODULES.update(mods)
    return {name: {m for m in imports(path, name) if m in mods and m != name}
            for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "pluto"


def test_there_is_no_import_cycle():
    assert cycles(graph()) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_dependencies_point_one_way():
    allowed = {
        "pluto": {"pluto"},  # the shared core: types, events, errors, config files
        "storage": {"pluto", "storage"},
        "agents": {"pluto", "agents"},
        "runtime": {"pluto", "runtime", "storage", "agents"},
        "gateway": {"pluto", "gateway", "agents", "runtime", "storage", "providers"},
        "providers": {"pluto", "providers", "gateway", "storage", "runtime"},
    }
    wrong = [f"{m} imports {d}" for m, deps in graph().items() for d in deps
             if layer(d) not in allowed[layer(m)]]
    assert wrong == []


def test_only_the_provider_registry_loads_providers():
    g = graph()
    loaders = sorted(m for m, deps in g.items() if layer(m) != "providers"
                     and any(layer(d) == "providers" for d in deps))
    assert loaders == []  # the registry finds them by entry point, never by import
    registry = (ROOT / "gateway" / "provider_registry.py").read_text()
    assert "entry_points" in registry


def test_providers_use_the_gateway_only_through_its_ports():
    reached = sorted({d for m, deps in graph().items() if layer(m) == "providers"
                      for d in deps if layer(d) == "gateway"})
    assert not [d for d in reached if d in ("pluto.gateway.app", "pluto.gateway.http.server",
                                            "pluto.gateway.pipeline.pipeline")]
    assert all(d.startswith(("pluto.gateway.ports", "pluto.gateway.logs",
                             "pluto.gateway.delivery.render")) for d in reached), reached


def test_only_storage_talks_to_a_database():
    drivers = ("sqlite3", "aiosqlite", "asyncpg", "psycopg")
    mods = modules()
    outside = sorted(f"{name} imports {d}" for name, path in mods.items()
                     if layer(name) != "storage"
                     for d in imports(path, name) if d.split(".")[0] in drivers)
    assert outside == []


def test_the_core_names_no_chat_platform():
    """Docstrings and comments may speak of platforms in general; code may not name one."""
    word = re.compile(r"\b(" + "|".join(PLATFORMS) + r")\b", re.I)
    core = [p for layer_ in ("pluto", "gateway", "agents", "runtime", "storage")
            for p in (ROOT / layer_).rglob("*.py")]
    named = []
    for path in core:
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in docstrings and word.search(node.value):
                named.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert named == []


def test_every_error_has_one_root():
    import importlib
    import inspect

    from pluto.errors import PlutoError

    rootless = []
    for name in sorted(modules()):
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException) and not issubclass(
                    cls, PlutoError):
                rootless.append(f"{name}.{cls.__qualname__}")
    assert rootless == []
