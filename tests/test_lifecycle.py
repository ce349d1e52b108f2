"""Starting and stopping: a failed start says one sentence and leaves nothing open; a started
gateway closes everything it opened, in order."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pluto.errors import ConfigError, StartupError, StorageUnavailable
from pluto.gateway.app import Gateway
from pluto.gateway.cli.commands import started_gateway
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig
from tests.test_cli import env, pluto, pluto_cmd  # noqa: F401 - env is a fixture


@pytest.fixture
def busy_port():
    """A port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def others(before: set[asyncio.Task]) -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t not in before and not t.done()}


async def test_a_busy_port_is_one_sentence_and_everything_is_closed_again(config_dir, data_dir,
                                                                           busy_port):
    threads = set(threading.enumerate())
    before = asyncio.all_tasks()
    config = PlutoConfig(data_dir=data_dir, providers={"web": {"enabled": True}})
    gw = Gateway(config_dir, config=config, model_factory=ScriptedModel(), serve=True,
                 http_bind=("127.0.0.1", busy_port))
    started = time.monotonic()
    with pytest.raises(StartupError) as failed:
        await gw.start()
    assert time.monotonic() - started < 1
    assert str(failed.value) == (f"cannot listen on 127.0.0.1:{busy_port}: the address is "
                                 "already in use (is another gateway running? pass --port to "
                                 "pick another)")
    await asyncio.sleep(0)
    assert not gw.store.is_open and others(before) == set()
    alive = {t for t in threading.enumerate()
             if t.is_alive() and not t.name.startswith("asyncio_")}  # the loop's own pool
    assert alive <= threads  # no storage thread left behind


async def test_an_invalid_provider_setting_fails_before_anything_is_opened(config_dir,
                                                                            data_dir):
    before = asyncio.all_tasks()
    config = PlutoConfig(data_dir=data_dir,
                         providers={"web": {"enabled": True, "rate_messages": 100000}})
    gw = Gateway(config_dir, config=config, model_factory=ScriptedModel(), serve=True,
                 http_bind=("127.0.0.1", 0))
    with pytest.raises(ConfigError, match=r"providers\.web\.rate_messages"):
        await gw.start()
    assert not gw.store.is_open and others(before) == set()
    assert not (data_dir / "pluto.db").exists()  # storage was never opened


async def test_stop_closes_in_order_and_twice_is_harmless(config_dir, data_dir):
    before = asyncio.all_tasks()
    config = PlutoConfig(data_dir=data_dir, providers={"web": {"enabled": True}})
    gw = Gateway(config_dir, config=config, model_factory=ScriptedModel(), serve=True,
                 http_bind=("127.0.0.1", 0))
    await gw.start()
    assert gw.store.is_open and gw.http is not None
    await gw.stop()
    await gw.stop()
    await asyncio.sleep(0)
    assert not gw.store.is_open and others(before) == set()


def _serve(*args: str, env: dict[str, str], config: Path) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run([*pluto_cmd(), "serve", *args, "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stderr, time.monotonic() - started


def test_serve_on_a_busy_port_exits_with_one_sentence(env, config_dir, busy_port):
    code, err, took = _serve("--port", str(busy_port), env=env, config=config_dir)
    lines = [line for line in err.splitlines() if line.startswith("pluto:")]
    assert code == 1 and lines == [
        f"pluto: cannot listen on 127.0.0.1:{busy_port}: the address is already in use (is "
        "another gateway running? pass --port to pick another)"], err
    assert "Traceback" not in err
    assert took < 10  # it exits (the interpreter's start-up is most of this), never hangs


def test_serve_with_an_invalid_provider_setting_exits_with_the_field(env, config_dir):
    (config_dir / "pluto.yaml").write_text(
        (config_dir / "pluto.yaml").read_text()
        + "\nproviders:\n  web: {enabled: true, rate_messages: 100000}\n")
    code, err, took = _serve("--port", "0", env=env, config=config_dir)
    assert code == 2 and "providers.web.rate_messages" in err and "Traceback" not in err
    assert took < 10


def test_a_check_of_the_cli_helpers_used_here(env, config_dir):
    assert pluto("--version", env=env, config=config_dir).returncode == 0


async def test_a_start_storage_refused_is_made_again_and_serves(config_dir, data_dir, caplog):
    """A database connection cut as an instance starts (tests/test_cluster_chaos_web.py, seed 7
    under load: the restarted instance exited with "Nothing can be saved right now" and never
    came back): the start closes what it opened and a new gateway starts, with a warning; one
    that storage keeps refusing past the patience gives the refusal; a signal stops trying."""
    before = asyncio.all_tasks()
    config = PlutoConfig(data_dir=data_dir, providers={"web": {"enabled": True}})
    made: list[Gateway] = []

    def make(failures: int) -> Gateway:
        gw = Gateway(config_dir, config=config, model_factory=ScriptedModel(), serve=True,
                     http_bind=("127.0.0.1", 0))
        if len(made) < failures:  # its outbox's first write at start is refused
            async def refused() -> None:
                raise StorageUnavailable("the database cannot be reached")
            gw.outbox.open = refused  # type: ignore[method-assign]
        made.append(gw)
        return gw

    async with started_gateway(lambda: make(2), asyncio.Event()) as gw:
        assert gw is made[2] and gw.store.is_open and gw.http is not None
        assert not made[0].store.is_open and not made[1].store.is_open
        assert caplog.text.count("the gateway could not start (the database cannot be "
                                 "reached); starting again in") == 2
    assert not gw.store.is_open and others(before) == set()
    made.clear()
    with pytest.raises(StorageUnavailable):
        async with started_gateway(lambda: make(99), asyncio.Event(), patience=1.0):
            raise AssertionError("started")
    assert 2 <= len(made) <= 3 and not any(g.store.is_open for g in made)
    made.clear()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    with pytest.raises(StorageUnavailable):
        async with started_gateway(lambda: make(99), stop):
            raise AssertionError("started")
    assert len(made) == 1 and others(before) == set()
