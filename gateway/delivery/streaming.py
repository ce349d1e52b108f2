"""Showing a reply while it is written, on platforms that can edit a sent message.

:class:`LivePreview` sends a first message as soon as the model starts writing and edits it as
deltas arrive, at most once per ``interval`` per chat (:class:`EditThrottle`, shared by every
run in the gateway, so two runs in one chat do not double the rate). The final, fully rendered
reply then replaces the preview through the outbox. :class:`Typing` keeps the platform's
"typing…" indicator on while a run is in progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from pluto.errors import DeliveryRefused, ProviderError

from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.ports import Provider
from pluto.gateway.delivery.render import render_preview
from pluto.types import OutgoingMessage

log = logging.getLogger(__name__)

ChatKey = tuple[str, str]  # (provider name, chat id)


class EditThrottle:
    """Hands out turns per chat, ``interval`` seconds apart (a platform's retry-after pushes the
    next turn back). ``interval`` may be a callable, read at each turn (live config reload)."""

    def __init__(self, interval: float | Callable[[], float]):
        self._interval = interval
        self._next: dict[ChatKey, float] = {}

    @property
    def interval(self) -> float:
        return self._interval() if callable(self._interval) else self._interval

    async def turn(self, key: ChatKey) -> None:
        now = asyncio.get_running_loop().time()
        slot = max(now, self._next.get(key, 0.0))
        self._next[key] = slot + self.interval  # reserved before sleeping: turns queue up
        if len(self._next) > 1000:
            self._next = {k: t for k, t in self._next.items() if t > now}
        if slot > now:
            await asyncio.sleep(slot - now)

    def hold(self, key: ChatKey, seconds: float) -> None:
        later = asyncio.get_running_loop().time() + seconds
        self._next[key] = max(self._next.get(key, 0.0), later)


class LivePreview:
    """One reply shown while it grows: sent once, then edited (throttled) with the latest text."""

    def __init__(self, provider: Provider, target: OutgoingMessage, throttle: EditThrottle,
                 flood: FloodControl | None = None, *, shown: str | None = None,
                 on_shown: Callable[[str], Awaitable[None]] | None = None):
        self.provider = provider
        self.flood = flood or FloodControl()
        self.target = replace(target, kind="delta", markup=provider.capabilities.markup.name)
        self.throttle = throttle
        self.key: ChatKey = (provider.name, target.chat_id)
        self.text = ""
        # a preview an interrupted run of the same message left: edited, not sent again
        self.message_id: str | None = shown
        self.on_shown = on_shown  # told the id of a new preview (kept for such a rerun)
        self._shown = ""
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._closed = False

    def add(self, delta: str) -> None:
        if self._closed:
            return
        self.text += delta
        self._changed.set()
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name=f"preview:{self.key[1]}")

    def new_turn(self) -> None:
        """The model called a tool: the text of its next turn replaces what is shown."""
        self.text = ""

    async def finish(self) -> str | None:
        """Stop editing (letting a call in flight complete); the preview's message id, if any."""
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            if self._busy:
                await asyncio.wait({task})
            else:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return self.message_id

    def cancel(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()

    async def _pump(self) -> None:
        caps = self.provider.capabilities
        while not self._closed:
            await self._changed.wait()
            await self.throttle.turn(self.key)
            await self.flood.wait(self.key)
            if self._closed:
                return
            self._changed.clear()
            text = render_preview(self.text, caps.markup, caps.max_message_length)
            if not text.strip() or text == self._shown:
                continue
            self._busy = True
            try:
                if not await self._show(text):
                    return
            except ProviderError as e:
                if e.retry_after is not None:  # the final and every other send wait too
                    await self.flood.hold(self.key, e.retry_after)
                    self._changed.set()
                elif isinstance(e, DeliveryRefused):
                    log.info("%s: live preview stopped: %s", self.provider.name, e)
                    return
                else:
                    log.debug("%s: preview update failed: %s", self.provider.name, e)
            finally:
                self._busy = False

    async def _show(self, text: str) -> bool:
        """Send or edit; False when the platform gave no id to edit later."""
        message = replace(self.target, text=text)
        if self.message_id is None:
            self.message_id = await self.provider.send(message)
            if self.message_id is None:
                return False
            if self.on_shown is not None:
                try:
                    await self.on_shown(self.message_id)
                except Exception as e:  # noqa: BLE001 - only a rerun after a crash needs it
                    log.warning("%s: could not keep the preview's id: %s", self.provider.name, e)
        else:
            await self.provider.edit(replace(message, edit_of=self.message_id))
        self._shown = text
        return True


class Typing:
    """Repeats the platform's typing indicator every ``interval`` seconds until stopped."""

    def __init__(self, provider: Provider, chat_id: str, thread_id: str | None,
                 interval: float = 4.0, flood: FloodControl | None = None):
        self.provider = provider
        self.flood = flood
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.provider.capabilities.has_typing:
            self._task = asyncio.create_task(self._loop(), name=f"typing:{self.chat_id}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                if self.flood is None or not self.flood.remaining((self.provider.name,
                                                                    self.chat_id)):
                    await self.provider.typing(self.chat_id, self.thread_id)
            except Exception as e:  # a lost typing indicator is not worth a failed reply
                log.debug("%s: typing indicator failed: %s", self.provider.name, e)
            await asyncio.sleep(self.interval)
