"""Sending to Discord: messages (Discord markdown), edits, files and images, the typing
indicator. Every failure is a :class:`ProviderError` (see ``errors.py``).

A message that belongs to a run carries a nonce derived from its contents (run, chat, text,
files), sent with ``enforce_nonce``: if the same chunk is sent again within Discord's nonce
window (the outbox after a crash, a request that timed out after Discord took it), Discord
answers with the message it already has instead of posting a second one.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import Any

import aiohttp
import discord

from pluto.errors import DeliveryRefused
from pluto.gateway.delivery.render import render
from pluto.gateway.delivery.render.dialects import escape_markdown
from pluto.providers.kit.files import read_outgoing
from pluto.types import MARKDOWN, Attachment, OutgoingMessage
from pluto.providers.discord.buttons import view_of
from pluto.providers.discord.errors import provider_error
from pluto.providers.discord.holds import sending
from pluto.providers.discord.markup import DISCORD

# replies ping the person asked; a model's text never pings @everyone, roles or users
MENTIONS = discord.AllowedMentions(everyone=False, users=False, roles=False, replied_user=True)
NONCE_LENGTH = 25  # Discord's limit for a string nonce
FAILURES = (discord.DiscordException, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def channel_id(chat_id: str, thread_id: str | None = None) -> int:
    """Where a message goes: the thread when there is one (a thread is a channel)."""
    raw = thread_id or chat_id
    if not raw.isdigit():
        raise DeliveryRefused(f"{raw!r} is not a Discord channel id")
    return int(raw)


def nonce_for(message: OutgoingMessage) -> str | None:
    """The same chunk of the same run gets the same nonce; other messages get none."""
    if message.run_id is None:
        return None
    digest = hashlib.sha256()
    parts = [message.run_id, message.chat_id, message.thread_id or "", message.kind,
             message.text, *(f"{a.filename}\0{a.path}" for a in message.attachments)]
    for part in parts:
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()[:NONCE_LENGTH]


def discord_text(message: OutgoingMessage) -> str:
    """The text in Discord markdown, whatever dialect it was written in."""
    if message.markup == DISCORD.name:
        return message.text
    if message.markup == MARKDOWN.name:
        return render(message.text, DISCORD)
    return escape_markdown(message.text)


async def send(client: discord.Client, message: OutgoingMessage) -> str:
    channel = client.get_partial_messageable(channel_id(message.chat_id, message.thread_id))
    files = [await _file(a) for a in message.attachments]
    reference = None
    if message.reply_to and message.reply_to.isdigit():
        reference = discord.MessageReference(message_id=int(message.reply_to),
                                             channel_id=channel.id, fail_if_not_exists=False)
    kwargs: dict[str, Any] = {"allowed_mentions": MENTIONS, "reference": reference,
                              "nonce": nonce_for(message)}
    if files:
        kwargs["files"] = files
    if message.buttons and (view := view_of(message.buttons)) is not None:
        kwargs["view"] = view
    try:
        with sending():  # a 429 is the outbox's (flood control), not a wait in this call
            sent = await channel.send(discord_text(message) or None, **kwargs)
    except FAILURES as e:
        raise provider_error(e) from None
    return str(sent.id)


async def edit(client: discord.Client, message: OutgoingMessage) -> None:
    assert message.edit_of is not None
    if not message.edit_of.isdigit():
        raise DeliveryRefused(f"{message.edit_of!r} is not a Discord message id")
    channel = client.get_partial_messageable(channel_id(message.chat_id, message.thread_id))
    kwargs: dict[str, Any] = {}
    if message.buttons and (view := view_of(message.buttons)) is not None:
        kwargs["view"] = view
    try:
        with sending():
            await channel.get_partial_message(int(message.edit_of)).edit(
                content=discord_text(message), allowed_mentions=MENTIONS, **kwargs)
    except FAILURES as e:
        raise provider_error(e) from None


async def delete(client: discord.Client, chat_id: str, platform_id: str,
                 thread_id: str | None = None) -> bool:
    if not platform_id.isdigit():
        raise DeliveryRefused(f"{platform_id!r} is not a Discord message id")
    channel = client.get_partial_messageable(channel_id(chat_id, thread_id))
    try:
        with sending():
            await channel.get_partial_message(int(platform_id)).delete()
    except discord.NotFound:
        pass  # gone already
    except FAILURES as e:
        raise provider_error(e) from None
    return True


async def typing(client: discord.Client, chat_id: str, thread_id: str | None = None) -> None:
    try:
        with sending():
            await client.http.send_typing(channel_id(chat_id, thread_id))
    except FAILURES as e:
        raise provider_error(e) from None


async def _file(attachment: Attachment) -> discord.File:
    data = await read_outgoing(attachment)
    return discord.File(io.BytesIO(data), filename=attachment.filename)
