"""Sending to Slack: mrkdwn text (``chat.postMessage``; with buttons, as Block Kit sections
and an actions block, see ``buttons.py``), edits (``chat.update``) and files through the
external upload flow (``files_upload_v2``), each into the message's thread.

A message's platform id is its ``ts`` (the channel is the chat id). Every failure is a
:class:`ProviderError` (see ``errors.py``); nothing is retried here: the outbox does that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from pluto.errors import DeliveryRefused, ProviderError
from pluto.gateway.delivery.render.dialects import escape_html
from pluto.types import Attachment, OutgoingMessage
from pluto.providers.slack.buttons import blocks_for
from pluto.providers.slack.errors import provider_error
from pluto.providers.slack.markup import SLACK_MRKDWN

Joined = Callable[[str, str], None]  # (channel, thread ts): the bot now takes part in it


class Outbound:
    def __init__(self, client: AsyncWebClient, joined: Joined):
        self.client = client
        self.joined = joined

    async def send(self, message: OutgoingMessage) -> str:
        if message.attachments:
            return await self._upload(message)
        response = await _call(self.client.chat_postMessage(
            channel=message.chat_id, text=_text(message), thread_ts=message.thread_id,
            blocks=_blocks(message), mrkdwn=message.markup == SLACK_MRKDWN.name,
            unfurl_links=False, unfurl_media=False))
        ts = str(response.get("ts") or "")
        if not ts:
            raise ProviderError("Slack accepted the message but gave no id for it")
        self.joined(message.chat_id, message.thread_id or ts)
        return ts

    async def edit(self, message: OutgoingMessage) -> None:
        assert message.edit_of is not None
        await _call(self.client.chat_update(channel=message.chat_id, ts=message.edit_of,
                                            text=_text(message), blocks=_blocks(message)))

    async def delete(self, chat_id: str, ts: str) -> bool:
        try:
            await _call(self.client.chat_delete(channel=chat_id, ts=ts))
        except DeliveryRefused as e:
            if "message_not_found" not in str(e):
                raise
        return True

    async def _upload(self, message: OutgoingMessage) -> str:
        """Each file in turn; the text (if any) goes with the first as its comment."""
        comment: str | None = _text(message) if message.text.strip() else None
        first: str | None = None
        for attachment in message.attachments:
            data = await _read(attachment)
            response = await _call(self.client.files_upload_v2(
                channel=message.chat_id, thread_ts=message.thread_id, content=data,
                filename=attachment.filename, title=attachment.filename,
                initial_comment=comment))
            files = response.get("files") or []
            file_id = str(files[0].get("id")) if files and isinstance(files[0], dict) else ""
            first, comment = first or file_id or "file", None
        if message.thread_id:
            self.joined(message.chat_id, message.thread_id)
        assert first is not None
        return first


def _text(message: OutgoingMessage) -> str:
    """The text as Slack should show it: mrkdwn as rendered, anything else escaped."""
    if message.markup == SLACK_MRKDWN.name:
        return message.text
    return escape_html(message.text)


def _blocks(message: OutgoingMessage) -> list[dict[str, Any]] | None:
    """Block Kit for a message with buttons (the text as sections, then the buttons); None for
    plain text (``text`` alone)."""
    if not message.buttons:
        return None
    return blocks_for(_text(message), message.buttons)


async def _read(attachment: Attachment) -> bytes:
    if attachment.path is None:
        raise DeliveryRefused(f"the file {attachment.filename} has no path")
    try:
        return await asyncio.to_thread(attachment.path.read_bytes)
    except OSError:
        raise DeliveryRefused(f"the file {attachment.filename} can no longer be read") from None


async def _call(coro: Any) -> Any:
    try:
        return await coro
    except (SlackClientError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise provider_error(e) from None
