"""Metering: what each model call cost, written to the ledger as it ends, and budgets.

The Runner hands every model call — each attempt of it, retries and cancelled ones included —
to :meth:`UsageMeter.record` with the tokens the model itself reported (or, when it reported
none, the runner's estimate, marked so). The cost comes from ``usage.prices`` in pluto.yaml
when the model is priced there (local or unknown models), else from litellm's offline price
list (the JSON file litellm ships, read once in a worker thread; litellm itself is not
imported for it), else it is unknown (None), never guessed.

Budgets (``usage.budgets``) limit the tokens or money an agent, route, user or chat spends per
day or month (UTC). Before each model call :meth:`UsageMeter.reserve` takes the call's
estimated maximum — its prompt plus the longest answer it may write (``max_output_tokens``, else
:data:`DEFAULT_MAX_OUTPUT`), and what that would cost — from the running counter of every budget
that applies, atomically in the database (so it holds across instances); a call whose budget
has no room left is refused with :class:`BudgetExceeded`, whose text is one sentence for the
person, and observers are told (log, metrics); when only other calls' reservations (not what
was spent) leave no room, it first waits a little for them to settle. The call's ledger row settles it: the real usage
is added and the reservation given back in one transaction (a failed call gives all of it
back). Parallel calls therefore pass a budget by at most one call's maximum answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pluto.runtime.errors import BudgetExceeded
from pluto.settings import Budget, ModelPrice
from pluto.storage.ports import UsageStore
from pluto.storage.sql.usage import Claim, Reservation, UsageCall

log = logging.getLogger(__name__)

__all__ = ["Attribution", "Prices", "Reservation", "UsageCall", "UsageMeter", "parse_since",
           "period_start"]

DEFAULT_MAX_OUTPUT = 4096  # tokens reserved for an answer when its model sets no maximum
RESERVATION_POLL = 0.1  # seconds between tries while the room left is held by calls in flight


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who a run answers: the chat platform, the person, the chat, the route's rule."""

    provider: str = ""
    user_id: str = ""
    chat_id: str = ""
    route: str = ""
    received: float = 0.0  # when the message arrived (time.time()), for its trace
    origin: str = "message"  # message | schedule (a firing of a schedule: the gateway's own)


# litellm's offline price list: read once per process, in a thread --------------------------

_PRICE_FILE = "model_prices_and_context_window_backup.json"  # shipped in litellm's package
_cost_map: dict[str, Any] | None = None
_cost_map_lock = threading.Lock()


def _read_cost_map() -> dict[str, Any]:
    global _cost_map
    with _cost_map_lock:
        if _cost_map is None:
            found: dict[str, Any] = {}
            try:  # a plain file lookup: neither litellm nor the import machinery is asked
                path = next((p for p in (Path(d) / "litellm" / _PRICE_FILE for d in sys.path
                                         if d) if p.is_file()), None)
                if path is not None:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    found = {k: v for k, v in data.items() if isinstance(v, dict)}
            except (OSError, ValueError) as e:
                log.warning("litellm's price list could not be read (costs stay unknown "
                            "unless usage.prices names the model): %s", e)
            _cost_map = found
        return _cost_map


class Prices:
    """USD per token of a model: pluto.yaml's ``usage.prices`` first, then litellm's list."""

    def __init__(self, configured: Mapping[str, ModelPrice]
                 | Callable[[], Mapping[str, ModelPrice]] | None = None):
        # a function: read at each call (a live reload of pluto.yaml applies at once)
        self._configured = configured if callable(configured) else (lambda: configured or {})
        self._map: dict[str, Any] | None = _cost_map

    async def load(self) -> None:
        if self._map is None:
            self._map = await asyncio.to_thread(_read_cost_map)

    def cost(self, models: Iterable[str], input_tokens: int, output_tokens: int,
             cached_tokens: int = 0) -> float | None:
        """The cost of a call to the first of ``models`` (its names) that has a price; None
        when none has. Cached input tokens are part of ``input_tokens``, priced apart."""
        cached = min(max(0, cached_tokens), input_tokens)
        fresh = input_tokens - cached
        names = list(models)
        configured = self._configured()
        for name in names:
            if (p := configured.get(name)) is not None:
                cached_price = p.input if p.cached is None else p.cached
                return (fresh * p.input + cached * cached_price + output_tokens * p.output) / 1e6
        for name in names:
            entry = self._lookup(name)
            if entry is None:
                continue
            inp = entry.get("input_cost_per_token")
            out = entry.get("output_cost_per_token")
            if not isinstance(inp, int | float) or not isinstance(out, int | float):
                continue
            listed = entry.get("cache_read_input_token_cost")
            per_cached = listed if isinstance(listed, int | float) else inp
            return fresh * inp + cached * per_cached + output_tokens * out
        return None

    def _lookup(self, name: str) -> dict[str, Any] | None:
        table = self._map or {}
        if name in table:
            return table[name]
        _, _, bare = name.partition("/")  # openai/gpt-4o-mini is listed as gpt-4o-mini
        return table.get(bare) if bare else None


# budgets -----------------------------------------------------------------------------------

def period_start(period: str, now: float) -> float:
    """The start (UTC) of the day or month that ``now`` is in."""
    t = datetime.fromtimestamp(now, UTC)
    t = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        t = t.replace(day=1)
    return t.timestamp()


def parse_since(text: str, now: float) -> float:
    """A start time from ``--since``; ValueError with a sentence when it is not one."""
    text = text.strip()
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text):
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]
        return now - float(m.group(1)) * unit
    if text in ("today", "day"):
        return period_start("day", now)
    if text == "month":
        return period_start("month", now)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use 30m, 24h, 7d, today, month or "
                         f"a date like 2026-11-01") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _renews(period: str) -> str:
    return "at midnight UTC" if period == "day" else "on the 1st of next month (UTC)"


def _whose(scope: str) -> str:
    return {"user": "You have", "chat": "This chat has", "agent": "This assistant has",
            "route": "Conversations here have"}[scope]


def budget_sentence(budget: Budget, used_tokens: int, used_cost: float) -> str:
    """The one sentence a person is told when a budget stops a run."""
    period = "daily" if budget.period == "day" else "monthly"
    limits = []
    if budget.tokens is not None:
        limits.append(f"{budget.tokens:,} tokens")
    if budget.cost is not None:
        limits.append(f"${budget.cost:,.2f}")
    return (f"{_whose(budget.per)} reached the {period} usage limit of "
            f"{' / '.join(limits)}, so I can't answer now; it renews {_renews(budget.period)}.")


def scope_key(scope: str, agent: str, who: Attribution) -> str:
    match scope:
        case "agent":
            return agent
        case "route":
            return who.route
        case "user":
            return f"{who.provider}:{who.user_id}"
        case _:
            return f"{who.provider}:{who.chat_id}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A budget that stopped a call: for the log and metrics."""

    budget: Budget
    key: str
    used_tokens: int
    used_cost: float


class UsageMeter:
    """Writes the ledger and keeps the budgets (see the module's docstring)."""

    def __init__(self, store: UsageStore, *, prices: Prices | None = None,
                 budgets: Callable[[], list[Budget]] = list,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.prices = prices or Prices()
        self.budgets = budgets  # read at each check: a reload of pluto.yaml applies at once
        self.clock = clock
        self.on_record: list[Callable[[UsageCall], None]] = []
        self.on_refusal: list[Callable[[Refusal], None]] = []
        # how long a call waits for calls in flight to give back what they did not use, when
        # only their reservations (not what was spent) leave no room for it
        self.reservation_wait = 10.0

    async def record(self, call: UsageCall, models: Iterable[str] = (),
                     release: Reservation | None = None) -> UsageCall:
        """Price the call (by its model, then by ``models``: other names of it), write it and
        give ``release`` back in the same transaction, tell the observers; the row as
        written."""
        call = await self.priced(call, models)
        await self.store.record(call, self._periods(),
                                release=release)
        self._observed(call)
        return call

    async def priced(self, call: UsageCall, models: Iterable[str] = ()) -> UsageCall:
        """The call with its cost, when the price tables know its model (or ``models``)."""
        if call.cost is None:
            await self.prices.load()
            cost = self.prices.cost([call.model, *models], call.input_tokens,
                                    call.output_tokens, call.cached_tokens)
            if cost is not None:
                call = replace(call, cost=cost)
        return call

    def record_soon(self, call: UsageCall,
                    release: Reservation | None = None) -> asyncio.Future[Any]:
        """Write a priced call with the next commit (one commit with the answer that follows
        it), giving ``release`` back in it; the observers are told once it is committed.
        Whoever holds the future awaits it (a failure is its to log)."""
        written = self.store.record_soon(call, self._periods(),
                                         release=release)

        def committed(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                self._observed(call)
        written.add_done_callback(committed)
        return written

    def _periods(self) -> dict[str, float]:
        now = self.clock()
        return {p: period_start(p, now) for p in ("day", "month")}

    def _observed(self, call: UsageCall) -> None:
        for observe in self.on_record:
            try:
                observe(call)
            except Exception:
                log.exception("a usage observer failed")

    async def reserve(self, agent: str, who: Attribution, *, prompt_tokens: int,
                      max_output: int | None, models: Iterable[str] = ()) -> Reservation | None:
        """Take a call's estimated maximum from every budget that applies, or raise
        :class:`BudgetExceeded` (nothing taken) when one has no room for its prompt; None when
        no budget applies or the counters cannot be reached (the answer goes on, logged)."""
        budgets = self.budgets()
        now = self.clock()
        claims = {}
        for budget in budgets:
            key = scope_key(budget.per, agent, who)
            if budget.only is not None and budget.only != key:
                continue
            claim = Claim(budget.per, key, budget.period, period_start(budget.period, now),
                          budget.tokens, budget.cost)
            claims[(claim.scope, claim.key, claim.period)] = (claim, budget)
        if not claims:
            return None
        order = sorted(claims)  # one lock order for every instance: no deadlock
        tokens = prompt_tokens + (max_output or DEFAULT_MAX_OUTPUT)
        await self.prices.load()
        cost = self.prices.cost(list(models), prompt_tokens, tokens - prompt_tokens) or 0.0
        held = Reservation(tuple(claims[k][0] for k in order), tokens, cost)
        waited = 0.0
        while True:
            try:
                full = await self.store.reserve(
                    held.claims, tokens, cost, prompt_tokens)
                if full is None:
                    return held
                claim, budget = claims[order[full]]
                spent = await self.store.spent(claim.scope, claim.key, claim.period,
                                               claim.start)
            except Exception:  # the counters cannot be reached: the answer goes on, says so
                log.exception("usage budgets of %s could not be checked", agent)
                return None
            held_back = ((budget.tokens is None
                          or spent.total_tokens + prompt_tokens <= budget.tokens)
                         and (budget.cost is None or spent.cost < budget.cost))
            if not held_back or waited >= self.reservation_wait:
                self._refuse(budget, claim.key, spent.total_tokens, spent.cost, prompt_tokens)
            # the room left is held by calls in flight: what they do not use comes back soon
            await asyncio.sleep(RESERVATION_POLL)
            waited += RESERVATION_POLL

    async def release(self, reservation: Reservation | None) -> None:
        """Give back a reservation whose call was never made (logged when it cannot be)."""
        if reservation is None:
            return
        try:
            await self.store.release(reservation)
        except Exception:
            log.exception("a usage reservation could not be given back")

    def _refuse(self, budget: Budget, key: str, tokens: int, cost: float,
                upcoming: int) -> None:
        refusal = Refusal(budget, key, tokens, cost)
        log.warning("usage budget reached: %s %s, %s per %s (used %d tokens, $%.4f; "
                    "the next call's prompt is about %d more)", budget.per, key,
                    _limits(budget), budget.period, tokens, cost, upcoming)
        for observe in self.on_refusal:
            observe(refusal)
        raise BudgetExceeded(budget_sentence(budget, tokens, cost), "usage")

    async def check(self, agent: str, who: Attribution, *, upcoming_tokens: int = 0,
                    models: Iterable[str] = ()) -> None:
        """Raise :class:`BudgetExceeded` when a budget that applies is spent, or would be by a
        call of ``upcoming_tokens`` more (an estimate of its prompt)."""
        budgets = self.budgets()
        if not budgets:
            return
        now = self.clock()
        for budget in budgets:
            key = scope_key(budget.per, agent, who)
            if budget.only is not None and budget.only != key:
                continue
            try:
                spent = await self.store.spent(budget.per, key, budget.period,
                                               period_start(budget.period, now))
            except Exception:  # the ledger cannot be read: the answer goes on, and says so
                log.exception("usage budget per %s of %s could not be checked", budget.per, key)
                continue
            over = budget.tokens is not None and (
                spent.total_tokens + upcoming_tokens > budget.tokens)
            over = over or (budget.cost is not None and spent.cost >= budget.cost)
            if over:
                self._refuse(budget, key, spent.total_tokens, spent.cost, upcoming_tokens)

    async def status(self) -> list[dict[str, Any]]:
        """Each budget with what its keys spent this period (the admin's view)."""
        now = self.clock()
        out = []
        resets = await self.store.resets()
        for budget in self.budgets():
            since = period_start(budget.period, now)
            if budget.only is not None:
                totals = [await self.store.spent(budget.per, budget.only, budget.period, since)]
            else:
                totals = await self.store.counters(budget.per, budget.period, since)
            spent = []
            for total in totals:
                key = total.key
                over = ((budget.tokens is not None and total.total_tokens >= budget.tokens)
                        or (budget.cost is not None and total.cost >= budget.cost))
                spent.append({"key": key, "total_tokens": total.total_tokens,
                              "cost": round(total.cost, 8), "over": over,
                              "reset_at": resets.get((budget.per, key))})
            out.append({"per": budget.per, "period": budget.period, "tokens": budget.tokens,
                        "cost": budget.cost, "only": budget.only, "since": since,
                        "spent": spent})
        return out

    async def reset(self, scope: str, key: str) -> None:
        """An admin's reset of ``key``'s budgets: what it spent until now no longer counts."""
        if scope not in ("agent", "route", "user", "chat"):
            raise ValueError(f"no budget per {scope!r}; one of: agent, route, user, chat")
        await self.store.reset(scope, key)
        log.warning("usage budgets of %s %s reset by an admin", scope, key)


def _limits(budget: Budget) -> str:
    parts = ([f"{budget.tokens} tokens"] if budget.tokens is not None else []) + (
        [f"${budget.cost:g}"] if budget.cost is not None else [])
    return " / ".join(parts)


