"""Sending to Mattermost: posts (in the thread a message came from: ``root_id``), files
uploaded first and attached by ``file_ids`` (five per post at most), edits of a streamed reply
(``PUT /posts/{id}/patch``), deletes; approval buttons as interactive message buttons, or as
the commands to write where clicks have nowhere to go (``buttons.py``). Every failure is a
:class:`ProviderError`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from pluto.errors import DeliveryRefused
from pluto.providers.kit.files import read_outgoing
from pluto.providers.mattermost.api import MattermostApi
from pluto.providers.mattermost.buttons import attachments_for, written
from pluto.providers.mattermost.errors import FAILURES, ApiError, provider_error
from pluto.types import Attachment, OutgoingMessage

T = TypeVar("T")
MAX_LENGTH = 16383  # Mattermost's limit for one post's message
FILES_PER_POST = 5
MAX_FILE = 100 * 1024 * 1024  # the server's default MaxFileSize
Sent = Callable[[str, str | None], None]  # (post id, thread root): what the bot wrote
ButtonsAt = tuple[str, bytes]  # (actions_url, the buttons' token key)


class Outbound:
    def __init__(self, api: MattermostApi, sent: Sent, token_env: str,
                 buttons: ButtonsAt | None = None):
        self.api = api
        self._sent = sent
        self._token_env = token_env
        self.buttons = buttons  # where clicks are posted; None: commands are written

    async def call(self, coro: Awaitable[T]) -> T:
        try:
            return await coro
        except FAILURES as e:
            raise provider_error(e, self._token_env) from None

    async def send(self, message: OutgoingMessage) -> str:
        props: dict[str, Any] = {}
        if message.buttons and self.buttons is not None:
            props["attachments"] = attachments_for(message.buttons, *self.buttons)
        elif message.buttons:
            message = replace(message, text=f"{message.text}\n\n{written(message.buttons)}")
        if len(message.text) > MAX_LENGTH:
            raise DeliveryRefused(f"a message longer than {MAX_LENGTH} characters")
        file_ids = [await self._upload(message.chat_id, a) for a in message.attachments]
        if not message.text and not file_ids:
            raise DeliveryRefused("an empty message cannot be sent")
        first: str | None = None
        groups = [file_ids[i:i + FILES_PER_POST]
                  for i in range(0, len(file_ids), FILES_PER_POST)] or [[]]
        for i, files in enumerate(groups):
            payload: dict[str, Any] = {"channel_id": message.chat_id,
                                       "message": message.text if i == 0 else ""}
            if message.thread_id:
                payload["root_id"] = message.thread_id
            if files:
                payload["file_ids"] = files
            if props and i == 0:
                payload["props"] = props
            post = await self.call(self.api.create_post(payload))
            post_id = str(post.get("id") or "")
            if not post_id:
                raise DeliveryRefused("Mattermost gave no post id")
            self._sent(post_id, message.thread_id)
            first = first or post_id
        assert first is not None
        return first

    async def edit(self, message: OutgoingMessage) -> None:
        assert message.edit_of is not None
        if len(message.text) > MAX_LENGTH:
            raise DeliveryRefused(f"a message longer than {MAX_LENGTH} characters")
        await self.call(self.api.patch_post(message.edit_of, message.text))

    async def delete(self, post_id: str) -> bool:
        try:
            await self.api.delete_post(post_id)
        except ApiError as e:
            if e.status == 404:
                return True  # already gone
            raise provider_error(e, self._token_env) from None
        except FAILURES as e:
            raise provider_error(e, self._token_env) from None
        return True

    async def _upload(self, channel_id: str, attachment: Attachment) -> str:
        data = await read_outgoing(attachment, MAX_FILE)
        return await self.call(self.api.upload(channel_id, data, attachment.filename,
                                               attachment.mime_type))
