"""An in-process scripted model, for tests and benchmarks that need a model answering at once.

Tests that exercise litellm itself use the fake OpenAI-compatible server in ``tests/fakes``;
this one skips HTTP entirely.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pluto.runtime.errors import ModelError
from pluto.runtime.images import SeenImage, resolved, seen, text_of
from pluto.runtime.model import ModelSettings, ModelTurn, ToolCall


@dataclass(frozen=True, slots=True)
class Scripted:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    chunk: int = 8  # characters per delta
    delay: float = 0.0  # seconds before each delta
    error: ModelError | None = None
    usage: dict[str, int] | None = None


class ScriptedModel:
    """Answers from a queue of :class:`Scripted` turns; ``echo`` when the queue is empty."""

    def __init__(self, *turns: Scripted, fallback: Callable[[list[dict]], Scripted] | None = None):
        self.turns: deque[Scripted] = deque(turns)
        self.fallback = fallback or (lambda msgs: Scripted(
            text=f"echo: {text_of(msgs[-1]['content'])}"))
        self.calls: list[list[dict[str, Any]]] = []
        # the image parts of each call, decoded (as a vision model's API would read them)
        self.images: list[list[SeenImage]] = []

    def __call__(self, settings: ModelSettings) -> ScriptedModel:  # usable as a model_factory
        return self

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: ModelSettings) -> AsyncIterator[str | ModelTurn]:
        messages = await resolved(messages)  # pictures as a model client sends them
        self.calls.append([dict(m) for m in messages])
        self.images.append([image for m in messages if isinstance(m.get("content"), list)
                            for p in m["content"] if (image := seen(p)) is not None])
        turn = self.turns.popleft() if self.turns else self.fallback(messages)
        if turn.error is not None:
            raise turn.error
        for i in range(0, len(turn.text), max(1, turn.chunk)):
            if turn.delay:
                await asyncio.sleep(turn.delay)
            yield turn.text[i:i + turn.chunk]
        usage = turn.usage or {"prompt_tokens": 10, "completion_tokens": len(turn.text) // 4 + 1}
        yield ModelTurn(turn.text, list(turn.tool_calls), usage,
                        "tool_calls" if turn.tool_calls else "stop")
