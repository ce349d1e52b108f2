"""The scheduler in a Gateway: built with it, started once providers are added, stopped first.

``attach(gateway)`` makes the :class:`~.scheduler.Scheduler` over the gateway's store,
pipeline, providers and routes, registers ``/remind`` and ``/schedules`` and adds the next
firing to ``/readyz``; ``await start(scheduler, stack, watch=serve)`` reads schedules.yaml (a
bad file stops the start, naming file and line), starts the task (and, serving, the file's
live reload) and registers its stop on the gateway's exit stack.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from pluto.gateway.schedules.commands import ScheduleCommands
from pluto.gateway.schedules.scheduler import Scheduler
from pluto.gateway.schedules.tool import ScheduleTools


def attach(gw: Any) -> Scheduler:
    scheduler = Scheduler(
        gw.store.schedules, pipeline=gw.pipeline, providers=gw.providers,
        routes=lambda: gw.routes, config_dir=gw.config_dir, agents=gw.registry.names,
        instance=gw.instance, metrics=gw.metrics, alive=gw.cluster.alive,
        tasks=gw.store.tasks, intakes=gw.intakes,
        reload_interval=lambda: gw.config.gateway.reload_interval_seconds)
    ScheduleCommands(scheduler).register(gw.pipeline.commands)
    gw.pipeline.scheduled = scheduler.take  # a firing's message, its chat's turn come
    # (a firing claimed by an instance is adopted only once that instance is surely gone)
    scheduler.takeover_after = max(scheduler.takeover_after, 3 * gw.cluster.ttl)
    gw.runner.services["schedules"] = ScheduleTools(scheduler)  # the schedule tool's
    gw.health_reports["schedules"] = lambda: report(scheduler)
    return scheduler


def report(scheduler: Scheduler) -> dict[str, object]:
    """For /readyz: the next firing this instance knows of, and schedules.yaml's state."""
    watcher = scheduler.watcher
    return {"next_firing": scheduler.next_firing,
            "file": "refused" if watcher is not None and watcher.state.problems else "ok"}


async def start(scheduler: Scheduler, stack: AsyncExitStack, *, watch: bool) -> None:
    await scheduler.load()
    scheduler.start(watch=watch)
    stack.push_async_callback(scheduler.stop)
