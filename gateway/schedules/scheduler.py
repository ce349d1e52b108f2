"""The gateway's scheduler: it wakes at the next due time, claims due firings and runs each
as a message in its chat.

One task per gateway. It sleeps until the soonest ``next_due`` among the schedules into the
providers this instance runs (at most :attr:`Scheduler.max_wait`, so a schedule added by
another process or instance is seen soon; :meth:`Scheduler.wake` when one is added here), then
claims every due firing with one statement each (storage: several instances, one firing) and
hands it to the pipeline as a message of the schedule's chat, from its owner, with its prompt,
for its agent — the answer goes out through the outbox like any answer. A firing later than
``misfire_grace`` is recorded ``missed`` and not run. The run's events pass through
:func:`heartbeat`: the answer is sent whole (no live preview), and an answer that is exactly
"nothing to report" (or empty) is not sent at all.

A crash between the claim and the hand-over leaves the firing ``claimed`` with no run: once its
instance is no longer alive (and the claim is :data:`TAKEOVER_AFTER` old), a live instance
takes it over with one statement and runs it — within the grace; later, it is recorded
``missed`` (:meth:`Scheduler.recover`, at start and every minute).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pluto.errors import RunTakenOver
from pluto.events import MessageDelta, MessageFinal, RunEnd, RunEvent
from pluto.gateway.pipeline.routing import RoutingTable, session_key
from pluto.gateway.schedules.config import (ScheduleConfig, ScheduleFileWatcher, ScheduleSettings,
                                            load_schedules)
from pluto.gateway.schedules.recurrence import BadTime, When
from pluto.ids import new_id
from pluto.storage.ports import ScheduleStore, TaskStore
from pluto.storage.sql.schedules import PENDING, Firing, Schedule
from pluto.types import Accepted, Dropped, IncomingMessage, Outcome, Route, SessionScope

log = logging.getLogger(__name__)

MAX_WAIT = 15.0  # seconds: the longest sleep between looks (schedules made elsewhere)
RECOVER_EVERY = 60.0  # seconds between looks for firings a stopped instance left
TAKEOVER_AFTER = 30.0  # a firing claimed this long ago and never handed over is stranded
ENDED = {"ok": "ran", "cancelled": "stopped"}  # a run's end -> its firing's outcome
_QUIET = re.compile(r"^\W*(nothing to report)?\W*$", re.I)


def is_quiet(text: str) -> bool:
    """An answer that says nothing needs attention: empty, or "nothing to report"."""
    return bool(_QUIET.match(text.strip()))


async def add_schedule(store: ScheduleStore, *, source: str, owner: tuple[str, str] | None,
                       provider: str, chat_id: str, agent: str, prompt: str, when: When,
                       created_by: str, thread_id: str | None = None,
                       is_direct: bool = True) -> Schedule:
    """Record a new schedule (checked: a one-off in the past is refused)."""
    when.check()
    now = await store.now()
    first = when.first(now)
    if first is None or (when.kind == "at" and first <= now):
        raise BadTime("That time has already passed; give one in the future.")
    return await store.add(Schedule(
        id=new_id()[:8], source=source, owner_provider=owner[0] if owner else None,
        owner_user=owner[1] if owner else None, provider=provider, chat_id=chat_id,
        thread_id=thread_id, is_direct=is_direct, agent=agent, prompt=prompt, kind=when.kind,
        expr=when.expr, tz=when.tz, next_due=first, created_by=created_by, created_at=now,
        active=True))


class Scheduler:
    def __init__(self, store: ScheduleStore, *, pipeline: Any, providers: Mapping[str, Any],
                 routes: Callable[[], RoutingTable], config_dir: Path | None = None,
                 agents: Callable[[], Collection[str]] = lambda: (), instance: str = "local",
                 reload_interval: Callable[[], float] = lambda: 0.0, metrics: Any = None,
                 alive: Callable[[], Awaitable[set[str]]] | None = None,
                 tasks: TaskStore | None = None, intakes: Mapping[str, Any] | None = None):
        self.store = store
        # each provider's intake (a firing enters its chat's inbox like a message); None or
        # missing: straight into the pipeline (the chat's order is then the session lane's)
        self.intakes: Mapping[str, Any] = intakes if intakes is not None else {}
        self.tasks = tasks  # the HTTP API's tasks: a firing into one is a step of it
        self.pipeline = pipeline
        self.providers = providers
        self.routes = routes
        self.config_dir = config_dir
        self.agents = agents
        self.instance = instance
        self.metrics = metrics
        self.alive = alive  # the ids of the live instances (stranded firings are adopted)
        self.takeover_after = TAKEOVER_AFTER
        self._recovered_at = -RECOVER_EVERY
        self.config = ScheduleConfig()
        self.max_wait = MAX_WAIT
        # False: schedules are read and checked, never fired here (``pluto run``: one turn)
        self.fires = True
        self.watcher = ScheduleFileWatcher(config_dir, lambda: set(self.agents()),
                                           self.apply_file, reload_interval) \
            if config_dir is not None else None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.next_firing: float | None = None  # the soonest due time seen (for /readyz)

    @property
    def settings(self) -> ScheduleSettings:
        return self.config.settings

    async def load(self) -> None:
        """schedules.yaml read and applied (at start: a bad file stops the start, naming file
        and line, like routes.yaml)."""
        if self.config_dir is None:
            return
        now = await self.store.now()
        config = await asyncio.to_thread(load_schedules, self.config_dir,
                                         set(self.agents()), now)
        await self.apply_file(config)
        if self.watcher is not None:
            await self.watcher.remember()  # (the version applied: read again once it changes)

    def start(self, *, watch: bool = False) -> None:
        if self._task is None and self.fires:
            self._task = asyncio.create_task(self._run(), name="scheduler")
        if watch and self.watcher is not None:
            self.watcher.start()

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def wake(self) -> None:
        """Look again now (a schedule was added or changed here)."""
        self._wake.set()

    async def _run(self) -> None:
        """Idle, one statement a look: now and the soonest due time; the due rows are read
        (and claimed) only when one is due."""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            wait = self.max_wait
            began = loop.time()
            try:
                if self.providers and began - self._recovered_at >= RECOVER_EVERY:
                    self._recovered_at = began
                    await self.recover()
                now, soonest = await self.store.soonest(list(self.providers))
                self.next_firing = soonest
                if soonest is not None and soonest <= now:
                    await self.tick()
                    continue  # (then look again: more may be due)
                if soonest is not None:  # (``now`` was read as the look began)
                    wait = min(self.max_wait, max(0.0, soonest - now - (loop.time() - began)))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - storage away: the next look tries again
                log.warning("scheduler: looking for due schedules failed: %s", e)
            if wait > 0:  # until woken, or the wait is over
                timer = loop.call_later(wait, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()

    async def recover(self) -> int:
        """Firings claimed by an instance that stopped before it handed them over (a crash in
        between): taken over by one statement each and run now — or, later than the grace,
        recorded missed. How many were found."""
        if self.alive is None or not self.providers:
            return 0
        found = await self.store.stranded({self.instance}, self.takeover_after,
                                          list(self.providers))
        if found:  # (who is alive is asked only then: idle, one statement a minute)
            alive = await self.alive() | {self.instance}
            found = [(f, s) for f, s in found if (f.instance or "") not in alive]
        if not found:
            return 0
        now = await self.store.now()
        grace = self.settings.misfire_grace
        for firing, schedule in found:
            if not await self.store.adopt(firing, self.instance, now=now):
                continue  # another instance took it
            if now - firing.due > grace:
                await self.store.fired(firing.id, "missed", detail="its instance stopped "
                                       "before running it, and the grace is over")
                self._count("missed")
                continue
            log.warning("schedule %s: the firing due %.0f s ago was claimed by an instance "
                        "that stopped before running it; running it now", schedule.id,
                        now - firing.due)
            await self._fire(schedule, replace(firing, instance=self.instance))
        return len(found)

    async def tick(self) -> float:
        """One look: every due firing into this instance's providers claimed and handed over;
        returns now (the database's clock)."""
        if not self.providers:
            return await self.store.now()
        now, due = await self.store.due(providers=list(self.providers))
        grace = self.settings.misfire_grace
        for schedule in due:
            firing = await self._claim(schedule, now, grace)
            if firing is None:
                continue
            if firing.outcome == "missed":
                log.warning("schedule %s: the firing due %.0f s ago was missed (later than "
                            "the %.0f s grace); not run", schedule.id, now - firing.due, grace)
                self._count("missed")
                continue
            await self._fire(schedule, firing)
        return now

    async def _claim(self, schedule: Schedule, now: float, grace: float) -> Firing | None:
        when = When(schedule.kind, schedule.expr, schedule.tz)
        try:
            nxt = when.next_after(now, anchor=schedule.next_due)
        except (BadTime, ValueError) as e:  # (checked when made: a zone gone from the system)
            log.error("schedule %s cannot be computed any more (%s); it is stopped",
                      schedule.id, e)
            nxt = None
        late = now - (schedule.next_due or now)
        return await self.store.claim(schedule, now=now, next_due=nxt, missed=late > grace,
                                      instance=self.instance)

    async def _fire(self, schedule: Schedule, firing: Firing) -> None:
        """Hand the firing over: into its chat's inbox as a message, so whoever holds the chat
        (this instance or another) runs it in its turn — after what people sent before it,
        never beside it (:meth:`take`). The API's chats are its tasks: there it is a step."""
        if schedule.provider not in self.providers:  # (removed meanwhile)
            await self.store.fired(firing.id, "failed", detail=f"the provider "
                                   f"{schedule.provider} is not running")
            return
        msg = IncomingMessage(provider=schedule.provider, chat_id=schedule.chat_id,
                              user_id=schedule.owner_user or "scheduler", text=schedule.prompt,
                              message_id=f"schedule:{firing.id}", thread_id=schedule.thread_id,
                              is_direct=schedule.is_direct, mentions_bot=True, firing=firing.id)
        intake = self.intakes.get(schedule.provider)
        if schedule.provider == "api" or intake is None:  # (no inbox: no message id)
            await self._start(schedule, firing, replace(msg, message_id=None))
            return
        try:
            ticket = await intake.submit(msg)  # (recorded in the inbox: a crash loses nothing)
        except Exception as e:  # noqa: BLE001 - storage away: claimed, adopted later
            log.warning("schedule %s: handing the firing over failed (%s); it is taken up "
                        "again once its claim is stale", schedule.id, e)
            return
        if ticket.done() and isinstance(stopping := await ticket.outcome(), Dropped):
            log.warning("schedule %s: the firing was not handed over (%s)", schedule.id,
                        stopping.reason)  # (left claimed: taken up once this one is gone)
            return
        await self.store.queued(firing.id)  # (Duplicate: handed over before a crash)

    async def take(self, msg: IncomingMessage) -> Outcome:
        """A firing's message, its chat's turn come (on whichever instance holds the chat,
        also after a restart): started in the schedule's session."""
        firing = await self.store.firing(msg.firing) if msg.firing is not None else None
        schedule = await self.store.get(firing.schedule_id) if firing is not None else None
        if firing is None or schedule is None:
            return Dropped("the schedule's firing is gone")
        if firing.outcome not in PENDING:
            return Dropped(f"the schedule's firing is over ({firing.outcome})")
        return await self._start(schedule, firing, msg)

    async def _start(self, schedule: Schedule, firing: Firing,
                     msg: IncomingMessage) -> Outcome:
        route = self._route(schedule, msg)
        step = None
        if schedule.provider == "api" and self.tasks is not None:
            # (the API's chats are its tasks: the firing is a step of the task, so a client
            # reading the task finds the answer among its steps, as it finds its own)
            if await self.tasks.task(schedule.chat_id) is None:
                await self.store.fired(firing.id, "failed", detail=f"the API task "
                                       f"{schedule.chat_id} does not exist (any more)")
                self._count("failed")
                return Dropped("the API task is gone")
            step = await self.tasks.add_step(schedule.chat_id, schedule.prompt,
                                             {"schedule": schedule.id})
        try:
            outcome = await self.pipeline.submit(msg, route, wrap=self._heartbeat(firing))
        except RunTakenOver:
            # its message is answered by another run already (after a restart the inbox's
            # replay and the recovery of claimed firings may both hand it over): that run
            # records the firing; this is no failure
            log.info("schedule %s: the firing is answered by another run", schedule.id)
            if step is not None and self.tasks is not None:
                await self.tasks.answered(step.id, error="The scheduled message is answered "
                                          "in another step.")
            return Dropped("the firing is answered by another run")
        except Exception as e:  # noqa: BLE001 - recorded; the scheduler goes on
            log.exception("schedule %s: handing the firing over failed", schedule.id)
            await self.store.fired(firing.id, "failed", detail=str(e)[:500])
            self._count("failed")
            if step is not None and self.tasks is not None:
                await self.tasks.answered(step.id, error="The scheduled message could not be "
                                          "handed over (a problem on our side).")
            return Dropped("the firing could not be handed over")
        if isinstance(outcome, Accepted):
            if step is not None and self.tasks is not None:
                await self.tasks.started(step.id, outcome.run_id)
            await self.store.fired(firing.id, None, run_id=outcome.run_id)
        else:
            if step is not None and self.tasks is not None:
                await self.tasks.answered(step.id, error=f"The scheduled message was not "
                                          f"taken: {outcome}")
            await self.store.fired(firing.id, "failed", detail=str(outcome)[:500])
            self._count("failed")
        return outcome

    def _route(self, schedule: Schedule, msg: IncomingMessage) -> Route:
        """The chat's own route when it goes to the schedule's agent (its session, tools and
        rule: budgets apply); else the agent in the chat's session of its own."""
        decision = self.routes().decide(msg)
        if decision.route is not None and decision.route.agent == schedule.agent:
            return decision.route
        scope: SessionScope = "thread" if schedule.thread_id else "chat"
        return Route(agent=schedule.agent, session_key=session_key(schedule.agent, scope, msg),
                     rule=f"schedule:{schedule.id}")

    def _heartbeat(self, firing: Firing) -> Callable[[AsyncIterator[RunEvent]],
                                                     AsyncIterator[RunEvent]]:
        async def wrap(events: AsyncIterator[RunEvent]) -> AsyncIterator[RunEvent]:
            outcome: str | None = None
            try:
                async for event in events:
                    match event:
                        case MessageDelta():
                            continue  # the answer goes out whole, or not at all
                        case MessageFinal(text=text) if is_quiet(text):
                            outcome = "quiet"
                            continue
                        case RunEnd(outcome=ended) if ended != "ok" or outcome is None:
                            outcome = ENDED.get(ended, "failed")
                    yield event
            except (asyncio.CancelledError, GeneratorExit):  # /stop, or the gateway stopping
                outcome = outcome or "stopped"
                raise
            finally:
                outcome = outcome or "failed"
                self._count(outcome)
                try:
                    await self.store.fired(firing.id, outcome)
                except Exception as e:  # noqa: BLE001 - history only
                    log.warning("schedule firing %d: recording its outcome failed: %s",
                                firing.id, e)
        return wrap

    def _count(self, outcome: str) -> None:
        counter = getattr(self.metrics, "schedule_firing", None)
        if counter is not None:
            counter(outcome)

    # schedules.yaml ---------------------------------------------------------------------

    async def apply_file(self, config: ScheduleConfig) -> None:
        """The file's schedules put in storage (each under file:NAME); those gone stopped."""
        self.config = config
        now = await self.store.now()
        existing = {s.id: s for s in await self.store.list(source="file", active=False)}
        for planned in config.schedules:
            old = existing.pop(planned.id, None)
            when, spec = planned.when, planned.spec
            same_when = old is not None and (old.kind, old.expr, old.tz) == (
                when.kind, when.expr, when.tz)
            if old is not None and same_when:
                next_due, active = old.next_due, old.active and spec.active
                if spec.active and not old.active and when.kind != "at":
                    next_due, active = when.next_after(now), True
            else:
                next_due = when.first(now)
                active = spec.active and next_due is not None and (
                    when.kind != "at" or next_due > now)
            row = Schedule(
                id=planned.id, source="file", owner_provider=None, owner_user=None,
                provider=planned.provider, chat_id=planned.chat_id,
                thread_id=planned.thread_id, is_direct=spec.direct, agent=spec.agent,
                prompt=spec.prompt, kind=when.kind, expr=when.expr, tz=when.tz,
                next_due=next_due if active else None, created_by=f"file:{config.source}",
                created_at=old.created_at if old is not None else now, active=active)
            if old is None or replace(old, created_by=row.created_by) != row:
                # (its due time untouched when only what it says changed: a firing being
                # claimed meanwhile, here or on another instance, is not fired again)
                await self.store.put(row, keep_due=old is not None and (
                    old.next_due, old.active) == (row.next_due, row.active))
        for gone in existing.values():
            if gone.active:
                await self.store.cancel(gone.id)
                log.info("schedule %s is no longer in %s: stopped", gone.id, config.source)
        self.wake()
