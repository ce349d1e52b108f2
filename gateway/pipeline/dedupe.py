"""The first step of the pipeline: a message the platform delivers twice starts one run only.

Keyed by provider and the platform's own message id (:attr:`IncomingMessage.message_id`),
persisted, so a redelivery after a restart is caught too. Messages without an id pass.
"""

from __future__ import annotations

import logging

from pluto.types import IncomingMessage
from pluto.storage.inbound import InboundStore
from pluto.storage.sqlite import SqliteStore

log = logging.getLogger(__name__)


class InboundDedupe:
    def __init__(self, store: SqliteStore, *, max_rows: int = 100_000):
        self.seen = InboundStore(store, max_rows=max_rows)

    async def open(self) -> None:
        await self.seen.open()

    async def first_time(self, msg: IncomingMessage) -> bool:
        """True for a message not seen before (and records it); False for a redelivery."""
        if not msg.message_id:
            return True
        if await self.seen.first_time(msg.provider, msg.message_id):
            return True
        log.info("%s: message %s was delivered again; ignored", msg.provider, msg.message_id)
        return False
