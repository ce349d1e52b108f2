"""The schedule tool: "remind me today at 5pm" through a scripted model's tool call becomes
the person's schedule in their chat, under /remind's limits, and fires there."""

from __future__ import annotations

import json
from pathlib import Path

from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.test_schedules_gateway import (START, Clock, _outcome, advance, ask, clock, start,
                                          until_async)

__all__ = ["clock"]  # (the fixture)


def call(name: str, args: dict[str, object], id: str = "c1") -> ToolCall:
    return ToolCall(id, name, json.dumps(args))


async def test_an_agent_schedules_through_its_tool(config_dir: Path, data_dir: Path,
                                                   clock: Clock):
    """"Remind me Friday at 5": the model turns it into the schedule tool's call; the schedule
    is the person's, in their chat, under the same limits; it fires there."""
    agent = config_dir / "agents" / "default" / "agent.yaml"
    agent.write_text(agent.read_text().replace("tools: [current_time,",
                                               "tools: [schedule, current_time,"))
    model = ScriptedModel(
        Scripted(tool_calls=[call("schedule", {"action": "add", "when": "at 2027-01-15 17:00",
                                               "prompt": "Remind them to call the bank."})]),
        Scripted(text="Done: I'll remind you at 17:00."),
        Scripted(tool_calls=[call("schedule", {"action": "add", "when": "every 1m",
                                               "prompt": "spam"}, "c2")]),
        Scripted(text="I can't do that."),
        Scripted(text="Call the bank now."))
    gw, p = await start(config_dir, data_dir, clock, model)
    try:
        assert await ask(p, "remind me today at 5pm to call the bank", chat="dm9",
                         user="u5") == "Done: I'll remind you at 17:00."
        [made] = await gw.store.schedules.list(owner=("test", "u5"))
        assert (made.chat_id, made.agent, made.kind, made.prompt) == (
            "dm9", "default", "at", "Remind them to call the bank.")
        assert made.next_due == START + 9 * 3600  # 17:00 UTC
        tool_result = model.calls[1][-1]
        assert tool_result["role"] == "tool" and "Scheduled `" in tool_result["content"]
        assert await ask(p, "ping me every minute", chat="dm9", user="u5") == "I can't do that."
        refused = model.calls[3][-1]["content"]
        assert "may repeat at most every 5m" in refused
        await advance(gw, clock, 9 * 3600)
        assert (await p.wait_finals(3, chat="dm9"))[-1] == "Call the bank now."
        await until_async(lambda: _outcome(gw, made.id, "ran"))
        ran = gw.metrics.registry.get_sample_value("pluto_schedule_firings_total",
                                                   {"outcome": "ran"})
        assert ran == 1
    finally:
        await gw.stop()
