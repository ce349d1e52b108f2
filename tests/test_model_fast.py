"""Both model paths — litellm and the direct OpenAI-compatible one — pass the same tests against
the fake OpenAI-compatible server, over the wire: streamed text, tool calls assembled from
deltas, usage, errors, retry-after, a stream cut in the middle."""

from __future__ import annotations

import json

import pytest

from pluto.runtime.errors import ModelError
from pluto.runtime.model import LiteLLMModel, ModelSettings, ModelTurn
from pluto.runtime.openai_compat import (OpenAICompatibleModel, close_sessions, model_for,
                                         model_path, uses_litellm)
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

KEY = "sk-test-fast-path"
PATHS = {"litellm": LiteLLMModel, "direct": OpenAICompatibleModel}


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key=KEY) as server:
        yield server
    await close_sessions()


@pytest.fixture(params=sorted(PATHS))
def model(request):
    return PATHS[request.param]()


def settings(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, **kw) -> ModelSettings:
    monkeypatch.setenv("PLUTO_TEST_KEY", KEY)
    return ModelSettings(**{"model": "openai/fake", "api_base": fake.base_url,
                            "api_key_env": "PLUTO_TEST_KEY", "timeout": 5, **kw})


async def collect(model, s: ModelSettings, tools: list | None = None,
                  shown: list[str] | None = None) -> ModelTurn:
    shown = [] if shown is None else shown
    turn = None
    async for item in model.stream([{"role": "user", "content": "hi"}], tools or [], s):
        if isinstance(item, ModelTurn):
            turn = item
        else:
            shown.append(item)
    assert turn is not None
    return turn


TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up.",
                                           "parameters": {"type": "object", "properties": {
                                               "q": {"type": "string"}}}}}]


async def test_streamed_text(fake, model, monkeypatch):
    fake.script(Reply(text="The answer is forty-two, as always.", chunk_size=4))
    shown: list[str] = []
    turn = await collect(model, settings(fake, monkeypatch, temperature=0.2), shown=shown)
    assert "".join(shown) == turn.text == "The answer is forty-two, as always."
    assert len(shown) >= 8 and turn.finish_reason == "stop" and turn.tool_calls == []
    body = fake.requests[0]
    assert body["model"] == "fake" and body["stream"] is True and body["temperature"] == 0.2
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert fake.request_headers[0]["Authorization"] == f"Bearer {KEY}"


async def test_tool_calls_are_assembled_from_deltas(fake, model, monkeypatch):
    fake.script(Reply(tool_calls=[ToolCall("lookup", {"q": "pluto's moons"}, id="call_a"),
                                  ToolCall("lookup", '{"q": ', id="call_b")], chunk_size=3))
    turn = await collect(model, settings(fake, monkeypatch), TOOLS)
    assert [(c.id, c.name) for c in turn.tool_calls] == [("call_a", "lookup"), ("call_b", "lookup")]
    assert json.loads(turn.tool_calls[0].arguments) == {"q": "pluto's moons"}
    assert turn.tool_calls[1].arguments == '{"q": '  # malformed JSON is kept as written
    assert turn.finish_reason == "tool_calls"
    assert fake.requests[0]["tools"][0]["function"]["name"] == "lookup"


async def test_usage(fake, model, monkeypatch):
    fake.script(Reply(text="Short.", usage=(321, 7)))
    turn = await collect(model, settings(fake, monkeypatch))
    assert turn.usage["prompt_tokens"] == 321 and turn.usage["completion_tokens"] == 7
    assert fake.requests[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (401, False), (404, False),
                                                   (500, True), (503, True)])
async def test_errors_are_classified(fake, model, monkeypatch, status, retryable):
    fake.script(Reply(status=status))
    with pytest.raises(ModelError) as info:
        await collect(model, settings(fake, monkeypatch))
    assert info.value.retryable is retryable
    assert KEY not in str(info.value) and "Traceback" not in str(info.value)


async def test_rate_limit_carries_retry_after(fake, model, monkeypatch):
    fake.script(Reply(status=429, headers={"retry-after": "7"}))
    with pytest.raises(ModelError) as info:
        await collect(model, settings(fake, monkeypatch))
    assert info.value.retryable and info.value.retry_after == 7.0
    assert "rate limited" in str(info.value)


async def test_a_stream_cut_in_the_middle(fake, model, monkeypatch):
    fake.script(Reply(text="This will be cut off halfway through", chunk_size=2, drop_after=5))
    shown: list[str] = []
    with pytest.raises(ModelError) as info:
        await collect(model, settings(fake, monkeypatch), shown=shown)
    assert shown and "".join(shown) != "This will be cut off halfway through"
    assert str(info.value).endswith(".") and "Traceback" not in str(info.value)


async def test_a_stream_cut_before_any_text(fake, model, monkeypatch):
    fake.script(Reply(text="never shown", drop_after=0))
    with pytest.raises(ModelError) as info:
        await collect(model, settings(fake, monkeypatch))
    assert info.value.retryable  # nothing was shown: the runner may try again


async def test_unreachable_service(model):
    s = ModelSettings(model="openai/fake", api_base="http://127.0.0.1:9/v1", timeout=2)
    with pytest.raises(ModelError) as info:
        await collect(model, s)
    assert info.value.retryable and "reach" in str(info.value)
    await close_sessions()


async def test_both_paths_say_the_same_sentence(fake, monkeypatch):
    """One classification for both paths: a person cannot tell which path served them."""
    s = settings(fake, monkeypatch)
    for reply in (Reply(status=401), Reply(status=404), Reply(status=429),
                  Reply(status=500), Reply(status=400, error_message="bad tool schema")):
        said = []
        for path in sorted(PATHS):
            fake.script(reply)
            with pytest.raises(ModelError) as info:
                await collect(PATHS[path](), s)
            said.append((str(info.value), info.value.retryable))
        assert said[0] == said[1], reply.status


async def test_no_key_and_no_endpoint_is_one_sentence():
    with pytest.raises(ModelError) as info:
        await collect(OpenAICompatibleModel(), ModelSettings(model="openai/gpt-4o-mini"))
    assert "API key" in str(info.value) and not info.value.retryable


async def test_a_connection_is_reused_across_answers(fake, monkeypatch):
    s = settings(fake, monkeypatch)
    for _ in range(3):
        await collect(OpenAICompatibleModel(), s)
    peers = {h.get("X-Forwarded-For") for h in fake.request_headers}
    assert len(fake.requests) == 3 and peers == {None}
    from pluto.runtime.openai_compat import _session
    assert _session(fake.base_url.rstrip("/")) is _session(fake.base_url.rstrip("/"))


def test_which_path_serves_which_model():
    def path(model: str, api_base: str | None = None) -> str:
        return model_path(ModelSettings(model=model, api_base=api_base))

    assert path("offline") == path("echo") == "built-in"
    assert path("openai/gpt-4o-mini") == "openai-compatible"
    assert path("openai/llama3", "http://localhost:11434/v1") == "openai-compatible"
    assert path("openrouter/anthropic/claude-sonnet-4") == "openai-compatible"
    assert path("hosted_vllm/qwen") == "litellm"  # no URL to post to
    assert path("hosted_vllm/qwen", "http://gpu:8000/v1") == "openai-compatible"
    assert path("anthropic/claude-sonnet-4-5") == path("gemini/gemini-2.5-flash") == "litellm"
    assert path("gpt-4o-mini") == "litellm"  # no prefix: litellm's tables decide
    assert isinstance(model_for(ModelSettings(model="openai/x")), OpenAICompatibleModel)
    assert isinstance(model_for(ModelSettings(model="anthropic/x")), LiteLLMModel)
    assert not uses_litellm(ModelSettings(model="openai/x"))
    assert uses_litellm(ModelSettings(model="anthropic/x"))


def test_the_proxy_is_decided_once_per_base_url_from_the_environment(monkeypatch):
    from pluto.runtime import openai_compat

    monkeypatch.setattr(openai_compat, "_proxies", {})
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert openai_compat._proxy_for("https://api.openai.com/v1") == "http://proxy.internal:3128"
    assert openai_compat._proxy_for("http://127.0.0.1:8080/v1") is None
    monkeypatch.delenv("HTTPS_PROXY")
    assert openai_compat._proxy_for("https://api.openai.com/v1") == "http://proxy.internal:3128"
    monkeypatch.setattr(openai_compat, "_proxies", {})
    assert openai_compat._proxy_for("https://api.openai.com/v1") is None


async def _plain_server(body: object, content_type: str = "application/json"):
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(body).encode(), content_type=content_type)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


async def test_a_server_that_ignores_stream_still_answers():
    runner, base = await _plain_server({
        "choices": [{"finish_reason": "tool_calls", "message": {"content": "Let me look.",
                     "tool_calls": [{"id": "c9", "type": "function", "function": {
                         "name": "lookup", "arguments": "{\"q\": \"x\"}"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    try:
        shown: list[str] = []
        turn = await collect(OpenAICompatibleModel(),
                             ModelSettings(model="openai/fake", api_base=base), shown=shown)
    finally:
        await runner.cleanup()
        await close_sessions()
    assert shown == ["Let me look."] and turn.text == "Let me look."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("c9", "lookup", '{"q": "x"}')]
    assert turn.usage == {"prompt_tokens": 5, "completion_tokens": 3}


@pytest.mark.parametrize("body", [{"error": {"message": "upstream exploded"}}, ["not", "a", "completion"]])
async def test_a_200_that_is_not_a_completion_is_a_model_error(body):
    runner, base = await _plain_server(body)
    try:
        with pytest.raises(ModelError) as info:
            await collect(OpenAICompatibleModel(), ModelSettings(model="openai/fake", api_base=base))
    finally:
        await runner.cleanup()
        await close_sessions()
    assert "Traceback" not in str(info.value) and str(info.value).endswith(".")


def test_the_admin_may_choose_the_path_per_model():
    from pluto.settings import PlutoConfig

    cfg = PlutoConfig(models={"local": {"model": "meta-llama/Llama-3.1-8B",
                                        "api_base": "http://127.0.0.1:8000/v1",
                                        "client": "openai"},
                              "proxied": {"model": "openai/gpt-4o-mini", "client": "litellm"}})
    local = ModelSettings(model=cfg.models["local"].model, api_base=cfg.models["local"].api_base,
                          client=cfg.models["local"].client)
    assert model_path(local) == "openai-compatible"
    from pluto.runtime.openai_compat import endpoint_of
    assert endpoint_of(local)[:2] == ("http://127.0.0.1:8000/v1", "meta-llama/Llama-3.1-8B")
    assert model_path(ModelSettings(model="openai/gpt-4o-mini", client="litellm")) == "litellm"
    assert model_path(ModelSettings(model="echo", client="openai")) == "built-in"
    with pytest.raises(Exception, match="client"):
        PlutoConfig(models={"x": {"model": "openai/x", "client": "httpx"}})
