"""The fake OpenAI server, checked against the real clients (litellm, openai SDK) over HTTP."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
from typing import Any

import aiohttp
import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply, ThreadedFakeOpenAI, ToolCall

MESSAGES = [{"role": "user", "content": "hello there"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_sql",
            "description": "Run a read-only SQL query.",
            "parameters": {
                "type": "object",
                "properties": {"sql": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["sql"],
            },
        },
    }
]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(scope="module")
def litellm() -> Any:
    """litellm, imported lazily (≈3 s) and never allowed to fetch its price list."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm as _litellm

    _litellm.telemetry = False
    _litellm.suppress_debug_info = True  # else every exception prints "Give Feedback" to stdout
    return _litellm


@pytest.fixture
async def fake() -> Any:
    async with FakeOpenAI() as server:
        yield server


# litellm 1.106.2 imports its MCP gateway (which needs the `mcp` package) on every call
# that has `tools`, even plain function tools; without `mcp` installed the call fails with
# APIConnectionError "No module named 'mcp'". `_skip_mcp_handler` bypasses that import.
_NEEDS_MCP_BYPASS = importlib.util.find_spec("mcp") is None


def _kwargs(fake: FakeOpenAI, **extra: Any) -> dict[str, Any]:
    if extra.get("tools") and _NEEDS_MCP_BYPASS:
        extra["_skip_mcp_handler"] = True
    return {
        "model": "openai/fake",
        "api_base": fake.base_url,
        "api_key": "sk-test",
        "messages": MESSAGES,
        "num_retries": 0,
        "max_retries": 0,
        **extra,
    }


async def _collect(stream: Any) -> list[Any]:
    return [chunk async for chunk in stream]


# -- streamed -----------------------------------------------------------------------


async def test_litellm_streamed_text_with_usage(litellm: Any, fake: FakeOpenAI) -> None:
    fake.script(Reply(text="Hello from the fake model!", usage=(11, 7)))
    stream = await litellm.acompletion(
        **_kwargs(fake, stream=True, stream_options={"include_usage": True})
    )
    chunks = await _collect(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the fake model!"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # really in pieces
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    usages = [u for c in chunks if (u := getattr(c, "usage", None))]
    assert usages, "usage should arrive in the stream"
    assert (usages[-1].prompt_tokens, usages[-1].completion_tokens, usages[-1].total_tokens) == (11, 7, 18)

    built = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    assert built.choices[0].message.content == "Hello from the fake model!"
    assert built.usage.prompt_tokens == 11 and built.usage.completion_tokens == 7

    body = fake.requests[0]
    assert body["model"] == "fake" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == MESSAGES


async def test_litellm_streamed_tool_call(litellm: Any, fake: FakeOpenAI) -> None:
    args = {"sql": "SELECT region, sum(amount) FROM sales GROUP BY 1", "limit": 10}
    fake.script(
        Reply(
            text="Let me look.",
            tool_calls=[ToolCall("run_sql", args, id="call_abc"), ToolCall("run_sql", {"sql": "SELECT 1"})],
            chunk_size=5,
        )
    )
    stream = await litellm.acompletion(
        **_kwargs(fake, tools=TOOLS, stream=True, stream_options={"include_usage": True})
    )
    chunks = await _collect(stream)

    pieces = [
        tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls
    ]
    assert len([p for p in pieces if p.index == 0]) > 3  # arguments split across pieces

    # assemble by index, as an agent loop would
    calls: dict[int, dict[str, str]] = {}
    for piece in pieces:
        call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
        call["id"] = piece.id or call["id"]
        if piece.function.name:
            call["name"] = piece.function.name
        call["arguments"] += piece.function.arguments or ""
    assert calls[0]["id"] == "call_abc" and calls[0]["name"] == "run_sql"
    assert json.loads(calls[0]["arguments"]) == args
    assert calls[1]["id"].startswith("call_") and json.loads(calls[1]["arguments"]) == {"sql": "SELECT 1"}
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]

    built = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    message = built.choices[0].message
    assert message.content == "Let me look."
    assert [tc.function.name for tc in message.tool_calls] == ["run_sql", "run_sql"]
    assert json.loads(message.tool_calls[0].function.arguments) == args
    assert built.choices[0].finish_reason == "tool_calls"
    assert fake.requests[0]["tools"] == TOOLS


async def test_malformed_arguments_are_sent_verbatim(litellm: Any, fake: FakeOpenAI) -> None:
    fake.script(Reply(tool_calls=[ToolCall("run_sql", '{"sql": "SELECT', id="call_bad")]))
    stream = await litellm.acompletion(**_kwargs(fake, tools=TOOLS, stream=True))
    built = litellm.stream_chunk_builder(await _collect(stream), messages=MESSAGES)
    assert built.choices[0].message.tool_calls[0].function.arguments == '{"sql": "SELECT'


async def test_raw_sse_framing(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="abcdefg", chunk_size=2, tool_calls=[ToolCall("f", {"a": 1})]))
    body = {"model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.base_url}/chat/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/event-stream"
            raw = await response.text()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "abcdefg"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    tool_pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert tool_pieces[0]["function"]["name"] == "f" and tool_pieces[0]["type"] == "function"
    assert "name" not in tool_pieces[1]["function"]
    assert json.loads("".join(p["function"]["arguments"] for p in tool_pieces)) == {"a": 1}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == []
    assert set(chunks[-1]["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


async def test_no_usage_chunk_unless_asked(fake: FakeOpenAI) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.base_url}/chat/completions", json=body) as response:
            raw = await response.text()
    chunks = [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.startswith("data: {")]
    assert all(c["choices"] for c in chunks) and all("usage" not in c for c in chunks)


# -- not streamed -------------------------------------------------------------------


async def test_litellm_non_streamed(litellm: Any, fake: FakeOpenAI) -> None:
    fake.script(
        Reply(text="Plain answer."),
        Reply(tool_calls=[ToolCall("run_sql", {"sql": "SELECT 2"})], usage=(20, 5)),
    )
    first = await litellm.acompletion(**_kwargs(fake))
    assert first.choices[0].message.content == "Plain answer."
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens > 0

    second = await litellm.acompletion(**_kwargs(fake, tools=TOOLS))
    call = second.choices[0].message.tool_calls[0]
    assert call.function.name == "run_sql" and json.loads(call.function.arguments) == {"sql": "SELECT 2"}
    assert call.id.startswith("call_")
    assert second.choices[0].finish_reason == "tool_calls"
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (20, 5)

    third = await litellm.acompletion(**_kwargs(fake))  # queue empty: default reply
    assert third.choices[0].message.content == "ok"
    assert len(fake.requests) == 3 and "stream" not in fake.requests[0]


async def test_respond_with_and_default_reply(litellm: Any, fake: FakeOpenAI) -> None:
    fake.default_reply = Reply(text="default")
    fake.script(Reply(text="scripted"))

    def echo(body: dict[str, Any]) -> Reply | None:
        last = body["messages"][-1]["content"]
        return Reply(text=f"echo: {last}") if last.startswith("echo") else None

    fake.respond_with(echo)
    a = await litellm.acompletion(**_kwargs(fake, messages=[{"role": "user", "content": "echo me"}]))
    b = await litellm.acompletion(**_kwargs(fake))
    c = await litellm.acompletion(**_kwargs(fake))
    assert [r.choices[0].message.content for r in (a, b, c)] == ["echo: echo me", "scripted", "default"]


# -- errors -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_litellm_error_statuses(litellm: Any, fake: FakeOpenAI, stream: bool) -> None:
    fake.script(
        Reply(status=429, error_message="slow down", headers={"retry-after": "7"}),
        Reply(status=500, error_message="boom"),
        Reply(status=503, error_message="overloaded"),
        Reply(status=400, error_message="bad request"),
        Reply(status=401),  # OpenAI's own text: litellm needs "Incorrect API key provided"
        Reply(status=401, error_message="nope"),  # litellm: invalid_request_error -> BadRequest
        Reply(status=404),
    )
    expected = [
        (litellm.RateLimitError, 429, "slow down"),
        (litellm.InternalServerError, 500, "boom"),
        (litellm.ServiceUnavailableError, 503, "overloaded"),
        (litellm.BadRequestError, 400, "bad request"),
        (litellm.AuthenticationError, 401, "Incorrect API key provided"),
        (litellm.BadRequestError, 401, "nope"),
        (litellm.NotFoundError, 404, "does not exist"),
    ]
    for exc_type, status, message in expected:
        with pytest.raises(exc_type) as info:
            response = await litellm.acompletion(**_kwargs(fake, stream=stream))
            if stream:
                await _collect(response)
        assert info.value.status_code == status
        assert message in str(info.value)
        if status == 429:  # the response headers travel on the exception
            assert info.value.litellm_response_headers["retry-after"] == "7"
    assert len(fake.requests) == len(expected)  # no retries


async def test_error_shape_and_headers(fake: FakeOpenAI) -> None:
    fake.script(Reply(status=429, error_message="slow down", headers={"retry-after": "2"}))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.base_url}/chat/completions", json={"model": "m", "messages": MESSAGES}) as r:
            assert r.status == 429 and r.headers["retry-after"] == "2"
            assert (await r.json())["error"] == {
                "message": "slow down", "type": "requests", "param": None, "code": "rate_limit_exceeded"
            }
        async with http.post(f"{fake.base_url}/chat/completions", data=b"{not json") as r:
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
        async with http.post(f"{fake.base_url}/chat/completions", json={"model": "m"}) as r:
            assert r.status == 400
        async with http.get(f"{fake.base_url}/embeddings") as r:
            assert r.status == 404 and "Invalid URL" in (await r.json())["error"]["message"]
        async with http.get(f"{fake.base_url}/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "fake"


async def test_drop_after_fails_the_client(litellm: Any, fake: FakeOpenAI) -> None:
    from litellm.exceptions import MidStreamFallbackError

    fake.script(Reply(text="this answer never finishes", drop_after=3))
    stream = await litellm.acompletion(**_kwargs(fake, stream=True))
    received: list[str] = []
    with pytest.raises(MidStreamFallbackError) as info:  # a ServiceUnavailableError subclass
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "this a"  # role chunk + 2 content chunks of 3 chars
    assert info.value.generated_content == "this a"
    assert not info.value.is_pre_first_chunk
    assert isinstance(info.value.original_exception, litellm.APIConnectionError)
    assert isinstance(info.value, litellm.ServiceUnavailableError)

    fake.script(Reply(text="never", drop_after=0))  # dropped before the first chunk
    with pytest.raises(MidStreamFallbackError) as info:
        await _collect(await litellm.acompletion(**_kwargs(fake, stream=True)))
    assert info.value.is_pre_first_chunk

    fake.script(Reply(drop_after=0))  # not streamed: the connection closes with no response
    with pytest.raises(litellm.InternalServerError, match="Connection error"):
        await litellm.acompletion(**_kwargs(fake))


async def test_delays(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="abcdef", chunk_size=1, chunk_delay=0.03), Reply(delay=0.2))
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        start = time.monotonic()
        async with http.post(f"{fake.base_url}/chat/completions", json=body) as r:
            await r.text()
        assert time.monotonic() - start >= 0.2
        start = time.monotonic()
        async with http.post(f"{fake.base_url}/chat/completions", json={"model": "m", "messages": MESSAGES}) as r:
            assert r.status == 200
        assert time.monotonic() - start >= 0.2


async def test_stop_does_not_wait_for_a_long_delay() -> None:
    fake = FakeOpenAI()
    await fake.start()
    fake.script(Reply(delay=30))
    async with aiohttp.ClientSession() as http:
        request = asyncio.create_task(
            http.post(f"{fake.base_url}/chat/completions", json={"model": "m", "messages": MESSAGES})
        )
        await fake.wait_for_requests(1)
        start = time.monotonic()
        await fake.stop()
        assert time.monotonic() - start < 5
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)


# -- threaded, from sync code ------------------------------------------------------


def test_threaded_with_openai_sdk() -> None:
    import openai

    with ThreadedFakeOpenAI() as fake:
        fake.script(
            Reply(text="sync hello", chunk_size=2),
            Reply(tool_calls=[ToolCall("run_sql", {"sql": "SELECT 3"})]),
            Reply(status=429, headers={"retry-after": "0"}),
        )
        client = openai.OpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
        stream = client.chat.completions.create(
            model="fake", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "sync hello"
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0

        completion = client.chat.completions.create(model="fake", messages=MESSAGES, tools=TOOLS)
        call = completion.choices[0].message.tool_calls[0]
        assert call.function.name == "run_sql" and json.loads(call.function.arguments) == {"sql": "SELECT 3"}

        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="fake", messages=MESSAGES)

        assert [m.id for m in client.models.list()] == ["fake"]
        assert len(fake.wait_for_requests(3)) == 3
        assert fake.requests[1]["tools"] == TOOLS
        assert fake.pending == 0
        client.close()
    assert fake.base_url  # stopped cleanly


def test_in_thread_alias_and_api_key() -> None:
    import openai

    with FakeOpenAI.in_thread(api_key="sk-right") as fake:
        good = openai.OpenAI(base_url=fake.base_url, api_key="sk-right", max_retries=0)
        assert good.chat.completions.create(model="fake", messages=MESSAGES).choices[0].message.content == "ok"
        bad = openai.OpenAI(base_url=fake.base_url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="fake", messages=MESSAGES)
        good.close()
        bad.close()
