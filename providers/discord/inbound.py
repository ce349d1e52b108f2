"""From a Discord message to an :class:`IncomingMessage`.

Chats: a direct message's chat is its DM channel; a server message's chat is its channel, and
in a thread the thread (a thread is a channel of its own on Discord, so replies go there and it
is its own conversation by default); ``thread_id`` is set for threads, ``guild_id`` for servers.

In a server, a message is addressed to the bot when it mentions the bot's user id (the
``mentions`` array or a ``<@id>`` in the text) or replies to one of the bot's messages —
decided by ids, never by names; ``@everyone`` does not count. ``message_id`` is Discord's own
message id (a snowflake, unique across channels): the key of the gateway's inbound dedupe, so
an event replayed after a gateway RESUME never starts a second run.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import aiohttp
import discord

from pluto.providers.kit.files import (kind_of, max_bytes, not_downloaded, safe_filename,
                                       save_bytes, too_large)
from pluto.types import Attachment, IncomingMessage

log = logging.getLogger(__name__)

PROVIDER = "discord"
USER_MESSAGES = (discord.MessageType.default, discord.MessageType.reply)


def is_direct(message: discord.Message) -> bool:
    return guild_id(message) is None


def guild_id(message: discord.Message) -> int | None:
    """The server of a message, also when discord.py has not cached that server."""
    if message.guild is not None:
        return message.guild.id
    return getattr(message.channel, "guild_id", None)


def addressed_to_bot(message: discord.Message, bot_id: int) -> bool:
    if is_direct(message):
        return True
    if any(user.id == bot_id for user in message.mentions):
        return True
    if re.search(rf"<@!?{bot_id}>", message.content or ""):
        return True
    replied = message.reference.resolved if message.reference is not None else None
    return isinstance(replied, discord.Message) and replied.author.id == bot_id


def readable_text(message: discord.Message, bot_id: int) -> str:
    """The text without the bot's mention; other users' mentions read as ``@name``."""
    text = re.sub(rf"<@!?{bot_id}>[,:]?", "", message.content or "")
    for user in message.mentions:
        if user.id != bot_id:
            text = re.sub(rf"<@!?{user.id}>", f"@{user.display_name}", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def to_incoming(message: discord.Message, bot_id: int,
                attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    channel = message.channel
    thread = isinstance(channel, discord.Thread)
    guild = guild_id(message)
    reference = message.reference
    return IncomingMessage(
        provider=PROVIDER, chat_id=str(channel.id), user_id=str(message.author.id),
        user_name=message.author.display_name, text=readable_text(message, bot_id),
        message_id=str(message.id), attachments=attachments,
        thread_id=str(channel.id) if thread else None,
        reply_to_id=str(reference.message_id) if reference and reference.message_id else None,
        is_direct=guild is None, mentions_bot=addressed_to_bot(message, bot_id),
        guild_id=str(guild) if guild is not None else None,
        timestamp=message.created_at.timestamp())


class Downloads:
    """Files users attach, saved under ``<data_dir>/uploads/discord/<channel>/``."""

    def __init__(self, data_dir: Path, max_mb: float):
        self.root = data_dir / "uploads" / PROVIDER
        self.max_mb = max_mb

    async def fetch(self, message: discord.Message) -> tuple[tuple[Attachment, ...], list[str]]:
        """The message's files as attachments, and a sentence for the user per file refused."""
        saved: list[Attachment] = []
        problems: list[str] = []
        for item in message.attachments:
            got = await self._one(message, item)
            if isinstance(got, str):
                problems.append(got)
            else:
                saved.append(got)
        return tuple(saved), problems

    async def _one(self, message: discord.Message, item: discord.Attachment) -> Attachment | str:
        name = item.filename or f"file-{item.id}"
        if item.size > max_bytes(self.max_mb):
            return too_large(name, self.max_mb)
        folder = self.root / str(message.channel.id)
        path = folder / f"{message.id}-{item.id}-{safe_filename(name)}"
        try:
            data = await item.read()
            if len(data) > max_bytes(self.max_mb):
                return too_large(name, self.max_mb)
            await save_bytes(path, data)
        except (discord.HTTPException, aiohttp.ClientError, OSError) as e:
            log.warning("discord: downloading %s from channel %s failed: %s", name,
                        message.channel.id, type(e).__name__)
            return not_downloaded(name)
        mime = (item.content_type or "application/octet-stream").split(";")[0].strip()
        return Attachment(filename=name, mime_type=mime, size=len(data), path=path,
                          kind=kind_of(mime))
