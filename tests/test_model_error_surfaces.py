"""A failed model call: a chat user (the web widget, a chat) reads one plain sentence that
names nothing of the server; the terminal, the admin API and the log get the full cause
(the internal endpoint, the key's variable)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pluto.events import RunError
from pluto.gateway.app import Gateway
from pluto.providers.api.sse import encode
from pluto.providers.web.protocol import run_frame
from pluto.runtime.model_errors import SETUP, UNAVAILABLE
from pluto.settings import PlutoConfig
from pluto.types import Capabilities
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.helpers.gateway import RecordingProvider

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key="sk-surfaces") as server:
        yield server


async def test_a_visitor_reads_a_plain_sentence_and_the_operator_the_cause(
        fake: FakeOpenAI, config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PLUTO_API_KEY", "sk-surfaces")
    cfg = PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": fake.base_url, "api_key_env": "PLUTO_API_KEY",
        "retries": 0, "timeout": 5}})
    fake.script(Reply(status=500, error_message="upstream exploded"),
                Reply(status=500, error_message="upstream exploded"))
    async with Gateway(config_dir, config=cfg) as gw:
        visitor = RecordingProvider("visitor")
        operator = RecordingProvider("terminal", capabilities=Capabilities(operator=True))
        for provider in (visitor, operator):
            gw.add_provider(provider)
            await provider.running.wait()
        with caplog.at_level(logging.WARNING, logger="pluto.runtime.model"):
            await visitor.say("hi")
            [seen] = await visitor.wait_finals(1)
            await operator.say("hi")
            [full] = await operator.wait_finals(1)
        assert seen == UNAVAILABLE
        assert "127.0.0.1" not in seen and "http" not in seen
        assert full == f"The model service at {fake.base_url} had an error: upstream exploded."
        await gw.settled()  # (the error is shown at once; the run's end commits just after)
        run_ids = [m.run_id for m in visitor.sent + operator.sent if m.kind == "error"]
        for run_id in run_ids:  # the admin API's view of the run has both
            [error] = [e for e in await gw.store.conversations.events(run_id)
                       if isinstance(e, RunError)]
            assert (error.message, error.detail) == (UNAVAILABLE, full)
            row = await gw.store.conversations.run(run_id)
            assert row is not None and row.error == UNAVAILABLE  # what the HTTP API shows
    logged = [r.getMessage() for r in caplog.records]
    assert any(fake.base_url in m and "upstream exploded" in m for m in logged), logged


def test_the_widget_and_the_api_stream_never_carry_the_detail() -> None:
    error = RunError(run_id="r1", seq=4, message=SETUP,
                     detail="The model service at http://10.0.0.7:4000/v1 rejected the API key "
                            "in PLUTO_API_KEY")
    frame = run_frame(4, error, lambda path: None)
    assert frame is not None and frame["message"] == SETUP and "10.0.0.7" not in str(frame)
    sent = encode(error).decode()
    data = json.loads(re.search(r"^data: (.*)$", sent, re.M).group(1))  # type: ignore[union-attr]
    assert data["message"] == SETUP and "detail" not in data and "10.0.0.7" not in sent


def test_pluto_run_shows_the_operator_the_full_cause(tmp_path: Path) -> None:
    exe = shutil.which("pluto")
    cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env |= {"PLUTO_DATA_DIR": str(tmp_path), "PLUTO_MODEL": "openai/fake",
            "PLUTO_API_BASE": "http://127.0.0.1:9/v1", "PLUTO_API_KEY": "sk-x"}
    done = subprocess.run([*cmd, "run", "hello", "--config", str(ROOT / "config")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    said = done.stdout + done.stderr
    assert "Could not reach the model service at http://127.0.0.1:9/v1" in said, said
    assert UNAVAILABLE not in said
