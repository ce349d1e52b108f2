"""Sending to Telegram: text (HTML, with a plain-text fallback), edits, photos and documents,
the typing indicator. Every failure is a :class:`ProviderError` (see ``errors.py``)."""

from __future__ import annotations

import asyncio
import html
import logging
import re
from typing import Any

from telegram import Bot, Message, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, TelegramError

from pluto.errors import DeliveryRefused, ProviderError
from pluto.providers.kit.files import read_outgoing
from pluto.types import Attachment, OutgoingMessage
from pluto.providers.telegram.buttons import keyboard
from pluto.providers.telegram.errors import CANT_PARSE, GONE, NOT_MODIFIED, provider_error
from pluto.providers.telegram.inbound import platform_message_id
from pluto.providers.telegram.markup import TELEGRAM_HTML

log = logging.getLogger(__name__)

MAX_CAPTION = 1024


class Outbound:
    def __init__(self, bot: Bot):
        self.bot = bot

    async def send(self, message: OutgoingMessage) -> str:
        target = _target(message)
        if message.attachments:
            return await self._send_files(message, target)
        markup = keyboard(message.buttons)
        sent = await self._with_plain_fallback(
            message, lambda text, mode: self.bot.send_message(text=text, parse_mode=mode,
                                                              reply_markup=markup, **target))
        return str(sent.message_id)

    async def edit(self, message: OutgoingMessage) -> None:
        assert message.edit_of is not None
        chat_id, message_id = _chat(message.chat_id), platform_message_id(message.edit_of)
        markup = keyboard(message.buttons)
        try:
            await self._with_plain_fallback(
                message, lambda text, mode: self.bot.edit_message_text(
                    text, chat_id=chat_id, message_id=message_id, parse_mode=mode,
                    reply_markup=markup))
        except ProviderError as e:
            if NOT_MODIFIED not in str(e).lower():
                raise

    async def delete(self, chat_id: str, platform_id: str) -> bool:
        try:
            await self._call(self.bot.delete_message(_chat(chat_id),
                                                     platform_message_id(platform_id)))
        except DeliveryRefused as e:
            if GONE not in str(e).lower():
                raise
        return True

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self._call(self.bot.send_chat_action(
            _chat(chat_id), ChatAction.TYPING, message_thread_id=_int(thread_id)))

    async def _send_files(self, message: OutgoingMessage, target: dict[str, Any]) -> str:
        caption = message.text if len(message.text) <= MAX_CAPTION else None
        if message.text and caption is None:
            await self.send(OutgoingMessage(chat_id=message.chat_id, text=message.text,
                                            thread_id=message.thread_id, markup=message.markup,
                                            reply_to=message.reply_to))
            target = {**target, "reply_parameters": None}
        first: str | None = None
        for attachment in message.attachments:
            sent = await self._send_file(attachment, caption or None, message.markup, target)
            first, caption = first or str(sent.message_id), None
        assert first is not None
        return first

    async def _send_file(self, attachment: Attachment, caption: str | None, markup: str,
                         target: dict[str, Any]) -> Message:
        data = await read_outgoing(attachment)
        mode = _parse_mode(markup) if caption else None
        if attachment.kind == "image":
            try:
                return await self.bot.send_photo(photo=data, caption=caption, parse_mode=mode,
                                                 **target)
            except BadRequest as e:  # not an image Telegram can show: send it as a file
                log.info("telegram: %s not sent as a photo (%s); sending a file",
                         attachment.filename, e.message)
            except TelegramError as e:
                raise provider_error(e) from None
        if attachment.mime_type == "audio/ogg":  # OGG/Opus: a voice note (docs/voice.md)
            return await self._call(self.bot.send_voice(
                voice=data, filename=attachment.filename, caption=caption, parse_mode=mode,
                **target))
        return await self._call(self.bot.send_document(
            document=data, filename=attachment.filename, caption=caption, parse_mode=mode,
            **target))

    async def _with_plain_fallback(self, message: OutgoingMessage, call: Any) -> Any:
        """Send as HTML; if Telegram cannot parse it, send the same text as plain text."""
        mode = _parse_mode(message.markup)
        try:
            return await call(message.text, mode)
        except BadRequest as e:
            if mode is None or CANT_PARSE not in e.message.lower():
                raise provider_error(e) from None
            log.warning("telegram: the HTML was rejected (%s); sending plain text", e.message)
        except TelegramError as e:
            raise provider_error(e) from None
        return await self._call(call(html_to_plain(message.text), None))

    @staticmethod
    async def _call(coro: Any) -> Any:
        try:
            return await coro
        except TelegramError as e:
            raise provider_error(e) from None


def _parse_mode(markup: str) -> str | None:
    return ParseMode.HTML if markup == TELEGRAM_HTML.name else None


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def _chat(chat_id: str) -> int | str:
    """Telegram chat ids are integers (or ``@channelname``)."""
    if chat_id.lstrip("-").isdigit():
        return int(chat_id)
    if chat_id.startswith("@"):
        return chat_id
    raise DeliveryRefused(f"{chat_id!r} is not a Telegram chat id")


def _target(message: OutgoingMessage) -> dict[str, Any]:
    reply = None
    if message.reply_to:
        reply = ReplyParameters(platform_message_id(message.reply_to),
                                allow_sending_without_reply=True)
    return {"chat_id": _chat(message.chat_id), "message_thread_id": _int(message.thread_id),
            "reply_parameters": reply}


def html_to_plain(text: str) -> str:
    """What Telegram HTML says, without the markup."""
    return html.unescape(re.sub(r"<[^>]+>", "", text))
