"""A quiet notice: a sentence to a chat (a file refused, a message not taken) that never
raises — a notice that cannot be sent is logged and dropped, the message goes on."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from pluto.errors import ProviderError
from pluto.types import OutgoingMessage

Send = Callable[[OutgoingMessage], Awaitable[object]]


async def quiet_notice(send: Send, message: OutgoingMessage, *, log: logging.Logger,
                       provider: str, place: str) -> bool:
    """``send(message)``; a :class:`ProviderError` is logged (to the provider's ``log``) as
    ``<provider>: could not tell <place>: …``, never raised. Whether it was sent."""
    try:
        await send(message)
    except ProviderError as e:
        log.warning("%s: could not tell %s: %s", provider, place, e)
        return False
    return True


def notice(chat_id: str, text: str, *, thread_id: str | None = None,
           reply_to: str | None = None) -> OutgoingMessage:
    """An :class:`OutgoingMessage` of kind ``notice``."""
    return OutgoingMessage(chat_id=chat_id, text=text, kind="notice", thread_id=thread_id,
                           reply_to=reply_to)
