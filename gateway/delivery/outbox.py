"""The outbox: each chunk of a reply is recorded before it is sent, and sent exactly once.

:meth:`Outbox.deliver` records every chunk of a reply (idempotency key: reply id and chunk
index) and returns once they are durable; sending happens behind it, in one sender task per
chat, so replies to a chat go out in the order they were recorded and a chat that is flood
controlled or failing never holds up another chat — or the pipeline that recorded the reply.

Retries live here, in one place: a transient error is retried with exponential backoff, a
rate limit after the platform's ``retry_after``, which is kept as the chat's flood control
(:class:`~pluto.gateway.delivery.flood.FloodControl`): every send to that chat — previews,
finals, notices, replies taken up again after a restart — waits it out first; a
permanent refusal (chat gone, bot blocked) ends the reply and is recorded. When the retries run
out, the reply stays pending and the chat's sender rests: a sweep every ``sweep_seconds`` (and
every provider start) picks pending replies up again, until they expire.

A reply being sent is claimed in storage (an owner and a lease), so two senders never send it
at once. The one window no outbox can close: the process dying after the platform accepted a
message and before ``sent`` was written. Such a chunk is sent again (at least once), and logged
as possibly repeated; only Discord offers an idempotency key (its provider uses it).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pluto.errors import DeliveryRefused, PlutoError, ProviderError, RateLimited
from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.delivery.streaming import ChatOp, EditThrottle
from pluto.gateway.delivery.watchdog import SendWatchdog
from pluto.gateway.logs import EVERY_LINE
from pluto.gateway.ports import Provider
from pluto.storage.ports import OutboxStore
from pluto.storage.rows import OutboxRow
from pluto.types import Attachment, Button, OutgoingMessage

log = logging.getLogger(__name__)

ChatKey = tuple[str, str]  # (provider name, chat id)
AHEAD_WAIT = 0.5  # seconds between looks at the claim of a taken-over chat's older reply
AHEAD_LIMIT = 120.0  # seconds such a chat waits for it at most (its owner lives, but stalls)
UNCALLED_KEPT = 1000  # replies whose record failed, remembered (see Outbox._count_uncalled)
MAX_HOLDS = 10  # a rate-limited chunk waits out this many times the retries' worth of holds
RESTING_LOOK = 0.5  # seconds between looks at whether a resting chat was taken up again


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 6  # platform calls per chunk before the reply rests until the next sweep
    base_delay: float = 1.0  # doubled after each failure without a retry-after
    max_delay: float = 600.0  # a longer retry-after is cut to this

    def delay(self, error: ProviderError, attempt: int) -> float:
        wanted = error.retry_after if error.retry_after is not None else (
            self.base_delay * 2 ** attempt)
        return max(0.0, min(wanted, self.max_delay))


@dataclass(slots=True)
class _Chat:
    """What one chat waits for, in order — replies (by id) and other calls (previews, typing)
    — and the task making them."""

    queue: deque[str | ChatOp] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    # a reply ran out of retries: nothing more goes to this chat until the sweep takes it up
    # again (later replies wait, recorded, behind it; previews and typing are not made)
    resting: bool = False


class Outbox:
    files: Any = None  # several instances: the shared files (set by the gateway)

    def __init__(self, rows: OutboxStore, providers: Mapping[str, Provider], *,
                 retry: RetryPolicy | None = None, throttle: EditThrottle | None = None,
                 keep_seconds: float = 7 * 86400, lease_seconds: float = 300.0,
                 sweep_seconds: float = 30.0, owner: str | None = None,
                 flood: FloodControl | None = None, watchdog: SendWatchdog | None = None,
                 may_send: Callable[[], bool] | None = None):
        self.rows = rows
        self.providers = providers  # the running providers, by name (read at each send)
        self.retry = retry or RetryPolicy()
        self.throttle = throttle or EditThrottle(0.0)
        self.flood = flood or FloodControl()  # one per gateway: previews consult it too
        self.watchdog = watchdog  # told every platform call's outcome (a wedged send path)
        # several instances: false while this one may not act (a pause, leases not renewed)
        self.may_send: Callable[[], bool] = may_send or (lambda: True)
        self._silenced = False  # logged once per silence
        self.keep_seconds = keep_seconds
        self.lease_seconds = lease_seconds
        self.sweep_seconds = sweep_seconds
        self.owner = owner or uuid.uuid4().hex
        self._chats: dict[ChatKey, _Chat] = {}
        self._done: dict[str, asyncio.Future[bool]] = {}  # reply id → settles when it is out
        self._fresh: dict[str, list[OutboxRow]] = {}  # recorded and claimed by deliver()
        self._counted: set[int] = set()  # chunks whose next call is counted in storage
        # replies whose record (its first call counted) storage said failed: it may have been
        # committed all the same, and that count is of a call this instance never made
        self._uncalled: set[str] = set()
        # replies of chats taken over, queued ahead of this instance's own (flush_chat): the
        # chat waits for each of them, even while another instance still holds it
        self._ahead: set[str] = set()
        self.ahead_wait = AHEAD_WAIT  # seconds between looks at such a reply's claim
        self.ahead_limit = AHEAD_LIMIT  # seconds the chat waits for it at most
        self._sweeper: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self.flood.load()  # a retry-after from before a restart still holds
        pruned = await self.rows.prune(self.keep_seconds)
        if pruned:
            log.debug("outbox: pruned %d delivered chunk(s)", pruned)

    def start(self) -> None:
        """Sweep for replies left pending (retries exhausted, or from before) every so often."""
        if self._sweeper is None and self.sweep_seconds > 0:
            self._sweeper = asyncio.create_task(self._sweep(), name="outbox:sweep")

    async def close(self, grace: float = 5.0) -> None:
        """Stop sweeping; let the senders finish what they have for ``grace`` seconds."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        tasks = [c.task for c in self._chats.values() if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("outbox: %d chat(s) still had replies to send at shutdown; they "
                            "go out at the next start", len(pending))
                await asyncio.wait(pending, timeout=5)

    # recording ----------------------------------------------------------------------------

    async def deliver(self, provider: Provider, reply_id: str,
                      messages: list[OutgoingMessage]) -> asyncio.Future[bool]:
        """Record the chunks of one reply (durably), then hand them to the chat's sender.

        Returns at once with a future that settles when the reply is out (True) or was given
        up or left for later (False); nobody has to wait for it."""
        done = self._done.get(reply_id)
        if done is None:
            done = self._done[reply_id] = asyncio.get_running_loop().create_future()
        if not messages:
            _settle(done, True)
            return done
        key = (provider.name, messages[0].chat_id)
        # the first call is counted with the record only when it follows at once: a chunk
        # counted and then left waiting would be taken, after a crash, for one maybe sent
        at_once = self._idle(key)
        try:
            rows, claimed = await self.rows.record_claimed(
                [_to_row(provider.name, reply_id, i, m) for i, m in enumerate(messages)],
                self.owner, self.lease_seconds, count=at_once)  # one commit: recorded and ours
        except Exception:
            if at_once and len(self._uncalled) < UNCALLED_KEPT:
                self._uncalled.add(reply_id)
            raise
        self._uncalled.discard(reply_id)
        if claimed:
            self._fresh[reply_id] = rows
            first = next((r for r in rows if r.status == "pending"), None)
            if at_once and first is not None and first.id:
                self._counted.add(first.id)  # (each later chunk: counted at the mark before)
        if all(r.status != "pending" for r in rows):  # recorded and sent before
            self._forget(reply_id)
            _settle(done, all(r.status == "sent" for r in rows))
            return done
        if not self._enqueue(key, reply_id):  # the chat rests: the sweep sends it, in order
            self._forget(reply_id)
            _settle(done, False)
        return done

    def post(self, op: ChatOp) -> bool:
        """Queue a call that is not a recorded reply (a preview, a typing indicator) behind
        everything the chat already waits for; False when the chat rests (not made)."""
        return self._enqueue(op.key, op)

    async def flush(self, provider: Provider) -> int:
        """Hand every pending reply of a provider to its chat's sender (at its start, and
        from the sweep); returns how many chunks were pending."""
        return self._queue_pending(provider, await self.rows.pending(provider.name))

    async def flush_chat(self, provider: Provider, chat_id: str) -> int:
        """Several instances, a chat taken over from an instance that stopped: the replies it
        recorded there and never sent, queued now — ahead of anything this instance answers
        in the chat (its replies go out in order). How many chunks were pending."""
        pending = [r for r in await self.rows.pending(provider.name) if r.chat_id == chat_id]
        key = (provider.name, chat_id)
        chat = self._chats.get(key)
        if chat is not None:
            chat.resting = False
        queued = set() if chat is None else {r for r in chat.queue if isinstance(r, str)}
        for reply_id in dict.fromkeys(r.reply_id for r in pending):
            if reply_id not in queued and self._enqueue(key, reply_id):
                self._ahead.add(reply_id)
        return len(pending)

    async def flush_all(self) -> int:
        """:meth:`flush` for every provider, with one query (the sweep)."""
        pending = await self.rows.pending_all()
        return sum(self._queue_pending(p, [r for r in pending if r.provider == p.name])
                   for p in list(self.providers.values()))

    def _queue_pending(self, provider: Provider, pending: list[OutboxRow]) -> int:
        for key, chat in self._chats.items():  # the sweep's turn: resting chats go on
            if key[0] == provider.name:
                chat.resting = False
        queued = {r for chat in self._chats.values() for r in chat.queue if isinstance(r, str)}
        fresh = [row for row in pending if row.reply_id not in queued]
        if fresh:
            log.info("outbox: %d unsent chunk(s) for %s from before; sending them", len(fresh),
                     provider.name)
        for row in fresh:
            self._enqueue((row.provider, row.chat_id), row.reply_id)
        return len(fresh)

    def _idle(self, key: ChatKey) -> bool:
        """Whether a reply recorded now is sent at once: no reply waits ahead of it in the
        chat (a preview or typing call ahead is at most one call) and no flood hold."""
        chat = self._chats.get(key)
        waiting = chat is not None and any(isinstance(i, str) for i in chat.queue)
        return not waiting and not self.flood.remaining(key)

    def _enqueue(self, key: ChatKey, item: str | ChatOp) -> bool:
        chat = self._chats.get(key)
        if chat is None:
            chat = self._chats[key] = _Chat()
        if chat.resting and (isinstance(item, str) or not item.needed):
            return False  # (a reply rests recorded: the sweep sends it)
        if isinstance(item, str) and item in chat.queue:
            return True
        chat.queue.append(item)
        if chat.task is None:
            chat.task = asyncio.create_task(self._send_chat(key, chat),
                                            name=f"outbox:{key[0]}:{key[1]}")
        return True

    def forget_claims(self) -> None:
        """Several instances: this one was taken for dead (paused, cut off) and others may have
        sent its replies meanwhile: each is claimed and read again before it is sent."""
        self._fresh.clear()

    async def chat_idle(self, provider: str, chat_id: str, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until nothing waits to go to the chat from this
        instance (several instances: a chat is let go only then, so the next answer, from
        any instance, comes after); whether it is so. A resting chat is not idle: its reply
        could not go (out of retries, or this instance was silenced: paused, cut off from the
        database) and waits for the sweep — let go now, the chat's next answer, given by
        another instance, would be shown above it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (chat := self._chats.get((provider, chat_id))) is not None and (
                chat.resting or chat.task is not None and not chat.task.done()):
            left = deadline - loop.time()
            if left <= 0:
                return False
            if chat.task is None or chat.task.done():  # resting: until the sweep's turn
                await asyncio.sleep(min(left, RESTING_LOOK))
            else:
                await asyncio.wait({chat.task}, timeout=left)
        return True

    @property
    def busy(self) -> bool:
        return any(c.task is not None for c in self._chats.values())

    async def idle(self) -> None:
        """Wait until every chat's sender has nothing left (tests, shutdown)."""
        while tasks := [c.task for c in self._chats.values() if c.task is not None]:
            await asyncio.wait(tasks)

    # sending ------------------------------------------------------------------------------

    async def _send_chat(self, key: ChatKey, chat: _Chat) -> None:
        try:
            while chat.queue:
                item = chat.queue[0]
                if not isinstance(item, str):
                    try:
                        await item.perform()
                    finally:
                        chat.queue.popleft()
                    continue
                provider = self.providers.get(key[0])
                if provider is None:  # not running: it flushes this when it (re)starts
                    self._drop_waiting(chat)
                    continue
                try:
                    ok = await self._send_reply(provider, item, chat)
                finally:
                    chat.queue.popleft()
                self._finish(item, ok is True)
                if ok is None:  # out of retries: the chat rests; the sweep tries it again
                    chat.resting = True
                    self._drop_waiting(chat)
        finally:
            chat.task = None
            if not chat.queue and not chat.resting and self._chats.get(key) is chat:
                del self._chats[key]

    def _drop_waiting(self, chat: _Chat) -> None:
        """Let go of what waits in a chat that cannot be sent to now: replies stay recorded
        (sent later, in order), other calls are not made — but those needed all the same (a
        preview removed), which stay."""
        kept = [w for w in chat.queue if not isinstance(w, str) and w.needed]
        for waiting in chat.queue:
            if isinstance(waiting, str):
                self._forget(waiting)
                self._finish(waiting, False)
        chat.queue.clear()
        chat.queue.extend(kept)

    def _forget(self, reply_id: str) -> None:
        self._ahead.discard(reply_id)
        for row in self._fresh.pop(reply_id, ()):
            self._counted.discard(row.id or 0)

    def _finish(self, reply_id: str, ok: bool) -> None:
        done = self._done.pop(reply_id, None)
        if done is not None:
            _settle(done, ok)

    async def _send_reply(self, provider: Provider, reply_id: str,
                          chat: _Chat) -> bool | None:
        """Send a reply's pending chunks in order: True when all went out, False when the
        platform refused it for good, None when they could not go now (still pending)."""
        fresh = self._fresh.pop(reply_id, None)
        ahead = reply_id in self._ahead
        self._ahead.discard(reply_id)
        try:
            if fresh is None and not await self.rows.claim(reply_id, self.owner,
                                                           self.lease_seconds):
                if not ahead:
                    log.debug("outbox: reply %s is being sent by another sender", reply_id)
                    self._leave_to_its_sender(chat)
                    return True
                if not await self._wait_for_claim(reply_id):
                    return True
            rows = fresh if fresh is not None else await self.rows.reply(reply_id)
            if reply_id in self._uncalled and fresh is None:
                self._uncalled.discard(reply_id)
                self._count_uncalled(rows)
        except Exception as e:  # noqa: BLE001 - storage is away: nothing was sent; later
            log.error("outbox: could not read reply %s (%s); will try again later", reply_id, e)
            return None
        pending = [r for r in rows if r.status == "pending"]
        # The claim is given up once the reply is out or given up for good. Several instances:
        # one left for later stays ours — another instance's sweep taking it up meanwhile
        # would send it beside, or after, this chat's later replies, which are ours too; our
        # own sweep sends it again, in order, and were we to die the claim dies with us.
        released = kept = False
        try:
            for i, row in enumerate(pending):
                last = i + 1 == len(pending)
                following = self._next_fresh(chat) if last else pending[i + 1]
                try:
                    await self._send_one(provider, row, following,
                                         release=(reply_id, self.owner) if last else None)
                except ProviderError as e:
                    outcome = await self._failed(provider, row, pending[i:], e)
                    kept = outcome is None
                    return outcome
                except Silenced:  # nothing was sent: sent once we may act again
                    kept = True
                    return None
                except Exception as e:  # noqa: BLE001 - storage is away before a call
                    log.error("outbox: storage failed while sending reply %s (%s); will try "
                              "again later", reply_id, e)
                    kept = True
                    return None
                released = last
            return True
        finally:
            if not released and not (kept and self.rows.shared):
                await self._release(reply_id)

    def _count_uncalled(self, rows: list[OutboxRow]) -> None:
        """A reply recorded although storage said it failed, claimed here now: its first
        chunk's one counted call is the record's, never made (any other sender's call would
        have counted another) — so it is not taken for one that may have been delivered."""
        first = rows[0] if rows else None
        if first is not None and first.id and first.status == "pending" and first.attempts == 1:
            self._counted.add(first.id)

    async def _wait_for_claim(self, reply_id: str) -> bool:
        """A reply of a chat taken over, claimed by an instance still alive (it was taken for
        dead, then came back holding it): nothing newer of the chat goes before it. Its claim is
        looked at until it is ours — the reply then reads as sent, or is sent from here — or
        for ``ahead_limit`` seconds at most; whether it became ours."""
        log.info("outbox: reply %s of a chat taken over is still another instance's; the chat "
                 "waits for it", reply_id)
        deadline = asyncio.get_running_loop().time() + self.ahead_limit
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(self.ahead_wait)
            try:
                if await self.rows.claim(reply_id, self.owner, self.lease_seconds):
                    return True
            except Exception as e:  # noqa: BLE001 - storage is away: look again
                log.debug("outbox: could not look at reply %s's claim: %s", reply_id, e)
        log.warning("outbox: reply %s of a chat taken over stayed another instance's for %.0fs;"
                    " the chat goes on without it", reply_id, self.ahead_limit)
        return False

    def _leave_to_its_sender(self, chat: _Chat) -> None:
        """Several instances: a reply taken up from the outbox (not recorded here) is being
        sent by another sender — another instance's sweep took up the same replies. The chat's
        later replies taken up here are left to that sender, which has them queued behind it:
        sending them from here, beside it, could put one ahead of the reply it is sending.
        (Replies recorded here, and calls of this instance's own runs, stay.)"""
        later = list(chat.queue)[1:]
        left = [r for r in later
                if isinstance(r, str) and r not in self._fresh and r not in self._ahead]
        if not left:
            return
        for reply_id in left:
            chat.queue.remove(reply_id)
            self._finish(reply_id, False)  # still pending: its sender, or a sweep, sends it
        log.debug("outbox: %d later reply(ies) of the chat left to the sender of the one "
                  "ahead", len(left))

    def _next_fresh(self, chat: _Chat) -> OutboxRow | None:
        """The first chunk of the chat's next reply, if its first call is not counted yet
        (it is counted with this chunk's mark, so a crash between them is told apart)."""
        later = next((r for r in list(chat.queue)[1:] if isinstance(r, str)), None)
        rows = self._fresh.get(later) if later is not None else None
        first = next((r for r in rows if r.status == "pending"), None) if rows else None
        if first is None or first.id in self._counted:
            return None
        return first

    async def _release(self, reply_id: str) -> None:
        try:
            await self.rows.release(reply_id, self.owner)
        except Exception as e:  # noqa: BLE001 - the claim runs out by itself
            log.warning("outbox: could not release reply %s: %s", reply_id, e)

    async def _failed(self, provider: Provider, row: OutboxRow, rest: list[OutboxRow],
                      e: ProviderError) -> bool | None:
        if isinstance(e, DeliveryRefused):
            try:
                await self.rows.failed([r.id for r in rest if r.id], str(e))
            except Exception as stored:  # noqa: BLE001 - recorded as pending: tried again
                log.warning("outbox: could not record a refused reply: %s", stored)
            log.error("%s: could not deliver to chat %s (%s); gave up on this reply",
                      provider.name, row.chat_id, e)
            return False
        log.error("%s: could not deliver to chat %s (%s); will try again later", provider.name,
                  row.chat_id, e)
        return None

    async def _send_one(self, provider: Provider, row: OutboxRow, following: OutboxRow | None,
                        *, release: tuple[str, str] | None = None) -> str | None:
        """Send one chunk, retrying by the platform's rules; its mark also counts the first
        call of ``following`` and, with ``release``, gives up the reply's claim."""
        assert row.id is not None
        message = await self._files_here(_to_message(row))
        counted = row.id in self._counted
        if row.attempts and not counted and not message.edit_of:  # (an edit is idempotent)
            log.warning("%s: chunk %d of reply %s may have been delivered before a crash; "
                        "sending it again", provider.name, row.chunk, row.reply_id,
                        extra=EVERY_LINE)  # (each is a possible duplicate: none goes unsaid)
        key = (provider.name, row.chat_id)
        failures = 0
        while True:
            if message.edit_of:
                await self.throttle.turn(key)  # edits of one chat keep their pace
            await self.flood.wait(key)
            self._check_fence()  # silent: nothing is counted, so nothing is "maybe sent"
            if not counted:
                await self.rows.attempted(row.id)
            try:
                self._check_fence()  # (the fence closed while the attempt was recorded)
            except Silenced:
                self._counted.add(row.id)  # counted but not made: the next try adds none
                raise
            counted = False
            self._counted.discard(row.id)
            try:
                platform_id = await _call(provider, message)
            except ProviderError as e:
                message, failures = await self._retry(provider, row, message, e, failures)
                continue
            self._observed(provider, None)
            count = following.id if following is not None and following.id and \
                not self.flood.remaining(key) else None
            await self._mark_sent(row, platform_id, release, count)
            if count is not None:
                self._counted.add(count)
            return platform_id

    async def _retry(self, provider: Provider, row: OutboxRow, message: OutgoingMessage,
                     e: ProviderError, failures: int) -> tuple[OutgoingMessage, int]:
        """After a failed call: what to send next and the failures so far; raises when it is
        time to stop. A rate limit delays the chat (kept for every send to it) without using
        up the retries, up to a bound."""
        assert row.id is not None
        if isinstance(e, DeliveryRefused) and message.edit_of:
            return replace(message, edit_of=None), failures  # the message to edit is gone
        self._observed(provider, e)
        try:
            await self.rows.note_error(row.id, str(e), unsent=e.unsent)
        except Exception as stored:  # noqa: BLE001 - only a note
            log.debug("outbox: could not note an error: %s", stored)
        limited = isinstance(e, RateLimited)
        failures += 1
        if isinstance(e, DeliveryRefused) or failures >= self.retry.attempts * (
                MAX_HOLDS if limited else 1):
            raise e
        delay = self.retry.delay(e, failures - 1)
        log.warning("%s: sending failed (%s); retrying in %.1fs", provider.name, e, delay)
        if limited:  # every send to this chat waits (kept)
            await self.flood.hold((provider.name, row.chat_id), delay)
        else:
            await asyncio.sleep(delay)
        return message, failures

    async def _mark_sent(self, row: OutboxRow, platform_id: str | None,
                         release: tuple[str, str] | None, count: int | None) -> None:
        """The platform took the chunk: record it, however long storage takes to come back —
        a chunk sent is never sent again because its mark failed (the chat waits meanwhile)."""
        assert row.id is not None
        delay = 0.5
        while True:
            try:
                await self.rows.sent(row.id, platform_id, release=release, count=count)
                return
            except Exception as e:  # noqa: BLE001 - retried: the chunk is out
                if delay == 0.5:
                    log.error("outbox: chunk %d of reply %s was sent but could not be recorded "
                              "(%s); retrying until storage takes it", row.chunk, row.reply_id,
                              e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _check_fence(self) -> None:
        if self.may_send():
            if self._silenced:
                log.info("outbox: sending again")
                self._silenced = False
            return
        if not self._silenced:
            log.warning("outbox: silent: this instance could not renew its leases in time "
                        "(paused, or the database is away); replies wait")
            self._silenced = True
        raise Silenced("this instance may not send now")

    def _observed(self, provider: Provider, error: ProviderError | None) -> None:
        if self.watchdog is None:
            return
        if error is None:
            self.watchdog.succeeded(provider.name)
        elif not isinstance(error, DeliveryRefused):  # the platform answered: not wedged
            self.watchdog.failed(provider.name, error)

    async def _files_here(self, message: OutgoingMessage) -> OutgoingMessage:
        """A chart another instance drew (its reply is sent from here): fetched into this data
        dir from the shared file store first."""
        if self.files is None or not message.attachments:
            return message
        found = []
        for a in message.attachments:
            if a.path is not None and not a.path.is_file():
                try:
                    a = replace(a, path=await self.files.local(a.path) or a.path)
                except PlutoError as e:
                    log.warning("outbox: %s could not be fetched: %s", a.filename, e)
            found.append(a)
        return replace(message, attachments=tuple(found))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_seconds)
            if not self.flood.followed:  # (told as they are kept, when they can be)
                await self.flood.load()  # holds another instance kept meanwhile
            try:
                await self.flush_all()
            except Exception as e:  # noqa: BLE001 - storage is away: the next sweep
                log.warning("outbox: the sweep failed: %s", e)


async def _call(provider: Provider, message: OutgoingMessage) -> str | None:
    """One platform call; an unexpected exception (a provider bug) counts as permanent."""
    try:
        if message.edit_of:
            await provider.edit(message)
            return message.edit_of
        return await provider.send(message)
    except ProviderError:
        raise
    except Exception as e:
        log.exception("%s failed to send a message", provider.name)
        raise DeliveryRefused(f"the provider failed: {type(e).__name__}") from e


class Silenced(PlutoError):
    """This instance may not make platform calls now (see :meth:`Cluster.fresh`)."""


def _settle(future: asyncio.Future[bool], ok: bool) -> None:
    if not future.done():
        future.set_result(ok)


def _to_row(provider: str, reply_id: str, chunk: int, m: OutgoingMessage) -> OutboxRow:
    return OutboxRow(reply_id=reply_id, chunk=chunk, run_id=m.run_id, seq=m.seq,
                     provider=provider, chat_id=m.chat_id, thread_id=m.thread_id,
                     reply_to=m.reply_to, answers=m.answers, edit_of=m.edit_of, kind=m.kind,
                     markup=m.markup, text=m.text,
                     attachments=[_attachment_dict(a) for a in m.attachments],
                     buttons=[{"label": b.label, "command": b.command, "style": b.style}
                              for b in m.buttons])


def _to_message(row: OutboxRow) -> OutgoingMessage:
    return OutgoingMessage(chat_id=row.chat_id, thread_id=row.thread_id, reply_to=row.reply_to,
                           answers=row.answers, edit_of=row.edit_of,
                           kind=row.kind,  # type: ignore[arg-type]
                           markup=row.markup, text=row.text, run_id=row.run_id, seq=row.seq,
                           attachments=tuple(_attachment(a) for a in row.attachments),
                           buttons=tuple(Button(b["label"], b["command"],
                                                b.get("style", "default"))  # type: ignore[arg-type]
                                         for b in row.buttons))


def _attachment_dict(a: Attachment) -> dict[str, Any]:
    return {"filename": a.filename, "mime_type": a.mime_type, "size": a.size,
            "path": str(a.path) if a.path else None, "url": a.url, "kind": a.kind}


def _attachment(d: dict[str, Any]) -> Attachment:
    return Attachment(filename=d["filename"], mime_type=d.get("mime_type") or
                      "application/octet-stream", size=int(d.get("size") or 0),
                      path=Path(d["path"]) if d.get("path") else None, url=d.get("url"),
                      kind=d.get("kind") or "file")
