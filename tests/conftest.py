"""Test-wide guards and fixtures.

- No test reaches the internet, and so no test can call a real model: sockets may connect to
  loopback only, and names other than localhost do not resolve.
- Model credentials and proxies are removed from the environment.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from pathlib import Path

import pytest

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a long scenario (tens of seconds); "
                            "deselect with -m 'not slow'")


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
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which is not allowed: {report.longrepr}"
