"""``/remind`` and ``/schedules``: people schedule their agent, in the chat they write from.

- ``/remind in 2h check the deploy`` — once, in two hours;
- ``/remind every weekday 9:00 sales summary`` — recurring (also ``every 30m``, ``every monday
  8:30``, ``every day 18:00``, or a cron expression: ``every 0 9 * * 1-5 …``);
- ``/remind at 2026-12-01 09:00 …`` — once, at a date and time (``at 17:30``: the next 17:30);
- ``/schedules`` lists the person's own; ``/schedules cancel ID`` stops one.

A schedule made here fires into this chat (and thread), for the agent this chat is routed to,
as the person who made it. Times are in ``settings.default_tz`` of schedules.yaml. A person
may hold ``max_per_user`` active schedules, none repeating more often than ``min_interval``;
every refusal is one sentence.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pluto.gateway.pipeline.commands import Commands, Failed
from pluto.gateway.schedules.recurrence import BadTime, format_duration, parse_spec, zone
from pluto.gateway.schedules.scheduler import add_schedule
from pluto.storage.sql.schedules import Schedule
from pluto.types import IncomingMessage, Route

if TYPE_CHECKING:
    from pluto.gateway.schedules.scheduler import Scheduler

MAX_LISTED = 50


def when_text(t: float | None, tz: str) -> str:
    if t is None:
        return "never again"
    return f"{datetime.fromtimestamp(t, zone(tz)):%Y-%m-%d %H:%M} {tz}"


def describe(s: Schedule) -> str:
    from pluto.gateway.schedules.recurrence import When

    prompt = s.prompt if len(s.prompt) <= 60 else s.prompt[:59] + "…"
    return (f"`{s.id}` — {When(s.kind, s.expr, s.tz).describe()}, next "
            f"{when_text(s.next_due, s.tz)} — {prompt}")


class ScheduleCommands:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    def register(self, commands: Commands) -> None:
        commands.add("remind", "schedule a message: /remind in 2h … or every weekday 9:00 …",
                     self._remind)
        commands.add("schedules", "list your schedules; /schedules cancel ID stops one",
                     self._schedules)

    async def _remind(self, msg: IncomingMessage, route: Route, args: str) -> str:
        if not args:
            return Failed("Say when and what, e.g. '/remind in 2h check the deploy' or "
                          "'/remind every weekday 9:00 sales summary'.")
        return await remind(self.scheduler, args, owner=(msg.provider, msg.user_id),
                            chat_id=msg.chat_id, thread_id=msg.thread_id,
                            is_direct=msg.is_direct, agent=route.agent)

    async def _schedules(self, msg: IncomingMessage, route: Route, args: str) -> str:
        store = self.scheduler.store
        owner = (msg.provider, msg.user_id)
        words = args.split()
        if words and words[0].lower() in ("cancel", "stop", "rm", "delete"):
            if len(words) != 2:
                return Failed("Say which one: /schedules cancel ID (/schedules lists them).")
            if await store.cancel(words[1].strip("`"), owner=owner):
                self.scheduler.wake()
                return f"Cancelled `{words[1].strip('`')}`."
            return Failed(f"You have no active schedule `{words[1]}`; /schedules lists yours.")
        if words:
            return Failed("/schedules lists yours; /schedules cancel ID stops one.")
        mine = await store.list(owner=owner)
        if not mine:
            return "You have no schedules. Make one with /remind in 2h check the deploy."
        lines = ["Your schedules:"] + [f"- {describe(s)}" for s in mine[:MAX_LISTED]]
        if len(mine) > MAX_LISTED:
            lines.append(f"(and {len(mine) - MAX_LISTED} more)")
        return "\n".join(lines)


async def remind(scheduler: Scheduler, words: str, *, owner: tuple[str, str], chat_id: str,
                 thread_id: str | None, is_direct: bool, agent: str) -> str:
    """A schedule made by a person (``/remind``, the ``schedule`` tool) into the chat they
    write from: checked against the limits; the answer, a :class:`Failed` when refused."""
    settings = scheduler.settings
    store = scheduler.store
    have = await store.count(owner)
    if have >= settings.max_per_user:
        return Failed(f"You have {have} schedules, the most allowed here; cancel one "
                      "first (/schedules lists them).")
    try:
        spec = parse_spec(words, settings.zone_for(owner[0], chat_id, owner[1]),
                          await store.now())
        gap = spec.when.interval()
        if gap is not None and gap < settings.min_interval:
            return Failed(f"Schedules here may repeat at most every "
                          f"{format_duration(settings.min_interval)}; "
                          f"{spec.when.describe()} is more often.")
        made = await add_schedule(
            store, source="user", owner=owner, provider=owner[0], chat_id=chat_id,
            thread_id=thread_id, is_direct=is_direct, agent=agent, prompt=spec.prompt,
            when=spec.when, created_by=f"{owner[0]}:{owner[1]}")
    except BadTime as e:
        return Failed(str(e))
    scheduler.wake()
    nxt = "" if made.kind == "at" else f", next {when_text(made.next_due, made.tz)}"
    return (f"Scheduled `{made.id}`: {spec.when.describe()}{nxt}. `/schedules cancel "
            f"{made.id}` stops it.")
