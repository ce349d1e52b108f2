"""Secrets out of reach of a stdio MCP server (docs/security.md).

A hostile server (tests/mcp_servers/hostile.py) reads ``/proc/<gateway pid>/environ``, every
other ``/proc/*/environ`` it can see, and its own environment. The "gateway" is a real process
started with secrets in its environment (tests/helpers/secret_probe.py), protecting them as
``pluto serve`` does and starting the server through the runtime's McpConnection.

These tests run as root here and in CI, where ``prctl(PR_SET_DUMPABLE, 0)`` alone protects
nothing (CAP_SYS_PTRACE reads any process): the protected case is bubblewrap's PID namespace,
and a control run without it shows the same server does read every secret — so the test is
known to exercise the protection. The prctl half is tested on its own with a dropped user
(gateway and peer both ``nobody``), as it protects against a peer of the same non-root user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pluto.runtime.mcp.sandbox import bwrap_path

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {"PLUTO_ADMIN_KEY": "admin-secret-5f1e0c9a77",
           "PLUTO_API_KEYS": "apikey-one-8d2b41,apikey-two-c03e9f",
           "TELEGRAM_BOT_TOKEN": "123456:bot-token-e6a1d0f3",
           "DATABASE_URL": "postgresql://pluto:db-password-71ac@db/pluto"}
VALUES = ["admin-secret-5f1e0c9a77", "apikey-one-8d2b41", "apikey-two-c03e9f",
          "bot-token-e6a1d0f3", "db-password-71ac"]
ALLOWED = "allowed-for-the-server-0b7d"


def run_probe(*flags: str, user: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env.update(SECRETS, HOSTILE_ALLOWED=ALLOWED, PYTHONPATH=str(ROOT.parent),
               HOME="/tmp")
    done = subprocess.run([sys.executable, "-m", "tests.helpers.secret_probe", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          user=user)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def leaked(text: str) -> list[str]:
    return [v for v in VALUES if v in text]


def test_bubblewrap_is_installed_and_usable():
    # scripts/test.sh installs it (as it installs chromium); without it the servers below
    # would run unconfined, and the protection would not be tested at all
    from pluto.runtime.mcp.sandbox import usable
    assert bwrap_path() is not None, "bwrap is missing: apt-get install bubblewrap"
    assert usable(), "bwrap cannot create namespaces here"


def test_doctor_says_in_one_sentence_when_bubblewrap_is_missing(monkeypatch):
    from pluto.gateway.cli import doctor
    from pluto.runtime.mcp import sandbox

    assert doctor._mcp_sandbox().ok  # (installed here)
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    monkeypatch.setattr(sandbox, "_usable", None)
    check = doctor._mcp_sandbox()
    assert check.line() == (
        "FAIL  mcp sandbox: bubblewrap (bwrap) is not installed, so stdio MCP servers run "
        "unconfined and could read the gateway's secrets as root: apt-get install bubblewrap.")
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(sandbox, "_usable", False)  # installed, but no namespaces allowed
    assert "cannot create namespaces here" in doctor._mcp_sandbox().line()


def test_a_hostile_mcp_server_gets_none_of_the_gateways_secrets():
    seen = run_probe("--protect")
    peek = seen["peek"]
    assert leaked(json.dumps(peek)) == [], peek  # gateway, parent, every process, its own env
    assert peek["gateway"].startswith("<refused: FileNotFoundError")  # not in its namespace
    assert len(peek["visible_pids"]) <= 3, peek["visible_pids"]  # bwrap and the server only
    assert peek["own"]["HOSTILE_ALLOWED"] == ALLOWED  # what its env: allows does reach it
    assert not any(name in peek["own"] for name in SECRETS)
    assert leaked(seen["child_env"]) == []  # a plain child inherits none of them either
    assert seen["dumpable"] == 0 and seen["still_readable_here"] is True


def test_control_without_the_protections_the_same_server_reads_every_secret():
    """Proof the test above exercises something: unsandboxed and unprotected, the hostile
    server (root here, or the same user elsewhere) reads the gateway's environ."""
    peek = run_probe("--unsandboxed")["peek"]
    assert sorted(leaked(peek["gateway"])) == sorted(VALUES)


# (the module's source is handed over, not its path: a checkout may sit where nobody can read,
# e.g. under a 0700 directory made by mktemp -d)
GATEWAY_AS_NOBODY = """
import sys, types
secrecy = types.ModuleType("secrecy")
exec(compile(sys.argv[1], "secrecy.py", "exec"), secrecy.__dict__)
if sys.argv[2] == "protect":
    assert secrecy.make_undumpable()
print("ready", flush=True)
sys.stdin.read()
"""


def python_for_nobody() -> str:
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            if subprocess.run([candidate, "-c", "pass"], user=65534,
                              capture_output=True).returncode == 0:
                return candidate
        except OSError:  # not there, or not executable by nobody
            continue
    pytest.fail("no Python the user nobody may run (tried the test's, /usr/bin, /usr/local/bin)")


def peer_reads_gateway_as_nobody(protect: bool) -> subprocess.CompletedProcess[bytes]:
    gateway = subprocess.Popen(
        [python_for_nobody(), "-c", GATEWAY_AS_NOBODY,
         (ROOT / "gateway" / "secrecy.py").read_text(encoding="utf-8"),
         "protect" if protect else "open"], user=65534, cwd="/",
        env={"PATH": "/usr/bin:/bin", **SECRETS}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert gateway.stdout is not None and gateway.stdout.readline() == b"ready\n"
        return subprocess.run(["cat", f"/proc/{gateway.pid}/environ"], user=65534,
                              capture_output=True, timeout=30)
    finally:
        gateway.communicate(b"", timeout=30)


def test_an_undumpable_gateway_is_unreadable_to_a_peer_of_its_own_user():
    """Gateway and peer both run as ``nobody`` (dropped from root): after prctl the peer cannot
    read /proc/<gateway>/environ; without it, it can (the control)."""
    assert os.geteuid() == 0, "this test drops to the user nobody: it must run as root"
    protected = peer_reads_gateway_as_nobody(protect=True)
    assert protected.returncode != 0 and b"Permission denied" in protected.stderr
    assert leaked(protected.stdout.decode(errors="replace")) == []
    control = peer_reads_gateway_as_nobody(protect=False)
    assert control.returncode == 0
    assert sorted(leaked(control.stdout.decode(errors="replace"))) == sorted(VALUES)
