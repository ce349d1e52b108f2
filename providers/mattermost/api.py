"""The API v4 calls the provider makes, over one aiohttp session with the bot's token.

Every refusal raises :class:`ApiError` (see ``errors.py``); answers are capped in size.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from pluto.errors import DeliveryRefused
from pluto.providers.kit.files import CHUNK, save_stream
from pluto.providers.mattermost.errors import ApiError, api_error

MAX_JSON = 32 * 1024 * 1024  # one answer (a page of posts) at most
ID = re.compile(r"[a-z0-9]{26}")  # every Mattermost id: 26 lowercase letters and digits


class MattermostApi:
    def __init__(self, api_url: str, token: str, timeout: float):
        self.api_url = api_url
        self._auth = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None
        self.server_ms: int | None = None  # the server's clock at the last answer (its Date)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._auth)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, path: str, **kw: Any) -> Any:
        """One call; its JSON answer. :class:`ApiError` when refused."""
        async with self.session().request(method, f"{self.api_url}{path}", **kw) as r:
            self._note_clock(r)
            raw = await r.content.read(MAX_JSON + 1)
            if len(raw) > MAX_JSON:
                raise ApiError(r.status, "", "the answer is too large")
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            if r.status >= 400:
                raise api_error(r.status, body, r.headers)
            if body is None and raw:
                raise ValueError("the answer is not JSON")
            return body

    def _note_clock(self, r: aiohttp.ClientResponse) -> None:
        date = r.headers.get("Date")
        try:
            parsed = email.utils.parsedate_to_datetime(date) if date else None
        except (TypeError, ValueError):
            parsed = None
        self.server_ms = int(parsed.timestamp() * 1000) if parsed else int(time.time() * 1000)

    async def me(self) -> dict[str, Any]:
        return _dict(await self.call("GET", "/users/me"))

    async def user(self, user_id: str) -> dict[str, Any]:
        return _dict(await self.call("GET", f"/users/{_id(user_id)}"))

    async def channels(self) -> list[dict[str, Any]]:
        """Every channel the bot is a member of (DMs and group messages included)."""
        found: dict[str, dict[str, Any]] = {}
        for team in _dicts(await self.call("GET", "/users/me/teams")):
            path = f"/users/me/teams/{_id(str(team.get('id')))}/channels"
            for channel in _dicts(await self.call("GET", path)):
                found[str(channel.get("id"))] = channel
        return list(found.values())

    async def channel(self, channel_id: str) -> dict[str, Any]:
        return _dict(await self.call("GET", f"/channels/{_id(channel_id)}"))

    async def posts_since(self, channel_id: str, since_ms: int) -> list[dict[str, Any]]:
        """The posts created or changed after ``since_ms``, oldest first."""
        body = _dict(await self.call("GET", f"/channels/{_id(channel_id)}/posts",
                                     params={"since": str(since_ms)}))
        posts = _dict(body.get("posts"))
        return sorted(_dicts(list(posts.values())), key=lambda p: _int(p.get("create_at")))

    async def post(self, post_id: str) -> dict[str, Any]:
        return _dict(await self.call("GET", f"/posts/{_id(post_id)}"))

    async def create_post(self, payload: dict[str, Any]) -> dict[str, Any]:
        return _dict(await self.call("POST", "/posts", json=payload))

    async def patch_post(self, post_id: str, message: str) -> None:
        await self.call("PUT", f"/posts/{_id(post_id)}/patch", json={"message": message})

    async def delete_post(self, post_id: str) -> None:
        await self.call("DELETE", f"/posts/{_id(post_id)}")

    async def upload(self, channel_id: str, data: bytes, filename: str, mime: str) -> str:
        """Upload one file to a channel; its file id (for a post's ``file_ids``)."""
        form = aiohttp.FormData()
        form.add_field("channel_id", channel_id)
        form.add_field("files", data, filename=filename, content_type=mime)
        body = _dict(await self.call("POST", "/files", data=form))
        infos = _dicts(body.get("file_infos"))
        if not infos or not infos[0].get("id"):
            raise ApiError(201, "", "Mattermost gave no file id")
        return str(infos[0]["id"])

    async def file_info(self, file_id: str) -> dict[str, Any]:
        return _dict(await self.call("GET", f"/files/{_id(file_id)}/info"))

    async def download(self, file_id: str, path: Path, max_bytes: int) -> int:
        """A file into ``path``, streamed; its size. The kit's ``TooLarge`` past
        ``max_bytes`` (the partial file removed)."""
        async with self.session().get(f"{self.api_url}/files/{_id(file_id)}") as r:
            if r.status >= 400:
                raise api_error(r.status, None, r.headers)
            return await save_stream(r.content.iter_chunked(CHUNK), path, max_bytes)


def _id(value: str) -> str:
    """An id for a path; a refusal (never a request) for anything else."""
    if not ID.fullmatch(value):
        raise DeliveryRefused(f"{value[:40]!r} is not a Mattermost id")
    return value


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
