"""Storage: what the core keeps — sessions and messages, runs and their events, the outbox,
inbound dedupe, the API's tasks, pairing — behind the interfaces in :mod:`.ports`.

SQLite (:mod:`.sqlite`) is the embedded default. :func:`open_store` picks the engine; no
module outside this package holds a connection or writes SQL.
"""

from __future__ import annotations

from pathlib import Path

from pluto.storage.ports import (ConversationStore, InboundStore, OutboxStore, PairingStore,
                                 RunReader, Store, TaskStore)

__all__ = ["ConversationStore", "InboundStore", "OutboxStore", "PairingStore", "RunReader",
           "Store", "TaskStore", "store_for"]


def store_for(data_dir: Path) -> Store:
    """The store of a data dir (not yet open): ``<data_dir>/pluto.db``."""
    from pluto.storage.sqlite import SqliteStore

    return SqliteStore(data_dir / "pluto.db")
