"""The gateway's side of the ``schedule`` tool (:mod:`pluto.runtime.schedule_tool`): the
service it calls, under ``/remind``'s rules, for the person a run answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pluto.gateway.pipeline.commands import Failed
from pluto.gateway.schedules.commands import describe, remind
from pluto.runtime.schedule_tool import SCHEDULE_TOOLS, schedule
from pluto.runtime.tools import ToolError

if TYPE_CHECKING:
    from pluto.gateway.schedules.scheduler import Scheduler

__all__ = ["SCHEDULE_TOOLS", "ScheduleTools", "schedule"]


class ScheduleTools:
    """``services["schedules"]``: what the tool does, for ``speaker``."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    async def add(self, speaker: Any, agent: str, thread_id: str | None, when: str,
                  prompt: str) -> str:
        answer = await remind(self.scheduler, f"{when} {prompt}",
                              owner=(speaker.provider, speaker.user_id),
                              chat_id=speaker.chat_id, thread_id=thread_id,
                              is_direct=speaker.is_direct, agent=agent)
        if isinstance(answer, Failed):
            raise ToolError(str(answer))
        return answer

    async def list(self, speaker: Any) -> str:
        mine = await self.scheduler.store.list(owner=(speaker.provider, speaker.user_id))
        return "\n".join(f"- {describe(s)}" for s in mine) or "No schedules."

    async def cancel(self, speaker: Any, schedule_id: str) -> str:
        if not await self.scheduler.store.cancel(schedule_id,
                                                 owner=(speaker.provider, speaker.user_id)):
            raise ToolError(f"this person has no active schedule '{schedule_id}'")
        self.scheduler.wake()
        return f"Cancelled {schedule_id}."
