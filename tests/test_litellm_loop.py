"""The whole pipeline against an OpenAI-compatible server over HTTP, through the real litellm."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.events import MessageDelta, RunError, ToolStart
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.helpers.gateway import RecordingProvider
from tests.helpers.inspect_store import runs


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key="sk-test-key") as server:
        yield server


@pytest.fixture
async def setup(fake: FakeOpenAI, config_dir: Path, data_dir: Path,
                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PLUTO_API_KEY", "sk-test-key")
    cfg = PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": fake.base_url, "api_key_env": "PLUTO_API_KEY",
        "retries": 2, "timeout": 5}})
    gw = Gateway(config_dir, config=cfg)
    gw.runner.retry_base_delay = 0.01
    async with gw:
        provider = RecordingProvider(streams=True)
        gw.add_provider(provider)
        await provider.running.wait()
        yield gw, provider


async def ended_usage(gw: Gateway) -> dict:
    for _ in range(100):
        ended = [r for r in await runs(gw.store) if r["ended_at"] is not None]
        if ended:
            return ended[0]["usage"]
        await asyncio.sleep(0.02)
    raise AssertionError("the run never ended")


async def run_events(gw: Gateway) -> list:
    """The events of the last run, as the run feed gives them to watchers."""
    [row] = await gw.store.conversations.recent_runs(limit=1)
    return await gw.store.conversations.events(row["id"])


async def ask(provider: RecordingProvider, text: str, n: int = 1) -> list[str]:
    await provider.say(text)
    return await provider.wait_finals(n)


async def test_streams_the_answer_token_by_token(setup, fake):
    gw, p = setup
    # a token every 50 ms, as a model writes: an answer that comes whole before its first
    # batch could go out (its run's start still being committed) is shown as the answer alone
    fake.script(Reply(text="The answer is forty-two.", chunk_size=4, chunk_delay=0.05))
    assert await ask(p, "question?") == ["The answer is forty-two."]
    events = await run_events(gw)
    deltas = [e.text for e in events if isinstance(e, MessageDelta)]
    assert deltas and "".join(deltas) == "The answer is forty-two."  # in batches
    body = fake.requests[0]
    assert body["stream"] is True and body["model"] == "fake"
    assert body["messages"][0]["role"] == "system" and body["messages"][-1] == {
        "role": "user", "content": "question?"}
    assert [t["function"]["name"] for t in body["tools"]] == [
        "current_time", "list_datasets", "describe_dataset", "run_sql", "make_chart"]
    assert fake.request_headers[0]["Authorization"] == "Bearer sk-test-key"
    usage = await ended_usage(gw)
    assert usage["total_tokens"] > 0 and usage["prompt_tokens"] > 0


async def test_calls_tools_and_feeds_results_back(setup, fake):
    gw, p = setup
    fake.script(Reply(tool_calls=[ToolCall("current_time", {"timezone": "Europe/Paris"})],
                      chunk_size=5),
                Reply(text="It is late in Paris."))
    assert await ask(p, "time in Paris?") == ["It is late in Paris."]
    assert any(isinstance(e, ToolStart) and e.name == "current_time"
               for e in await run_events(gw))
    second = fake.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == '{"timezone": "Europe/Paris"}'
    assert second[-1]["role"] == "tool" and "+01:00" in second[-1]["content"] or \
        "+02:00" in second[-1]["content"]


async def test_malformed_tool_arguments_are_returned_to_the_model(setup, fake):
    gw, p = setup
    fake.script(Reply(tool_calls=[ToolCall("current_time", '{"timezone": ')]),
                Reply(text="Let me fix that."))
    assert await ask(p, "time?") == ["Let me fix that."]
    tool_msg = fake.requests[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and "not valid JSON" in tool_msg["content"]


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_transient_errors_are_retried(setup, fake, status):
    gw, p = setup
    fake.script(Reply(status=status, headers={"retry-after": "0"}), Reply(text="recovered"))
    assert await ask(p, "hi") == ["recovered"]
    assert len(fake.requests) == 2


async def test_persistent_rate_limit_is_one_plain_sentence(setup, fake):
    gw, p = setup
    fake.script(*[Reply(status=429, headers={"retry-after": "0"})] * 3)
    [msg] = await ask(p, "hi")
    assert msg == "The model is rate limited right now; please try again in a moment."
    assert [m.kind for m in p.sent][-1] == "error" and len(fake.requests) == 3


async def test_wrong_key_is_reported_without_the_key(setup, fake, monkeypatch):
    gw, p = setup
    monkeypatch.setenv("PLUTO_API_KEY", "sk-wrong-key")
    [msg] = await ask(p, "hi")
    assert msg == ("This assistant cannot answer right now: its model service is not set up "
                   "correctly. Please let the people who run it know.")  # a chat user
    [error] = [e for e in await run_events(gw) if isinstance(e, RunError)]
    assert error.message == msg and error.detail is not None  # the operators' sentence
    assert error.detail.startswith("The model service at http") and "rejected the API key " \
        "in PLUTO_API_KEY: Incorrect API key provided. Check the value of PLUTO_API_KEY." \
        in error.detail
    assert "sk-wrong" not in msg + error.detail


async def test_connection_dropped_mid_stream_is_not_retried_twice_on_screen(setup, fake):
    gw, p = setup
    fake.script(Reply(text="This will be cut off halfway", chunk_size=2, drop_after=4))
    [msg] = await ask(p, "hi")
    assert [m.kind for m in p.sent if m.kind != "delta"] == ["error"]
    assert len(fake.requests) == 1  # text was shown: no retry that would repeat it
    assert msg.endswith(".") and "Traceback" not in msg


async def test_slow_model_hits_the_wall_time_budget(setup, fake, config_dir):
    gw, p = setup
    agent_yaml = config_dir / "agents" / "default" / "agent.yaml"
    agent_yaml.write_text(agent_yaml.read_text().replace("max_seconds: 120", "max_seconds: 0.5"))
    gw.registry.forget("default")  # the edit takes effect now, not at the next look
    fake.script(Reply(text="slow " * 40, chunk_size=5, chunk_delay=0.1))
    [msg] = await ask(p, "hi")
    assert "0.5-second limit" in msg


async def test_unreachable_model_is_reported(config_dir, data_dir):
    cfg = PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": "http://127.0.0.1:9/v1", "retries": 0}})
    async with Gateway(config_dir, config=cfg) as gw:
        p = RecordingProvider()
        gw.add_provider(p)
        [msg] = await ask(p, "hi")
        assert msg == "The model service is not available right now; please try again in a " \
            "moment."  # a chat user: no internal URL
        [error] = [e for e in await run_events(gw) if isinstance(e, RunError)]
        assert error.detail.startswith("Could not reach the model service at ") and \
            "http://127.0.0.1:9/v1" in error.detail and "PLUTO_API_BASE" in error.detail
    await asyncio.sleep(0)
