"""The ``schedule`` tool: an agent that lists it in ``agent.yaml`` (``tools: [schedule]``) can
turn "remind me Friday at 5" into a schedule in the chat it is talking in, for the person it is
talking to. The work is the gateway's (``services["schedules"]``, a :class:`ScheduleService`:
the same rules as ``/remind`` — limits, the chat written from, one-sentence refusals the model
reads and can act on); the tool only carries the call."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pluto.runtime.tools import ToolContext, ToolError, ToolResult, tool


class ScheduleService(Protocol):
    """What the tool asks of the gateway, for the person ``speaker`` (a runtime Speaker); each
    returns the sentence for the model, or raises :class:`ToolError` with the refusal."""

    async def add(self, speaker: Any, agent: str, thread_id: str | None, when: str,
                  prompt: str) -> str: ...

    async def list(self, speaker: Any) -> str: ...

    async def cancel(self, speaker: Any, schedule_id: str) -> str: ...


def _thread(session_key: str) -> str | None:
    """The thread of a thread-scoped session (``agent/provider/chat/t/THREAD``)."""
    _, sep, thread = session_key.partition("/t/")
    return (thread or None) if sep else None


@tool
async def schedule(ctx: ToolContext, action: Literal["add", "list", "cancel"], when: str = "",
                   prompt: str = "", id: str = "") -> ToolResult:
    """Schedule yourself to speak in this chat later: a reminder or a recurring check, for the
    person you are talking to. When it fires you are asked the prompt and your answer is sent
    here (an answer of exactly "nothing to report" sends nothing).

    Args:
        action: add a schedule, list this person's schedules, or cancel one by its id.
        when: For add, in the gateway's time zone: 'in 2h', 'in 30m', 'at 2026-12-01 17:00', 'at 17:00', 'every weekday 9:00', 'every monday 8:30', 'every 2h', or 'every' and a cron expression. Use current_time first to know today's date.
        prompt: For add: what you will be asked when it fires, e.g. 'Remind the user to call the bank.'
        id: For cancel: the schedule's id (from list).
    """
    service: ScheduleService | None = ctx.services.get("schedules")
    if service is None or ctx.speaker is None:
        raise ToolError("schedules can only be made from a chat of a running gateway")
    if action == "list":
        return ToolResult(await service.list(ctx.speaker))
    if action == "cancel":
        if not id.strip():
            raise ToolError("give the id of the schedule to cancel (action list shows them)")
        return ToolResult(await service.cancel(ctx.speaker, id.strip().strip("`")))
    if not when.strip() or not prompt.strip():
        raise ToolError("add needs both 'when' (e.g. 'in 2h') and 'prompt'")
    return ToolResult(await service.add(ctx.speaker, ctx.agent, _thread(ctx.session_key),
                                         when.strip(), prompt.strip()))


SCHEDULE_TOOLS = {schedule.name: schedule}
