"""Who gets an answer: the steps between the routing table and the agent.

For each message, :meth:`Access.admit` asks the routing table, then applies the matched rule's
policy, one concern at a time:

1. **No rule admits it** (a ``deny`` rule, or no rule and no default): nothing — or, for a
   direct message, the one-line ``access.refusal`` from ``pluto.yaml`` (at most once per ten
   minutes per user, so a refused user cannot make the bot talk).
2. **A mention is required** (``require_mention: true``) and a group message does not mention
   the bot: nothing.
3. **Pairing** (``access: pairing``): a direct message from a user no admin has approved gets a
   short code (the same code while it is valid, repeated at most once a minute); the admin
   approves it with ``pluto pairing approve CODE`` or ``POST /admin/pairing/approve``, and from
   then on the user is admitted on every ``access: pairing`` rule. Group messages from users
   not approved get nothing (a code is never posted in a group).
4. **Rate limits** (``rate_limit: {user: 5/minute, chat: 30/minute}``): a message over a limit
   gets nothing, except the first of a streak, which gets one polite notice. Chat commands
   (``/stop``, ``/help``) are not counted: they never start a run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from pluto.settings import AccessConfig
from pluto.gateway.pipeline.ratelimit import OncePer, RateLimiter, limited_notice
from pluto.gateway.pipeline.routing import Decision, RoutingTable
from pluto.types import IncomingMessage, Route
from pluto.storage.access import PairingStore, format_code
from pluto.storage.sqlite import SqliteStore

log = logging.getLogger(__name__)

Notify = Callable[[IncomingMessage, str], Awaitable[None]]

REFUSAL_EVERY = 600.0
PAIRING_REMINDER_EVERY = 60.0


def pairing_text(code: str, ttl: float) -> str:
    minutes = max(1, round(ttl / 60))
    return (f"Hi! I only talk to people an admin has approved. Your pairing code is "
            f"{format_code(code)} (valid for {minutes} minute{'s' if minutes != 1 else ''}). "
            f"Send it to the admin; once it is approved, write to me again.")


class Access:
    def __init__(self, store: SqliteStore, config: Callable[[], AccessConfig], notify: Notify,
                 *, is_command: Callable[[str], bool] = lambda text: False,
                 limiter: RateLimiter | None = None, refusals: OncePer | None = None,
                 reminders: OncePer | None = None):
        self.pairing = PairingStore(store)
        self.config = config  # read on every message: pluto.yaml reloads apply at once
        self.notify = notify
        self.is_command = is_command
        self.limiter = limiter or RateLimiter()
        self.refusals = refusals or OncePer(REFUSAL_EVERY)
        self.reminders = reminders or OncePer(PAIRING_REMINDER_EVERY)

    async def open(self) -> None:
        await self.pairing.migrate()

    async def admit(self, msg: IncomingMessage, table: RoutingTable) -> Route | None:
        """The route for a message that may go on to its agent, or None (handled here)."""
        decision = table.decide(msg)
        where = f"{msg.provider} chat {msg.chat_id} user {msg.user_id}"
        if decision.outcome in ("deny", "unmatched"):
            log.info("%s: not admitted (%s); ignored", where, decision.label)
            await self._refuse(msg)
            return None
        if decision.outcome == "needs_mention":
            log.debug("%s: %s answers groups only when mentioned", where, decision.label)
            return None
        if decision.policy.access == "pairing" and not await self._paired(msg, where):
            return None
        if not self.is_command(msg.text) and await self._over_limit(msg, decision, where):
            return None
        return decision.route

    async def _refuse(self, msg: IncomingMessage) -> None:
        text = self.config().refusal
        if text and msg.is_direct and self.refusals.due((msg.provider, msg.user_id)):
            await self.notify(msg, text)

    async def _paired(self, msg: IncomingMessage, where: str) -> bool:
        if await self.pairing.is_approved(msg.provider, msg.user_id):
            return True
        if not msg.is_direct:
            log.info("%s: not paired; group message ignored", where)
            return False
        ttl = self.config().pairing_ttl_seconds
        req = await self.pairing.request(msg.provider, msg.user_id, msg.chat_id, msg.user_name,
                                         ttl)
        if req.new:
            log.warning("pairing: %s (%s) asks for access; approve with: pluto pairing approve "
                        "%s", where, msg.user_name or "no name", req.code)
        if self.reminders.due((msg.provider, msg.user_id, req.code)):  # a new code: always
            await self.notify(msg, pairing_text(req.code, req.expires_at - req.created_at))
        return False

    async def _over_limit(self, msg: IncomingMessage, decision: Decision, where: str) -> bool:
        spec = decision.policy.rate_limit
        if spec is None:
            return False
        limits = []
        for scope, rate in spec.rates():
            who = msg.user_id if scope == "user" else msg.chat_id
            limits.append(((decision.label, str(spec), scope, msg.provider, who), rate))
        limited = self.limiter.acquire(limits)
        if limited is None:
            return False
        over = str(limited.key[2])  # type: ignore[index]
        log.info("%s: over the %s limit of %s (%s)", where, over, decision.label, limited.rate)
        if limited.notify:
            await self.notify(msg, limited_notice(limited, over))
        return True
