"""Where the provider keeps its ``/sync`` position: a small file under the data dir.

The core offers providers no state storage of their own, so the token lives in
``<data dir>/matrix/<bot user>.json``, written whole (a temporary file renamed over the old
one), off the event loop. It is written only after every message of a batch was recorded by
intake: a crash before that replays the batch (the gateway's dedupe drops what it already has),
a crash after it resumes past it, so a restart neither misses nor repeats a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)


class SyncTokenFile:
    def __init__(self, data_dir: Path, user_id: str):
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", user_id.lstrip("@"))[:100] or "bot"
        self.path = data_dir / "matrix" / f"{name}.json"

    async def load(self) -> str | None:
        return await asyncio.to_thread(self._load)

    async def save(self, token: str) -> None:
        await asyncio.to_thread(self._save, token)

    def _load(self) -> str | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("matrix: the sync position in %s cannot be read (%s); starting from now",
                        self.path, type(e).__name__)
            return None
        token = data.get("next_batch") if isinstance(data, dict) else None
        return token if isinstance(token, str) and token else None

    def _save(self, token: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"next_batch": token}), encoding="utf-8")
        os.replace(tmp, self.path)
