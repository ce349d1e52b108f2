"""The ``pluto`` command, run as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pluto.events import MessageDelta, RunEnd, RunEvent
from pluto.runtime.model import OFFLINE_REPLY
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.helpers.inspect_store import opened, runs

ROOT = Path(__file__).resolve().parent.parent


def pluto_cmd() -> list[str]:
    exe = shutil.which("pluto")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("the pluto console script is not installed (pip install -e .)")
        return [sys.executable, "-m", "pluto.gateway.cli"]
    return [exe]


@pytest.fixture
def env(data_dir: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    e["PLUTO_DATA_DIR"] = str(data_dir)
    e["PYTHONUNBUFFERED"] = "1"
    return e


def pluto(*args: str, env: dict[str, str], config: Path, stdin: str | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*pluto_cmd(), *args, "--config", str(config)], input=stdin, env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def fake():
    with FakeOpenAI.in_thread() as server:
        yield server


@pytest.fixture
def model_env(env: dict[str, str], fake) -> dict[str, str]:
    return env | {"PLUTO_MODEL": "openai/fake", "PLUTO_API_BASE": fake.base_url,
                  "PLUTO_API_KEY": "sk-cli-test"}


def test_help_is_light_and_version_works() -> None:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "pluto.gateway.cli", "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 0 and "chat" in out.stdout and "serve" in out.stdout
    imported = out.stderr
    for heavy in ("litellm", "aiohttp", "aiosqlite", "pydantic", "yaml"):
        assert f" {heavy}\n" not in imported and f" {heavy}." not in imported, heavy
    version = subprocess.run([*pluto_cmd(), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("pluto 0.")


def test_run_offline_default_answers_and_exits_zero(env, config_dir) -> None:
    out = pluto("run", "hello", env=env, config=config_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == OFFLINE_REPLY
    helped = pluto("run", "/help", env=env, config=config_dir)
    assert "/new" in helped.stdout and helped.returncode == 0


def test_run_reads_the_message_from_stdin(model_env, config_dir, fake) -> None:
    fake.script(Reply(text="got it"))
    out = pluto("run", "-", env=model_env, config=config_dir, stdin="a question\non two lines\n")
    assert out.returncode == 0 and out.stdout.strip() == "got it"
    assert fake.requests[0]["messages"][-1]["content"] == "a question\non two lines"


def test_run_streams_and_calls_tools_through_a_real_model_server(model_env, config_dir,
                                                                 fake) -> None:
    fake.script(Reply(tool_calls=[ToolCall("current_time", {})]),
                Reply(text="It is **now**.", chunk_size=2))
    out = pluto("run", "what time is it?", env=model_env, config=config_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "It is **now**."
    assert "using current_time" in out.stderr
    assert fake.requests[1]["messages"][-1]["role"] == "tool"
    assert fake.request_headers[0]["Authorization"] == "Bearer sk-cli-test"


def test_run_failure_is_one_sentence_and_non_zero(model_env, config_dir, fake) -> None:
    fake.script(Reply(status=400, error_message="bad things"))
    out = pluto("run", "hi", env=model_env, config=config_dir)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"! The model service at {fake.base_url} refused the "
                                  "request: bad things.")
    assert "Traceback" not in out.stdout + out.stderr


def test_config_errors_exit_2_with_file_and_line(env, config_dir) -> None:
    (config_dir / "routes.yaml").write_text("routes:\n  - match: {provider: cli}\n    agent: nope\n")
    out = pluto("run", "hi", env=env, config=config_dir)
    assert out.returncode == 2
    assert "routes.yaml:3: routes[0].agent: Value error, unknown agent 'nope'" in out.stderr
    unknown = pluto("run", "--agent", "ghost", "hi", env=env,
                    config=config_dir.parent / "missing")
    assert unknown.returncode == 2 and "config directory not found" in unknown.stderr
    ghost = pluto("chat", "--agent", "ghost", env=env, config=ROOT / "config")
    assert ghost.returncode == 2 and "unknown agent 'ghost'" in ghost.stderr


def test_agents_lists_and_checks(env, config_dir) -> None:
    out = pluto("agents", env=env, config=config_dir)
    assert out.returncode == 0 and "\ndefault\toffline\t" in out.stdout  # after cook
    bad = config_dir / "agents" / "bad"
    bad.mkdir()
    (bad / "agent.yaml").write_text("budget: 3\n")
    out = pluto("agents", env=env, config=config_dir)
    assert out.returncode == 2 and "bad\tERROR\t" in out.stdout and "agent.yaml:1" in out.stdout


def test_chat_over_a_pipe_keeps_the_conversation(model_env, config_dir, fake) -> None:
    fake.respond_with(lambda body: Reply(
        text=f"{sum(m['role'] == 'user' for m in body['messages'])} messages so far"))
    out = pluto("chat", env=model_env, config=config_dir, stdin="one\ntwo\n/new\nthree\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1 messages so far", "2 messages so far",
                                       "Started a new conversation. Earlier messages are "
                                       "forgotten.", "1 messages so far"]


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(model_env, config_dir, fake) -> None:
    fake.script(Reply(text="slow " * 200, chunk_size=5, chunk_delay=0.05), Reply(text="fast"))
    proc = subprocess.Popen([*pluto_cmd(), "chat", "--config", str(config_dir)], env=model_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdin and proc.stdout
    proc.stdin.write("tell me a long story\n")
    proc.stdin.flush()
    assert proc.stdout.read(10) == "slow slow "  # the reply is streaming
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate("again\n", timeout=30)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert "Stopped." in lines and lines[-1] == "fast"
    assert "Traceback" not in err


async def runs_and_first_events(data_dir: Path) -> tuple[list[str], list[RunEvent]]:
    """The runs' statuses, oldest first, and the first run's events, as stored."""
    async with opened(data_dir) as store:
        found = await runs(store)
        return [r["status"] for r in found], await store.conversations.events(found[0]["id"])


def test_killed_mid_run_leaves_a_session_the_next_start_continues(model_env, config_dir,
                                                                fake, data_dir) -> None:
    fake.script(Reply(tool_calls=[ToolCall("current_time", {})]),
                Reply(text="never finished " * 100, chunk_size=5, chunk_delay=0.05))
    proc = subprocess.Popen([*pluto_cmd(), "run", "--session", "s1", "first question",
                             "--config", str(config_dir)], env=model_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout
    shown = proc.stdout.read(30)  # six previews, the first 250 ms before the kill
    assert shown == "never finished never finished "
    proc.kill()  # SIGKILL: no cleanup at all
    proc.wait(timeout=10)
    fake.script(Reply(text="second answer"))
    out = pluto("run", "--session", "s1", "second question", env=model_env, config=config_dir)
    assert out.returncode == 0 and out.stdout.strip() == "second answer"
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[1]["content"] == "first question" and sent[-1]["content"] == "second question"
    statuses, first_events = asyncio.run(runs_and_first_events(data_dir))
    assert statuses == ["interrupted", "ok"]
    assert isinstance(first_events[-1], RunEnd) and first_events[-1].outcome == "interrupted"
    kept = "".join(e.text for e in first_events if isinstance(e, MessageDelta))
    # previews are committed behind the screen: a kill loses at most the last ones, so what is
    # on disk is what the user saw, up to its last words
    assert len(kept) >= 10 and shown.startswith(kept[:len(shown)])


def test_serve_stops_gracefully_on_sigterm(env, config_dir) -> None:
    proc = subprocess.Popen([*pluto_cmd(), "serve", "--config", str(config_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr
    deadline = time.monotonic() + 30
    line = ""
    while "serving" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    assert "serving" in line
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in err


def test_run_shows_where_a_chart_was_saved(model_env, config_dir, fake, data_dir) -> None:
    sql = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 2 DESC"
    fake.script(Reply(tool_calls=[ToolCall("make_chart", {"sql": sql, "kind": "bar",
                                                          "x": "region", "y": ["total"]})]),
                Reply(text="Here is the chart."))
    out = pluto("run", "chart sales by region", env=model_env, config=config_dir)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Here is the chart." and lines[1].startswith("[image: ")
    png = Path(lines[1].removeprefix("[image: ").removesuffix("]"))
    assert png.is_relative_to(data_dir) and png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_a_failed_sql_command_exits_non_zero(env, config_dir) -> None:
    good = pluto("run", "/sql SELECT count(*) AS n FROM sales", env=env, config=config_dir)
    assert good.returncode == 0 and "n" in good.stdout
    refused = pluto("run", "/sql DROP TABLE sales", env=env, config=config_dir)
    assert refused.returncode == 1
    assert refused.stderr.startswith("! The query was refused: ")
    assert "Traceback" not in refused.stderr
