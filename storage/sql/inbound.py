"""The inbox in SQLite: every message a provider hands over, recorded before it is queued.

``(provider, message_id)`` is the key, so a platform that delivers the same message twice
(Telegram after a restart, Slack retries, a Discord resume) finds it there: inbound dedupe.
A message stays *unhandled* until the pipeline has decided what becomes of it (for a message
that starts a run: in the same commit that records the run), so a message taken from a
platform and not yet handled when the process died is handled after the restart, not lost.
The table is bounded: handled rows older than ``max_age`` seconds go, and at most ``max_rows``.

On a database several instances share, arrival times are the database's clock (``now_sql``):
how long a message has waited is judged the same by every instance, whatever its own clock says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pluto.storage.sql import Engine, Migration, Statement, json_text
from pluto.storage.sql.fencing import Claim, fence

if TYPE_CHECKING:
    from pluto.storage.ports import LeaseStore

log = logging.getLogger(__name__)

COMPONENT = "inbound"
MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE inbound_seen (
        provider TEXT NOT NULL,
        message_id TEXT NOT NULL,
        seen_at REAL NOT NULL,
        PRIMARY KEY (provider, message_id)
    );
    CREATE INDEX inbound_seen_at ON inbound_seen(seen_at);
    """,
    """
    ALTER TABLE inbound_seen ADD COLUMN payload TEXT;
    ALTER TABLE inbound_seen ADD COLUMN handled INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX inbound_unhandled ON inbound_seen(provider, seen_at) WHERE handled = 0;
    """,
    # The order of arrival: SQLite's implicit rowid; PostgreSQL names a sequence the same.
    {"sqlite": "SELECT 1", "postgres": "ALTER TABLE inbound_seen ADD COLUMN rowid BIGSERIAL"},
    # Several instances: a chat's messages are taken in arrival order by whichever instance
    # holds the chat, and the one that received a message reads back what became of it.
    """
    ALTER TABLE inbound_seen ADD COLUMN chat_id TEXT;
    ALTER TABLE inbound_seen ADD COLUMN outcome TEXT;
    CREATE INDEX inbound_chat ON inbound_seen(provider, chat_id, handled);
    """,
    # the platform id of the live preview shown in answer to it (a rerun replaces it)
    "ALTER TABLE inbound_seen ADD COLUMN preview TEXT",
]


def _with_preview(payload: str, preview: str | None) -> dict[str, Any]:
    message = json.loads(payload)
    if preview is not None and isinstance(message, dict):
        message["shown"] = preview
    return message


def _unhandled_in_chat(provider: str, chat_id: str, limit: int) -> Statement:
    return ("SELECT payload, preview FROM inbound_seen WHERE provider = ? AND chat_id = ? AND"
            " handled = 0 AND payload IS NOT NULL ORDER BY rowid LIMIT ?",
            (provider, chat_id, limit))


class SqliteInbound:
    def __init__(self, engine: Engine, *, max_rows: int = 100_000,
                 max_age: float = 14 * 86400, prune_every: int = 1000):
        self.engine = engine
        self.max_rows = max_rows
        self.max_age = max_age
        self.prune_every = prune_every
        self._since_prune = 0
        self._pruning: asyncio.Task[int] | None = None  # the prune under way, apart from intake
        # now, as a statement reads it: the database's clock when several instances share it
        # (one clock for them all), this process's otherwise (a parameter: nothing to compute)
        self._now = engine.now_sql if engine.shared else "?"
        # several instances (PostgreSQL): the channel told of each message recorded, in the
        # statement that records it ("new|<provider>|<chat>|<receiver>": its chat's holder wakes up)
        self.notify: str | None = None
        # several instances: the chat claim each message was taken under (its outcome is
        # recorded only while the claim holds: storage/sql/fencing.py)
        self._claims: dict[tuple[str, str], Claim] = {}

    def claim(self, source: tuple[str, str], claim: Claim | None) -> None:
        """The message ``source`` (provider, message id) was taken under ``claim`` (None: it
        is done with)."""
        if claim is None:
            self._claims.pop(source, None)
        else:
            self._claims[source] = claim

    def _at(self, offset: float = 0.0) -> tuple[Any, ...]:
        """The parameters ``self._now`` needs, ``offset`` seconds from now (none on a shared
        database: its statements say ``now_sql - ?`` with the offset alone)."""
        return () if self.engine.shared else (time.time() + offset,)

    async def migrate(self) -> None:
        await self.engine.migrate(COMPONENT, MIGRATIONS)
        await self.prune()

    async def accept(self, provider: str, message_id: str, payload: dict[str, Any]) -> bool:
        insert = ("INSERT INTO inbound_seen (provider, message_id, seen_at, payload, handled,"
                  f" chat_id) VALUES (?,?,{self._now},?,0,?) ON CONFLICT DO NOTHING",
                  (provider, message_id, *self._at(), json_text(payload),
                   str(payload.get("chat_id", ""))))
        if self.notify is not None:  # (one statement: the row and its notification)
            # told only when another instance holds the chat (lease ``chat:<provider>:<chat>``,
            # gateway/pipeline/intake.py): its receiver's worker takes it otherwise
            via = str(payload.get("via") or "")
            insert = (f"WITH ins AS ({insert[0]} RETURNING provider, chat_id), n AS (SELECT"
                      " pg_notify(?, 'new|' || provider || '|' || chat_id || '|' || ?) FROM ins"
                      " WHERE EXISTS (SELECT 1 FROM leases WHERE name = 'chat:' || provider"
                      " || ':' || chat_id AND owner <> ?))"
                      " SELECT 1 FROM ins WHERE 0 * (SELECT count(*) FROM n) = 0",
                      (*insert[1], self.notify, via, via))
        inserted = await self.engine.write(insert)
        if inserted == 0:
            return False
        self._counted()
        return True

    def _counted(self) -> None:
        """One more message recorded: every ``prune_every``, a prune starts beside it — the
        message that happens to be the thousandth is not held up by it (in a burst, it waited
        for the prune behind every commit queued before it: seconds)."""
        self._since_prune += 1
        if self._since_prune >= self.prune_every and (
                self._pruning is None or self._pruning.done()):
            self._since_prune = 0
            self._pruning = asyncio.create_task(self._prune_aside(), name="inbox-prune")

    async def _prune_aside(self) -> int:
        try:
            return await self.prune()
        except Exception as e:  # noqa: BLE001 - the next one prunes what this one left
            log.warning("inbox: could not forget old message ids: %s", e)
            return 0

    async def pruned(self) -> None:
        """Until the prune under way (if any) has ended."""
        if self._pruning is not None:
            await asyncio.shield(self._pruning)

    async def close(self) -> None:
        """A prune under way is given up (the next process prunes)."""
        if self._pruning is not None and not self._pruning.done():
            self._pruning.cancel()
            await asyncio.wait([self._pruning])

    async def first_time(self, provider: str, message_id: str) -> bool:
        return await self.accept(provider, message_id, {})

    async def handled(self, provider: str, message_id: str,
                      outcome: dict[str, Any] | None = None) -> None:
        await self.engine.write(fence((
            "UPDATE inbound_seen SET handled = 1, payload = NULL, outcome = ? WHERE"
            " provider = ? AND message_id = ? AND handled = 0",
            (json.dumps(outcome) if outcome else None, provider, message_id)),
            self._claims.get((provider, message_id)) if self._claims else None))

    async def outcome(self, provider: str, message_id: str) -> dict[str, Any] | None:
        """What became of a message once it is handled (by any instance); None until then."""
        row = await self.engine.fetchone(
            "SELECT handled, outcome FROM inbound_seen WHERE provider = ? AND message_id = ?",
            (provider, message_id))
        if row is None:
            return {"type": "dropped", "reason": "forgotten"}
        if not row[0]:
            return None
        return json.loads(row[1]) if row[1] else {"type": "handled"}

    async def unhandled_in_chat(self, provider: str, chat_id: str,
                                limit: int = 100) -> list[dict[str, Any]]:
        """The chat's messages not yet handled, in arrival order (whoever received them)."""
        rows = await self.engine.fetchall(*_unhandled_in_chat(provider, chat_id, limit))
        return [_with_preview(r[0], r[1]) for r in rows if r[0]]

    async def waiting_in_chat(self, provider: str, chat_id: str, session_id: str | None,
                              limit: int = 100) -> list[dict[str, Any]]:
        """The chat's messages waiting for their turn, in arrival order: those not yet
        handled and those taken up by a run of session ``session_id`` still queued behind
        the session's running one (handled, in no transcript yet)."""
        queued = "" if session_id is None else (
            " UNION ALL SELECT i.payload, i.preview, i.rowid AS arrived FROM runs r JOIN"
            " inbound_seen i ON i.provider = r.source_provider AND i.message_id = r.source_id"
            " WHERE r.status = 'queued' AND r.session_id = ? AND r.source_provider = ? AND"
            " i.chat_id = ? AND i.handled = 1 AND i.payload IS NOT NULL")
        rows = await self.engine.fetchall(
            "SELECT payload, preview FROM (SELECT payload, preview, rowid AS arrived FROM"
            " inbound_seen WHERE provider = ? AND chat_id = ? AND handled = 0 AND payload IS"
            f" NOT NULL{queued}) w ORDER BY arrived LIMIT ?",
            (provider, chat_id, *(() if session_id is None else (session_id, provider,
                                                                   chat_id)), limit))
        return [_with_preview(r[0], r[1]) for r in rows if r[0]]

    async def take_chat(self, leases: LeaseStore, name: str, owner: str, ttl: float,
                        provider: str, chat_id: str, *, takeover: bool = True
                        ) -> tuple[tuple[int, bool] | None, list[dict[str, Any]]]:
        """The chat's lease ``name`` taken (:meth:`LeaseStore.take`) and, once it is, the
        chat's unhandled messages (:meth:`unhandled_in_chat`) — one statement on PostgreSQL."""
        took, rows = await leases.take_reading(
            name, owner, ttl, _unhandled_in_chat(provider, chat_id, 100), takeover=takeover)
        return took, [_with_preview(r[0], r[1]) for r in rows if r[0]]

    async def accept_taking(self, leases: LeaseStore, name: str, owner: str, ttl: float,
                            provider: str, message_id: str, payload: dict[str, Any], *,
                            takeover: bool = True
                            ) -> tuple[bool, tuple[int, bool] | None,
                                       list[dict[str, Any]]] | None:
        """:meth:`accept` and :meth:`take_chat` of its chat in one statement (PostgreSQL,
        several instances: its notification too); None elsewhere. A message seen before takes
        nothing (as :meth:`accept` alone). The chat's messages read are those before it (the
        read does not see the row the statement records)."""
        if self.notify is None:
            return None
        chat_id = str(payload.get("chat_id", ""))
        parts: list[tuple[str, Statement]] = [
            ("ins", ("INSERT INTO inbound_seen (provider, message_id, seen_at, payload, handled,"
                     f" chat_id) VALUES (?,?,{self._now},?,0,?) ON CONFLICT DO NOTHING"
                     " RETURNING provider, chat_id",
                     (provider, message_id, *self._at(), json_text(payload), chat_id)))]
        # (the chat's holder is told only when it is another: taken here, nobody needs it)
        after: list[tuple[str, Statement]] = [
            ("n", ("SELECT pg_notify(?, 'new|' || provider || '|' || chat_id || '|' || ?)"
                   " FROM ins WHERE NOT EXISTS (SELECT 1 FROM l)",
                   (self.notify, str(payload.get("via") or ""))))]
        done = await leases.take_along(
            name, owner, ttl, parts, "(SELECT count(*) FROM ins) + 0 * (SELECT count(*) FROM n)",
            _unhandled_in_chat(provider, chat_id, 100), only_if="ins", takeover=takeover,
            after=after)
        if done is None:
            return None
        inserted, took, rows = done
        if inserted:
            self._counted()
        return bool(inserted), took, [_with_preview(r[0], r[1]) for r in rows if r[0]]

    async def keep_preview(self, provider: str, message_id: str, platform_id: str) -> None:
        """The live preview shown in answer to the message (a rerun after a crash edits it)."""
        await self.engine.write((
            "UPDATE inbound_seen SET preview = ? WHERE provider = ? AND message_id = ?",
            (platform_id, provider, message_id)))

    async def waiting_chats(self, provider: str, older_than: float) -> list[str]:
        """Chats with a message that has waited longer than ``older_than`` seconds."""
        rows = await self.engine.fetchall(
            "SELECT DISTINCT chat_id FROM inbound_seen WHERE provider = ? AND handled = 0"
            f" AND seen_at < {self._now} - ?", (provider, *self._at(), older_than))
        return [r[0] for r in rows if r[0] is not None]

    async def unhandled(self, provider: str, *, older_than: float = 0.0
                        ) -> list[dict[str, Any]]:
        """The provider's messages not yet handled, in arrival order (``older_than``: only
        those received at least that many seconds ago)."""
        rows = await self.engine.fetchall(
            "SELECT payload, preview FROM inbound_seen WHERE provider = ? AND handled = 0"
            f" AND seen_at <= {self._now} - ? ORDER BY rowid", (provider, *self._at(),
                                                                  older_than))
        return [_with_preview(r[0], r[1]) for r in rows if r[0]]

    async def prune(self) -> int:
        """Forget old ids: those past ``max_age``, then all but the newest ``max_rows``."""
        self._since_prune = 0

        def prune(conn) -> int:
            old = conn.execute(f"DELETE FROM inbound_seen WHERE seen_at < {self._now} - ?",
                               (*self._at(), self.max_age)).rowcount  # handled or not
            extra = conn.execute(
                "DELETE FROM inbound_seen WHERE seen_at < (SELECT seen_at FROM inbound_seen"
                " ORDER BY seen_at DESC LIMIT 1 OFFSET ?)", (self.max_rows - 1,)).rowcount
            return old + extra

        return await self.engine.transact(prune)

    async def count(self) -> int:
        row = await self.engine.fetchone("SELECT COUNT(*) FROM inbound_seen")
        return int(row[0]) if row else 0
