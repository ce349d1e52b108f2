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

import inspect
import logging
from collections.abc import Callable

from pluto.gateway.pipeline.ratelimit import (OncePer, RateLimiter, SharedRateLimiter,
                                              limited_notice)
from pluto.gateway.pipeline.routing import Decision, RoutingTable
from pluto.settings import AccessConfig
from pluto.storage.ports import PairingStore
from pluto.storage.rows import format_code
from pluto.types import IncomingMessage, Refused, Route

log = logging.getLogger(__name__)

REFUSAL_EVERY = 600.0
PAIRING_REMINDER_EVERY = 60.0


def pairing_text(code: str, ttl: float) -> str:
    minutes = max(1, round(ttl / 60))
    return (f"Hi! I only talk to people an admin has approved. Your pairing code is "
            f"{format_code(code)} (valid for {minutes} minute{'s' if minutes != 1 else ''}). "
            f"Send it to the admin; once it is approved, write to me again.")


class Access:
    def __init__(self, pairing: PairingStore, config: Callable[[], AccessConfig], *,
                 is_command: Callable[[str], bool] = lambda text: False,
                 limiter: RateLimiter | SharedRateLimiter | None = None,
                 refusals: OncePer | None = None,
                 reminders: OncePer | None = None):
        self.pairing = pairing
        self.config = config  # read on every message: pluto.yaml reloads apply at once
        self.is_command = is_command
        self.limiter = limiter if limiter is not None else RateLimiter()
        self.refusals = refusals if refusals is not None else OncePer(REFUSAL_EVERY)
        self.reminders = reminders if reminders is not None else OncePer(PAIRING_REMINDER_EVERY)

    async def admit(self, msg: IncomingMessage, table: RoutingTable) -> Route | Refused:
        """The route of a message that may go on to its agent, or why not (with the one line
        the chat should be told, if any)."""
        decision = table.decide(msg)
        where = f"{msg.provider} chat {msg.chat_id} user {msg.user_id}"
        if decision.outcome in ("deny", "unmatched"):
            log.info("%s: not admitted (%s); ignored", where, decision.label)
            return Refused(f"not admitted ({decision.label})", self._refusal(msg))
        if decision.outcome == "needs_mention":
            log.debug("%s: %s answers groups only when mentioned", where, decision.label)
            return Refused(f"{decision.label} answers groups only when mentioned")
        if decision.policy.access == "pairing" and (refused := await self._unpaired(msg, where)):
            return refused
        if not self.is_command(msg.text) and (
                refused := await self._over_limit(msg, decision, where)):
            return refused
        assert decision.route is not None
        return decision.route

    def _refusal(self, msg: IncomingMessage) -> str | None:
        text = self.config().refusal
        if text and msg.is_direct and self.refusals.due((msg.provider, msg.user_id)):
            return text
        return None

    async def _unpaired(self, msg: IncomingMessage, where: str) -> Refused | None:
        if await self.pairing.is_approved(msg.provider, msg.user_id):
            return None
        if not msg.is_direct:
            log.info("%s: not paired; group message ignored", where)
            return Refused("not paired (a group message)")
        ttl = self.config().pairing_ttl_seconds
        req = await self.pairing.request(msg.provider, msg.user_id, msg.chat_id, msg.user_name,
                                         ttl)
        if req.new:
            log.warning("pairing: %s (%s) asks for access; approve with: pluto pairing approve "
                        "%s", where, msg.user_name or "no name", req.code)
        notice = None
        if self.reminders.due((msg.provider, msg.user_id, req.code)):  # a new code: always
            notice = pairing_text(req.code, req.expires_at - req.created_at)
        return Refused("waiting for an admin to approve the pairing code", notice)

    async def _over_limit(self, msg: IncomingMessage, decision: Decision,
                          where: str) -> Refused | None:
        spec = decision.policy.rate_limit
        if spec is None:
            return None
        limits = []
        for scope, rate in spec.rates():
            who = msg.user_id if scope == "user" else msg.chat_id
            limits.append(((decision.label, str(spec), scope, msg.provider, who), rate))
        limited = self.limiter.acquire(limits)
        if inspect.isawaitable(limited):  # kept in the database (several instances)
            limited = await limited
        if limited is None:
            return None
        over = str(limited.key[2])  # type: ignore[index]
        log.info("%s: over the %s limit of %s (%s)", where, over, decision.label, limited.rate)
        return Refused(f"over the {over} rate limit of {decision.label}",
                       limited_notice(limited, over) if limited.notify else None)
