"""From a Telegram message to an :class:`IncomingMessage`.

In a private chat every message is for the bot. In a group, a message is addressed to the bot
when it @mentions the bot's username (a ``mention`` entity), mentions the bot's user id (a
``text_mention``), is a command for it (``/help`` or ``/help@this_bot``) or replies to one of
its messages — decided by ids and the unique username, never by display names.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Literal

from telegram import Bot, Message, MessageEntity
from telegram.error import TelegramError

from pluto.providers.kit.files import max_bytes, not_downloaded, safe_filename, too_large
from pluto.types import Attachment, IncomingMessage

log = logging.getLogger(__name__)

PROVIDER = "telegram"


def message_key(chat_id: int | str, message_id: int | str) -> str:
    """Message ids are per chat on Telegram: the key that identifies one is both."""
    return f"{chat_id}:{message_id}"


def platform_message_id(key: str) -> int:
    """The Telegram message id in a key made by :func:`message_key` (or a bare id)."""
    return int(key.rpartition(":")[2])


def _entities(message: Message) -> dict[MessageEntity, str]:
    return {**message.parse_entities(), **message.parse_caption_entities()}


def command_target(message: Message) -> str | None:
    """For a message that starts with a command: the bot it names ('' for none), else None."""
    for entity, text in _entities(message).items():
        if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            return text.partition("@")[2]
    return None


def addressed_to_bot(message: Message, bot_id: int, username: str) -> bool:
    if message.chat.type == "private":
        return True
    replied = message.reply_to_message
    if (replied is not None and replied.from_user is not None
            and replied.from_user.id == bot_id and replied.forum_topic_created is None):
        return True
    target = command_target(message)
    if target is not None and target.lower() in ("", username.lower()):
        return True
    for entity, text in _entities(message).items():
        if entity.type == MessageEntity.MENTION and text[1:].lower() == username.lower():
            return True
        if (entity.type == MessageEntity.TEXT_MENTION and entity.user is not None
                and entity.user.id == bot_id):
            return True
    return False


def without_mention(text: str, username: str) -> str:
    """``"@this_bot what now?"`` → ``"what now?"`` (commands keep their ``@this_bot``)."""
    cleaned = re.sub(rf"(?i)(^|\s)@{re.escape(username)}\b[,:]?", r"\1", text)
    return re.sub(r"[ \t]{2,}", " ", cleaned).strip()


def to_incoming(message: Message, bot_id: int, username: str,
                attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    user = message.from_user
    assert user is not None
    chat = message.chat
    addressed = addressed_to_bot(message, bot_id, username)
    replied = message.reply_to_message
    return IncomingMessage(
        provider=PROVIDER, chat_id=str(chat.id), user_id=str(user.id),
        user_name=user.username or user.full_name,
        text=without_mention(message.text or message.caption or "", username),
        message_id=message_key(chat.id, message.message_id),
        attachments=attachments,
        thread_id=str(message.message_thread_id) if message.is_topic_message and
        message.message_thread_id else None,
        reply_to_id=message_key(chat.id, replied.message_id) if replied else None,
        is_direct=chat.type == "private", mentions_bot=addressed,
        timestamp=message.date.timestamp())


class Downloads:
    """Files users send (documents, photos, voice notes, audio) saved under ``<data_dir>/uploads/telegram/<chat>``."""

    def __init__(self, data_dir: Path, max_mb: float):
        self.root = data_dir / "uploads" / PROVIDER
        self.max_mb = max_mb

    async def fetch(self, bot: Bot, message: Message) -> tuple[tuple[Attachment, ...], str | None]:
        """The message's file as an attachment, or a sentence for the user saying why not."""
        spec = _file_spec(message)
        if spec is None:
            return (), None
        file_id, name, mime, size, kind = spec
        if size > max_bytes(self.max_mb):
            return (), too_large(name, self.max_mb)
        folder = self.root / str(message.chat.id)
        path = folder / f"{message.message_id}-{safe_filename(name)}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tg_file = await bot.get_file(file_id)
            await tg_file.download_to_drive(path)
        except (TelegramError, OSError) as e:
            log.warning("telegram: downloading %s from chat %s failed: %s", name,
                        message.chat.id, e)
            return (), not_downloaded(name)
        return (Attachment(filename=name, mime_type=mime, size=path.stat().st_size, path=path,
                           kind=kind),), None


def _file_spec(message: Message) -> tuple[str, str, str, int, Literal["file", "image"]] | None:
    if message.document is not None:
        doc = message.document
        return (doc.file_id, doc.file_name or f"document-{message.message_id}",
                doc.mime_type or "application/octet-stream", doc.file_size or 0, "file")
    if message.voice is not None:  # a voice note: OGG/Opus
        voice = message.voice
        return (voice.file_id, f"voice-{message.message_id}.ogg",
                voice.mime_type or "audio/ogg", voice.file_size or 0, "file")
    if message.audio is not None:
        audio = message.audio
        return (audio.file_id, audio.file_name or f"audio-{message.message_id}.mp3",
                audio.mime_type or "audio/mpeg", audio.file_size or 0, "file")
    if message.photo:
        photo = message.photo[-1]  # the largest size
        return (photo.file_id, f"photo-{message.message_id}.jpg", "image/jpeg",
                photo.file_size or 0, "image")
    return None
