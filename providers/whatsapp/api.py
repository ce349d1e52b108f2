"""The few Cloud API calls the provider makes, over one aiohttp session.

``POST /<phone_number_id>/messages`` (text, image, document; a read receipt with the typing
indicator), ``POST /<phone_number_id>/media`` (an upload), ``GET /<media_id>`` then the URL it
names (a download, with the same bearer token). Every refusal raises :class:`GraphError`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import aiohttp

from pluto.providers.kit.files import CHUNK, TooLarge, save_stream
from pluto.providers.whatsapp.errors import GraphError, graph_error

TIMEOUT = aiohttp.ClientTimeout(total=60, connect=10)


class GraphApi:
    def __init__(self, api_url: str, phone_number_id: str, token: str):
        self.api_url = api_url
        self.phone_number_id = phone_number_id
        self._auth = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=TIMEOUT, headers=self._auth)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _json(self, response: aiohttp.ClientResponse) -> dict[str, Any]:
        try:
            body = await response.json(content_type=None)
        except (ValueError, aiohttp.ContentTypeError):
            body = None
        if response.status >= 400 or not isinstance(body, dict) or "error" in body:
            raise graph_error(response.status, body, response.headers)
        return body

    async def number(self) -> dict[str, Any]:
        """The business number's display number and name (checks the token and the id)."""
        async with self.session().get(f"{self.api_url}/{self.phone_number_id}", params={
                "fields": "display_phone_number,verified_name"}) as r:
            return await self._json(r)

    async def message(self, to: str, kind: str, content: dict[str, Any],
                      reply_to: str | None = None) -> str:
        """Send one message; its ``wamid``."""
        payload: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual",
                                   "to": to, "type": kind, kind: content}
        if reply_to:
            payload["context"] = {"message_id": reply_to}
        async with self.session().post(f"{self.api_url}/{self.phone_number_id}/messages",
                                       json=payload) as r:
            body = await self._json(r)
        found = body.get("messages")
        if not isinstance(found, list) or not found or not isinstance(found[0], dict):
            raise GraphError(r.status, 0, "WhatsApp gave no message id")
        return str(found[0].get("id") or "")

    async def mark_read(self, message_id: str, typing: bool) -> None:
        """The blue ticks on ``message_id``, and the typing indicator (until the reply, at most
        25 s) if asked."""
        payload: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read",
                                   "message_id": message_id}
        if typing:
            payload["typing_indicator"] = {"type": "text"}
        async with self.session().post(f"{self.api_url}/{self.phone_number_id}/messages",
                                       json=payload) as r:
            await self._json(r)

    async def upload(self, data: bytes, filename: str, mime_type: str) -> str:
        """Upload a file; its media id."""
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime_type)
        form.add_field("file", data, filename=filename, content_type=mime_type)
        async with self.session().post(f"{self.api_url}/{self.phone_number_id}/media",
                                       data=form) as r:
            body = await self._json(r)
        if not body.get("id"):
            raise GraphError(r.status, 0, "WhatsApp gave no media id")
        return str(body["id"])

    async def download(self, media_id: str, path: Path, max_bytes: int) -> int:
        """Fetch a user's media into ``path`` (its SHA-256 checked when WhatsApp gives one);
        its size. :class:`TooLarge` when over ``max_bytes``."""
        async with self.session().get(f"{self.api_url}/{media_id}") as r:
            meta = await self._json(r)
        url = meta.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise GraphError(r.status, 0, "WhatsApp gave no download URL")
        if int(meta.get("file_size") or 0) > max_bytes:
            raise TooLarge()
        digest = hashlib.sha256()
        async with self.session().get(url) as r:
            if r.status >= 400:
                raise graph_error(r.status, None, r.headers)
            size = await save_stream(r.content.iter_chunked(CHUNK), path, max_bytes,
                                     each=digest.update)
        expected = meta.get("sha256")
        if isinstance(expected, str) and expected and expected != digest.hexdigest():
            raise GraphError(200, 0, "the downloaded file does not match its checksum")
        return size
