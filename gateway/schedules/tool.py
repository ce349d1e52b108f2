"""The ``schedule`` tool: an agent that lists it in ``agent.yaml`` (``tools: [schedule]``) can
turn "remind me Friday at 5" into a schedule in the chat it is talking in, for the person it is
talking to — the same rules as ``/remind`` (limits, the chat written from, one-sentence
refusals the model reads and can act on)."""

from __future__ import annotations

from typing import Any, Literal

from pluto.gateway.pipeline.commands import Failed
from pluto.gateway.schedules.commands import describe, remind
from pluto.runtime.tools import ToolContext, ToolError, ToolResult, tool


def _thread(session_key: str) -> str | None:
    """The thread of a thread-scoped session (``agent/provider/chat/t/THREAD``)."""
    _, sep, thread = session_key.partition("/t/")
    return thread or None if sep else None


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
    scheduler: Any = ctx.services.get("schedules")
    speaker: Any = getattr(ctx, "speaker", None)
    if scheduler is None or speaker is None:
        raise ToolError("schedules can only be made from a chat of a running gateway")
    owner = (speaker.provider, speaker.user_id)
    store = scheduler.store
    if action == "list":
        mine = await store.list(owner=owner)
        text = "\n".join(f"- {describe(s)}" for s in mine) or "No schedules."
        return ToolResult(text)
    if action == "cancel":
        if not id:
            raise ToolError("give the id of the schedule to cancel (action list shows them)")
        if not await store.cancel(id.strip("`"), owner=owner):
            raise ToolError(f"this person has no active schedule '{id}'")
        scheduler.wake()
        return ToolResult(f"Cancelled {id}.")
    if not when.strip() or not prompt.strip():
        raise ToolError("add needs both 'when' (e.g. 'in 2h') and 'prompt'")
    answer = await remind(scheduler, f"{when.strip()} {prompt.strip()}", owner=owner,
                          chat_id=speaker.chat_id, thread_id=_thread(ctx.session_key),
                          is_direct=speaker.is_direct, agent=ctx.agent)
    if isinstance(answer, Failed):
        raise ToolError(str(answer))
    return ToolResult(answer)


SCHEDULE_TOOLS = {schedule.name: schedule}
