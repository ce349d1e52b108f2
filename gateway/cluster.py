"""Several gateway instances on one database: who holds what.

With SQLite one process serves the database and :class:`Cluster` is a formality: every lease
is this process's at once and nothing touches the database. On a shared database (PostgreSQL)
each instance holds

- ``instance:<id>`` while it lives (its heartbeat renews it, every ``ttl / 3`` seconds);
- ``chat:<provider>:<chat>`` while it takes that chat's messages, in arrival order, from the
  shared inbox (:mod:`.pipeline.intake`);
- ``session:<key>`` while it runs that session's messages (:mod:`.pipeline.lanes`);
- ``provider:<name>`` while it holds a connection only one process may hold (a Telegram long
  poll, a Discord gateway session, a Slack socket): :meth:`Cluster.exclusive`.

Leases are renewed together by the heartbeat; one that cannot be renewed (the database says
another instance took it: its token moved on) is lost, and whatever held it is cancelled —
an instance paused past its lease stops acting as the holder. When an instance dies its leases
run out after ``ttl`` seconds and the others take its chats, sessions and connections over.

Tokens only grow (a database sequence), so a write fenced with a token (storage checks it in
the same statement) is refused once anyone took the lease since. Expiry is judged on the
database's clock from the holder's heartbeat, and an outage every instance saw hands no live
work around: an instance whose heartbeat could not reach the database takes nothing from
another holder for a lease's length once it is back (:meth:`Cluster.settling`) — time for the
holders, back as well, to renew what they hold. See docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from pluto.storage.ports import InboundStore, LeaseStore

log = logging.getLogger(__name__)

LEASE_SECONDS = 10.0
FENCE_MARGIN = 0.25  # of a lease: acting stops this long before a lease can run out


def _always() -> bool:
    return True


def new_instance_id() -> str:
    """``<PLUTO_INSTANCE_ID or host-pid>.<random>``: readable in logs, and unique to this
    process even when a restarted one is given the same name (what the last process left is
    then another instance's, taken over like any dead instance's)."""
    given = os.environ.get("PLUTO_INSTANCE_ID", "").strip()[:48]
    prefix = given or f"{socket.gethostname()[:24]}-{os.getpid()}"
    return f"{prefix}.{uuid.uuid4().hex[:6]}"


class Cluster:
    def __init__(self, leases: LeaseStore | None, instance_id: str, *,
                 ttl: float = LEASE_SECONDS, poll: float = 0.25):
        self.leases = leases  # None: one process (SQLite), nothing to coordinate
        self.id = instance_id
        self.ttl = ttl
        self.poll = poll
        self._held: dict[str, int] = {}  # lease name → token
        self._holders: dict[str, asyncio.Task[Any]] = {}  # tasks cancelled when one is lost
        self._heartbeat: asyncio.Task[None] | None = None
        # when the last renewal that succeeded was asked for (this process's monotonic clock):
        # every lease held is good until then + ttl on the database, so this instance acts
        # only until then + ttl - margin (a pause or an outage silences it before anyone else
        # may take over)
        self._renewed_at: float | None = None
        # after this instance could not reach the database: it takes over nothing until then
        # (monotonic), so the holders, who saw the same outage, renew first
        self._settle_until = 0.0
        self._cut_off = False
        # called when this instance was taken for dead and joins again (before it acts
        # again): what it claimed meanwhile may be another's now (the outbox's replies)
        self.on_rejoin: list[Callable[[], None]] = []

    @property
    def enabled(self) -> bool:
        return self.leases is not None

    def held(self) -> list[str]:
        return sorted(self._held)

    @property
    def margin(self) -> float:
        return self.ttl * FENCE_MARGIN

    def fresh(self) -> bool:
        """Whether this instance may act now: its leases were renewed recently enough that
        nobody else can have taken any of them over (always, with one process)."""
        if self.leases is None:
            return True
        return self._renewed_at is not None and \
            time.monotonic() < self._renewed_at + self.ttl - self.margin

    def fence(self, name: str) -> Callable[[], bool]:
        """A check for the side effects of work done under lease ``name`` as held now: true
        while this instance is :meth:`fresh` and still holds it with the same token (never
        again once it was lost, even if taken back). Not holding it now: freshness alone."""
        if self.leases is None:
            return _always
        token = self._held.get(name)
        if token is None:
            return self.fresh
        return lambda: self._held.get(name) == token and self.fresh()

    async def start(self) -> None:
        if self.leases is None:
            return
        asked = time.monotonic()
        if await self.acquire(f"instance:{self.id}") is None:
            raise RuntimeError(f"another live instance uses the id {self.id!r}")
        self._renewed_at = asked
        self._heartbeat = asyncio.create_task(self._beat(), name="cluster:heartbeat")
        log.info("cluster: instance %s joined (leases of %gs)", self.id, self.ttl)

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self.leases is not None:
            for name in list(self._held):
                await self.release(name)

    async def alive(self) -> set[str]:
        """The ids of the instances whose heartbeat is current."""
        if self.leases is None:
            return {self.id}
        return {lease.name.removeprefix("instance:")
                for lease in await self.leases.held("instance:")}

    # leases -------------------------------------------------------------------------------

    def settling(self) -> bool:
        """Whether this instance is cut off from the database (its last renewal failed) or
        back from it too recently to take anything over (a lease that ran out meanwhile may
        be a live holder's)."""
        return self._cut_off or time.monotonic() < self._settle_until

    async def acquire(self, name: str) -> int | None:
        """Take ``name`` if it is free (or ours); its token, or None when another holds it (or
        held it when it ran out, while this instance is :meth:`settling`)."""
        took = await self.take(name)
        return took[0] if took is not None else None

    async def take(self, name: str) -> tuple[int, bool] | None:
        """:meth:`acquire`, and whether ``name`` was taken from another instance (that stopped
        renewing it) rather than found free or ours: (token, taken), or None."""
        if self.leases is None:
            self._held[name] = 1
            return 1, False
        kwargs = {"takeover": False} if self.settling() else {}
        take = getattr(self.leases, "take", None)
        if take is not None:
            took = await take(name, self.id, self.ttl, **kwargs)
        else:  # (a store that tells no more than the token: a first token was free)
            token = await self.leases.acquire(name, self.id, self.ttl, **kwargs)
            took = None if token is None else (token, token > 1)
        if took is not None:
            self._held[name] = took[0]
        return took

    async def take_chat(self, name: str, inbox: InboundStore, provider: str, chat_id: str
                        ) -> tuple[tuple[int, bool] | None, list[dict[str, Any]] | None]:
        """:meth:`take` for a chat's lease, and the chat's unhandled messages read in the same
        statement (None: not read — the lease was not taken, or there is no database)."""
        if self.leases is None:
            return await self.take(name), None
        kwargs = {"takeover": False} if self.settling() else {}
        took, found = await inbox.take_chat(self.leases, name, self.id, self.ttl, provider,
                                            chat_id, **kwargs)
        if took is None:
            return None, None
        self._held[name] = took[0]
        return took, found

    async def accept_taking(self, name: str, inbox: InboundStore, provider: str,
                            message_id: str, payload: dict[str, Any]
                            ) -> tuple[bool, tuple[int, bool] | None,
                                       list[dict[str, Any]]] | None:
        """A message recorded in the inbox and its chat's lease ``name`` taken, in one
        statement (:meth:`InboundStore.accept_taking`); None where they are made apart."""
        if self.leases is None:
            return None
        kwargs = {"takeover": False} if self.settling() else {}
        done = await inbox.accept_taking(self.leases, name, self.id, self.ttl, provider,
                                         message_id, payload, **kwargs)
        if done is not None and done[1] is not None:
            self._held[name] = done[1][0]
        return done

    async def wait_for(self, name: str, *, cancelled: Callable[[], bool] = lambda: False) -> int:
        """Take ``name``, waiting while another instance holds it."""
        delay = self.poll / 5
        while True:
            token = await self.acquire(name)
            if token is not None:
                return token
            if cancelled():
                raise asyncio.CancelledError
            await asyncio.sleep(delay)
            delay = min(self.poll, delay * 2)

    async def release(self, name: str) -> None:
        token = self._held.pop(name, None)
        self._holders.pop(name, None)
        if token is not None and self.leases is not None:
            try:
                await self.leases.release(name, self.id, token)
            except Exception as e:  # noqa: BLE001 - it runs out on its own
                log.warning("cluster: could not release %s (%s); it runs out in %gs", name,
                            e, self.ttl)

    def holds(self, name: str) -> bool:
        """Whether this instance still holds ``name`` (as far as its last renewal knows)."""
        return name in self._held

    async def confirm(self, name: str) -> bool:
        """Whether this instance holds ``name`` on the record: renewed now, not at the next
        beat — for a holder whose fenced write was just refused (the lease may have moved on
        since the last renewal: going on as holder until the beat tells would start the
        chat's work again and again, each try refused). A lease found lost is let go here
        as the beat lets it go. Storage errors go to the caller."""
        token = self._held.get(name)
        if token is None or self.leases is None:
            return token is not None
        if name not in await self.leases.renew_all(self.id, {name: token}, self.ttl):
            return True
        self._lost(name, token)
        return False

    def _lost(self, name: str, token: int) -> None:
        """``name``, held with ``token``, was found lost: let go (its exclusive work stops) —
        unless it was released or taken again meanwhile."""
        if self._held.get(name) != token:
            return
        log.warning("cluster: lease %s was lost", name)
        del self._held[name]
        holder = self._holders.pop(name, None)
        if holder is not None and not holder.done():
            holder.cancel()

    @contextlib.asynccontextmanager
    async def holding(self, name: str) -> AsyncIterator[int]:
        """Hold ``name`` (waiting for it) for the body. Losing it does not stop the body: what
        the body commits is fenced in the database (a run taken over by another instance
        cannot record its answer), so work in flight ends without effect instead of being
        cut off halfway."""
        token = await self.wait_for(name)
        try:
            yield token
        finally:
            await asyncio.shield(self.release(name))

    async def exclusive(self, name: str,
                        work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work`` only while holding ``name``: wait for the lease, run, and when the
        lease is lost stop the work and wait for the lease again. Returns when ``work``
        returns."""
        if self.leases is None:
            await work()
            return
        waiting_logged = False
        while True:
            token = await self.acquire(name)
            if token is None:
                if not waiting_logged:
                    holder = await self.leases.holder(name)
                    log.info("cluster: %s is held by %s; standing by", name,
                             holder.owner if holder else "another instance")
                    waiting_logged = True
                await asyncio.sleep(min(2.0, self.ttl / 4))
                continue
            waiting_logged = False
            log.info("cluster: holding %s (token %d)", name, token)
            runner = asyncio.create_task(work(), name=f"exclusive:{name}")
            self._holders[name] = runner
            try:
                await runner
                return
            except asyncio.CancelledError:
                if name in self._held:  # we were cancelled, not the lease lost
                    raise
                log.warning("cluster: lost %s; standing by", name)
            finally:
                if not runner.done():
                    runner.cancel()
                    with contextlib.suppress(BaseException):
                        await runner
                await asyncio.shield(self.release(name))

    async def _beat(self) -> None:
        assert self.leases is not None
        while True:
            await asyncio.sleep(self.ttl / 3)
            tokens = dict(self._held)
            asked = time.monotonic()
            try:
                lost = await self.leases.renew_all(self.id, tokens, self.ttl)
            except Exception as e:  # noqa: BLE001 - the database is away: try again soon
                log.warning("cluster: could not renew leases (%s)%s", e,
                            "" if self.fresh() else "; silent until they are")
                self._cut_off = True
                continue
            if self._cut_off:  # back: what ran out meanwhile may be live holders' (shared)
                self._cut_off = False
                self._settle_until = time.monotonic() + self.ttl
                log.info("cluster: the database answers again; taking nothing over for %gs",
                         self.ttl)
            for name in lost:
                self._lost(name, tokens[name])
            await self._renewed(asked, lost)

    async def _renewed(self, asked: float, lost: set[str]) -> None:
        """After a renewal: fresh again, unless this instance's own lease was lost (the others
        took it for dead and its work over): then it joins again as a newcomer."""
        me = f"instance:{self.id}"
        if me not in lost:
            self._renewed_at = asked
            return
        asked = time.monotonic()
        try:
            joined = await self.acquire(me) is not None
        except Exception as e:  # noqa: BLE001 - the next beat tries again
            log.warning("cluster: could not join again (%s)", e)
            return
        if joined:
            log.warning("cluster: this instance was taken for dead; it joined again")
            for forget in self.on_rejoin:
                forget()
            self._renewed_at = asked
