"""Approvals in the gateway: a decision taken in a chat, and requests nobody decided in time.

A decision is a message like any other — ``/approve [id]``, ``/deny [id] [reason]``, or a
button that sends one as the person who clicked it — so it goes through the chat's inbox, in
the chat's order, on whichever instance holds the chat, and survives a crash like any message.
:class:`ApprovalDesk` checks it (the request is this chat's, the person may decide), records
the decision with one statement only a pending, unexpired request takes, and queues the run that
resumes it in the request's session (claimed once: runtime/approvals.py, storage/sql/approvals).

:class:`ApprovalSweep` marks requests expired when nobody decided in time and hands each to its
chat as a message the gateway makes itself (``IncomingMessage.approval``): the resumed run tells
the model it was not run, and the chat sees one line. It also hands over again a decision whose
instance died before its run began. Each look is a statement or two, every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pluto.errors import StorageError
from pluto.runtime.approvals import Decision, parse_decision, who_decides
from pluto.storage.ports import ApprovalStore
from pluto.storage.rows import ToolApproval
from pluto.types import Answered, IncomingMessage, Outcome, Refused, Route

if TYPE_CHECKING:
    from pluto.gateway.ports import Provider

log = logging.getLogger(__name__)

NOT_HERE = "There is no approval request {id}waiting in this chat."
STATUS = {"approved": "was already approved", "denied": "was already denied",
          "expired": "expired before anyone decided", "cancelled": "was cancelled"}


class ApprovalDesk:
    """The pipeline's side of approvals (see the module)."""

    def __init__(self, store: ApprovalStore,
                 reply: Callable[[Provider, IncomingMessage, str, str], Awaitable[Any]],
                 resume: Callable[[IncomingMessage, Route, ToolApproval], Awaitable[Outcome]]):
        self.store = store
        self.reply = reply  # (provider, msg, text, kind): a line to the chat
        self.resume = resume  # queue the run that resumes a decided request

    @staticmethod
    def parse(msg: IncomingMessage) -> Decision | None:
        return parse_decision(msg.text) if msg.text.startswith("/") else None

    async def check(self, provider: str, chat_id: str, user_id: str,
                    approval_id: str) -> str | None:
        """Whether this person may decide this request, asked by a provider before it hands
        a button's click over (so a refusal is private and in the platform's time): None
        when they may, else the sentence to show them."""
        row = await self.store.get(approval_id)
        if row is None or row.provider != provider or row.chat_id != chat_id:
            return "This approval request is not from this chat."
        if row.status != "pending":
            return f"This request {STATUS.get(row.status, 'is over')}."
        if not row.may_decide(provider, user_id):
            return f"Only {who_decides(row.approvers)} can decide this request."
        return None

    async def decide(self, msg: IncomingMessage, route: Route, provider: Provider,
                     decision: Decision) -> Outcome:
        row = (await self.store.get(decision.approval_id) if decision.approval_id
               else await self.store.latest_pending(msg.provider, msg.chat_id))
        if row is None or row.provider != msg.provider or row.chat_id != msg.chat_id:
            shown = f"{decision.approval_id} " if decision.approval_id else ""
            text = NOT_HERE.format(id=shown)
            await self.reply(provider, msg, text, "notice")
            return Answered(text, failed=True)
        if not row.may_decide(msg.provider, msg.user_id):
            text = f"Only {who_decides(row.approvers)} can decide this request."
            log.info("approval %s: %s %s may not decide it", row.id, msg.provider, msg.user_id)
            await self.reply(provider, msg, text, "notice")
            return Refused("not an approver", notice=text)
        by = msg.user_name or msg.user_id
        decided, fresh = await self.store.decide(row.id, decision.verdict, by=by,
                                                 message_id=msg.message_id,
                                                 reason=decision.reason or None)
        if decided is None or not fresh:
            current = decided or row
            text = f"This request {STATUS.get(current.status, 'is over')}."
            await self.reply(provider, msg, text, "notice")
            return Answered(text)
        log.info("approval %s (%s): %s by %s %s", decided.id, decided.tool, decided.status,
                 msg.provider, msg.user_id)
        return await self.resume(msg, route, decided)


class ApprovalSweep:
    """Expired requests handed to their chats; decisions whose run never began, again.

    A request made here is expected (:meth:`expect`): the sweep looks just after its deadline.
    Requests of other instances (which may have stopped) are found by a look every ``every``
    seconds — one statement — and decisions stranded by a dead instance every
    ``stranded_after`` seconds: an idle instance costs a statement a minute, not one a second.
    """

    def __init__(self, store: ApprovalStore, intakes: Mapping[str, Any], *,
                 every: float = 60.0, stranded_after: float = 30.0):
        self.store = store
        self.intakes = intakes  # provider name -> its IntakeQueue (submit)
        self.every = every
        self.stranded_after = stranded_after
        self._task: asyncio.Task[None] | None = None
        self._last_stranded = 0.0
        self._due: list[float] = []  # monotonic times just after the deadlines of ours
        self._wake = asyncio.Event()

    def expect(self, row: ToolApproval) -> None:
        """A request made here: look again just after its deadline (its timeout from now)."""
        self._due.append(time.monotonic() + max(0.0, row.expires_at - row.created_at) + 0.2)
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="approvals:sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            now = time.monotonic()
            soonest = min([last + self.every, *self._due])
            if soonest > now:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), soonest - now)
                    continue  # a new deadline: wait again for the soonest
                except TimeoutError:
                    pass
            now = last = time.monotonic()
            self._due = [t for t in self._due if t > now]
            try:
                await self.look()
            except (StorageError, OSError) as e:
                log.warning("approvals: the sweep failed (%s); it looks again soon", e)
                self._due.append(now + 5.0)
            except Exception:
                log.exception("approvals: the sweep failed")

    async def look(self) -> int:
        """One look; how many requests were handed to their chats."""
        rows = await self.store.expire_due()
        for row in rows:
            log.info("approval %s (%s, run %s) expired: nobody decided in time", row.id,
                     row.tool, row.run_id)
        now = time.monotonic()
        if now - self._last_stranded >= self.stranded_after:
            self._last_stranded = now
            seen = {r.id for r in rows}
            rows += [r for r in await self.store.unresumed(self.stranded_after)
                     if r.id not in seen]
        handed = 0
        for row in rows:
            intake = self.intakes.get(row.provider)
            if intake is None:
                continue  # (an instance running that provider hands it over)
            await intake.submit(resume_message(row))
            handed += 1
        return handed

def resume_message(row: ToolApproval) -> IncomingMessage:
    """The message the gateway makes to resume a request decided without one (it expired, or
    its decision's instance died): its chat's turn, its id the same every time (one run)."""
    return IncomingMessage(provider=row.provider, chat_id=row.chat_id, user_id=row.asker,
                           text="", message_id=f"approval:{row.id}", thread_id=row.thread_id,
                           is_direct=True, mentions_bot=True, approval=row.id)
