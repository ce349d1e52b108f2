"""Models: anything that streams a turn. litellm for real models (imported lazily, never on the
event loop), and the built-in offline model that needs nothing.

A model's ``stream`` yields text deltas (``str``) and, last, one :class:`ModelTurn`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import importlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pluto.runtime.errors import ModelError
from pluto.runtime.images import resolved, text_of
from pluto.runtime.model_errors import classify_error
from pluto.yamldoc import paused_gc


@dataclass(frozen=True, slots=True)
class ModelSettings:
    model: str = "offline"
    api_base: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    timeout: float = 60.0
    retries: int = 2
    client: str = "auto"  # "auto" | "openai" | "litellm": which path serves it (openai_compat)
    # pictures users send (runtime/images.py): as image parts (vision) or one-line descriptions
    vision: bool = True
    image_max_side: int = 1568  # pixels, the longest side an image is shrunk to
    image_max_mb: float = 4.0  # one image, re-encoded
    images_per_message: int = 4  # more are skipped (the user is told)
    images_in_context: int = 8  # the newest of the conversation sent; older ones described

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it (may be malformed)

    def as_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ModelTurn:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None


class Model(Protocol):
    def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               settings: ModelSettings) -> AsyncIterator[str | ModelTurn]: ...


log = logging.getLogger(__name__)


def load_litellm() -> Any:
    """Import litellm, offline: no price-list download, no telemetry. Blocking for 2–3 s: from
    async code use :func:`imported_litellm` (or :func:`warm_litellm`), which run it in a thread."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


# What litellm 1.106 still imports or builds on its first call (~0.3–1 s of the loop's time):
# the OpenAI client's resources, httpx's async backend, tiktoken's encoding (bundled: offline),
# pydantic models it builds on first use. Warming imports them, then streams one offline
# `mock_response` turn. All best effort: a name missing in another release is skipped.
_FIRST_CALL_MODULES = ("openai.resources", "openai.lib.streaming.chat", "anyio._backends._asyncio",
                       "jiter", "litellm.litellm_core_utils.default_encoding",
                       "litellm.llms.litellm_proxy", "litellm.proxy._types",
                       "litellm._service_logger")
_import_lock = threading.Lock()
_import: concurrent.futures.Future[Any] | None = None  # one per process, awaitable from any loop


def _import_and_warm() -> Any:
    """In the import thread. The garbage collector is paused meanwhile, and what the import
    made is then frozen: a collection over litellm's ~300k objects holds the GIL for 0.1 s —
    a stall of the event loop — during the import and at every full collection after it."""
    with paused_gc():
        litellm = load_litellm()
        for name in _FIRST_CALL_MODULES:
            try:
                importlib.import_module(name)
            except Exception as e:
                log.debug("litellm warm-up: %s not imported: %s", name, e)
        try:
            for _ in litellm.completion(model="openai/pluto-warm-up", mock_response="ok",
                                        messages=[{"role": "user", "content": "hi"}],
                                        stream=True, stream_options={"include_usage": True},
                                        _skip_mcp_handler=True):
                pass
        except Exception as e:
            log.debug("litellm warm-up call failed: %s", e)
        gc.freeze()  # never scanned again (refcounting still frees them); what garbage cycles
        # the import left stay, once: collecting them first would be the 0.1 s stall avoided
    return litellm


def _run_import(future: concurrent.futures.Future[Any]) -> None:
    try:
        future.set_result(_import_and_warm())
    except BaseException as e:  # handed to every caller that awaits the import
        future.set_exception(e)


def _litellm_import() -> concurrent.futures.Future[Any]:
    """The process's one import of litellm, started in a daemon thread on the first call (again
    after a failed one). A thread of its own, not an event loop's executor: any loop may await
    it, and a process that exits meanwhile does not wait for it."""
    global _import
    with _import_lock:
        future = _import
        if future is None or (future.done() and future.exception() is not None):
            future = _import = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # a cancelled waiter never cancels the import
            future.add_done_callback(_report_failed_import)
            threading.Thread(target=_run_import, args=(future,), name="litellm-import",
                             daemon=True).start()
        return future


async def imported_litellm() -> Any:
    """litellm, imported in a worker thread; concurrent callers (on any loop) share one import."""
    future = _litellm_import()
    if future.done():
        return future.result()
    return await asyncio.wrap_future(future)


async def warm_litellm() -> None:
    """Start importing litellm in a worker thread and return at once (idempotent): call it when
    a gateway that will use a real model starts, so its first call does not wait for it."""
    _litellm_import()


def _report_failed_import(future: concurrent.futures.Future[Any]) -> None:
    if (e := future.exception()) is not None:
        log.warning("litellm could not be imported (the next model call tries again): %s", e)


def uses_litellm(model_name: str) -> bool:
    """Whether a model string is served by litellm (anything but the built-in models)."""
    return model_name not in _BUILT_IN


class LiteLLMModel:
    """Any model litellm knows (``openai/…``, ``anthropic/…``, ``ollama/…``), streamed."""

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[str | ModelTurn]:
        litellm = await imported_litellm()
        kwargs: dict[str, Any] = {
            "model": settings.model, "messages": await resolved(messages), "stream": True,
            "stream_options": {"include_usage": True}, "timeout": settings.timeout,
            "num_retries": 0, "max_retries": 0,
        }
        if tools:
            kwargs["tools"] = tools
            # Our tools run in-process; without this flag litellm 1.106 routes every call with
            # tools through its MCP proxy handler, which imports the optional `mcp` package.
            kwargs["_skip_mcp_handler"] = True
        if settings.api_base:
            kwargs["api_base"] = settings.api_base
        if (key := settings.api_key()) is not None:
            kwargs["api_key"] = key
        elif settings.api_base and settings.model.startswith("openai/") and not os.environ.get(
                "OPENAI_API_KEY"):
            kwargs["api_key"] = "no-key"  # local OpenAI-compatible servers often need none
        if settings.temperature is not None:
            kwargs["temperature"] = settings.temperature
        if settings.max_output_tokens:
            kwargs["max_tokens"] = settings.max_output_tokens
        acc = _TurnBuilder()
        try:
            response = await litellm.acompletion(**kwargs)
            async for chunk in response:
                if text := acc.add(chunk):
                    yield text
        except ModelError:
            raise
        except Exception as e:  # litellm wraps every provider error; classify by status
            raise classify_error(e, settings) from e
        yield acc.turn()


class _TurnBuilder:
    """Assembles streamed chunks: text, tool calls arriving in pieces by index, usage."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.usage: dict[str, int] = {}
        self.finish: str | None = None

    def add(self, chunk: Any) -> str:
        usage = getattr(chunk, "usage", None)
        if usage:
            self.usage = {"prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                          "completion_tokens": getattr(usage, "completion_tokens", 0) or 0}
            details = getattr(usage, "prompt_tokens_details", None)  # cached input tokens
            if cached := getattr(details, "cached_tokens", None):
                self.usage["cached_tokens"] = int(cached)
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            return ""
        choice = choices[0]
        self.finish = getattr(choice, "finish_reason", None) or self.finish
        delta = getattr(choice, "delta", None)
        if delta is None:
            return ""
        for tc in getattr(delta, "tool_calls", None) or []:
            slot = self.calls.setdefault(getattr(tc, "index", 0) or 0,
                                         {"id": "", "name": "", "arguments": ""})
            slot["id"] = getattr(tc, "id", None) or slot["id"]
            fn = getattr(tc, "function", None)
            if fn is not None:
                slot["name"] = getattr(fn, "name", None) or slot["name"]
                slot["arguments"] += getattr(fn, "arguments", None) or ""
        text = getattr(delta, "content", None) or ""
        if text:
            self.text.append(text)
        return text

    def turn(self) -> ModelTurn:
        calls = [ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"] or "{}")
                 for i, c in sorted(self.calls.items())]
        return ModelTurn("".join(self.text), calls, self.usage, self.finish)


OFFLINE_REPLY = (
    "I'm Pluto's built-in offline model, so I can't answer that myself. "
    "To chat with a real model, set PLUTO_MODEL (for example openai/gpt-4o-mini) with its API key "
    "in PLUTO_API_KEY (and PLUTO_API_BASE for any OpenAI-compatible server), or edit "
    "config/pluto.yaml. Without one, /datasets lists the data you can query and /sql runs "
    "a query, e.g. /sql SELECT region, sum(amount) FROM sales GROUP BY 1 (/help lists every "
    "command)."
)


class OfflineModel:
    """Deterministic and offline: explains how to configure a real model."""

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[str | ModelTurn]:
        words = OFFLINE_REPLY.split(" ")
        for i, word in enumerate(words):
            yield word if i == 0 else " " + word
        prompt = sum(len(json.dumps(text_of(m.get("content")))) for m in messages) // 4
        yield ModelTurn(OFFLINE_REPLY, [], {"prompt_tokens": prompt,
                                            "completion_tokens": len(OFFLINE_REPLY) // 4}, "stop")


class EchoModel:
    """``model: echo`` answers at once with the user's own words, in one piece: for smoke
    tests of a deployment and for benchmarks of the gateway itself."""

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[str | ModelTurn]:
        text = text_of(messages[-1].get("content")) if messages else ""
        yield text
        yield ModelTurn(text, [], {"prompt_tokens": len(text) // 4 + 1,
                                   "completion_tokens": len(text) // 4 + 1}, "stop")


_BUILT_IN: dict[str, Model] = {"offline": OfflineModel(), "echo": EchoModel()}


def model_for(settings: ModelSettings) -> Model:
    return _BUILT_IN.get(settings.model) or LiteLLMModel()
