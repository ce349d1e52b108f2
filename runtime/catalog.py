"""The tools an agent may name in ``tools:``: the built-in tools, the data tools and
``schedule``. (Its skills' loader and its MCP servers' tools come with its ``skills:`` and
``mcp:`` blocks.)"""

from __future__ import annotations

from pluto.runtime.data_tools import DATA_TOOLS
from pluto.runtime.schedule_tool import SCHEDULE_TOOLS
from pluto.runtime.tools import BUILTIN_TOOLS, Tool


def standard_tools() -> dict[str, Tool]:
    return {**BUILTIN_TOOLS, **DATA_TOOLS, **SCHEDULE_TOOLS}
