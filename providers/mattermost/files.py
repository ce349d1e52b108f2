"""Files people attach to a post, downloaded into the data dir under a size cap; the sentence
a person is told when one cannot be read (the post goes on without it)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pluto.providers.kit.files import TooLarge, kind_of, max_bytes, not_downloaded, too_large
from pluto.providers.mattermost.api import MattermostApi
from pluto.providers.mattermost.errors import FAILURES, provider_error
from pluto.providers.mattermost.inbound import Post, file_meta, upload_path
from pluto.types import Attachment

log = logging.getLogger(__name__)

MAX_FILES = 10  # files read from one post


class Downloads:
    def __init__(self, api: MattermostApi, root: Path, max_mb: float):
        self.api, self.root, self.max_mb = api, root, max_mb

    async def fetch(self, post: Post) -> tuple[tuple[Attachment, ...], str | None]:
        """The post's files, and what to tell the person about those left out."""
        found: list[Attachment] = []
        problems: list[str] = []
        meta = file_meta(post)
        for file_id in post.file_ids[:MAX_FILES]:
            attachment, problem = await self._one(post, file_id, meta.get(file_id))
            found += [attachment] if attachment else []
            problems += [problem] if problem else []
        return tuple(found), " ".join(problems) or None

    async def _one(self, post: Post, file_id: str, info: dict[str, Any] | None
                   ) -> tuple[Attachment | None, str | None]:
        limit = max_bytes(self.max_mb)
        try:
            info = info or await self.api.file_info(file_id)
        except FAILURES as e:
            log.warning("mattermost: file %s unknown: %s", file_id, provider_error(e))
            return None, "I could not read a file you sent; please send it again."
        name = str(info.get("name") or "file")
        if (size := info.get("size")) and isinstance(size, int) and size > limit:
            return None, too_large(name, self.max_mb)
        path = upload_path(self.root, post, file_id, name)
        try:
            got = await self.api.download(file_id, path, limit)
        except TooLarge:
            return None, too_large(name, self.max_mb)
        except FAILURES as e:
            log.warning("mattermost: downloading %s failed: %s", name, provider_error(e))
            return None, not_downloaded(name)
        mime = str(info.get("mime_type") or "application/octet-stream")
        return Attachment(filename=name, mime_type=mime, size=got, path=path,
                          kind=kind_of(mime)), None
