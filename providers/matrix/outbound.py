"""Sending to Matrix: ``m.text`` in HTML with its plain body (``m.notice`` for notices),
images and files uploaded to the media repository first, edits (``m.replace``) for streamed
replies, replies in the thread a message came from, the typing indicator (ended once the answer
is there). Every failure is a :class:`ProviderError` (see ``errors.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from mautrix.client import ClientAPI
from mautrix.types import EventContent, EventType, RoomID

from pluto.errors import DeliveryRefused, ProviderError
from pluto.providers.kit.files import read_outgoing
from pluto.providers.matrix.errors import call
from pluto.providers.matrix.markup import to_event_content
from pluto.types import Attachment, OutgoingMessage

log = logging.getLogger(__name__)

Sent = Callable[[str, str | None], None]  # (event id, thread id): what the bot wrote


class Outbound:
    def __init__(self, client: Callable[[], ClientAPI], sent: Sent):
        self.client = client
        self._sent = sent
        self._typing: set[str] = set()  # rooms where the bot shows "typing…"

    async def send(self, message: OutgoingMessage) -> str | None:
        first: str | None = None
        if message.text:
            content = to_event_content(message.text, message.markup)
            if message.kind == "notice":
                content["msgtype"] = "m.notice"
            first = await self._send(message, content)
        for attachment in message.attachments:
            sent = await self._send(message, await self._file_content(attachment))
            first = first or sent
        if first is None:
            raise DeliveryRefused("an empty message cannot be sent")
        if message.kind in ("reply", "error") and message.chat_id in self._typing:
            await self._stop_typing(message.chat_id)
        return first

    async def edit(self, message: OutgoingMessage) -> None:
        assert message.edit_of is not None
        new = to_event_content(message.text, message.markup)
        content: dict[str, Any] = {
            "msgtype": "m.text", "body": f"* {new['body']}", "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": message.edit_of}}
        if "formatted_body" in new:
            content |= {"format": new["format"], "formatted_body": f"* {new['formatted_body']}"}
        await call(self.client().send_message_event(
            RoomID(message.chat_id), EventType.ROOM_MESSAGE, _json(content)))
        if message.kind in ("reply", "error") and message.chat_id in self._typing:
            await self._stop_typing(message.chat_id)

    async def typing(self, chat_id: str) -> None:
        await call(self.client().set_typing(RoomID(chat_id), timeout=30000))
        self._typing.add(chat_id)

    async def _stop_typing(self, room_id: str) -> None:
        """Homeservers keep "typing…" until its timeout: end it once the answer is there."""
        self._typing.discard(room_id)
        try:
            await call(self.client().set_typing(RoomID(room_id), timeout=0))
        except ProviderError as e:
            log.debug("matrix: typing off in %s: %s", room_id, e)

    async def _send(self, message: OutgoingMessage, content: dict[str, Any]) -> str:
        if not message.chat_id.startswith("!"):
            raise DeliveryRefused(f"{message.chat_id!r} is not a Matrix room id")
        content["m.mentions"] = {}  # a reply never pings anyone by itself
        if message.thread_id:
            content["m.relates_to"] = {
                "rel_type": "m.thread", "event_id": message.thread_id, "is_falling_back": True,
                "m.in_reply_to": {"event_id": message.answers or message.thread_id}}
        elif message.reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": message.reply_to}}
        event_id = str(await call(self.client().send_message_event(
            RoomID(message.chat_id), EventType.ROOM_MESSAGE, _json(content))))
        self._sent(event_id, message.thread_id)
        return event_id

    async def _file_content(self, attachment: Attachment) -> dict[str, Any]:
        data = await read_outgoing(attachment)
        mxc = await call(self.client().upload_media(
            data, mime_type=attachment.mime_type, filename=attachment.filename))
        image = attachment.kind == "image" and attachment.mime_type.startswith("image/")
        return {"msgtype": "m.image" if image else "m.file", "body": attachment.filename,
                "filename": attachment.filename, "url": str(mxc),
                "info": {"mimetype": attachment.mime_type, "size": len(data)}}


def _json(content: dict[str, Any]) -> EventContent:
    """A plain JSON event content: mautrix sends a dict as it is (it serializes only its own
    classes), though its annotation names only those classes."""
    return cast(EventContent, content)
