"""SQLite, the embedded default: one file under the data dir, every part of the store in it.

``async with SqliteStore(path) as store:`` opens the file, brings every table to its newest
schema and hands out the parts (``store.conversations``, ``store.outbox``, ...), which all share
one connection and one write path (:mod:`.engine`).
"""

from __future__ import annotations

from pathlib import Path

from pluto.storage.sqlite.conversations import SqliteConversations
from pluto.storage.sqlite.engine import SqliteEngine
from pluto.storage.sqlite.inbound import SqliteInbound
from pluto.storage.sqlite.outbox import SqliteOutbox
from pluto.storage.sqlite.pairing import SqlitePairing, approved_sync
from pluto.storage.sqlite.tasks import SqliteTasks

__all__ = ["SqliteStore", "approved_sync"]


class SqliteStore:
    def __init__(self, path: Path):
        self.path = path
        self.engine = SqliteEngine(path)
        self.conversations = SqliteConversations(self.engine)
        self.outbox = SqliteOutbox(self.engine)
        self.inbound = SqliteInbound(self.engine)
        self.tasks = SqliteTasks(self.engine)
        self.pairing = SqlitePairing(self.engine)

    @property
    def is_open(self) -> bool:
        return self.engine.is_open

    async def open(self) -> None:
        await self.engine.open()
        try:
            for part in (self.conversations, self.outbox, self.inbound, self.tasks,
                         self.pairing):
                await part.migrate()
        except BaseException:
            await self.engine.close()
            raise

    async def close(self) -> None:
        await self.engine.close()

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
