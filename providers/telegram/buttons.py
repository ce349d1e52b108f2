"""Approval buttons on Telegram (docs/approvals.md, ``providers/kit/buttons.py``).

Shown: ``OutgoingMessage.buttons`` become an inline keyboard, one row, each button's
``callback_data`` the command it stands for (:func:`~pluto.providers.kit.buttons.payload_of`:
at most 64 bytes, Telegram's limit; a longer one is never sent — the button is left out).
Clicked: a ``callback_query`` update. Its data is read back with ``command_of`` (anything else is
forged or stale: answered "This button is no longer valid", nothing handed over); the clicker is
checked with ``ProviderContext.approvals``; the query is answered at once — the refusal as an
alert only the clicker sees, else a short toast — and the click is handed over as the command
from the clicker, under ``click:<query id>`` (a redelivered update is one decision). Once handed
over, the keyboard is taken off the request message (best effort).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from telegram import Bot, CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup
from telegram.error import TelegramError

from pluto.providers.kit.bounded import remember
from pluto.providers.kit.buttons import click_message, command_of, payload_of
from pluto.types import Button, IncomingMessage

log = logging.getLogger(__name__)

PROVIDER = "telegram"
NOT_VALID = "This button is no longer valid"
CHECK_WITHIN = 5.0  # seconds for the approvals check (a client gives up on an answer ~10 s)
ANSWERED = 4096  # query ids remembered as answered (a redelivered update is not answered twice)
Check = Callable[[str, str, str, str], Awaitable[str | None]]


def keyboard(buttons: tuple[Button, ...]) -> InlineKeyboardMarkup | None:
    """The buttons as one row of an inline keyboard (None when there are none to show)."""
    row = []
    for button in buttons:
        try:
            row.append(InlineKeyboardButton(button.label, callback_data=payload_of(button)))
        except ValueError as e:  # over 64 bytes: Telegram would refuse the whole message
            log.warning("telegram: a button left out: %s", e)
    return InlineKeyboardMarkup([row]) if row else None


class Clicks:
    """What a callback query becomes; ``approvals`` is ``ProviderContext.approvals``."""

    def __init__(self, approvals: Check | None):
        self.approvals = approvals
        self._answered: OrderedDict[str, None] = OrderedDict()

    async def receive(self, bot: Bot, query: CallbackQuery) -> IncomingMessage | None:
        """Answer the query; the message to hand over when the click is allowed, else None."""
        found = command_of(query.data)
        message = query.message
        if found is None or message is None or query.from_user.is_bot:
            await self._answer(bot, query, NOT_VALID, alert=True)
            return None
        command, approval_id = found
        chat_id, user_id = str(message.chat.id), str(query.from_user.id)
        refusal = await self._check(chat_id, user_id, approval_id)
        if refusal is not None:
            await self._answer(bot, query, refusal, alert=True)
            return None
        await self._answer(bot, query, "Approved" if command.startswith("/approve")
                           else "Denied", alert=False)
        user = query.from_user
        thread = getattr(message, "message_thread_id", None)
        topic = bool(getattr(message, "is_topic_message", False))
        return click_message(PROVIDER, chat_id=chat_id, user_id=user_id, command=command,
                             click_id=query.id, user_name=user.username or user.full_name,
                             thread_id=str(thread) if topic and thread else None,
                             is_direct=message.chat.type == "private")

    async def _check(self, chat_id: str, user_id: str, approval_id: str) -> str | None:
        """The approvals check, bounded so the query is answered in Telegram's window: when it
        takes too long, the click is handed over and the gateway decides (it checks again)."""
        if self.approvals is None:
            return None
        try:
            async with asyncio.timeout(CHECK_WITHIN):
                return await self.approvals(PROVIDER, chat_id, user_id, approval_id)
        except TimeoutError:
            log.warning("telegram: checking a click took over %gs; the gateway decides",
                        CHECK_WITHIN)
            return None

    async def _answer(self, bot: Bot, query: CallbackQuery, text: str, *, alert: bool) -> None:
        """Answer once (a redelivered update is not answered again: Telegram would refuse)."""
        if query.id in self._answered:
            return
        remember(self._answered, query.id, None, ANSWERED)
        try:
            await bot.answer_callback_query(query.id, text=text[:200], show_alert=alert)
        except TelegramError as e:
            log.info("telegram: answering callback query %s failed: %s", query.id, e)

    @staticmethod
    async def take_off(bot: Bot, query: CallbackQuery) -> None:
        """Remove the keyboard from the request message (best effort: it may be gone)."""
        message = query.message
        if message is None:
            return
        try:
            await bot.edit_message_reply_markup(chat_id=message.chat.id,
                                                message_id=message.message_id, reply_markup=None)
        except TelegramError as e:
            log.debug("telegram: taking the buttons off message %s failed: %s",
                      message.message_id, e)
