"""Intake: a provider hands a message over and returns at once.

Each provider has its own :class:`IntakeQueue`. A message is first recorded in the inbox
(storage): a redelivery of a message seen before stops there (dedupe), and a message taken from
the platform is never lost — if the process dies before it was handled, it is handled after the
restart (:meth:`IntakeQueue.replay`). Then it waits in its chat's queue (so a chat's
messages are handled in the order they arrived) and one worker task per busy chat hands them to
the pipeline (dedupe, access, routing, commands, the session lanes). Chats are independent: a
slow command or a flood-controlled reply in one chat never holds up another, and nothing a
provider does waits on the pipeline, a model or a platform's retry-after.

The queue is bounded per provider (``capacity`` messages not yet handled): when it is full,
:meth:`IntakeQueue.submit` waits for room (back-pressure: long polling simply polls later) and
:meth:`IntakeQueue.offer` says no at once (a webhook answers 503 and the platform redelivers).
Nothing is dropped silently. The :class:`Ticket` a provider gets back resolves to the typed
:data:`~pluto.types.Outcome` once the pipeline has decided.

**Several instances** (a shared database, :class:`Shared`): a chat's messages may reach any
instance (webhooks behind a load balancer), and the inbox is the chat's queue. The instance
that holds the chat's lease takes its unhandled messages in arrival order — whoever received
them — and waits for each run to end before it takes the next, so a chat is answered in order
and never by two runs at once. It first takes over any run of the chat that a dead instance
left (its message goes back to the inbox, ahead of the later ones). An instance that received a
message while another holds the chat only waits to learn, from the inbox, what became of it.
A sweep finds chats whose messages wait with nobody holding them (their instance died).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from pluto.errors import RunTakenOver, StorageError
from pluto.storage.ports import InboundStore
from pluto.types import (Accepted, Attachment, Dropped, Duplicate, IncomingMessage, Outcome,
                         outcome_from_dict, outcome_to_dict)

log = logging.getLogger(__name__)

Handler = Callable[[IncomingMessage], Awaitable[Outcome]]


def message_to_dict(msg: IncomingMessage) -> dict[str, Any]:
    d = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    d["attachments"] = [{**{f.name: getattr(a, f.name) for f in dataclasses.fields(a)},
                         "path": str(a.path) if a.path else None} for a in msg.attachments]
    return d


def message_from_dict(d: dict[str, Any]) -> IncomingMessage:
    names = {f.name for f in dataclasses.fields(IncomingMessage)}
    attachments = tuple(Attachment(**{**a, "path": Path(a["path"]) if a.get("path") else None})
                        for a in d.get("attachments") or ())
    return IncomingMessage(**{k: v for k, v in d.items() if k in names and k != "attachments"},
                           attachments=attachments)


class Ticket:
    """A message handed over; :meth:`outcome` waits for the pipeline's decision."""

    __slots__ = ("message", "_future", "asked", "recorded")

    def __init__(self, message: IncomingMessage):
        self.message = message
        self._future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        # when its recording in the inbox was asked for and when it was done, on the intake's
        # own count (one recorded before another was asked for comes first in the inbox)
        self.asked = self.recorded = 0

    async def outcome(self) -> Outcome:
        return await asyncio.shield(self._future)

    def done(self) -> bool:
        return self._future.done()

    def when_decided(self, callback: Callable[[Outcome], None]) -> None:
        """Call ``callback`` with the outcome once decided (a callback, not a task)."""
        self._future.add_done_callback(
            lambda fut: None if fut.cancelled() else callback(fut.result()))

    def settle(self, outcome: Outcome) -> None:
        if not self._future.done():
            self._future.set_result(outcome)


@dataclasses.dataclass(frozen=True, slots=True)
class Shared:
    """What intake needs when several instances share the database (see the module)."""

    cluster: Any  # pluto.gateway.cluster.Cluster
    take_over: Callable[[str, str], Awaitable[Any]]  # (provider, chat): a dead one's runs
    finished: Callable[[str], Awaitable[None]]  # a run accepted here has ended
    urgent: Callable[[IncomingMessage], bool] = lambda msg: False  # /stop: not behind a run
    # (provider, message id) taken under (chat lease, token), or None once done with: the
    # writes of the run answering it are fenced by that token (storage/sql/fencing.py)
    claimed: Callable[[tuple[str, str], tuple[str, int] | None], None] = \
        lambda source, claim: None
    # a note to the other instances (LISTEN/NOTIFY; see IntakeQueue.note): None, no bus
    publish: Callable[[str], Awaitable[None]] | None = None
    # whether notes are heard now (the bus's listening connection is up): while they are
    # not, a missing note tells nothing and a chat's inbox is read, not taken from memory
    hearing: Callable[[], bool] = lambda: True
    # wait (at most so long) until this instance sent what it holds for (provider, chat),
    # whether it did: the chat is let go only then (waited for again while it is still
    # held), so the next answer, from anywhere, comes after
    delivered: Callable[[str, str, float], Awaitable[Any]] | None = None
    fallback: float = 5.0  # seconds: a wait for a note looks again by itself after this
    # seconds a chat is kept after its last message was answered, in case the next follows
    # (answered under the same hold: no release, no take again — two statements fewer)
    linger: float = 0.25
    # a run that storage cut short is handed back (its message in the inbox again) before
    # the chat's next message is taken: awaited after each run
    handed_back: Callable[[str], Awaitable[bool]] | None = None
    # (provider, chat): the same for every such run of the chat, as the chat is taken — a
    # worker that lost the chat to the outage that cut its run short takes it again afresh;
    # whether any was handed back
    stranded_in: Callable[[str, str], Awaitable[bool]] | None = None
    sweep_every: float = 2.0  # (seconds between an intake's own looks: with no ``sweep``)
    # one look for every provider's intake at once (None: each intake looks by itself)
    sweep: ChatSweep | None = None


class ChatSweep:
    """Several instances: now and then, one query for every provider's chats that need taking
    up — ``look`` finds them: messages that have waited a while with nobody holding them (the
    instance that received them died), runs whose instance died — each handed to its
    provider's intake (an idle instance costs one statement per look, not one per provider
    and kind)."""

    def __init__(self, look: Callable[[], Awaitable[Iterable[tuple[str, str]]]], every: float):
        self.look = look
        self.every = every
        self.intakes: dict[str, IntakeQueue] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, intake: IntakeQueue) -> None:
        self.intakes[intake.name] = intake
        self.start()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="intake:sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                found = await self.look()
            except Exception as e:  # noqa: BLE001 - the database is away: next time
                log.warning("intake: the sweep failed: %s", e)
                continue
            for provider, key in found:
                if (intake := self.intakes.get(provider)) is not None:
                    intake.kick(key)


class IntakeQueue:
    def __init__(self, name: str, handler: Handler, inbox: InboundStore, *,
                 capacity: int = 1000, shared: Shared | None = None):
        self.name = name
        self.handler = handler
        self.inbox = inbox
        self.capacity = capacity
        self._free = capacity
        self._room = asyncio.Event()  # set when a message leaves a full queue
        self._chats: dict[str, deque[Ticket]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self._replayed = False
        self.shared = shared
        self._sweeper: asyncio.Task[None] | None = None
        # several instances: tickets of messages being recorded in the inbox, not yet in their
        # chat's queue — the chat's holder may take the message from the inbox meanwhile
        self._arriving: dict[str, Ticket] = {}
        self._wake: dict[str, asyncio.Event] = {}  # chats whose worker waits for a note
        # busy chats with a message recorded by another instance since this one last read
        # them (its note "new"), and every chat read before notes were last missed: read them
        # again before letting go (else the release's note tells that message's receiver to
        # take it). Notes missed (the listener was away) count up ``_missed``; each busy
        # chat's last read is stamped with its count then (``_looked``): one chat's read
        # says nothing of the others'.
        self._news: set[str] = set()
        self._missed = 0
        self._looked: dict[str, int] = {}
        self._notes: set[asyncio.Task[None]] = set()  # notes being sent
        self._ticks = 0  # the count tickets' recordings are ordered by (Ticket.asked)

    @property
    def free(self) -> int:
        """Room left: messages it may still take before a submitter waits (``capacity`` when
        every message taken was handled)."""
        return self._free

    @property
    def waiting(self) -> int:
        """Messages handed over and not yet handled."""
        return sum(len(q) for q in self._chats.values())

    async def submit(self, msg: IncomingMessage) -> Ticket:
        if self._closed:
            return self._refused(msg)
        while self._free <= 0:
            self._room.clear()
            await self._room.wait()
            if self._closed:
                return self._refused(msg)
        return await self._take(msg)

    async def offer(self, msg: IncomingMessage) -> Ticket | None:
        if self._closed:
            return self._refused(msg)
        if self._free <= 0:
            log.warning("%s: intake is full (%d waiting); asking the platform to retry",
                        self.name, self.capacity)
            return None
        return await self._take(msg)

    async def _take(self, msg: IncomingMessage) -> Ticket:
        self._free -= 1
        ticket = Ticket(msg)
        # (a redelivery while the first copy is on its way never takes the first one's place)
        mid = msg.message_id or ""
        arriving = (self.shared is not None and bool(mid)
                    and self._arriving.setdefault(mid, ticket) is ticket)
        payload = message_to_dict(msg)
        if self.shared is not None:  # who received it: told what became of it (note "done")
            payload["via"] = self.shared.cluster.id
        taking = self._taking(msg) if mid else None
        ticket.asked = self._tick()
        try:
            if taking is not None:
                fresh = await self._accept_taking(msg, mid, payload, taking)
            else:
                fresh = not mid or await self.inbox.accept(msg.provider, mid, payload)
        except BaseException:
            if taking is not None:
                _tell(taking, None)  # (its worker takes the chat itself)
            self._unsure(msg.chat_id)
            self._release()
            raise
        finally:
            ticket.recorded = self._tick()
            if arriving and self._arriving.get(mid) is ticket:
                del self._arriving[mid]
        if not fresh:
            self._unsure(msg.chat_id)
            self._release()
            log.info("%s: message %s was delivered again; ignored", msg.provider,
                     msg.message_id)
            ticket.settle(Duplicate())
            return ticket
        if ticket.done():  # the chat's holder took it from the inbox and decided already
            self._release()
            return ticket
        return self._enqueue(msg, ticket)

    def _tick(self) -> int:
        self._ticks += 1
        return self._ticks

    def _unsure(self, key: str) -> None:
        """A recording of a message of chat ``key`` failed, or found the message there
        already (a redelivery — or the engine's retry of a recording that had committed):
        the chat's inbox may hold a message of ours that is not in its queue — it is read,
        not taken from memory, next time (:meth:`_only_ours`)."""
        if self.shared is not None:
            self._news.add(key)

    def _taking(self, msg: IncomingMessage) -> asyncio.Future[Any] | None:
        """Several instances, no worker here for the message's chat: one is started now,
        waiting for the statement that records the message to take the chat as well (one
        statement for both: :meth:`_accept_taking`); what it is told, or None (no worker
        started: the chat has one)."""
        key = msg.chat_id
        if self.shared is None or self._closed or key in self._workers or \
                msg.provider != self.name:
            return None
        taking: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue = self._chats.setdefault(key, deque())
        self._workers[key] = asyncio.create_task(self._work_shared(key, queue, taking),
                                                 name=f"intake:{self.name}:{key}")
        return taking

    async def _accept_taking(self, msg: IncomingMessage, mid: str, payload: dict[str, Any],
                             taking: asyncio.Future[Any]) -> bool:
        """Record the message and take its chat in one statement; its chat's worker is told
        how that went (``taking``): None, take the chat yourself; (None, None), another
        instance holds it; else (the take, the chat's waiting messages, this one last)."""
        assert self.shared is not None
        self._heard_of(msg.chat_id)  # (taking the chat reads its inbox)
        queued = set(self._chats.get(msg.chat_id, ()))  # (as the statement reads the inbox)
        done = await self.shared.cluster.accept_taking(f"chat:{self.name}:{msg.chat_id}",
                                                       self.inbox, self.name, mid, payload)
        if done is None:  # (the engine makes them apart)
            _tell(taking, None)
            return await self.inbox.accept(msg.provider, mid, payload)
        fresh, took, waiting = done
        if took is not None and fresh:  # (the read did not see it: as a read would give it)
            waiting = [*waiting, json.loads(json.dumps(payload))]
        # (a worker cancelled meanwhile: the gateway is stopping; the lease goes with it)
        _tell(taking, (took, waiting if took is not None else None, queued))
        return bool(fresh)

    async def replay(self) -> int:
        """Queue the messages a previous process received and never handled (before any new
        message of this provider); returns how many."""
        if self._replayed:  # once per process: later ones are in the queue already
            return 0
        self._replayed = True
        if self.shared is not None:  # the chats' holders take them, in order; we help
            chats = await self.inbox.waiting_chats(self.name, 0.0)
            for key in chats:
                self.kick(key)
            self.start_sweeping()
            return len(chats)
        found = await self.inbox.unhandled(self.name)
        for payload in found:
            try:
                msg = message_from_dict(payload)
            except (TypeError, ValueError, KeyError) as e:
                log.error("%s: a message saved before a restart is unreadable (%s); skipped",
                          self.name, e)
                continue
            self._free -= 1  # may go below zero: these were taken before, they must not wait
            self._enqueue(msg)
        if found:
            log.warning("%s: %d message(s) received before the last shutdown were not handled; "
                        "handling them now", self.name, len(found))
        return len(found)

    def requeue(self, payloads: list[dict[str, Any]], busy: Collection[str]) -> int:
        """One process per database (the recovery sweep): messages the inbox holds unhandled
        that are neither waiting here nor in ``busy`` (message ids of runs going on) — their
        handling met a storage error — queued again; returns how many."""
        if self.shared is not None or self._closed or not self._replayed:
            return 0  # (before the replay at start: it queues them)
        here = {t.message.message_id for q in self._chats.values() for t in q}
        queued = 0
        for payload in payloads:
            try:
                msg = message_from_dict(payload)
            except (TypeError, ValueError, KeyError):
                continue  # (replay at the next start says so)
            if msg.message_id in here or msg.message_id in busy:
                continue
            self._free -= 1  # (taken before: they must not wait for room)
            self._enqueue(msg)
            queued += 1
        return queued

    @staticmethod
    def _refused(msg: IncomingMessage) -> Ticket:
        ticket = Ticket(msg)
        ticket.settle(Dropped("the gateway is stopping"))
        return ticket

    def _enqueue(self, msg: IncomingMessage, ticket: Ticket | None = None) -> Ticket:
        ticket = ticket or Ticket(msg)
        key = msg.chat_id
        queue = self._chats.get(key)
        if queue is None:
            queue = self._chats[key] = deque()
        queue.append(ticket)
        if (event := self._wake.get(key)) is not None:  # (its worker waits: a /stop, say)
            event.set()
        if key not in self._workers:
            work = self._work if self.shared is None else self._work_shared
            self._workers[key] = asyncio.create_task(work(key, queue),
                                                     name=f"intake:{self.name}:{key}")
        return ticket

    async def _work(self, key: str, queue: deque[Ticket]) -> None:
        try:
            while queue:
                ticket = queue[0]
                try:
                    ticket.settle(await self.handler(ticket.message))
                except asyncio.CancelledError:
                    ticket.settle(Dropped("the gateway is stopping"))
                    raise
                except Exception:
                    log.exception("%s: handling a message of chat %s failed", self.name, key)
                    ticket.settle(Dropped("an internal error"))
                finally:
                    queue.popleft()
                    self._release()
        finally:
            if self._chats.get(key) is queue:
                del self._chats[key]
            self._workers.pop(key, None)
            for ticket in queue:  # cancelled while messages waited: say what became of them
                ticket.settle(Dropped("the gateway is stopping"))
                self._release()
            queue.clear()

    # several instances ------------------------------------------------------------------------

    async def _work_shared(self, key: str, queue: deque[Ticket],
                           taking: asyncio.Future[Any] | None = None) -> None:
        """A chat's worker; ``taking``: the chat is taken by the statement that records its
        message, which tells how it went (:meth:`_accept_taking`)."""
        assert self.shared is not None
        lease = f"chat:{self.name}:{key}"
        try:
            given = await taking if taking is not None else None
            while True:
                turn, given = given, None
                try:
                    if await self._hold_chat(key, queue, lease, turn):
                        return
                except StorageError as e:  # the database is away: the messages wait in it
                    log.warning("%s: chat %s waits for storage (%s)", self.name, key, e)
                    await self._noted(key)  # (the listener, back, wakes every chat)
        finally:
            if self._chats.get(key) is queue:
                del self._chats[key]
            self._workers.pop(key, None)
            self._wake.pop(key, None)
            self._news.discard(key)  # (the chat's next worker reads it as it takes it)
            self._looked.pop(key, None)
            for ticket in queue:
                ticket.settle(Dropped("the gateway is stopping"))
                self._release()
            queue.clear()

    async def _take_chat(self, key: str, queue: deque[Ticket], lease: str
                         ) -> tuple[Any, Any, set[Ticket]]:
        """Take the chat (one statement: its lease, then its waiting messages): (the take,
        the read, the tickets queued as the inbox was read). One of those not in the read was
        handled elsewhere — but one queued while the read is under way may not be in it, and
        is ours (counted, it was skipped: the next ones, taken from memory, went before it)."""
        assert self.shared is not None
        queued = set(queue)
        self._heard_of(key)  # (taking the chat reads its inbox)
        took, first = await self.shared.cluster.take_chat(lease, self.inbox, self.name, key)
        return took, first, queued

    async def _hold_chat(self, key: str, queue: deque[Ticket], lease: str,
                         given: tuple[Any, Any, set[Ticket]] | None = None) -> bool:
        """One turn of a chat's worker: hold the chat and answer its waiting messages, or
        learn what became of ours; whether the worker is done. ``given``: the chat was taken
        (or found held) already, by the statement that recorded a message: (take, read, the
        tickets queued as it was sent)."""
        assert self.shared is not None
        cluster = self.shared.cluster
        took, first, queued = given or await self._take_chat(key, queue, lease)
        if took is None:  # another instance holds the chat
            if not queue:
                return True  # nothing of ours waits: the holder takes the rest
            # its holder says what became of ours ("done"), or lets go ("free")
            if not await self._noted(key):
                await self._learn_outcomes(queue)  # (no note: look)
            return False
        before = set(queue)  # (only these may have been handled by the chat's last holder)
        seen = queued & before  # (the tickets queued when the inbox was last read)
        held = False
        try:
            # taken: from an instance that stopped renewing it (not found free)
            taken = took[1]
            while True:
                found = await self._drain_chat(key, queue, lease, took[0], taken=taken,
                                               first=first, seen=seen)
                taken, first = False, None
                await self._answers_out(key, lease, queue)
                # a message received meanwhile: answered under the same hold (no release and
                # take again) — or one that follows soon (a conversation's next turn, a burst)
                if not found or self._closed or not cluster.holds(lease):
                    break  # (found none: ours still queued were handled elsewhere, learnt below)
                if not self._more_since(key, queue) and (
                        self.shared.linger <= 0
                        or not await self._noted(key, timeout=self.shared.linger)
                        or self._closed or not cluster.holds(lease)
                        or not self._more_since(key, queue)):
                    break
                first = self._only_ours(key, queue, seen)  # (None: read)
            if not self._closed:  # (however the turn ended: at once when they are out)
                await self._answers_out(key, lease)
            held = cluster.holds(lease)
        finally:
            await asyncio.shield(cluster.release(lease))
        # ours that another instance handled before we held the chat (or after, were it lost);
        # one that came while we held it was handled by nobody: taken in the next turn
        if learn := [t for t in queue if not held or t in before]:
            await self._learn_outcomes(queue, learn)
        if self._closed:
            if await self.inbox.unhandled_in_chat(self.name, key, 1):
                self._note(f"orphan|{self.name}|{key}")  # stopping: the others take them
            return True
        # (a message recorded elsewhere after our last look: its receiver waits for the
        # chat, woken by the release's note — or, were it to die meanwhile, the sweep)
        return not queue  # (one handed to us meanwhile: ours to take)

    async def _answers_out(self, key: str, lease: str,
                           queue: deque[Ticket] | None = None) -> None:
        """Until this instance's answers to the chat are sent, however long the platform holds
        them (a flood hold past a lease's length): the chat is let go only then — one let go
        with an answer still waiting here was answered next elsewhere, shown above it. Back
        early when stopping or the chat is lost (this instance goes silent then), and, given
        ``queue``, when a message came meanwhile (answered under this hold, behind)."""
        assert self.shared is not None
        cluster = self.shared.cluster
        while self.shared.delivered is not None and not await self.shared.delivered(
                self.name, key, cluster.ttl):
            if self._closed or not cluster.holds(lease) or (
                    queue is not None and self._more_since(key, queue)):
                return

    async def _noted(self, key: str, also: asyncio.Future[Any] | None = None, *,
                     timeout: float | None = None) -> bool:
        """Wait for a note about chat ``key`` (or ``also`` to finish), at most ``timeout``
        (``shared.fallback``) seconds; whether one came (or ``also`` finished) — a message of
        the chat queued here wakes it too."""
        assert self.shared is not None
        event = self._wake.setdefault(key, asyncio.Event())
        waiting = [True]  # (``also`` finishing later wakes no later wait)

        def finished(_: asyncio.Future[Any]) -> None:
            if waiting[0]:
                event.set()
        if also is not None:  # (it ends the wait as a note would: no task, no asyncio.wait)
            also.add_done_callback(finished)
        try:
            async with asyncio.timeout(self.shared.fallback if timeout is None else timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            waiting[0] = False
            if also is not None:
                also.remove_done_callback(finished)
            event.clear()

    def note(self, payload: str | None) -> None:
        """A note from an instance (several instances, LISTEN/NOTIFY): ``new|<provider>|<chat>``
        a message was recorded, ``free|chat:<provider>:<chat>`` a chat was let go,
        ``done|<provider>|<message id>|<outcome>`` what became of a message received here,
        ``orphan|<provider>|<chat>`` a stopping instance left the chat's messages to us;
        None: notes may have been missed (every waiting chat looks again)."""
        if payload is None:
            self._missed += 1
            for waiting in self._wake.values():
                waiting.set()
            return
        kind, _, rest = payload.partition("|")
        if kind == "free":
            provider, _, chat = rest.removeprefix("chat:").partition(":")
        else:
            provider, _, chat = rest.partition("|")
        if provider != self.name:
            return
        if kind == "new":  # new|<provider>|<chat>|<receiver>
            chat, _, via = chat.rpartition("|")
            if self.shared is not None and via == self.shared.cluster.id:
                return  # received here: in the chat's queue already (its worker was woken)
            if chat in self._workers:  # (a chat with no worker here is read when taken)
                self._news.add(chat)
        if kind == "done":
            self._done_elsewhere(*chat.partition("|")[::2])
        elif kind == "orphan":
            self.kick(chat)
        elif (event := self._wake.get(chat)) is not None:
            event.set()

    def _done_elsewhere(self, message_id: str, outcome: str) -> None:
        arriving = self._arriving.get(message_id)
        if arriving is not None:  # decided before its recording returned here
            with contextlib.suppress(ValueError, TypeError, KeyError):
                arriving.settle(outcome_from_dict(json.loads(outcome)))
            return
        for key, queue in self._chats.items():
            for ticket in queue:
                if ticket.message.message_id == message_id:
                    try:
                        self._settle(queue, ticket, outcome_from_dict(json.loads(outcome)))
                    except (ValueError, TypeError, KeyError):
                        return  # (its worker reads it)
                    if (event := self._wake.get(key)) is not None:
                        event.set()
                    return

    def _note(self, payload: str) -> None:
        """Send a note to the other instances, without waiting (one lost costs a fallback)."""
        if self.shared is None or self.shared.publish is None:
            return
        task = asyncio.get_running_loop().create_task(self._send_note(payload))
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def _send_note(self, payload: str) -> None:
        assert self.shared is not None and self.shared.publish is not None
        try:
            await self.shared.publish(payload)
        except Exception as e:  # noqa: BLE001 - they look again by themselves
            log.debug("%s: a note to the other instances was not sent: %s", self.name, e)

    async def _drain_chat(self, key: str, queue: deque[Ticket], lease: str, token: int, *,
                          taken: bool = True, first: list[dict[str, Any]] | None = None,
                          seen: set[Ticket] | None = None) -> int:
        """Holding the chat: its unhandled messages, in arrival order, each run to its end;
        how many were read. ``taken``: the chat was taken from an instance that died (or
        stalled), which may have left a run unfinished or an answer undelivered: those come
        first. ``first``: the messages read as the chat was taken (the first look), or those
        received here since the last look (:meth:`_only_ours`). ``seen``: the tickets queued
        when the inbox was last read (kept up to date here)."""
        assert self.shared is not None
        cluster = self.shared.cluster
        seen = set(queue) if seen is None else seen
        if taken:  # (its runs' messages go back to the inbox: the first look is stale)
            await self.shared.take_over(self.name, key)
            first = None
        if self.shared.stranded_in is not None and \
                await self.shared.stranded_in(self.name, key):
            first = None  # (a run of ours cut short: its message is back in the inbox, first)
        again, found = True, 0
        while again:
            if first is None:
                seen.clear()
                seen.update(queue)  # (any of these not in the read is handled already)
            if not (payloads := await self._unhandled(key, first)):
                break
            first = None
            again = False
            found += len(payloads)
            log.debug("%s: chat %s: %s", self.name, key,
                      [p.get("message_id") for p in payloads])
            for payload in payloads:
                if not cluster.holds(lease):  # lost (we were too slow to renew): let go
                    log.warning("%s: lost chat %s to another instance", self.name, key)
                    return 0
                if self._closed and not queue:  # stopping: what we received is answered,
                    return 0  # the rest is the others' (the chat is let go once ours is out)
                if await self._answer(key, queue, (lease, token), payload):
                    # its message is back in the inbox, first: read again — if the chat is
                    # still ours (its run may have been refused because it is not: each
                    # try would start a run, and call the model, only to be refused)
                    if not await cluster.confirm(lease):
                        log.warning("%s: lost chat %s to another instance", self.name, key)
                        return 0
                    again = True
                    break
            else:  # (none handed back) only ours came since: taken from memory, not read
                first = self._only_ours(key, queue, seen)
            again = again or self._more_since(key, queue)
        return found

    async def _answer(self, key: str, queue: deque[Ticket], claim: tuple[str, int],
                      payload: dict[str, Any]) -> bool:
        """One message of the chat, taken under ``claim``, handled and its run waited for;
        whether its run was handed back (its message is in the inbox again)."""
        assert self.shared is not None
        try:
            msg = message_from_dict(payload)
            message_id = _stored_id(msg)
        except (TypeError, ValueError, KeyError) as e:
            log.error("%s: a stored message of chat %s is unreadable (%s); skipped",
                      self.name, key, e)
            await self.inbox.handled(self.name, str(payload.get("message_id")),
                                     {"type": "dropped", "reason": "unreadable"})
            return False
        ticket = self._ticket(queue, message_id)
        source = (self.name, message_id)
        self.shared.claimed(source, claim)  # its run's writes: fenced
        try:
            try:
                outcome = await self.handler(msg if ticket is None or msg.shown
                                             else ticket.message)
            except RunTakenOver:  # another instance took the chat and this message
                return False
            except (asyncio.CancelledError, StorageError):  # (storage: it stays in the inbox,
                raise  # taken again once storage works)
            except Exception:
                log.exception("%s: handling a message of chat %s failed", self.name, key)
                outcome = Dropped("an internal error")
                await self.inbox.handled(self.name, message_id, outcome_to_dict(outcome))
            if ticket is not None:
                self._settle(queue, ticket, outcome)
            elif payload.get("via") not in (None, self.shared.cluster.id):  # received elsewhere
                self._note(f"done|{self.name}|{message_id}|"
                           f"{json.dumps(outcome_to_dict(outcome))}")
            if not isinstance(outcome, Accepted):
                return False
            await self._until_finished(key, queue, outcome.run_id)  # the next one waits
            return self.shared.handed_back is not None and \
                await self.shared.handed_back(outcome.run_id)
        finally:
            self.shared.claimed(source, None)

    async def _unhandled(self, key: str, read: list[dict[str, Any]] | None = None
                         ) -> list[dict[str, Any]]:
        """The chat's unhandled messages, oldest first (what was noted so far is in them);
        ``read``: as read with the chat's lease (the notes before it were let go then), or
        the messages received here since (:meth:`_only_ours`)."""
        if read is not None:
            return read
        self._heard_of(key)
        return await self.inbox.unhandled_in_chat(self.name, key)

    def _only_ours(self, key: str, queue: deque[Ticket], seen: set[Ticket]
                   ) -> list[dict[str, Any]] | None:
        """The chat's messages not yet handled, when all of them were received here since its
        inbox was last read (queued after ``seen``) — in memory: the inbox is not read again
        (a statement per message fewer) — else None (read it). Only when no other instance
        noted one (:meth:`_more_since`), none of ours is being recorded or could not be
        (:meth:`_unsure`), and each was recorded before the next was asked for (the inbox's
        order); a message the inbox holds again for a run handed back is read. (A ticket
        queued before the last read and not in it was handled elsewhere: its outcome is
        learnt once the chat is let go.)"""
        if self._more_news(key) or any(t.message.chat_id == key
                                       for t in self._arriving.values()):
            return None  # (one of ours still being recorded may come first in the inbox)
        assert self.shared is not None
        before = set(seen)
        seen.clear()
        seen.update(queue)
        ours = [t for t in queue if not t.done() and t not in before]
        # in the inbox's order only if each was recorded before the next was asked for
        # (recordings made side by side may have reached the inbox in either order)
        if not ours or any(a.recorded >= b.asked for a, b in zip(ours, ours[1:])):
            return None
        payloads = []
        for ticket in ours:
            payload = message_to_dict(ticket.message)
            payload["via"] = self.shared.cluster.id
            payloads.append(payload)
        return payloads

    def _more_news(self, key: str) -> bool:
        """Whether another instance may have recorded a message of the chat since its inbox
        was last read (a note says so, or notes may have been missed)."""
        return self.shared is None or self.shared.publish is None or key in self._news or \
            self._looked.get(key, -1) != self._missed or not self.shared.hearing()

    def _heard_of(self, key: str) -> None:
        """The chat's inbox is about to be read: what was noted of it so far is in it."""
        self._news.discard(key)
        self._looked[key] = self._missed

    def _more_since(self, key: str, queue: deque[Ticket]) -> bool:
        """Whether the chat may have a message its holder has not read yet: one received here
        (waiting in the queue), or one another instance noted — else the inbox is not read
        again (a statement per message fewer): one recorded unnoticed (or still being
        recorded here) is taken by its receiver, woken by the chat's release."""
        if self._more_news(key):
            return True  # (or no notes: only reading tells)
        return any(not t.done() for t in queue)

    async def _until_finished(self, key: str, queue: deque[Ticket], run_id: str) -> None:
        """Wait for the chat's run to end; meanwhile a ``/stop`` sent to the chat (to any
        instance) is handled at once — it is what stops the run (a message recorded wakes
        this up: note ``new``)."""
        assert self.shared is not None
        done = asyncio.ensure_future(self.shared.finished(run_id))
        try:
            while not done.done():
                await self._noted(key, done)
                if done.done():
                    break
                try:
                    await self._urgent_first(key, queue)
                except StorageError as e:  # (the run is still ours: the chat is not let go
                    log.debug("%s: chat %s: a look for a /stop failed: %s", self.name, key,
                              e)  # while it goes on — the next note looks again)
        finally:
            done.cancel()

    async def _urgent_first(self, key: str, queue: deque[Ticket]) -> None:
        """While the chat's run goes on: a ``/stop`` waiting in the chat is handled now."""
        assert self.shared is not None
        # (only ours waiting: those in the queue, the inbox not read)
        waiting = [t.message for t in queue if not t.done()] if not self._more_news(key) \
            else [message_from_dict(p) for p in
                  await self.inbox.unhandled_in_chat(self.name, key, 5)]
        for msg in waiting:
            if not self.shared.urgent(msg):
                continue
            ticket = self._ticket(queue, msg.message_id)
            outcome = await self.handler(msg)
            if ticket is not None:
                self._settle(queue, ticket, outcome)

    def _ticket(self, queue: deque[Ticket], message_id: str | None) -> Ticket | None:
        """The ticket of a message taken from the inbox: in the chat's queue, or still on its
        way there (its provider hands it over while the inbox records it)."""
        return next((t for t in queue if t.message.message_id == message_id),
                    None) or self._arriving.get(message_id or "")

    def _settle(self, queue: deque[Ticket], ticket: Ticket, outcome: Outcome) -> None:
        ticket.settle(outcome)
        if ticket in queue:  # (one on its way is released when it arrives)
            queue.remove(ticket)
            self._release()

    async def _learn_outcomes(self, queue: deque[Ticket],
                              only: Collection[Ticket] | None = None) -> None:
        """What became of the queue's messages (or ``only`` these of them), where decided."""
        for ticket in list(queue if only is None else only):
            found = await self.inbox.outcome(self.name, ticket.message.message_id or "")
            if found is not None and ticket in queue:  # (a note may have settled it meanwhile)
                self._settle(queue, ticket, outcome_from_dict(found))

    def start_sweeping(self) -> None:
        """Several instances: now and then, take up chats whose messages wait with nobody
        holding them (the instance that received them died)."""
        if self.shared is not None and self.shared.sweep is not None:
            self.shared.sweep.add(self)
        elif self.shared is not None and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name=f"intake:{self.name}:sweep")

    async def _sweep(self) -> None:
        assert self.shared is not None
        while not self._closed:
            await asyncio.sleep(self.shared.sweep_every)
            try:
                for key in await self.inbox.waiting_chats(self.name, self.shared.sweep_every):
                    self.kick(key)
            except Exception as e:  # noqa: BLE001 - the database is away: next time
                log.warning("%s: the intake sweep failed: %s", self.name, e)

    def kick(self, key: str) -> None:
        """Look at chat ``key``'s waiting messages now (shared mode), if no worker does."""
        if self.shared is None or self._closed or key in self._workers:
            return
        queue = self._chats[key] = deque()
        self._workers[key] = asyncio.create_task(self._work_shared(key, queue),
                                                 name=f"intake:{self.name}:{key}")

    async def idle(self) -> None:
        """Wait until every message handed over has been handled."""
        while workers := list(self._workers.values()):
            await asyncio.wait(workers)

    def _release(self) -> None:
        self._free += 1
        self._room.set()

    async def close(self, grace: float) -> None:
        """Take no more messages; let those handed over be handled for ``grace`` seconds."""
        self._closed = True
        self._room.set()  # submitters waiting for room are told the gateway is stopping
        if self._sweeper is not None:
            self._sweeper.cancel()
        workers = list(self._workers.values())
        if not workers:
            return
        _, pending = await asyncio.wait(workers, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("%s: %d chat(s) still had messages being handled at shutdown",
                        self.name, len(pending))
            await asyncio.wait(pending, timeout=5)


def _tell(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _stored_id(msg: IncomingMessage) -> str:
    """The id a message of the inbox is kept under (only messages with one are recorded)."""
    if not msg.message_id:
        raise ValueError("a stored message without its id")
    return msg.message_id
