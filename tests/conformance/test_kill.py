"""Exactly once across a crash: ``pluto serve`` (a real process, a real model server over HTTP,
the provider against its fake platform) is killed with SIGKILL in the middle of a multi-chunk
reply; after a restart every chunk is on the platform exactly once, and none twice."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pluto.gateway.delivery.render import render_chunks
from tests.conformance.conftest import harnesses
from tests.conformance.harness import Harness
from tests.conformance.test_scenarios import long_text
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.helpers.inspect_store import nothing_left_to_deliver, opened

ROOT = Path(__file__).resolve().parents[2]


def pluto_cmd() -> list[str]:
    exe = shutil.which("pluto")
    return [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]


class Serve:
    """``pluto serve`` as a subprocess; its stderr goes to a file (read it on failure)."""

    def __init__(self, config_dir: Path, env: dict[str, str], log: Path):
        self.config_dir, self.env, self.log = config_dir, env, log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, *extra: str) -> None:
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *pluto_cmd(), "serve", "--config", str(self.config_dir), *extra, env=self.env,
                cwd=ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=err)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@pytest.fixture
def model_server() -> Iterator[object]:
    with FakeOpenAI.in_thread() as server:
        yield server


@pytest.mark.parametrize("harness", harnesses(lambda h: "serve" in h.features
                                              and "flood_control" in h.features
                                              and not h.caps.streams_deltas), indirect=True)
async def test_sigkill_mid_reply_then_each_chunk_exactly_once(harness: Harness, model_server,
                                                               tmp_path: Path) -> None:
    reply = long_text(36)
    expected = render_chunks(reply, harness.caps.markup, harness.caps.max_message_length)
    assert len(expected) >= 3
    model_server.script(Reply(text=reply, chunk_size=400))  # type: ignore[attr-defined]
    providers, secrets = harness.serve_config()
    config_file = harness.config_dir / "pluto.yaml"
    config = yaml.safe_load(config_file.read_text()) or {}
    config["providers"] = providers
    config_file.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")} | secrets | {
        "PLUTO_DATA_DIR": str(harness.data_dir), "PLUTO_HTTP_PORT": "0",
        "PLUTO_MODEL": "openai/fake", "PLUTO_API_BASE": model_server.base_url,  # type: ignore
        "PLUTO_API_KEY": "sk-kill-test", "PYTHONUNBUFFERED": "1"}
    serve = Serve(harness.config_dir, env, tmp_path / "serve.log")
    chat = harness.direct_chat
    # the third chunk is refused with a retry-after: the gateway waits, mid-reply, and the
    # restarted process honours what is left of it (flood control survives a restart)
    harness.rate_limit_sends(chat, after=2, retry_after=4)
    try:
        harness.expect_connection()
        await serve.start()
        await harness.connected(timeout=60)
        await harness.user_says("tell me everything")
        await harness.wait_shown(lambda s: bool(harness.refused_sends()), timeout=60,
                                 what="the third chunk being refused")
        assert len(harness.shown()) == 2
        assert await serve.stop(signal.SIGKILL) == -signal.SIGKILL

        harness.expect_connection()
        await serve.start("--verbose")  # debug logs too must not show the token
        await harness.connected(timeout=60)
        await harness.wait_texts(expected, raw=True, timeout=60)
        assert await serve.stop() == 0  # once it is gone, what the platform shows is final
        async with opened(harness.data_dir) as store:  # and nothing was left to send later
            assert await nothing_left_to_deliver(store)
        assert [s.raw for s in harness.shown()] == expected
        assert len(harness.accepted_sends()) == len(expected)
        assert len(model_server.requests) == 1  # type: ignore[attr-defined]
    except BaseException:
        print(serve.tail())
        raise
    finally:
        if serve.proc is not None and serve.proc.returncode is None:
            serve.proc.kill()
            await serve.proc.wait()
    logs = serve.log.read_text(errors="replace")
    for secret in secrets.values():
        assert secret not in logs
    assert "Traceback" not in logs
