"""``pluto init``, ``pluto doctor``, ``pluto status`` and ``pluto logs``, run as real commands
outside the repository (issue 17)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply

ROOT = Path(__file__).resolve().parent.parent


def pluto(*args: str, cwd: Path, env: dict[str, str] | None = None,
          timeout: float = 90) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("pluto")
    cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    base |= {"PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*cmd, *args], cwd=cwd, env=base | (env or {}), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def fake():
    with FakeOpenAI.in_thread(api_key="sk-doctor") as server:
        yield server


# ---- init ------------------------------------------------------------------------------


def test_init_writes_a_working_config_and_never_overwrites(tmp_path: Path) -> None:
    made = pluto("init", "--model", "openai/fake", "--api-base", "http://127.0.0.1:9/v1",
                 cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[0] == ("Wrote config/: pluto.yaml, routes.yaml and agents/ "
                                           "(model: openai/fake at http://127.0.0.1:9/v1).")
    assert "Next: pluto doctor" in made.stdout
    config = tmp_path / "config"
    text = (config / "pluto.yaml").read_text()
    assert "model: ${PLUTO_MODEL:-openai/fake}" in text
    assert "api_base: ${PLUTO_API_BASE:-http://127.0.0.1:9/v1}" in text
    assert (config / "agents" / "default" / "agent.yaml").is_file()
    assert (config / "routes.yaml").read_text() == (ROOT / "config" / "routes.yaml").read_text()
    assert pluto("agents", cwd=tmp_path).returncode == 0

    (config / "routes.yaml").write_text("# mine\n" + (config / "routes.yaml").read_text())
    again = pluto("init", cwd=tmp_path)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.strip() == ("pluto init: config already holds a configuration "
                                    "(pluto.yaml, routes.yaml); nothing was changed. Edit it, "
                                    "or choose another directory.")
    assert (config / "routes.yaml").read_text().startswith("# mine\n")

    elsewhere = pluto("init", str(tmp_path / "other"), cwd=tmp_path)
    assert elsewhere.returncode == 0 and "model: offline" in elsewhere.stdout
    assert "pluto doctor --config " in elsewhere.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "bad model'"], "has characters that cannot go in pluto.yaml"),
])
def test_init_refuses_values_it_cannot_write(tmp_path: Path, args: list[str], says: str) -> None:
    out = pluto("init", *args, cwd=tmp_path)
    assert out.returncode == 1 and says in out.stderr and "Traceback" not in out.stderr


def test_the_env_file_beside_the_config_is_read_but_never_wins(tmp_path: Path) -> None:
    with FakeOpenAI.in_thread() as fake:  # any key: it records which one came
        env_file_is_read(tmp_path, fake)


def env_file_is_read(tmp_path: Path, fake) -> None:
    assert pluto("init", "--model", "openai/fake", "--api-base", fake.base_url,
                 cwd=tmp_path).returncode == 0
    env_file = tmp_path / "config" / ".env"
    env_file.write_text("# a comment\nPLUTO_API_KEY='sk-doctor'\nexport OTHER=1\n")
    fake.script(Reply(text="hello"))
    out = pluto("run", "hi", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "hello", out.stderr
    assert fake.request_headers[-1]["Authorization"] == "Bearer sk-doctor"
    fake.script(Reply(text="hello"))
    pluto("run", "hi", cwd=tmp_path, env={"PLUTO_API_KEY": "sk-from-env"})
    assert fake.request_headers[-1]["Authorization"] == "Bearer sk-from-env"


# ---- doctor ----------------------------------------------------------------------------


def test_doctor_passes_against_a_working_model(tmp_path: Path, fake) -> None:
    assert pluto("init", "--model", "openai/fake", "--api-base", fake.base_url,
                 cwd=tmp_path).returncode == 0
    fake.script(Reply(text="OK"))
    out = pluto("doctor", cwd=tmp_path, env={"PLUTO_API_KEY": "sk-doctor"})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:-1]] == [
        "ok    config", "ok    data dir", "ok    open files", "ok    storage",
        "ok    mcp sandbox", "ok    python sandbox", "ok    mcp cook/kitchen", "ok    provider web",
        "ok    provider api", "ok    model default"]
    assert lines[-1] == "All good. Start with: pluto chat (or pluto serve)."
    assert "open files" in lines[2] and "answers can stream at once" in lines[2]
    assert fake.requests[-1]["max_tokens"] == 5


def test_doctor_explains_each_failure_and_exits_non_zero(tmp_path: Path, fake) -> None:
    assert pluto("init", "--model", "openai/fake", "--api-base", fake.base_url,
                 cwd=tmp_path).returncode == 0
    out = pluto("doctor", cwd=tmp_path)  # no key
    assert out.returncode == 1
    [model] = [ln for ln in out.stdout.splitlines() if "model default" in ln]
    assert model.startswith("FAIL  model default: ")
    assert "PLUTO_API_KEY" in model and "Traceback" not in out.stdout + out.stderr

    fake.script(Reply(status=401, error_message="Incorrect API key provided: sk-wrong"))
    wrong = pluto("doctor", cwd=tmp_path, env={"PLUTO_API_KEY": "sk-wrong"})
    assert wrong.returncode == 1 and "sk-wrong" not in wrong.stdout
    assert "rejected the API key in PLUTO_API_KEY" in wrong.stdout

    (tmp_path / "config" / "routes.yaml").write_text("routes:\n  - agent: nope\n")
    broken = pluto("doctor", cwd=tmp_path)
    assert broken.returncode == 2
    assert broken.stdout.startswith("FAIL  config: ") and "unknown agent 'nope'" in broken.stdout


def test_doctor_outside_a_config_dir_says_how_to_get_one(tmp_path: Path) -> None:
    out = pluto("doctor", cwd=tmp_path)
    assert out.returncode == 2 and "make one with 'pluto init'" in out.stderr


# ---- status and logs -------------------------------------------------------------------


def test_status_without_a_gateway_and_the_last_errors(tmp_path: Path) -> None:
    assert pluto("init", cwd=tmp_path).returncode == 0
    config = tmp_path / "config" / "pluto.yaml"
    config.write_text(config.read_text().replace("${PLUTO_HTTP_PORT:-8000}", "9"))
    state = tmp_path / ".pluto"
    state.mkdir()
    (state / "pluto.log").write_text(
        "2026-01-01 10:00:00,000 INFO pluto: started\n"
        "2026-01-01 10:00:01,000 ERROR pluto.runtime: run r1 failed\n")
    out = pluto("status", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("gateway: not running at http://127.0.0.1:9 (nothing listens there) "
                        "(started with --port? then: pluto status --port N); start it with "
                        "pluto serve")
    assert lines[-2:] == ["last errors (1):",
                          "  2026-01-01 10:00:01,000 ERROR pluto.runtime: run r1 failed"]
    report = json.loads(pluto("status", "--json", cwd=tmp_path).stdout)
    assert report["gateway"]["running"] is False and report["running"] == []


def test_logs_shows_the_last_lines(tmp_path: Path) -> None:
    assert pluto("init", cwd=tmp_path).returncode == 0
    missing = pluto("logs", cwd=tmp_path)
    assert missing.returncode == 1 and "no " in missing.stderr and "pluto.log" in missing.stderr
    (tmp_path / ".pluto").mkdir()
    (tmp_path / ".pluto" / "pluto.log").write_text("".join(f"line {i}\n" for i in range(100)))
    out = pluto("logs", "-n", "3", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "line 97\nline 98\nline 99\n"


async def test_doctor_makes_a_harmless_call_to_each_enabled_platform(tmp_path: Path) -> None:
    import asyncio

    from tests.fakes.telegram_server import DEFAULT_TOKEN, FakeTelegram

    assert pluto("init", cwd=tmp_path).returncode == 0
    config = tmp_path / "config" / "pluto.yaml"
    async with FakeTelegram() as fake:
        config.write_text(config.read_text().replace(
            "\nproviders:\n", f"\nproviders:\n  telegram:\n    enabled: true\n"
                              f"    base_url: {fake.url}\n", 1))

        async def doctor(token: str) -> tuple[int, str]:
            exe = shutil.which("pluto")
            cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
            env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
            env |= {"PYTHONPATH": os.pathsep.join(sys.path), "TELEGRAM_BOT_TOKEN": token}
            proc = await asyncio.create_subprocess_exec(
                *cmd, "doctor", cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
            out, _ = await asyncio.wait_for(proc.communicate(), 90)
            return proc.returncode or 0, out.decode()

        code, out = await doctor(DEFAULT_TOKEN)
        assert code == 0, out
        assert "ok    provider telegram: the bot @pluto_test_bot answered (getMe)" in out
        code, out = await doctor("123:wrong")
        assert code == 1
        [line] = [ln for ln in out.splitlines() if "provider telegram" in ln]
        assert line.startswith("FAIL  provider telegram: Telegram rejected the bot token "
                               "(check TELEGRAM_BOT_TOKEN)"), line
        assert "123:wrong" not in out


def test_status_of_a_running_gateway_and_its_log(tmp_path: Path) -> None:
    import signal
    import socket
    import time
    import urllib.request

    assert pluto("init", cwd=tmp_path).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("pluto")
    cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env |= {"PYTHONPATH": os.pathsep.join(sys.path), "PLUTO_HTTP_PORT": str(port)}
    serve = subprocess.Popen([*cmd, "serve"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                assert serve.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
        out = pluto("status", cwd=tmp_path, env={"PLUTO_HTTP_PORT": str(port)})
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == (f"gateway: running at http://127.0.0.1:{port} "
                                              "(ready); providers: web (running), api (running)")
        logged = pluto("logs", "-n", "200", cwd=tmp_path).stdout
        assert f"serving on http://127.0.0.1:{port} (config: {tmp_path / 'config'}, data: " \
               f"{tmp_path / '.pluto'})" in logged
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)


def test_init_on_a_terminal_asks_for_the_model_and_keeps_the_key_private(tmp_path: Path) -> None:
    import pty
    import select

    exe = shutil.which("pluto")
    cmd = [exe, "init"] if exe else [sys.executable, "-m", "pluto.gateway.cli", "init"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env |= {"PYTHONPATH": os.pathsep.join(sys.path), "TERM": "dumb"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: pluto init on a terminal
        os.chdir(tmp_path)
        os.execve(cmd[0], cmd, env)
    seen = b""

    def until(prompt: bytes) -> None:
        nonlocal seen
        while prompt not in seen:
            ready, _, _ = select.select([fd], [], [], 60)
            assert ready, f"no {prompt!r} in {seen!r}"
            seen += os.read(fd, 4096)

    until(b"model [offline]: ")
    os.write(fd, b"openai/fake\n")
    until(b"API base URL")
    os.write(fd, b"http://127.0.0.1:9/v1\n")
    until(b"API key")
    os.write(fd, b"sk-typed-secret\n")
    until(b"Next: pluto doctor")
    os.waitpid(pid, 0)
    os.close(fd)
    env_file = tmp_path / "config" / ".env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert "PLUTO_API_KEY=sk-typed-secret" in env_file.read_text()
    assert b"sk-typed-secret" not in seen  # not echoed, not printed
    assert "${PLUTO_MODEL:-openai/fake}" in (tmp_path / "config" / "pluto.yaml").read_text()


def test_logs_follow_prints_new_lines(tmp_path: Path) -> None:
    import select

    assert pluto("init", cwd=tmp_path).returncode == 0
    log = tmp_path / ".pluto" / "pluto.log"
    log.parent.mkdir()
    log.write_text("old line\n")
    exe = shutil.which("pluto")
    cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env |= {"PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}
    follow = subprocess.Popen([*cmd, "logs", "-f", "-n", "1"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert follow.stdout is not None
        assert select.select([follow.stdout], [], [], 60)[0]
        assert follow.stdout.readline() == b"old line\n"
        with log.open("a") as f:
            f.write("new line\n")
        assert select.select([follow.stdout], [], [], 60)[0]
        assert follow.stdout.readline() == b"new line\n"
    finally:
        follow.terminate()
        follow.wait(timeout=30)
