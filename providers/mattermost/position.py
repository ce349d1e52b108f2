"""How far the provider has taken each channel: a small file under the data dir.

Mattermost sends a post once, over the WebSocket; one that comes while the provider is away (a
reconnect, a restart) is fetched afterwards with ``GET /channels/{id}/posts?since=<ms>``. The
file keeps, per channel, the creation time (the server's milliseconds) of the last post intake
recorded, and the ``floor``: the server's time at the bot's first start (history before it is
not answered). It is written whole (a temporary file renamed over the old one), off the event
loop, only after intake recorded a post: a crash before that fetches the post again (the
gateway's dedupe drops what it already has), so a restart neither misses nor repeats one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_CHANNELS = 100_000


class Positions:
    def __init__(self, data_dir: Path, user_id: str):
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", user_id)[:100] or "bot"
        self.path = data_dir / "mattermost" / f"{name}.json"
        self.floor: int | None = None
        self.channels: dict[str, int] = {}
        self._lock = asyncio.Lock()

    def of(self, channel_id: str) -> int:
        return self.channels.get(channel_id, self.floor or 0)

    def advance(self, channel_id: str, create_at: int) -> bool:
        if create_at <= self.of(channel_id):
            return False
        self.channels[channel_id] = create_at
        return True

    async def load(self) -> bool:
        """Read the file; False on a first start (no file)."""
        data = await asyncio.to_thread(self._read)
        if data is None:
            return False
        floor = data.get("floor")
        self.floor = floor if isinstance(floor, int) else None
        channels = data.get("channels")
        if isinstance(channels, dict):
            self.channels = {str(k): v for k, v in list(channels.items())[:MAX_CHANNELS]
                             if isinstance(v, int)}
        return self.floor is not None

    async def save(self) -> None:
        async with self._lock:  # one writer at a time, the latest state last
            data = {"floor": self.floor, "channels": dict(self.channels)}
            await asyncio.to_thread(self._write, data)

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("mattermost: the positions in %s cannot be read (%s); starting from now",
                        self.path, type(e).__name__)
            return None
        return data if isinstance(data, dict) else None

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)
