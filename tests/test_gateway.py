"""The gateway pipeline in-process: routing, commands, per-session order, stop, shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.gateway.supervisor import TaskHealth, supervise
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.gateway import RecordingProvider
from tests.helpers.inspect_store import runs
from tests.helpers.served import wait_for


class CountingModel(ScriptedModel):
    """Echoes slowly and records how many runs overlap, overall and per conversation."""

    def __init__(self, delay: float = 0.02):
        super().__init__(fallback=lambda m: Scripted(text=f"re: {m[-1]['content']}", chunk=2,
                                                     delay=delay))
        self.active = 0
        self.max_active = 0

    async def stream(self, messages, tools, settings):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            async for item in super().stream(messages, tools, settings):
                yield item
        finally:
            self.active -= 1


@pytest.fixture
async def gw(config_dir: Path, data_dir: Path):
    model = CountingModel()
    cfg = PlutoConfig(data_dir=data_dir)
    gateway = Gateway(config_dir, config=cfg, model_factory=model)
    gateway.model = model  # type: ignore[attr-defined]
    async with gateway:
        yield gateway


async def start(gw: Gateway, **kw: object) -> RecordingProvider:
    p = RecordingProvider(**kw)  # type: ignore[arg-type]
    gw.add_provider(p)
    await p.running.wait()
    return p


async def test_one_run_at_a_time_per_session_in_order(gw):
    p = await start(gw)
    for i in range(5):
        await p.say(f"m{i}")
    finals = await p.wait_finals(5)
    assert finals == [f"re: m{i}" for i in range(5)]
    assert gw.model.max_active == 1
    # each run saw the previous answers: the order is the order of arrival
    last_prompt = gw.model.calls[-1]
    assert [m["content"] for m in last_prompt if m["role"] == "user"] == [f"m{i}" for i in range(5)]


async def test_different_sessions_run_concurrently(gw):
    p = await start(gw)
    await asyncio.gather(*(p.say(f"hello {c}", chat=c) for c in ("a", "b", "c")))
    for c in ("a", "b", "c"):
        assert await p.wait_finals(1, chat=c) == [f"re: hello {c}"]
    assert gw.model.max_active == 3


async def test_stop_cancels_the_running_run_and_drops_the_queue(gw):
    gw.model.fallback = lambda m: Scripted(text="x" * 200, chunk=1, delay=0.02)
    p = await start(gw)
    await p.say("long one")
    await p.say("queued")
    await wait_for(lambda: gw.model.active == 1)  # the first is being answered
    await p.say("/stop")
    assert (await p.wait_finals(1))[0] == "Stopped and dropped 1 waiting message(s)."
    await gw.settled()
    assert [(r["status"], r["error"]) for r in await runs(gw.store)] == [
        ("cancelled", "stopped by the user"), ("cancelled", "dropped by /stop before it ran")]
    await p.say("/stop")
    assert (await p.wait_finals(2))[1] == "Nothing to stop."


async def test_new_starts_a_fresh_session(gw):
    p = await start(gw)
    await p.say("remember me")
    await p.wait_finals(1)
    await p.say("/new")
    assert "new conversation" in (await p.wait_finals(2))[1]
    await p.say("who am I")
    await p.wait_finals(3)
    assert [m["content"] for m in gw.model.calls[-1] if m["role"] == "user"] == ["who am I"]


async def test_help_and_agents_need_no_model(gw):
    p = await start(gw)
    await p.say("/help")
    await p.say("/agents@pluto_bot")
    await gw.settled()
    *help_chunks, agents = p.finals()  # /help is split at this platform's 200 characters
    help_text = "\n".join(help_chunks)
    assert "/new" in help_text and "/stop" in help_text and "**default**" in agents
    assert gw.model.calls == []


async def test_denied_and_unrouted_messages_get_nothing(config_dir, data_dir):
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - match: {user: intruder}\n    deny: true\n"
        "  - match: {provider: test}\n    agent: default\ndefault: null\n")
    model = CountingModel()
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=model) as gw:
        p = await start(gw)
        other = await start(gw, name="elsewhere")
        await p.say("let me in", user="intruder")
        await other.say("anyone?")
        await p.say("hi", user="friend")
        assert await p.wait_finals(1) == ["re: hi"]
        await gw.settled()  # every message handed over was handled: the others got nothing
        assert p.finals() == ["re: hi"] and other.sent == [] and len(model.calls) == 1


async def test_long_replies_are_split_for_the_platform(gw):
    gw.model.fallback = lambda m: Scripted(text=("word " * 100).strip())
    p = await start(gw)
    await p.say("talk a lot")
    await gw.settled()
    chunks = p.finals()
    assert len(chunks) >= 3 and all(len(c) <= 200 for c in chunks)
    assert " ".join(chunks).split() == ["word"] * 100


async def test_broken_agent_edit_keeps_the_last_good_definition(gw, config_dir, caplog):
    gw.registry.recheck_seconds = 0  # look at the files on every message
    p = await start(gw)
    (config_dir / "agents" / "default" / "agent.yaml").write_text("budget: {max_seconds: -1}\n")
    await p.say("hello")
    assert await p.wait_finals(1) == ["re: hello"]  # the last good definition keeps serving
    assert "default/agent.yaml:1: budget.max_seconds" in caplog.text


async def test_shutdown_cancels_runs_after_grace_and_records_them(config_dir, data_dir):
    model = CountingModel(delay=0.5)
    cfg = PlutoConfig(data_dir=data_dir, gateway={"shutdown_grace_seconds": 0.2})
    gw = Gateway(config_dir, config=cfg, model_factory=model)
    await gw.start()
    p = await start(gw)
    await p.say("a slow question")
    await wait_for(lambda: model.active == 1)  # the run is under way when the gateway stops
    await gw.stop()
    gw2 = Gateway(config_dir, config=cfg, model_factory=model)
    async with gw2:
        assert [r["status"] for r in await runs(gw2.store)] == ["cancelled"]


async def test_supervisor_restarts_a_crashing_provider():
    attempts = 0

    async def flaky() -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise ConnectionError("platform went away")

    health = TaskHealth("flaky")
    await supervise(health, flaky, min_backoff=0.01)
    assert attempts == 3 and health.restarts == 2 and health.state == "done"
    assert health.last_error == "ConnectionError: platform went away"


async def test_supervisor_does_not_restart_a_permanent_failure():
    from pluto.errors import ProviderUnusable

    attempts = 0

    async def bad_token() -> None:
        nonlocal attempts
        attempts += 1
        raise ProviderUnusable("the bot token was rejected")

    health = TaskHealth("platform")
    await supervise(health, bad_token, min_backoff=0.01)
    assert attempts == 1 and health.state == "failed"
    assert health.last_error == "ProviderUnusable: the bot token was rejected"
