"""Where the reply leaves: from a run's events to what a provider sends, by its capabilities.

- A provider that shows deltas itself (terminal, web: ``streams_deltas``) gets each delta as it
  comes, tool notices, then the final message; it is a live connection, so nothing is queued
  for it across restarts.
- Every other provider gets the final reply rendered in its markup dialect, split at its length
  limit, through the :class:`~gateway.outbox.Outbox` (recorded before sending, exactly once).
  Where it can edit (``can_edit``), a live preview is sent early and edited as the model writes;
  the first chunk of the final reply then replaces the preview. Where it has a typing indicator,
  it is kept on while the run is in progress.

Images a tool produced (``ToolResult.details = {"image": path}``, under the data dir) go out
after the text, as images where the platform can show them.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pluto.gateway.delivery.outbox import Outbox, RetryPolicy
from pluto.errors import DeliveryRefused, ProviderError
from pluto.gateway.ports import Provider
from pluto.gateway.delivery.render import render_chunks
from pluto.gateway.delivery.streaming import EditThrottle, LivePreview, Typing
from pluto.types import (Attachment, IncomingMessage, MessageDelta, MessageFinal,
                           OutgoingMessage, RunError, RunEvent, ToolEnd, ToolStart)
from pluto.storage.sqlite import SqliteStore

log = logging.getLogger(__name__)

NO_ANSWER = "(no answer)"


def reply_to(msg: IncomingMessage, text: str, *, kind: str = "reply",
             run_id: str | None = None) -> OutgoingMessage:
    """A message back to where ``msg`` came from (quoting it in group chats)."""
    return OutgoingMessage(chat_id=msg.chat_id, thread_id=msg.thread_id, text=text,
                           kind=kind, run_id=run_id,  # type: ignore[arg-type]
                           reply_to=None if msg.is_direct else msg.message_id)


async def send_with_retry(provider: Provider, message: OutgoingMessage, *,
                          attempts: int = 5, base_delay: float = 1.0) -> str | None:
    """Send one message now (not recorded), honouring the platform's retry-after."""
    policy = RetryPolicy(attempts=attempts, base_delay=base_delay)
    for attempt in range(attempts):
        try:
            return await provider.send(message)
        except ProviderError as e:
            if isinstance(e, DeliveryRefused) or attempt == attempts - 1:
                log.error("%s: could not deliver to chat %s: %s", provider.name,
                          message.chat_id, e)
                raise
            delay = policy.delay(e, attempt)
            log.warning("%s: send failed (%s); retrying in %.1fs", provider.name, e, delay)
            await asyncio.sleep(delay)
    return None


def render_for(provider: Provider, markdown: str) -> list[str]:
    """The chunks of a Markdown text in the provider's dialect and length limit."""
    caps = provider.capabilities
    try:
        return render_chunks(markdown, caps.markup, caps.max_message_length)
    except Exception:
        log.exception("rendering for %s failed; sending plain text", provider.name)
        return render_chunks(markdown, "plain", caps.max_message_length)


@dataclass(slots=True)
class _Run:
    """What one run's delivery has collected so far."""

    preview: LivePreview | None
    typing: Typing
    images: list[Attachment] = field(default_factory=list)


class Delivery:
    def __init__(self, store: SqliteStore, *, data_dir: Path,
                 edit_interval: float | Callable[[], float] = 1.0, typing_interval: float = 4.0,
                 retry: RetryPolicy | None = None):
        self.outbox = Outbox(store, retry)
        self.data_dir = data_dir
        self.throttle = EditThrottle(edit_interval)
        self.typing_interval = typing_interval

    async def open(self) -> None:
        await self.outbox.open()

    async def attend(self, provider: Provider, running: Awaitable[None]) -> None:
        """Run a provider (``running`` is its ``run(...)``), sending what the outbox holds for
        it from before as it starts."""
        flush = asyncio.create_task(self._flush(provider), name=f"outbox:{provider.name}")
        try:
            await running
        finally:
            flush.cancel()
            await asyncio.gather(flush, return_exceptions=True)

    async def _flush(self, provider: Provider) -> None:
        try:
            await self.outbox.flush(provider)
        except Exception:
            log.exception("outbox: sending earlier replies to %s failed", provider.name)

    async def reply(self, provider: Provider, msg: IncomingMessage, text: str, *,
                    kind: str = "reply") -> None:
        """A gateway answer (a command's reply, a notice, an error) to ``msg``'s chat."""
        base = reply_to(msg, text, kind=kind)
        if provider.capabilities.streams_deltas:
            await send_with_retry(provider, replace(base, markup="markdown"))
            return
        await self.outbox.deliver(provider, f"answer:{uuid.uuid4().hex}",
                                  self._chunks(provider, base, text, []))

    async def run(self, provider: Provider, msg: IncomingMessage,
                  events: AsyncIterator[RunEvent]) -> RunEvent | None:
        """Deliver a run's events to the chat it came from; returns the last event."""
        if provider.capabilities.streams_deltas:
            return await self._live(provider, msg, events)
        caps = provider.capabilities
        state = _Run(LivePreview(provider, reply_to(msg, ""), self.throttle) if caps.can_edit
                     else None, Typing(provider, msg.chat_id, msg.thread_id, self.typing_interval))
        state.typing.start()
        last: RunEvent | None = None
        try:
            async with aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    last = event
                    await self._on_event(provider, msg, state, event)
        finally:
            state.typing.stop()
            if state.preview is not None:
                state.preview.cancel()
        return last

    async def _on_event(self, provider: Provider, msg: IncomingMessage, state: _Run,
                        event: RunEvent) -> None:
        match event:
            case MessageDelta(text=text) if state.preview is not None:
                state.preview.add(text)
            case ToolStart() if state.preview is not None:
                state.preview.new_turn()
            case ToolEnd(details=details):
                state.images.extend(self._images(details))
            case MessageFinal(text=text, run_id=run_id):
                await self._final(provider, msg, state, run_id, text, "reply")
            case RunError(message=message, run_id=run_id):
                await self._final(provider, msg, state, run_id, message, "error")

    async def _final(self, provider: Provider, msg: IncomingMessage, state: _Run, run_id: str,
                     text: str, kind: str) -> None:
        state.typing.stop()
        preview_id = await state.preview.finish() if state.preview is not None else None
        base = reply_to(msg, text, kind=kind, run_id=run_id)
        messages = self._chunks(provider, base, text, state.images if kind == "reply" else [])
        if preview_id is not None:
            if kind == "reply" and messages and not messages[0].attachments:
                messages[0] = replace(messages[0], edit_of=preview_id, reply_to=None)
            await self.throttle.turn((provider.name, msg.chat_id))
        await self.outbox.deliver(provider, run_id, messages)

    def _chunks(self, provider: Provider, base: OutgoingMessage, text: str,
                images: list[Attachment]) -> list[OutgoingMessage]:
        caps = provider.capabilities
        texts = render_for(provider, text) or ([] if images else render_for(provider, NO_ANSWER))
        out = [replace(base, text=t, markup=caps.markup, reply_to=base.reply_to if i == 0 else None)
               for i, t in enumerate(texts)]
        for image in images:
            if caps.can_send_images or caps.can_send_files:
                kind: Literal["file", "image"] = "image" if caps.can_send_images else "file"
                out.append(replace(base, text="", markup=caps.markup, reply_to=None,
                                   attachments=(replace(image, kind=kind),)))
            else:
                out += [replace(base, text=t, markup=caps.markup, reply_to=None)
                        for t in render_for(provider, f"(image: {image.filename})")]
        return out

    def _images(self, details: Any) -> list[Attachment]:
        """The image a tool made, when it names one under the data dir that exists."""
        if not isinstance(details, dict) or not isinstance(details.get("image"), str):
            return []
        path = Path(details["image"])
        if not path.is_absolute():
            path = self.data_dir / path
        try:
            path = path.resolve()
            inside = path.is_relative_to(self.data_dir.resolve()) and path.is_file()
        except OSError:
            inside = False
        if not inside:
            log.warning("a tool named an image outside the data dir or missing: %s", path)
            return []
        mime = mimetypes.guess_type(path.name)[0] or "image/png"
        return [Attachment(filename=path.name, mime_type=mime, size=path.stat().st_size,
                           path=path, kind="image")]

    async def _live(self, provider: Provider, msg: IncomingMessage,
                    events: AsyncIterator[RunEvent]) -> RunEvent | None:
        last: RunEvent | None = None
        images: list[Attachment] = []
        async with aclosing(events):  # type: ignore[type-var]
            async for event in events:
                last = event
                match event:
                    case MessageDelta(text=text, run_id=run_id):
                        await provider.send(reply_to(msg, text, kind="delta", run_id=run_id))
                    case ToolStart(name=name, run_id=run_id):
                        await provider.send(reply_to(msg, f"using {name}…", kind="notice",
                                                     run_id=run_id))
                    case ToolEnd(details=details):
                        images.extend(self._images(details))
                    case MessageFinal(text=text, run_id=run_id):
                        await send_with_retry(provider, replace(
                            reply_to(msg, text, run_id=run_id), markup="markdown",
                            attachments=tuple(images)))
                    case RunError(message=message, run_id=run_id):
                        await send_with_retry(provider, reply_to(msg, message, kind="error",
                                                                 run_id=run_id))
        return last
