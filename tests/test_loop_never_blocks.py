"""The event loop never blocks, seen from outside: a real `pluto serve` process, fresh (litellm
not imported yet), configured with a litellm model on the fake OpenAI server, the HTTP API and
Slack over HTTP on the fake Slack. While its first model call starts — while litellm is being
imported — `/healthz` keeps answering (its slowest answer a small part of the import's time;
the benchmark has the absolute figures), and a Slack event gets its 200 within Slack's 3 s.

The process reports when litellm's import runs and on which thread (a finder wrapped around
`pluto serve`, below), so the tests know the import really happened inside the window they
measure: from the moment the server listens until the model's answer is in. If litellm is
warmed at start-up instead of at the first call, that window still holds the import.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack_server import FakeSlack

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "loop-test-api-key-0123456789"
MODEL_KEY = "sk-loop-test-model-key"
MARK = "PLUTO-TEST-LITELLM-IMPORT"
SLACK_LIMIT = 3.0  # seconds: Slack retries an event not acknowledged by then

# `pluto serve`, telling on stderr when litellm's module starts and ends executing, and on which
# thread ("main": the event loop's).
SERVE = f"""
import importlib.abc, importlib.machinery, importlib.util, os, sys, threading, time

def tell(what, where):  # one write: a whole line, never mixed with the log's
    os.write(2, f"{MARK} {{what}} {{time.time():.6f}} {{where}}\\n".encode())

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "litellm":
            return None
        # (the path finder itself: asking importlib.util.find_spec would come back here; a
        # lookup that does not import, such as the usage ledger's, leaves the watch in place)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            where = "main" if threading.current_thread() is threading.main_thread() else "worker"
            tell("start", where)
            try:
                run(module)
            finally:
                tell("end", where)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Watch())
from pluto.gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Served:
    """A `pluto serve` process and what it said on stderr (each line with when it came)."""

    proc: asyncio.subprocess.Process
    lines: list[tuple[float, str]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))
            self.changed.set()

    async def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        async def look() -> re.Match[str]:
            while True:
                for _, line in self.lines:
                    if m := re.search(pattern, line):
                        return m
                if self.proc.returncode is not None:
                    raise AssertionError(f"pluto serve exited ({self.proc.returncode}):\n"
                                         f"{self.log}")
                self.changed.clear()
                await self.changed.wait()
        try:
            return await asyncio.wait_for(look(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {pattern!r} from pluto serve:\n{self.log}") from None

    def marks(self) -> dict[str, tuple[float, str]]:
        """'start' and 'end' of litellm's import: (time.time(), thread)."""
        found = {}
        for _, line in self.lines:
            if m := re.search(rf"{MARK} (start|end) ([\d.]+) (main|worker)$", line):
                found[m.group(1)] = (float(m.group(2)), m.group(3))
        return found

    @property
    def log(self) -> str:
        return "\n".join(line for _, line in self.lines)


def write_config(config_dir: Path, data_dir: Path, model_url: str, slack_url: str) -> None:
    (config_dir / "pluto.yaml").write_text(f"""\
data_dir: {json.dumps(str(data_dir))}
http: {{host: 127.0.0.1, port: 0}}
models:
  # through litellm (an OpenAI-compatible model would take the direct path, without it)
  default: {{model: openai/test, api_base: {json.dumps(model_url)}, api_key_env: LOOP_MODEL_KEY,
            timeout: 30, retries: 0, client: litellm}}
providers:
  api: {{enabled: true, keys_env: LOOP_API_KEYS}}
  slack:
    enabled: true
    mode: http
    api_base: {json.dumps(slack_url)}
    bot_token_env: LOOP_SLACK_BOT_TOKEN
    signing_secret_env: LOOP_SLACK_SIGNING_SECRET
gateway: {{reload_interval_seconds: 0.25}}
""")


@contextlib.asynccontextmanager
async def pluto_serve(config_dir: Path, data_dir: Path, fake_model: FakeOpenAI,
                      slack: FakeSlack) -> AsyncIterator[tuple[Served, str]]:
    """A fresh `pluto serve`; yields it and its base URL once it listens."""
    write_config(config_dir, data_dir, fake_model.base_url, slack.api_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLUTO_", "LITELLM_"))}
    env |= {"LOOP_MODEL_KEY": MODEL_KEY, "LOOP_API_KEYS": API_KEY,
            "LOOP_SLACK_BOT_TOKEN": slack.bot_token,
            "LOOP_SLACK_SIGNING_SECRET": slack.signing_secret, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVE, "serve", "--config", str(config_dir), env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    served = Served(proc)
    reader = asyncio.create_task(served.read())
    try:
        url = (await served.wait_for(r"listening on (http://\S+)")).group(1)
        yield served, url
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await asyncio.wait_for(reader, 10)
    assert "Traceback" not in served.log and "was never awaited" not in served.log, served.log


async def first_model_call(http: aiohttp.ClientSession, url: str) -> tuple[float, str]:
    """The first model call of the process, through the HTTP API: (when it ended, the answer)."""
    async with http.post(f"{url}/api/v1/agent/tasks?wait=60", json={"input": "hello"},
                         headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
        body = await resp.json()
    assert resp.status == 201, body
    return time.time(), body["last_step"]["output"]


def check_import(served: Served, window: tuple[float, float]) -> tuple[float, float]:
    """litellm was imported once, in a worker thread, and (at least its end) inside `window`."""
    marks = served.marks()
    assert set(marks) == {"start", "end"}, f"litellm's import was not seen:\n{served.log}"
    (start, where), (end, _) = marks["start"], marks["end"]
    assert where == "worker", "litellm was imported on the event loop's thread"
    assert window[0] < end <= window[1], (
        f"litellm's import ({start:.3f}–{end:.3f}) is not inside the window measured "
        f"({window[0]:.3f}–{window[1]:.3f}): the test did not observe it")
    return start, end


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeOpenAI, FakeSlack]]:
    async with FakeOpenAI(api_key=MODEL_KEY) as model, FakeSlack() as slack:
        model.default_reply = Reply(text="pong")
        slack.add_dm(channel_id="D0LOOPTEST")
        yield model, slack


async def test_healthz_keeps_answering_while_the_first_model_call_starts(
        config_dir: Path, data_dir: Path, fakes: tuple[FakeOpenAI, FakeSlack]) -> None:
    model, slack = fakes
    async with pluto_serve(config_dir, data_dir, model, slack) as (served, url), \
            aiohttp.ClientSession() as http:
        opened = time.time()
        call = asyncio.create_task(first_model_call(http, url))
        polls: list[tuple[float, float, int]] = []  # (sent at, seconds, status)
        # The server's answer is timed, not this client's collector: late in a test session a
        # full collection here walks all the session left behind (0.1 s and more in CI).
        gc.disable()
        try:
            while not call.done():
                sent, started = time.time(), time.perf_counter()
                async with http.get(f"{url}/healthz") as resp:
                    await resp.read()
                polls.append((sent, time.perf_counter() - started, resp.status))
                await asyncio.sleep(0.02)
        finally:
            gc.enable()
        ended, answer = await call
    assert answer == "pong"
    start, end = check_import(served, (opened, ended))
    during = [seconds for sent, seconds, _ in polls if max(start, opened) <= sent <= end]
    worst = max(seconds for _, seconds, _ in polls)
    print(f"\nlitellm imported in a worker thread in {end - start:.2f}s; {len(polls)} polls of "
          f"/healthz, {len(during)} during the import; slowest {worst * 1000:.0f} ms; first "
          f"model call answered {ended - opened:.2f}s after the server listened")
    assert all(status == 200 for _, _, status in polls)
    assert len(during) >= 10, "too few polls landed while litellm was being imported"
    # Measured against the import itself, in the same run (a loaded machine slows both): an
    # import on the loop would hold an answer back for all of it; in a worker thread the
    # slowest answer is a small part of it (45 ms alone, ~340 ms on a loaded 2-core machine,
    # for an import of 1-4 s). Absolute times are the benchmark's (bench/), not a test's.
    assert worst < 0.5 * (end - start), (
        f"/healthz took {worst * 1000:.0f} ms during an import of {end - start:.2f} s")


async def test_a_slack_event_sent_during_the_first_model_call_gets_its_200_within_3_s(
        config_dir: Path, data_dir: Path, fakes: tuple[FakeOpenAI, FakeSlack]) -> None:
    model, slack = fakes
    async with pluto_serve(config_dir, data_dir, model, slack) as (served, url), \
            aiohttp.ClientSession() as http:
        opened = time.time()
        call = asyncio.create_task(first_model_call(http, url))
        await served.wait_for(r"slack: connected")  # the provider takes events (before: a 503)
        await served.wait_for(rf"{MARK} start")  # litellm is being imported now
        said = await slack.user_message("D0LOOPTEST", "hello from Slack", deliver=False)
        sent = time.time()
        delivery = await slack.send_event(said.events[0], url=f"{url}/slack/events",
                                          retries=False, ack_timeout=30, wait=True)
        [attempt] = delivery.attempts
        assert attempt.status == 200 and attempt.acked, attempt
        ended, answer = await call
        await slack.wait_until(lambda: [m.get("text") for m in slack.history("D0LOOPTEST")
                                        if m.get("bot_id") == slack.bot_id] == ["pong"],
                               timeout=30, what="the bot's answer on Slack")
    assert answer == "pong"  # and the event was handled, not only acknowledged
    start, end = check_import(served, (opened, ended))
    assert sent < end, "the Slack event was sent after litellm's import had ended"
    print(f"\nlitellm imported in a worker thread in {end - start:.2f}s; the Slack event sent "
          f"{sent - start:.2f}s into it got HTTP {attempt.status} in {attempt.elapsed:.3f}s")
    assert attempt.elapsed < SLACK_LIMIT


# DuckDB and matplotlib: the data tools import them (and ingest, describe, draw) off the loop --

DATA_TOOLS_RUN = """
import asyncio, importlib.abc, json, sys, threading
from pathlib import Path

on_loop = {}

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("duckdb", "matplotlib") and name not in on_loop:
            on_loop[name] = threading.current_thread() is threading.main_thread()
        return None

sys.meta_path.insert(0, Watch())

async def main(data_dir: Path) -> None:
    from pluto.runtime.data import DataService
    from pluto.runtime.data_tools import DATA_TOOLS
    from pluto.runtime.tools import ToolContext

    service = DataService(data_dir)  # with the demo dataset, sales
    ctx = ToolContext("run", "session", "chat", "agent", data_dir, services={"data": service},
                      datasets="*")
    sql = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 1"
    calls = {"list_datasets": {}, "describe_dataset": {"name": "sales"}, "run_sql": {"sql": sql},
             "make_chart": {"sql": sql, "kind": "bar"}}
    failed = {name: (await DATA_TOOLS[name](ctx, args)).is_error for name, args in calls.items()}
    (data_dir / "sent.csv").write_text("a,b\\n1,2\\n3,4\\n")
    upload = await service.add_upload(data_dir / "sent.csv", "sent.csv", "text/csv", "chat")
    print(json.dumps({"failed": failed, "on_loop": on_loop, "rows": upload.rows}))

asyncio.run(main(Path(sys.argv[1])))
"""


def test_the_data_tools_import_duckdb_and_matplotlib_off_the_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env["MPLCONFIGDIR"] = str(tmp_path / "mpl")
    out = subprocess.run([sys.executable, "-c", DATA_TOOLS_RUN, str(tmp_path / "data")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["failed"] == {"list_datasets": False, "describe_dataset": False,
                                "run_sql": False, "make_chart": False}, out.stdout
    assert report["rows"] == 2
    assert report["on_loop"] == {"duckdb": False, "matplotlib": False}


# the shared import of litellm, in-process (with a stand-in for the slow import) ---------------

@pytest.fixture
def slow_import(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Event]:
    from pluto.runtime import model

    threads: list[str] = []
    release = threading.Event()

    def importing() -> str:
        threads.append(threading.current_thread().name)
        if not release.wait(10):
            raise TimeoutError("never released")
        return "the litellm module"

    monkeypatch.setattr(model, "_import_and_warm", importing)
    monkeypatch.setattr(model, "_import", None)
    return threads, release


def test_callers_on_many_loops_share_one_import_in_a_thread(slow_import) -> None:
    from pluto.runtime.model import imported_litellm, warm_litellm

    threads, release = slow_import
    started = time.perf_counter()
    asyncio.run(warm_litellm())  # starts it, does not wait for it
    assert time.perf_counter() - started < 0.5 and threads == ["litellm-import"]

    waiting = threading.Semaphore(0)  # one per loop whose caller awaits the import

    async def cancelled_then_awaited() -> str:
        waiter = asyncio.create_task(imported_litellm())
        await asyncio.sleep(0)  # one turn of the loop: the waiter runs until it awaits the import
        assert not waiter.done()
        waiter.cancel()  # e.g. Ctrl+C: the waiter goes at once, the import goes on
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        caller = asyncio.create_task(imported_litellm())
        await asyncio.sleep(0)  # the caller awaits the import
        waiting.release()
        return await caller

    got: list[str] = []
    loops = [threading.Thread(target=lambda: got.append(asyncio.run(cancelled_then_awaited())))
             for _ in range(4)]
    for t in loops:
        t.start()
    for _ in loops:  # every loop's caller waits on the one import before it ends
        assert waiting.acquire(timeout=10)
    release.set()
    for t in loops:
        t.join(10)
    assert got == ["the litellm module"] * 4 and threads == ["litellm-import"]
    assert asyncio.run(warm_litellm()) is None and threads == ["litellm-import"]


def test_a_failed_import_is_reported_to_its_waiters_and_tried_again(slow_import,
                                                                   monkeypatch) -> None:
    from pluto.runtime import model

    threads, release = slow_import
    monkeypatch.setattr(model, "_import_and_warm", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        asyncio.run(model.imported_litellm())
    monkeypatch.setattr(model, "_import_and_warm", lambda: "the litellm module")
    assert asyncio.run(model.imported_litellm()) == "the litellm module"


def test_which_models_use_litellm() -> None:
    from pluto.runtime.model import uses_litellm

    assert not uses_litellm("offline") and not uses_litellm("echo")
    assert uses_litellm("openai/gpt-4o-mini") and uses_litellm("ollama/llama3")
