"""``/py CODE``: Python over the chat's datasets, no model needed (like ``/sql``), in the
sandbox of ``run_python`` — in chats whose agent lists ``run_python`` in its tools.

The answer is Markdown: what the code printed, its tables, the value of its last line;
figures and files are kept as artifacts in the data dir (a command's answer is text)."""

from __future__ import annotations

import textwrap
import uuid
from typing import TYPE_CHECKING

from pluto.errors import PlutoError
from pluto.gateway.pipeline.commands import Commands, Failed
from pluto.types import IncomingMessage, Route

if TYPE_CHECKING:
    from pluto.gateway.pipeline.data_commands import DataCommands

EXAMPLE = 'load("sales").groupby("region")["amount"].sum()'
TABLE_ROWS = 25  # as /sql
OUTPUT_CHARS = 3000


class PythonCommand:
    def __init__(self, data: DataCommands) -> None:
        self.data = data

    def register(self, commands: Commands) -> None:
        commands.add("py", "run Python (pandas) over the datasets: /py CODE", self._py)

    async def _py(self, msg: IncomingMessage, route: Route, args: str) -> str:
        from pluto.runtime.data import result_markdown
        from pluto.runtime.python.sandbox import SandboxError
        from pluto.runtime.python.tool import query_result, run_code

        code = unfence(args)
        if not code:
            return f"Send code after /py, e.g. `/py {EXAMPLE}`. `/datasets` lists the data."
        try:
            tools = (await self.data.registry.load(route.agent)).tools
        except (LookupError, PlutoError):
            tools = ()
        if "run_python" not in tools:
            return Failed("/py works in chats whose agent has the run_python tool; this "
                          "one's does not (add run_python to tools: in its agent.yaml).")
        service = self.data.service
        try:
            saved = await run_code(service, await self.data.scope(route),
                                   f"py-{uuid.uuid4().hex[:12]}", code)
        except SandboxError as e:
            return Failed(str(e))
        out = saved.outcome
        parts = []
        if out.stdout:
            parts.append(fenced(out.stdout, out.dropped))
        for table in out.tables:
            parts.append(result_markdown(query_result(table), max_rows=TABLE_ROWS))
        if out.value is not None:
            parts.append(fenced(out.value))
        kept = [*saved.images, *saved.files]
        if kept:
            parts.append("Saved in the data dir: " + ", ".join(
                f"`{p.relative_to(service.data_dir)}`" for p in kept))
        if out.stderr:
            parts.append(fenced(out.stderr))
        if out.error:
            parts.append(fenced(out.error))
            return Failed("\n\n".join(["The code failed:", *parts]))
        return "\n\n".join(parts) or "(no output: end with an expression to see its value)"


def fenced(text: str, dropped: int = 0) -> str:
    if len(text) > OUTPUT_CHARS:
        dropped += len(text) - OUTPUT_CHARS
        text = text[:OUTPUT_CHARS]
    more = f"\n(… {dropped:,} more characters)" if dropped else ""
    return "```\n" + text.replace("```", "`\u200b``").rstrip("\n") + "\n```" + more


def unfence(text: str) -> str:
    """The code without the Markdown fence (```python … ```) a chat app may keep around it."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        text = text[3:-3]
        first, _, rest = text.partition("\n")
        text = rest if first.strip().lower() in ("py", "python", "python3") else text
    elif len(text) >= 2 and text[0] == text[-1] == "`":
        text = text[1:-1]
    return textwrap.dedent(text.strip("\n")).strip()
