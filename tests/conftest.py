"""Test-wide guards and fixtures.

- No test reaches the internet, and so no test can call a real model: sockets may connect to
  loopback only, and names other than localhost do not resolve.
- Model credentials and proxies are removed from the environment.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
from pathlib import Path

import pytest

from tests.helpers import pg

ROOT = Path(__file__).resolve().parent.parent

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_TELEMETRY"] = "False"
for _name in list(os.environ):
    if _name.upper() in {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"} or _name.endswith(
            ("_API_KEY", "_API_BASE")) or _name.startswith("PLUTO_"):
        del os.environ[_name]


def _loopback(host: object) -> bool:
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo


class NetworkBlocked(OSError):
    pass


def _guard(self: socket.socket, address: object) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0] if isinstance(address, tuple) else address
        if not _loopback(host):
            raise NetworkBlocked(f"tests may not reach {address!r} (loopback only)")


def _connect(self: socket.socket, address: object) -> None:
    _guard(self, address)
    return _real_connect(self, address)


def _connect_ex(self: socket.socket, address: object) -> int:
    _guard(self, address)
    return _real_connect_ex(self, address)


def _getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
    if host is not None and not _loopback(host) and not str(host).startswith("127."):
        raise socket.gaierror(socket.EAI_NONAME, f"tests may not resolve {host!r}")
    return _real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]


socket.socket.connect = _connect  # type: ignore[method-assign]
socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]
socket.getaddrinfo = _getaddrinfo  # type: ignore[assignment]


# ---- markers: `unit`, `slow`, `browser`, `postgres` (registered in pyproject.toml) --------------
# Applied here, by path and by what a test uses, so a new test is marked without anyone
# remembering to: `pytest -m "not slow"` is the fast subset (docs/tests.md).

# Known long tests (tests/slow.txt: measured with --durations): whole files, or test
# functions by their node id without parameters.
SLOW = {line.split("#")[0].strip() for line in (ROOT / "tests" / "slow.txt").read_text()
        .splitlines() if line.split("#")[0].strip()}
# what a test that talks to PostgreSQL uses (tests/helpers/pg.py)
_PG_WORDS = re.compile(r"\b(fresh_schema|url_with_schema|PG_URL)\b|(?<![\w.])_connect\(")
_PG_PARAMS = {"postgres", "postgresql", "pg"}


def _source(obj: object) -> str:
    import inspect

    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def _uses_postgres(item: pytest.Item) -> bool:
    """A test of PostgreSQL: parametrized with the engine `postgres`, or it (or a fixture or
    a helper of its module it names) opens a schema of tests/helpers/pg.py. An engine fixture
    parametrized over sqlite and postgres counts only in its postgres instance."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    if any(isinstance(v, str) and v in _PG_PARAMS for v in params.values()):
        return True
    func = getattr(item, "function", None)
    sources = [_source(func)]
    info = getattr(item, "_fixtureinfo", None)
    for name in (info.names_closure if info else ()):
        if name in params:  # a parametrized fixture: its param said sqlite above
            continue
        for fixturedef in (info.name2fixturedefs.get(name) or ()):
            if fixturedef.baseid.startswith(".."):
                continue
            sources.append(_source(fixturedef.func))
    module = getattr(item, "module", None)
    text = "\n".join(sources)
    for name, value in vars(module).items() if module else ():
        if (callable(value) and not name.startswith("test_") and f"{name}(" in text
                and getattr(value, "__module__", None) == module.__name__):
            text += _source(value)
    return _PG_WORDS.search(text) is not None


def _is_slow(item: pytest.Item) -> bool:
    path = Path(str(item.path)).relative_to(ROOT).as_posix()
    name = item.nodeid.split("[")[0]
    return path in SLOW or name in SLOW or item.get_closest_marker("slow") is not None


# A test that reaches PostgreSQL without the `postgres` mark fails (teardown): the mark is
# what `-m "not postgres"` trusts. Every connection of the tests goes through pg._connect.
_pg_tests: set[str] = set()
_running: list[str] = []
_pg_connect = pg._connect


def _counted_pg_connect():  # type: ignore[no-untyped-def]
    if _running:
        _pg_tests.add(_running[-1])
    return _pg_connect()


pg._connect = _counted_pg_connect  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running.append(item.nodeid)
    try:
        yield
    finally:
        _running.pop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).relative_to(ROOT).as_posix()
        marks = []
        if path.startswith("tests/browser/"):
            marks.append("browser")
        if _uses_postgres(item):
            marks.append("postgres")
        if _is_slow(item) and item.get_closest_marker("slow") is None:
            marks.append("slow")
        for mark in marks:
            item.add_marker(mark)
        if not marks and item.get_closest_marker("slow") is None:
            item.add_marker("unit")


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A copy of the example configuration, to edit freely."""
    dest = tmp_path / "config"
    shutil.copytree(ROOT / "config", dest)
    return dest


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Under CI a test that cannot run fails: a skip would hide missing work."""
    outcome = yield
    report = outcome.get_result()
    if (report.when == "teardown" and item.nodeid in _pg_tests
            and item.get_closest_marker("postgres") is None):
        report.outcome = "failed"
        report.longrepr = ("this test reached PostgreSQL but is not marked `postgres`: mark it "
                           "(pytest.mark.postgres) or teach tests/conftest.py's _uses_postgres")
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which is not allowed: {report.longrepr}"
