"""What a newcomer hit on the first day (issue 37): the CLI's small surprises, run as real
subprocesses (`pluto serve`, `run`, `status`, `memory`) or in-process (the terminal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(data_dir: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    return e | {"PLUTO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}


def pluto(*args: str, env: dict[str, str], config: Path,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pluto.gateway.cli", *args, "--config",
                           str(config)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_serve_stops_without_native_leak_reports(env, config_dir) -> None:
    """DuckDB's nanobind printed ~43 lines of 'leaked' at a stop when DuckDB was loaded before
    the gateway froze what it held (gc.freeze(): never collected, not even at exit). Loaded
    first here, so that it is always so."""
    start = ("import sys, duckdb; from pluto.gateway.cli import main; "
             "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", start, "serve", "--port", "0",
                             "--config", str(config_dir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "serving on" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped" in err and "nanobind" not in err and "leaked" not in err


def test_run_with_a_broken_agent_file_says_why(env, config_dir) -> None:
    broken = config_dir / "agents" / "broken"
    broken.mkdir()
    (broken / "agent.yaml").write_text("description: x\nmodel: [\n")
    for command in (["run", "--agent", "broken", "hi"], ["chat", "--agent", "broken"]):
        out = pluto(*command, env=env, config=config_dir)
        assert out.returncode == 2, out.stderr
        assert "agents/broken/agent.yaml:" in out.stderr and "invalid YAML" in out.stderr
        assert "not available right now" not in out.stdout + out.stderr
        assert "Traceback" not in out.stderr


# ---- MCP servers: "python" is Pluto's Python; doctor starts each server once ------------------


def test_python_in_an_mcp_command_means_the_gateways_interpreter() -> None:
    from pluto.agents.toolspec import McpServer

    for command in ("python", "python3", f"python3.{sys.version_info[1]}"):
        assert McpServer(command=command).executable() == sys.executable
    for command in ("node", "/usr/bin/python3", "python2", "./python3", "uvx"):
        assert McpServer(command=command).executable() == command
    assert McpServer(url="https://mcp.example.com/mcp").executable() is None


async def test_a_python3_server_starts_with_our_python_whatever_path_finds(tmp_path,
                                                                         monkeypatch) -> None:
    """A python3 first on PATH without the mcp package (outside a venv) made the model see
    "Connection closed"."""
    import asyncio

    from pluto.agents.toolspec import McpServer, McpServerSpec

    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    for name in ("python", "python3"):
        fake = elsewhere / name
        fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'mcp'\" >&2\n"
                        "exit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{elsewhere}{os.pathsep}{os.environ['PATH']}")
    connection = await asyncio.to_thread(__import__, "pluto.runtime.mcp.connection",
                                         fromlist=["McpConnection"])
    spec = McpServerSpec("demo", McpServer(command="python3", args=["-m", "tests.mcp_servers.demo"],
                                           connect_timeout=30), ROOT)
    conn = connection.McpConnection(spec, log_dir=tmp_path / "logs")
    try:
        assert await conn.ensure(), conn.error
        assert "add" in {t.name for t in conn.tools}
    finally:
        await conn.close()


def _cook_with(config_dir: Path, command: str) -> None:
    path = config_dir / "agents" / "cook" / "agent.yaml"
    text = path.read_text()
    assert "command: python3 " in text
    path.write_text(text.replace("command: python3 ", f"command: {command} ", 1))


def test_doctor_starts_each_mcp_server_and_says_why_one_fails(env, config_dir) -> None:
    good = pluto("doctor", "--offline", env=env, config=config_dir)
    assert good.returncode == 0, good.stdout + good.stderr
    line = next(x for x in good.stdout.splitlines() if "mcp cook/kitchen" in x)
    assert line.startswith("ok ") and f"{sys.executable} kitchen_server.py" in line
    assert "2 tool(s)" in line
    bad = config_dir / "agents" / "cook" / "wrongpython"
    bad.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                   "echo \"ModuleNotFoundError: No module named 'mcp'\" >&2\nexit 1\n")
    bad.chmod(0o755)
    _cook_with(config_dir, "./wrongpython")
    out = pluto("doctor", "--offline", env=env, config=config_dir)
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if "mcp cook/kitchen" in x)
    assert line.startswith("FAIL") and "could not be started" in line
    assert "No module named 'mcp'" in line and "run ./wrongpython kitchen_server.py" in line
    assert "All good" not in out.stdout and "Traceback" not in out.stdout


def test_doctor_says_of_the_api_what_serve_says(env, config_dir) -> None:
    def api_line(extra: dict[str, str]) -> str:
        out = pluto("doctor", "--offline", env=env | extra, config=config_dir)
        return next(x for x in out.stdout.splitlines() if "provider api" in x)

    assert api_line({}) == ("ok    provider api: no keys in $PLUTO_API_KEYS; every API call "
                            "will get 401")  # the warning pluto serve logs at its start
    assert api_line({"PLUTO_API_KEYS": "app:0123456789abcdef0123"}).endswith(
        "settings and secrets are in place")


def test_doctor_points_out_an_example_secret(env, config_dir) -> None:
    example = {"PLUTO_WEB_SECRET": "change-me-to-32-or-more-characters-please"}
    here = pluto("doctor", "--offline", env=env | example, config=config_dir)
    line = next(x for x in here.stdout.splitlines() if "secrets" in x)
    assert line.startswith("ok ") and "refused by pluto serve on any other address" in line
    public = pluto("doctor", "--offline", env=env | example | {"PLUTO_HTTP_HOST": "0.0.0.0"},
                   config=config_dir)
    line = next(x for x in public.stdout.splitlines() if "secrets" in x)
    assert public.returncode == 1 and line.startswith("FAIL") and "0.0.0.0" in line
    assert "change-me" not in public.stdout


# ---- pluto status --port, pluto memory show without --user ------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_asks_the_port_it_is_given(env, config_dir) -> None:
    port, unused = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pluto.gateway.cli", "serve", "--port",
                             str(port), "--config", str(config_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "serving on" in line:
                break
        there = pluto("status", "--port", str(port), env=env, config=config_dir)
        assert there.returncode == 0, there.stderr
        assert there.stdout.startswith(f"gateway: running at http://127.0.0.1:{port} (ready)")
        default = pluto("status", env=env | {"PLUTO_HTTP_PORT": str(unused)}, config=config_dir)
        assert default.stdout.startswith(f"gateway: not running at http://127.0.0.1:{unused} "
                                         "(nothing listens there) (started with --port? then: "
                                         "pluto status --port N)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def test_memory_show_without_user_says_where_the_notes_are(env, config_dir, data_dir) -> None:
    helper = config_dir / "agents" / "helper"
    helper.mkdir()
    (helper / "agent.yaml").write_text("model: default\ninstructions: []\n"
                                       "memory:\n  long_term: {scope: user}\n")
    none_yet = pluto("memory", "show", "helper", env=env, config=config_dir)
    assert none_yet.returncode == 1 and none_yet.stderr.strip() == (
        "pluto memory: nothing is remembered for agent helper; it keeps notes per user, and "
        "none has any yet")
    notes = data_dir / "memory" / "helper" / "users" / "web"
    notes.mkdir(parents=True)
    (notes / "42.md").write_text("- Likes tea <!-- by web:42 -->\n")
    out = pluto("memory", "show", "helper", env=env, config=config_dir)
    assert out.returncode == 1 and out.stderr.strip() == (
        "pluto memory: nothing is remembered for agent helper; it keeps notes per user: "
        "give --user web:42")
    shown = pluto("memory", "show", "helper", "--user", "web:42", env=env, config=config_dir)
    assert shown.returncode == 0 and "Likes tea" in shown.stdout
    plain = pluto("memory", "show", "default", env=env, config=config_dir)
    assert plain.returncode == 1 and plain.stderr.strip() == (
        "pluto memory: nothing is remembered for agent default: default keeps no notes (no "
        "memory.long_term in its agent.yaml)")
