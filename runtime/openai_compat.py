"""The direct path for OpenAI-compatible Chat Completions servers (OpenAI, OpenRouter, Groq,
DeepSeek, vLLM, llama.cpp, LM Studio, Ollama's ``/v1``, ...), and which path serves a model.

litellm builds a pydantic object per streamed chunk and goes through the openai SDK and httpx:
about 100 ms of CPU per 100-token answer, which on two cores made the gateway, not the model,
the bottleneck. This path posts the request on one pooled aiohttp session per base URL (per
event loop) and reads the server-sent events itself, each chunk parsed with orjson into plain
dicts: a few ms per answer. litellm stays for the services it translates (Anthropic, Gemini,
Bedrock, ...).

Which path serves a model (:func:`model_path`): the built-in models by name; ``client: openai``
or ``client: litellm`` in pluto.yaml when the admin chose; otherwise (``auto``) a model string
whose prefix names an OpenAI-compatible service (``openai/``, ``openrouter/``, ``groq/``,
``deepseek/``, ``hosted_vllm/``, ``lm_studio/``) goes direct, anything else through litellm.
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.request
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from pluto.errors import PlutoError
from pluto.runtime.errors import ModelError
from pluto.runtime.images import resolved
from pluto.runtime import model as base
from pluto.runtime.model import Model, ModelSettings, ModelTurn, ToolCall, classify_error

log = logging.getLogger(__name__)

# litellm's prefix → (the service's base URL when none is configured, its key's variable)
OPENAI_COMPATIBLE: dict[str, tuple[str | None, str]] = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": ("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "deepseek": ("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
    "hosted_vllm": (None, "HOSTED_VLLM_API_KEY"),
    "lm_studio": ("http://localhost:1234/v1", "LM_STUDIO_API_KEY"),
}
MAX_EVENT = 8 * 1024 * 1024  # one server-sent event larger than this is not a chat chunk
MAX_ERROR_BODY = 64 * 1024
CONNECTIONS = 4096  # per base URL: concurrent streams each hold one (HTTP/1.1)


def model_path(settings: ModelSettings) -> str:
    """``built-in``, ``openai-compatible`` (this module) or ``litellm``: shown by doctor."""
    if not base.uses_litellm(settings.model):
        return "built-in"
    if settings.client in ("openai", "litellm"):  # the admin chose (pluto.yaml: client)
        return "openai-compatible" if settings.client == "openai" else "litellm"
    prefix = settings.model.split("/", 1)[0] if "/" in settings.model else ""
    if prefix not in OPENAI_COMPATIBLE:
        return "litellm"
    if OPENAI_COMPATIBLE[prefix][0] is None and not settings.api_base:
        return "litellm"  # no URL to post to: litellm knows where (or says what is missing)
    return "openai-compatible"


def model_for(settings: ModelSettings) -> Model:
    """The model that serves ``settings`` (the Runner's default factory)."""
    match model_path(settings):
        case "openai-compatible":
            return _DIRECT
        case _:  # the built-in models, and litellm
            return base.model_for(settings)


def uses_litellm(settings: ModelSettings) -> bool:
    """Whether a model goes through litellm (a gateway that has one warms litellm at start)."""
    return model_path(settings) == "litellm"


def endpoint_of(settings: ModelSettings) -> tuple[str, str, str | None]:
    """(base URL, the model's name at the service, the API key or None)."""
    prefix, _, name = settings.model.partition("/")
    if prefix not in OPENAI_COMPATIBLE or not name:  # client: openai with any model name
        prefix, name = "openai", settings.model
    default_base, key_env = OPENAI_COMPATIBLE[prefix]
    url = (settings.api_base or default_base or "").rstrip("/")
    key = settings.api_key() or os.environ.get(key_env) or None
    return url, name, key


# one session per base URL per event loop --------------------------------------------------------

_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, aiohttp.ClientSession]] = \
    weakref.WeakKeyDictionary()
_proxies: dict[str, str | None] = {}
# NO_PROXY's test, as urllib applies it (the standard library has it, its stubs do not)
_bypass_environment: Callable[[str, dict[str, str]], object] = getattr(
    urllib.request, "proxy_bypass_environment")


def _session(url: str) -> aiohttp.ClientSession:
    pool = _pools.setdefault(asyncio.get_running_loop(), {})
    session = pool.get(url)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=CONNECTIONS, limit_per_host=CONNECTIONS,
                                         keepalive_timeout=60, ttl_dns_cache=300)
        # trust_env would look up .netrc and the proxy variables in a worker thread at every
        # request (a burst of questions then queues on a few threads): the proxy is decided
        # once per base URL instead (_proxy_for); no cookies either.
        session = pool[url] = aiohttp.ClientSession(connector=connector,
                                                    cookie_jar=aiohttp.DummyCookieJar())
    return session


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (HTTPS_PROXY, NO_PROXY, ...), once."""
    if url not in _proxies:
        host = urlsplit(url).hostname or ""
        proxies = urllib.request.getproxies_environment()
        scheme = urlsplit(url).scheme
        bypass = bool(_bypass_environment(host, proxies)) if proxies else True
        _proxies[url] = None if bypass else proxies.get(scheme) or proxies.get("all")
    return _proxies[url]


async def close_sessions() -> None:
    """Close this event loop's pooled sessions (at gateway stop; idempotent)."""
    pool = _pools.pop(asyncio.get_running_loop(), {})
    for session in pool.values():
        await session.close()


# the model --------------------------------------------------------------------------------------

class _StatusError(PlutoError):
    """An HTTP error answer, shaped for :func:`classify_error` (status, reason, headers);
    never leaves this module (classified into a :class:`ModelError`)."""

    def __init__(self, status: int, message: str, headers: Any):
        super().__init__(message)
        self.status_code = status
        self.message = message
        self.litellm_response_headers = headers


class APIConnectionError(PlutoError):
    """The service could not be reached (named as litellm names it: one classification);
    never leaves this module."""


class OpenAICompatibleModel:
    """Chat Completions, streamed over a pooled connection; chunks parsed as plain dicts."""

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[str | ModelTurn]:
        url, name, key = endpoint_of(settings)
        if key is None and not settings.api_base:
            raise classify_error(Exception("Missing credentials: the api_key client option must "
                                           "be set"), settings)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        messages = await resolved(messages)  # pictures: their files as data: URLs
        body = orjson.dumps(_request(name, messages, tools, settings, official=(
            settings.api_base is None and settings.model.startswith("openai/"))))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.timeout,
                                        sock_read=settings.timeout)
        turn = _Turn()
        try:
            async with _session(url).post(f"{url}/chat/completions", data=body,
                                           headers=headers, timeout=timeout,
                                           proxy=_proxy_for(url)) as response:
                if response.status != 200:
                    raise await _status_error(response)
                if not response.content_type.startswith("text/event-stream"):
                    turn.add_completion(orjson.loads(await response.read()))
                    if turn.text:
                        yield "".join(turn.text)
                else:
                    async for text in _events(response, turn):
                        yield text
        except ModelError:
            raise
        except _StatusError as e:
            raise classify_error(e, settings) from None
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise classify_error(TimeoutError("Timeout: the model did not answer in time"),
                                 settings) from e
        except aiohttp.ClientConnectorError as e:
            raise classify_error(APIConnectionError(f"Connection error: {e}"),
                                 settings) from None
        except (aiohttp.ClientError, orjson.JSONDecodeError) as e:
            if turn.text or turn.calls:
                raise _dropped() from e
            raise classify_error(APIConnectionError(f"Connection error: {e}"),
                                 settings) from None
        yield turn.turn()


_DIRECT = OpenAICompatibleModel()


def _request(name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
             settings: ModelSettings, *, official: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": name, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if tools:
        body["tools"] = tools
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if settings.max_output_tokens:  # OpenAI's own API renamed it; compatible servers did not
        body["max_completion_tokens" if official else "max_tokens"] = settings.max_output_tokens
    return body


async def _status_error(response: aiohttp.ClientResponse) -> _StatusError:
    raw = await response.content.read(MAX_ERROR_BODY)
    message = raw.decode("utf-8", "replace").strip()
    try:
        parsed = orjson.loads(raw)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
        elif isinstance(error, str):
            message = error
    except orjson.JSONDecodeError:
        pass
    return _StatusError(response.status, message or response.reason or "", response.headers)


def _dropped() -> ModelError:
    return ModelError("The model service stopped in the middle of the answer.", retryable=True)


async def _events(response: aiohttp.ClientResponse, turn: _Turn) -> AsyncIterator[str]:
    """The text deltas of a server-sent event stream, assembling the turn on the way."""
    buffer = b""
    data: list[bytes] = []
    async for piece in response.content.iter_any():
        buffer += piece
        if b"\n" not in piece:
            if len(buffer) > MAX_EVENT:
                raise ModelError("The model service sent a malformed stream.")
            continue
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if line:
                if line[:5] == b"data:":
                    data.append(line[6:] if line[5:6] == b" " else line[5:])
                continue  # comments, event:, id:, retry: fields
            if not data:
                continue
            payload = data[0] if len(data) == 1 else b"\n".join(data)
            data = []
            if payload == b"[DONE]":
                return
            if text := turn.add(orjson.loads(payload)):
                yield text
    if turn.finish is None:  # the connection ended before the answer did
        raise _dropped()


class _Turn:
    """A streamed turn from plain dict chunks: text, tool calls in pieces by index, usage."""

    __slots__ = ("text", "calls", "usage", "finish")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index → [id, name, arguments]
        self.usage: dict[str, int] = {}
        self.finish: str | None = None

    def add(self, chunk: Any) -> str:
        if not isinstance(chunk, dict):
            return ""
        if (usage := chunk.get("usage")) and isinstance(usage, dict):
            self.usage = {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                          "completion_tokens": int(usage.get("completion_tokens") or 0)}
            details = usage.get("prompt_tokens_details")  # cached input (part of the prompt)
            if isinstance(details, dict) and (cached := details.get("cached_tokens")):
                self.usage["cached_tokens"] = int(cached)
        choices = chunk.get("choices")
        if not choices:
            if (error := chunk.get("error")) is not None:
                message = error.get("message") if isinstance(error, dict) else str(error)
                log.warning("the model service sent an error mid-stream: %s", message)
                raise ModelError("The model service had an error in the middle of the answer.",
                                 retryable=True)
            return ""
        choice = choices[0]
        if finish := choice.get("finish_reason"):
            self.finish = finish
        delta = choice.get("delta")
        if not delta:
            return ""
        if calls := delta.get("tool_calls"):
            for call in calls:
                slot = self.calls.setdefault(call.get("index") or 0, ["", "", ""])
                slot[0] = call.get("id") or slot[0]
                if fn := call.get("function"):
                    slot[1] = fn.get("name") or slot[1]
                    slot[2] += fn.get("arguments") or ""
        text = delta.get("content")
        if text:
            self.text.append(text)
            return text
        return ""

    def add_completion(self, body: Any) -> None:
        """A server that ignored ``stream``: one whole completion."""
        if not isinstance(body, dict) or "choices" not in body:
            self.add(body if isinstance(body, dict) and "error" in body else {"error": body})
            return
        choice = (body.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        self.add({"usage": body.get("usage") if isinstance(body, dict) else None,
                  "choices": [{"finish_reason": choice.get("finish_reason") or "stop",
                               "delta": {"content": message.get("content"),
                                         "tool_calls": [dict(c, index=i) for i, c in enumerate(
                                             message.get("tool_calls") or [])]}}]})

    def turn(self) -> ModelTurn:
        calls = [ToolCall(c[0] or f"call_{i}", c[1], c[2] or "{}")
                 for i, c in sorted(self.calls.items())]
        return ModelTurn("".join(self.text), calls, self.usage, self.finish)
