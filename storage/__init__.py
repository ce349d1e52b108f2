"""Storage: what the core keeps — sessions and messages, runs and their events, the outbox,
inbound dedupe, the API's tasks, pairing — behind the interfaces in :mod:`.ports`.

SQLite (:mod:`.sqlite`) is the embedded default; PostgreSQL (:mod:`.postgres`) is the engine
for several gateway instances sharing one database. :func:`store_for` picks the engine; no
module outside this package holds a connection or writes SQL.
"""

from __future__ import annotations

import re
from pathlib import Path

from pluto.errors import ConfigError

from pluto.storage.ports import (ConversationStore, InboundStore, OutboxStore, PairingStore,
                                 RunReader, Store, TaskStore)

__all__ = ["ConversationStore", "InboundStore", "OutboxStore", "PairingStore", "RunReader",
           "Store", "TaskStore", "store_for"]


def store_for(data_dir: Path, url: str | None = None) -> Store:
    """The store (not yet open): PostgreSQL when ``url`` is a ``postgresql://`` URL, else
    SQLite in ``<data_dir>/pluto.db``."""
    if url:
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError([("environment", None, "", _not_postgres(url))])
        from pluto.storage.postgres import PostgresStore

        return PostgresStore(url)
    from pluto.storage.sqlite import SqliteStore

    return SqliteStore(data_dir / "pluto.db")


def _not_postgres(url: str) -> str:
    """Why ``url`` is refused, naming its scheme only (the rest may hold a password)."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]{0,30})://", url)
    given = f"a {scheme.group(1)}:// URL" if scheme else "not a URL"
    return (f"the database URL (DATABASE_URL, or the variable storage.url_env names) is "
            f"{given}; Pluto needs postgresql://… there, or no URL at all for SQLite in the "
            "data dir")
