"""Where each conversation's replies go: its ``serviceUrl``, learned from verified activities.

A reply, an edit or a proactive message (a schedule's answer, long after the last activity)
needs the conversation's ``serviceUrl``. The core offers providers no state storage of their
own, so the references live in ``<data dir>/teams/conversations.json``, written whole (a
temporary file renamed over the old one) off the event loop whenever one is new or moved; at
most :data:`KEPT` are kept, the least recently seen dropped first. Only a ``serviceUrl`` that
came with a verified token is ever stored: the bot's access token is sent there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)

KEPT = 20_000


class Conversations:
    def __init__(self, data_dir: Path):
        self.path = data_dir / "teams" / "conversations.json"
        self._urls: OrderedDict[str, str] | None = None
        self._lock = asyncio.Lock()

    async def service_url(self, conversation: str) -> str | None:
        urls = await self._loaded()
        return urls.get(conversation)

    async def remember(self, conversation: str, service_url: str) -> None:
        urls = await self._loaded()
        known = urls.get(conversation)
        urls[conversation] = service_url
        urls.move_to_end(conversation)
        if known == service_url:
            return
        while len(urls) > KEPT:
            urls.popitem(last=False)
        async with self._lock:
            await asyncio.to_thread(self._save, dict(urls))

    async def _loaded(self) -> OrderedDict[str, str]:
        if self._urls is None:
            loaded = await asyncio.to_thread(self._load)
            if self._urls is None:
                self._urls = loaded
        return self._urls

    def _load(self) -> OrderedDict[str, str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return OrderedDict()
        except (OSError, ValueError) as e:
            log.warning("teams: the conversation references in %s cannot be read (%s); "
                        "replies go to conversations seen from now on", self.path,
                        type(e).__name__)
            return OrderedDict()
        if not isinstance(data, dict):
            return OrderedDict()
        return OrderedDict((str(k), v) for k, v in data.items() if isinstance(v, str))

    def _save(self, urls: dict[str, str]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(urls), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:  # kept in memory: replies still go out while this process runs
            log.warning("teams: the conversation references could not be saved (%s)",
                        type(e).__name__)
