"""The outbox: each chunk of a reply is recorded before it is sent, and sent exactly once.

``deliver`` records every chunk of a reply (idempotency key: reply id and chunk index), then
sends them in order, marking each ``sent`` with the platform's message id as soon as the
platform confirms it. ``flush`` runs when a provider (re)starts and sends what an earlier
process recorded but did not send; chunks marked sent are never sent again.

Retries live here, in one place: a transient error is retried with exponential backoff, or after
the platform's ``retry_after``; a permanent one (chat gone, bot blocked) stops the reply and is
recorded. When the retries run out the chunk stays pending for the provider's next start.

The one window no outbox can close: the process dying after the platform accepted a message and
before ``sent`` was written. Such a chunk is sent again (at least once), and logged as possibly
repeated; chat platforms offer no idempotency key that would let us ask.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pluto.errors import DeliveryRefused, ProviderError
from pluto.gateway.ports import Provider
from pluto.types import Attachment, OutgoingMessage
from pluto.storage.outbox import OutboxRow, OutboxStore
from pluto.storage.sqlite import SqliteStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 6  # platform calls per chunk before it is left for the next start
    base_delay: float = 1.0  # doubled after each failure without a retry-after
    max_delay: float = 600.0  # a longer retry-after is cut to this

    def delay(self, error: ProviderError, attempt: int) -> float:
        wanted = error.retry_after if error.retry_after is not None else (
            self.base_delay * 2 ** attempt)
        return max(0.0, min(wanted, self.max_delay))


class Outbox:
    def __init__(self, store: SqliteStore, retry: RetryPolicy | None = None, *,
                 keep_seconds: float = 7 * 86400):
        self.rows = OutboxStore(store)
        self.retry = retry or RetryPolicy()
        self.keep_seconds = keep_seconds
        self._claimed: set[str] = set()  # replies being delivered by a task of this process

    async def open(self) -> None:
        await self.rows.open()
        pruned = await self.rows.prune(self.keep_seconds)
        if pruned:
            log.debug("outbox: pruned %d delivered chunk(s)", pruned)

    async def deliver(self, provider: Provider, reply_id: str,
                      messages: list[OutgoingMessage]) -> list[str | None]:
        """Record the chunks, then send them in order; returns the platform ids of the sent ones.

        Raises :class:`ProviderError` when a chunk failed permanently or ran out of retries.
        """
        rows = await self.rows.record([_to_row(provider.name, reply_id, i, m)
                                       for i, m in enumerate(messages)])
        with self._claim(reply_id) as mine:
            if not mine:
                return []
            return await self._send_rows(provider, rows, raise_errors=True)

    async def flush(self, provider: Provider) -> int:
        """Send the chunks an earlier process left unsent for this provider; returns how many."""
        pending = await self.rows.pending(provider.name)
        if pending:
            log.info("outbox: %d unsent chunk(s) for %s from before; sending them",
                     len(pending), provider.name)
        count = 0
        for reply_id in dict.fromkeys(row.reply_id for row in pending):  # oldest first
            with self._claim(reply_id) as mine:
                if mine:
                    rows = await self.rows.reply(reply_id)  # fresh: another task may have sent some
                    count += len(await self._send_rows(provider, rows, raise_errors=False))
        return count

    @contextmanager
    def _claim(self, reply_id: str) -> Iterator[bool]:
        if reply_id in self._claimed:
            yield False
            return
        self._claimed.add(reply_id)
        try:
            yield True
        finally:
            self._claimed.discard(reply_id)

    async def _send_rows(self, provider: Provider, rows: list[OutboxRow], *,
                         raise_errors: bool) -> list[str | None]:
        ids: list[str | None] = []
        for i, row in enumerate(rows):
            if row.status != "pending":
                continue
            try:
                ids.append(await self._send_one(provider, row))
            except ProviderError as e:
                rest = [r.id for r in rows[i:] if r.status == "pending" and r.id is not None]
                if isinstance(e, DeliveryRefused):
                    await self.rows.failed(rest, str(e))
                log.error("%s: could not deliver to chat %s (%s); %s", provider.name, row.chat_id,
                          e, "gave up on this reply" if isinstance(e, DeliveryRefused)
                          else "will try again when the provider restarts")
                if raise_errors:
                    raise
                return ids
        return ids

    async def _send_one(self, provider: Provider, row: OutboxRow) -> str | None:
        assert row.id is not None
        if row.attempts and row.error is None:
            log.warning("%s: chunk %d of reply %s may have been delivered before a crash; "
                        "sending it again", provider.name, row.chunk, row.reply_id)
        message = _to_message(row)
        for attempt in range(self.retry.attempts):
            await self.rows.attempted(row.id)
            try:
                platform_id = await _call(provider, message)
            except ProviderError as e:
                if isinstance(e, DeliveryRefused) and message.edit_of:  # the message to edit is gone: send anew
                    message = replace(message, edit_of=None)
                    continue
                await self.rows.note_error(row.id, str(e))
                if isinstance(e, DeliveryRefused) or attempt == self.retry.attempts - 1:
                    raise
                delay = self.retry.delay(e, attempt)
                log.warning("%s: sending failed (%s); retrying in %.1fs", provider.name, e, delay)
                await asyncio.sleep(delay)
                continue
            await self.rows.sent(row.id, platform_id)
            return platform_id
        raise DeliveryRefused("the platform kept refusing the message")


async def _call(provider: Provider, message: OutgoingMessage) -> str | None:
    """One platform call; an unexpected exception (a provider bug) counts as permanent."""
    try:
        if message.edit_of:
            await provider.edit(message)
            return message.edit_of
        return await provider.send(message)
    except ProviderError:
        raise
    except Exception as e:
        log.exception("%s failed to send a message", provider.name)
        raise DeliveryRefused(f"the provider failed: {type(e).__name__}") from e


def _to_row(provider: str, reply_id: str, chunk: int, m: OutgoingMessage) -> OutboxRow:
    return OutboxRow(reply_id=reply_id, chunk=chunk, run_id=m.run_id, provider=provider,
                     chat_id=m.chat_id, thread_id=m.thread_id, reply_to=m.reply_to,
                     edit_of=m.edit_of, kind=m.kind, markup=m.markup, text=m.text,
                     attachments=[_attachment_dict(a) for a in m.attachments])


def _to_message(row: OutboxRow) -> OutgoingMessage:
    return OutgoingMessage(chat_id=row.chat_id, thread_id=row.thread_id, reply_to=row.reply_to,
                           edit_of=row.edit_of, kind=row.kind, markup=row.markup,  # type: ignore
                           text=row.text, run_id=row.run_id,
                           attachments=tuple(_attachment(a) for a in row.attachments))


def _attachment_dict(a: Attachment) -> dict[str, Any]:
    return {"filename": a.filename, "mime_type": a.mime_type, "size": a.size,
            "path": str(a.path) if a.path else None, "url": a.url, "kind": a.kind}


def _attachment(d: dict[str, Any]) -> Attachment:
    return Attachment(filename=d["filename"], mime_type=d.get("mime_type") or
                      "application/octet-stream", size=int(d.get("size") or 0),
                      path=Path(d["path"]) if d.get("path") else None, url=d.get("url"),
                      kind=d.get("kind") or "file")
