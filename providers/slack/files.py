"""Files users send in Slack, saved under ``<data_dir>/uploads/slack/<channel>/``.

A ``file_share`` message lists its files; each is fetched from ``url_private_download`` with the
bot token (Slack answers its sign-in page, HTTP 200 HTML, when the token lacks ``files:read``),
at most ``max_mb`` megabytes, and only from Slack's own hosts (or the configured API host), so
the token is never sent anywhere else.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from pluto.errors import PlutoError
from pluto.providers.kit.files import (CHUNK, TooLarge, kind_of, max_bytes, not_downloaded,
                                       safe_filename, save_stream, too_large)
from pluto.types import Attachment
from pluto.providers.slack.inbound import PROVIDER

log = logging.getLogger(__name__)

FileInfo = Callable[[str], Awaitable[dict[str, Any]]]  # files.info for a file id
SLACK_HOSTS = ("slack.com", "slack-edge.com", "slack-files.com")


class FileProblem(PlutoError):
    """A file could not be fetched; the message is one sentence for the user."""


class Downloads:
    def __init__(self, data_dir: Path, max_mb: float, token: str, api_base: str):
        self.root = data_dir / "uploads" / PROVIDER
        self.max_bytes = max_bytes(max_mb)
        self.max_mb = max_mb
        self._token = token
        self._api_host = urlsplit(api_base).hostname or ""
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, event: dict[str, Any],
                    file_info: FileInfo) -> tuple[tuple[Attachment, ...], list[str]]:
        """The files of a message as attachments, and a sentence for each that failed."""
        found: list[Attachment] = []
        problems: list[str] = []
        for index, spec in enumerate(event.get("files") or []):
            if not isinstance(spec, dict):
                continue
            name = str(spec.get("name") or spec.get("title") or f"file-{index + 1}")
            try:
                found.append(await self._fetch_one(event, spec, index, file_info))
            except FileProblem as e:
                problems.append(str(e))
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                log.warning("slack: downloading %s from channel %s failed: %s", name,
                            event.get("channel"), type(e).__name__)
                problems.append(not_downloaded(name))
        return tuple(found), problems

    async def _fetch_one(self, event: dict[str, Any], spec: dict[str, Any], index: int,
                         file_info: FileInfo) -> Attachment:
        if not spec.get("url_private_download") and not spec.get("url_private") and spec.get("id"):
            spec = await file_info(str(spec["id"]))  # a partial file object ("check_file_info")
        name = str(spec.get("name") or spec.get("title") or f"file-{index + 1}")
        mime = str(spec.get("mimetype") or "application/octet-stream")
        if int(spec.get("size") or 0) > self.max_bytes:
            raise FileProblem(too_large(name, self.max_mb))
        url = str(spec.get("url_private_download") or spec.get("url_private") or "")
        if not url or not self._trusted(url):
            log.warning("slack: file %s has no download address on Slack's hosts", name)
            raise FileProblem(f"I could not download the file {name}.")
        folder = self.root / _safe(str(event.get("channel") or "unknown"))
        path = folder / f"{_safe(str(event.get('ts') or ''))}-{index}-{safe_filename(name)}"
        await self._download(url, path, name, mime)
        return Attachment(filename=name, mime_type=mime, size=path.stat().st_size, path=path,
                          kind=kind_of(mime))

    async def _download(self, url: str, path: Path, name: str, mime: str) -> None:
        session = self._session = self._session or aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=300, sock_read=60))
        headers = {"Authorization": f"Bearer {self._token}"}
        async with session.get(url, headers=headers) as resp:
            if resp.status != 200:
                log.warning("slack: downloading %s answered HTTP %d", name, resp.status)
                raise FileProblem(not_downloaded(name))
            if resp.content_type == "text/html" and "html" not in mime:
                log.warning("slack: downloading %s gave Slack's sign-in page: the app needs the "
                            "files:read scope", name)
                raise FileProblem(f"I am not allowed to read the file {name}.")
            if (resp.content_length or 0) > self.max_bytes:
                raise FileProblem(too_large(name, self.max_mb))
            partial = path.with_name(path.name + ".part")
            try:
                await save_stream(resp.content.iter_chunked(CHUNK), partial, self.max_bytes)
            except TooLarge:
                raise FileProblem(too_large(name, self.max_mb)) from None
            await asyncio.to_thread(partial.replace, path)

    def _trusted(self, url: str) -> bool:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host:
            return False
        if host == self._api_host.lower():
            return True
        return parts.scheme == "https" and any(host == h or host.endswith("." + h)
                                               for h in SLACK_HOSTS)


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", part).strip("._") or "_"
