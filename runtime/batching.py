"""Text deltas in batches: a model turn is read in a task of its own, and what it wrote is handed
on at most every ``interval`` seconds (or once ``max_chars`` have gathered), the first piece at
once.

Each batch becomes one ``message.delta``: one commit, one observer call, one frame per watcher
instead of one per token. A model writing a token every 20 ms costs about half the commits; a
fast one (a token per ms) a fortieth. The model's stream is read meanwhile, so storing and
showing a batch never holds the stream up, and the turn's end (or its error) is handed on as
soon as it comes, after the text before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

End = TypeVar("End")
# The first piece waits this long for the turn's end (an answer that comes at once is shown by
# its end alone: no preview to show and replace) or for more text to go with it
FIRST_GRACE = 0.002


class _Reader(Generic[End]):
    __slots__ = ("text", "chars", "end", "max_chars", "task", "_wake")

    def __init__(self, items: AsyncIterator[str | End], max_chars: int):
        self.text: list[str] = []
        self.chars = 0
        self.end: list[End] = []
        self.max_chars = max_chars
        self._wake: asyncio.Future[None] | None = None
        self.task = asyncio.create_task(self._read(items), name="model-turn")
        self.task.add_done_callback(self._poke)

    async def _read(self, items: AsyncIterator[str | End]) -> None:
        async for item in items:
            if isinstance(item, str):
                if not item:
                    continue
                self.text.append(item)
                self.chars += len(item)
                if len(self.text) == 1 or self.chars >= self.max_chars:
                    self._poke()
            else:
                self.end.append(item)

    def _poke(self, *_: object) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Until text arrives (into an empty buffer), the buffer is full, the turn ends — or
        ``timeout`` seconds pass."""
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        timer = loop.call_later(timeout, self._poke) if timeout is not None else None
        try:
            await self._wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    def take(self) -> str:
        text = self.text[0] if len(self.text) == 1 else "".join(self.text)
        self.text = []
        self.chars = 0
        return text


async def batched(items: AsyncIterator[str | End], *,
                  interval: float | Callable[[], float] = 0.04,
                  max_chars: int = 2000, after: Awaitable[object] | None = None,
                  covers: Callable[[End], bool] | None = None) -> AsyncIterator[str | End]:
    """``items`` (text deltas, then one end item) with the deltas joined in batches. An error
    raised by ``items`` comes after the text read before it.

    With ``after``, nothing is handed on (not even an error) before it is done — while
    ``items`` are read meanwhile: a run's model call starts while its start is committed.

    With ``covers``: an end for which it is true carries the turn's whole text itself (a final
    answer), so a turn that has ended so before its first batch went out hands on that end
    alone — no preview to show and replace at once. Once a batch went out, the batches always
    add up to the turn's text.

    ``interval`` may be a function: asked again before each batch (a gap that widens under
    load)."""
    reader: _Reader[End] = _Reader(items, max_chars)
    loop = asyncio.get_running_loop()
    last = float("-inf")  # when the last batch was handed on
    graced = False
    try:
        if after is not None:
            if isinstance(after, asyncio.Future) and after.done():
                after.result()  # (its error, if it failed)
            else:
                await asyncio.shield(after)  # (a stop ends this, never what it waits for)
        while True:
            done = reader.task.done()
            if not reader.text and not done:
                await reader.wait(None)
                continue
            if reader.text:
                if done and last < 0 and covers is not None and _covered(reader, covers):
                    reader.take()  # nothing shown yet, and the end says it all
                    continue
                if last < 0 and not done and covers is not None and not graced:
                    graced = True  # the first piece: is the end right behind it?
                    await reader.wait(FIRST_GRACE)
                    continue
                wait = last + (interval() if callable(interval) else interval) - loop.time()
                if wait > 0 and not done and reader.chars < reader.max_chars:
                    await reader.wait(wait)
                    continue
                last = loop.time()
                yield reader.take()
                continue
            reader.task.result()  # raises the turn's error, if it failed
            for end in reader.end:
                yield end
            return
    finally:
        if not reader.task.done():
            reader.task.cancel()
            await asyncio.gather(reader.task, return_exceptions=True)


def _covered(reader: _Reader[End], covers: Callable[[End], bool]) -> bool:
    """Whether the finished turn ended well with an end that carries its text."""
    task = reader.task
    return (not task.cancelled() and task.exception() is None and bool(reader.end)
            and all(covers(end) for end in reader.end))
