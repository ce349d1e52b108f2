"""From a run's events to what a provider sends, according to its declared capabilities.

A provider that shows deltas (terminal, web) gets each delta as it comes and then the final
message; the others get the final message only, split at their length limit. Retries with the
platform's retry-after live here, in one place; providers just raise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from gateway.provider import Provider, ProviderError
from gateway.types import (IncomingMessage, MessageDelta, MessageFinal, OutgoingMessage, RunError,
                           RunEvent, ToolStart)

log = logging.getLogger(__name__)


def reply_to(msg: IncomingMessage, text: str, *, kind: str = "reply",
             run_id: str | None = None) -> OutgoingMessage:
    return OutgoingMessage(chat_id=msg.chat_id, thread_id=msg.thread_id, text=text,
                           kind=kind, run_id=run_id)  # type: ignore[arg-type]


def split_text(text: str, limit: int) -> list[str]:
    """Split at paragraph, then line, then word boundaries so no chunk exceeds ``limit``."""
    chunks: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        cut = -1
        for sep in ("\n\n", "\n", ". ", " "):
            cut = rest.rfind(sep, 0, limit)
            if cut > limit // 4:
                cut += len(sep) if sep != "\n\n" else 0
                break
        if cut <= 0:
            cut = limit
        chunks.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        chunks.append(rest)
    return chunks


async def send_with_retry(provider: Provider, message: OutgoingMessage, *,
                          attempts: int = 5, base_delay: float = 1.0) -> str | None:
    """Send, honouring the platform's retry-after; a permanent error is not retried."""
    for attempt in range(attempts):
        try:
            return await provider.send(message)
        except ProviderError as e:
            if e.permanent or attempt == attempts - 1:
                log.error("%s: could not deliver to chat %s: %s", provider.name,
                          message.chat_id, e)
                raise
            delay = e.retry_after if e.retry_after is not None else base_delay * 2 ** attempt
            log.warning("%s: send failed (%s); retrying in %.1fs", provider.name, e, delay)
            await asyncio.sleep(delay)
    return None


async def deliver_run(provider: Provider, msg: IncomingMessage,
                      events: AsyncIterator[RunEvent]) -> RunEvent | None:
    """Deliver a run's events to the chat it came from; returns the last event."""
    caps = provider.capabilities
    last: RunEvent | None = None
    async with aclosing(events):  # type: ignore[type-var]
        async for event in events:
            last = event
            match event:
                case MessageDelta(text=text, run_id=run_id) if caps.streams_deltas:
                    await provider.send(reply_to(msg, text, kind="delta", run_id=run_id))
                case ToolStart(name=name, run_id=run_id) if caps.streams_deltas:
                    await provider.send(reply_to(msg, f"using {name}…", kind="notice",
                                                 run_id=run_id))
                case MessageFinal(text=text, run_id=run_id):
                    await _send_final(provider, msg, text, run_id)
                case RunError(message=message, run_id=run_id):
                    await send_with_retry(provider, reply_to(msg, message, kind="error",
                                                             run_id=run_id))
    return last


async def _send_final(provider: Provider, msg: IncomingMessage, text: str, run_id: str) -> None:
    if provider.capabilities.streams_deltas:
        await provider.send(reply_to(msg, text, run_id=run_id))
        return
    for chunk in split_text(text, provider.capabilities.max_message_length) or ["(no answer)"]:
        await send_with_retry(provider, reply_to(msg, chunk, run_id=run_id))
