"""A fake OpenAI-compatible Chat Completions server for tests.

It runs a real aiohttp server on 127.0.0.1 (any free port), so litellm and the
``openai`` SDK talk to it over the wire. Replies are scripted::

    async with FakeOpenAI() as fake:
        fake.script(
            Reply(tool_calls=[ToolCall("run_sql", {"sql": "select 1"})]),
            Reply(text="The answer is 1."),
        )
        await litellm.acompletion(model="openai/fake", api_base=fake.base_url,
                                  api_key="sk-test", messages=[...], stream=True)
        assert fake.requests[0]["messages"][-1]["content"] == "..."

Each request takes the next scripted ``Reply``; when the queue is empty the
``default_reply`` (``Reply(text="ok")``) answers. ``respond_with(fn)`` computes
replies from the request body instead (``fn`` may return ``None`` to fall back to
the queue). ``ThreadedFakeOpenAI`` runs the same server on its own loop in a
background thread for synchronous code (subprocess tests, benchmarks).

Endpoints: ``POST /v1/chat/completions`` (streamed and not), ``GET /v1/models``,
``GET /v1/models/{id}``. Anything else is a 404 in OpenAI's error shape; a body
that is not JSON is a 400.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["DEFAULT_ERROR_MESSAGES", "FakeOpenAI", "Image", "Reply", "ThreadedFakeOpenAI", "ToolCall", "error_body"]


@dataclass
class ToolCall:
    """A function call the fake model makes."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    """A dict is JSON-encoded; a str is sent verbatim (e.g. to send malformed JSON)."""
    id: str | None = None
    """The tool call id; ``call_<n>`` (unique per server) when None."""


@dataclass
class Reply:
    """One scripted response of the fake model."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    status: int | None = None
    """An HTTP error status (400, 401, 429, 500, 503, ...) instead of a completion."""
    error_message: str | None = None
    """``error.message``; None: what OpenAI says for that status (see ``DEFAULT_ERROR_MESSAGES``).
    Beware: litellm maps errors partly by text, so a 401 whose message lacks "Incorrect API
    key provided" becomes a ``BadRequestError`` (its type is ``invalid_request_error``)."""
    error_type: str | None = None
    """OpenAI's ``error.type``; derived from ``status`` when None."""
    error_code: str | None = None
    """OpenAI's ``error.code``; derived from ``status`` when None."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers, e.g. ``{"retry-after": "1"}``."""
    delay: float = 0.0
    """Seconds to wait before the response starts (headers included)."""
    chunk_delay: float = 0.0
    """Seconds between streamed chunks."""
    chunk_size: int = 3
    """Characters per content delta, and per tool-call arguments piece."""
    drop_after: int | None = None
    """Streamed: abort the connection after this many SSE chunks (0 = right after
    the headers), never sending ``[DONE]``. Not streamed: abort without a response."""
    usage: tuple[int, int] | None = None
    """(prompt_tokens, completion_tokens); default: a rough count (chars / 4)."""
    cached_tokens: int | None = None
    """Reported as ``usage.prompt_tokens_details.cached_tokens`` (part of the prompt tokens)."""
    finish_reason: str | None = None
    """Override the finish reason ("length", "content_filter", ...); default:
    "tool_calls" when there are tool calls, else "stop"."""


ReplyFn = Callable[[dict[str, Any]], "Reply | None | Awaitable[Reply | None]"]

_ERROR_DEFAULTS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    409: ("conflict", None),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


DEFAULT_ERROR_MESSAGES: dict[int, str] = {
    400: "scripted error",
    401: "Incorrect API key provided: sk-test. You can find your API key at https://platform.openai.com/account/api-keys.",
    403: "Country, region, or territory not supported",
    404: "The model `fake` does not exist or you do not have access to it.",
    429: "Rate limit reached for fake in organization org-fake on requests per min (RPM): Limit 3, Used 3, Requested 1.",
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The engine is currently overloaded, please try again later.",
}

_DEFAULT: Any = object()


def error_body(status: int, message: str, type_: str | None = None, code: str | None = _DEFAULT) -> dict[str, Any]:
    """OpenAI's error shape for an HTTP status (``code`` defaults by status; None is kept)."""
    default_type, default_code = _ERROR_DEFAULTS.get(
        status, ("server_error", None) if status >= 500 else ("invalid_request_error", None)
    )
    return {
        "error": {
            "message": message,
            "type": type_ or default_type,
            "param": None,
            "code": default_code if code is _DEFAULT else code,
        }
    }


def _rough_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4) if text else 0


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict):
                parts.append(json.dumps(call.get("function", {})))
    if body.get("tools"):
        parts.append(json.dumps(body["tools"]))
    return "\n".join(parts)


MAX_IMAGE_BYTES = 20 * 2**20  # OpenAI: per image
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "WEBP")
UNSUPPORTED_IMAGE = ("You uploaded an unsupported image. Please make sure your image is below 20 "
                     "MB in size and is of one the following formats: ['png', 'jpeg', 'gif', "
                     "'webp'].")


@dataclass(frozen=True)
class Image:
    """An image part the fake model received, as decoded."""

    mime: str
    width: int
    height: int
    nbytes: int
    format: str
    role: str


class _BadImage(Exception):
    """An image part OpenAI would refuse (the fake answers 400 with its message)."""


def _images_of(body: dict[str, Any]) -> list[Image]:
    """The image parts of a request, decoded as the API reads them: base64 ``data:`` URLs of
    PNG, JPEG, GIF or WebP up to 20 MB, in user messages only (else a 400)."""
    found: list[Image] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            role = str(message.get("role"))
            if role != "user":
                raise _BadImage(f"Image URLs are only allowed for messages with role 'user', "
                                f"but this message with role '{role}' contains an image URL.")
            found.append(_decoded(str((part.get("image_url") or {}).get("url") or ""), role))
    return found


def _decoded(url: str, role: str) -> Image:
    import base64
    import binascii
    import io
    import re

    from PIL import Image as PIL, UnidentifiedImageError

    m = re.match(r"^data:(image/[a-z]+);base64,(.*)$", url, re.S)
    if m is None:
        raise _BadImage("Invalid image URL: expected a base64-encoded data URL with an image "
                        "MIME type (e.g. 'data:image/png;base64,...').")
    try:
        raw = base64.b64decode(m.group(2), validate=True)
        if len(raw) > MAX_IMAGE_BYTES:
            raise _BadImage(UNSUPPORTED_IMAGE)
        with PIL.open(io.BytesIO(raw), formats=IMAGE_FORMATS) as im:
            im.load()
            return Image(m.group(1), im.width, im.height, len(raw), str(im.format), role)
    except (binascii.Error, UnidentifiedImageError, OSError, ValueError):
        raise _BadImage(UNSUPPORTED_IMAGE) from None


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


class FakeOpenAI:
    """An OpenAI-compatible Chat Completions server on 127.0.0.1 (async context manager).

    ``script``, ``requests``, ``default_reply`` and ``respond_with`` may be used from
    any thread. A ``respond_with`` function runs on the server's event loop.
    """

    def __init__(
        self,
        *,
        default_reply: Reply | None = None,
        api_key: str | None = None,
        models: list[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """``api_key``: when set, requests with another bearer token get a 401."""
        self.default_reply: Reply = default_reply if default_reply is not None else Reply(text="ok")
        self.api_key = api_key
        self.models: list[str] = list(models) if models is not None else ["fake"]
        self.requests: list[dict[str, Any]] = []
        """Every JSON chat-completions request body received, in order."""
        self.request_headers: list[dict[str, str]] = []
        """The headers of each entry of ``requests`` (same index)."""
        self.images: list[list[Image]] = []
        """The image parts of each request (decoded; same index as ``requests`` for requests
        that got this far), in order."""
        self.base_url: str = ""
        """``http://127.0.0.1:PORT/v1`` once started."""
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._respond_fn: ReplyFn | None = None
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None

    # -- scripting ---------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies: each request takes the next; when empty, ``default_reply``."""
        with self._lock:
            self._queue.extend(replies)

    def clear(self) -> None:
        """Drop queued replies, the ``respond_with`` function and recorded requests."""
        with self._lock:
            self._queue.clear()
            self._respond_fn = None
            self.requests.clear()
            self.request_headers.clear()
            self.images.clear()

    @property
    def pending(self) -> int:
        """How many scripted replies are still queued."""
        with self._lock:
            return len(self._queue)

    def respond_with(self, fn: ReplyFn | None) -> None:
        """Compute replies from the request body (sync or async ``fn``); takes priority
        over the queue. ``fn`` may return None to fall back to the queue. None unsets."""
        with self._lock:
            self._respond_fn = fn

    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Wait until at least ``n`` requests arrived; return a copy of ``requests``."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} requests, got {len(self.requests)}")
            await asyncio.sleep(0.01)
        with self._lock:
            return list(self.requests)

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> str:
        """Start listening; return ``base_url``."""
        if self._runner is not None:
            return self.base_url
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model:.+}", self._get_model)
        app.middlewares.append(self._error_middleware)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        server = site._server  # noqa: SLF001 - the only way to learn the bound port
        assert server is not None and server.sockets
        port = server.sockets[0].getsockname()[1]
        self.base_url = f"http://{self._host}:{port}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is None:
            return
        assert self._closing is not None
        self._closing.set()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @classmethod
    def in_thread(cls, **kwargs: Any) -> ThreadedFakeOpenAI:
        """A ``ThreadedFakeOpenAI`` (a sync context manager) built with these arguments."""
        return ThreadedFakeOpenAI(**kwargs)

    # -- HTTP handlers -------------------------------------------------------

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {
                404: f"Invalid URL ({request.method} {request.path})",
                405: f"Method {request.method} not allowed for {request.path}",
            }.get(exc.status, exc.reason)
            return self._error(exc.status, message, code=None)

    def _error(
        self,
        status: int,
        message: str,
        type_: str | None = None,
        code: str | None = _DEFAULT,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        return web.json_response(
            error_body(status, message, type_, code), status=status, headers=headers or {}
        )

    async def _list_models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": now, "owned_by": "pluto-tests"}
                    for m in self.models
                ],
            }
        )

    async def _get_model(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in self.models:
            return self._error(404, f"The model '{model}' does not exist", code="model_not_found")
        return web.json_response(
            {"id": model, "object": "model", "created": int(time.time()), "owned_by": "pluto-tests"}
        )

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        if self.api_key is not None:
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {self.api_key}":
                return self._error(401, "Incorrect API key provided.", code="invalid_api_key")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return self._error(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means "
                "you aren't using your HTTP library correctly.)",
            )
        if not isinstance(body, dict):
            return self._error(400, "The request body must be a JSON object.")
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(dict(request.headers))
        try:
            images = _images_of(body)
        except _BadImage as e:
            return self._error(400, str(e), code="invalid_image")
        with self._lock:
            self.images.append(images)
        if not isinstance(body.get("model"), str) or not body["model"]:
            return self._error(400, "you must provide a model parameter", code="missing_required_parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._error(400, "'messages' must be a non-empty array", code="invalid_value")

        reply = await self._next_reply(body)
        if reply.delay > 0:
            await self._sleep(reply.delay)
        if reply.status is not None:
            code = _DEFAULT if reply.error_code is None else reply.error_code
            message = reply.error_message
            if message is None:
                message = DEFAULT_ERROR_MESSAGES.get(reply.status, "scripted error")
            return self._error(reply.status, message, reply.error_type, code, reply.headers)
        if body.get("stream"):
            return await self._stream(request, body, reply)
        if reply.drop_after is not None:
            return self._abort(request, web.Response())
        return web.json_response(self._completion(body, reply), headers=self._headers(reply))

    async def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            fn = self._respond_fn
        if fn is not None:
            result = fn(body)
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                return result
        with self._lock:
            return self._queue.popleft() if self._queue else self.default_reply

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but return early when the server stops."""
        assert self._closing is not None
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            pass

    @staticmethod
    def _abort(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """Cut the connection. aiohttp then fails to finish ``response`` and, seeing a
        ConnectionError, treats it as a client disconnect (quietly)."""
        if request.transport is not None:
            request.transport.abort()
        return response

    @staticmethod
    def _headers(reply: Reply) -> dict[str, str]:
        return {"x-request-id": f"req_{uuid.uuid4().hex[:24]}", **reply.headers}

    # -- completions ---------------------------------------------------------

    def _tool_call_ids(self, reply: Reply) -> list[str]:
        return [call.id or f"call_{next(self._ids)}" for call in reply.tool_calls]

    @staticmethod
    def _arguments(call: ToolCall) -> str:
        return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        if reply.usage is not None:
            prompt, completion = reply.usage
        else:
            prompt = _rough_tokens(_prompt_text(body))
            completion = _rough_tokens(
                reply.text + "".join(c.name + self._arguments(c) for c in reply.tool_calls)
            )
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}
        if reply.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
        return usage

    @staticmethod
    def _finish_reason(reply: Reply) -> str:
        return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text if (reply.text or not reply.tool_calls) else None,
            "refusal": None,
        }
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": self._arguments(call)},
                }
                for call, call_id in zip(reply.tool_calls, self._tool_call_ids(reply), strict=True)
            ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish_reason(reply)}],
            "usage": self._usage(body, reply),
        }

    def _chunks(self, body: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": "fp_fake",
        }

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            out = {**base, "choices": [choice]}
            if include_usage:
                out["usage"] = None
            return out

        chunks: list[dict[str, Any]] = []
        first: dict[str, Any] = {
            "role": "assistant",
            "content": "" if (reply.text or not reply.tool_calls) else None,
            "refusal": None,
        }
        pieces = _pieces(reply.text, reply.chunk_size)
        if pieces and not reply.tool_calls:
            # like the real API: the role chunk carries an empty content, text follows
            chunks.append(chunk(first))
            first = {}
        for piece in pieces:
            chunks.append(chunk({**first, "content": piece}))
            first = {}
        for index, (call, call_id) in enumerate(zip(reply.tool_calls, self._tool_call_ids(reply), strict=True)):
            head = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            chunks.append(chunk({**first, "tool_calls": [head]}))
            first = {}
            for piece in _pieces(self._arguments(call), reply.chunk_size):
                chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        if first:  # nothing at all to say: still announce the role
            chunks.append(chunk(first))
        chunks.append(chunk({}, self._finish_reason(reply)))
        if include_usage:
            chunks.append({**base, "choices": [], "usage": self._usage(body, reply)})
        return chunks

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **self._headers(reply),
            },
        )
        await response.prepare(request)
        for n, chunk in enumerate(self._chunks(body, reply)):
            if reply.drop_after is not None and n >= reply.drop_after:
                return self._abort(request, response)
            if n and reply.chunk_delay > 0:
                await self._sleep(reply.chunk_delay)
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if reply.drop_after is not None:  # asked to drop after more chunks than there are
            return self._abort(request, response)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class ThreadedFakeOpenAI:
    """``FakeOpenAI`` on its own event loop in a background thread, for sync code.

    ``with ThreadedFakeOpenAI() as fake: ...`` (or ``start()`` / ``stop()``).
    ``script``, ``requests``, ``default_reply``, ``respond_with`` are those of the
    underlying ``server`` and safe to use from the calling thread.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.server = FakeOpenAI(**kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.server.requests

    @property
    def request_headers(self) -> list[dict[str, str]]:
        return self.server.request_headers

    @property
    def images(self) -> list[list[Image]]:
        return self.server.images

    @property
    def default_reply(self) -> Reply:
        return self.server.default_reply

    @default_reply.setter
    def default_reply(self, reply: Reply) -> None:
        self.server.default_reply = reply

    @property
    def pending(self) -> int:
        return self.server.pending

    def script(self, *replies: Reply) -> None:
        self.server.script(*replies)

    def respond_with(self, fn: ReplyFn | None) -> None:
        self.server.respond_with(fn)

    def clear(self) -> None:
        self.server.clear()

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least ``n`` requests arrived; return a copy of ``requests``."""
        deadline = time.monotonic() + timeout
        while len(self.server.requests) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} requests, got {len(self.server.requests)}")
            time.sleep(0.01)
        return list(self.server.requests)

    def start(self) -> str:
        if self._thread is not None:
            return self.base_url
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fake-openai", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            return asyncio.run_coroutine_threadsafe(self.server.start(), loop).result(timeout=10)
        except BaseException:
            self._shutdown_loop()
            raise

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=10)
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> ThreadedFakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
