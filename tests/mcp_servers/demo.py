"""A small MCP server with the tools the tests need: plain answers, an ``isError`` result, a
slow call, a crash mid-call, an image, progress, a tool list that grows, and (``--many N``) a
long list of tools.

Run over stdio (``python -m tests.mcp_servers.demo``, what a gateway starts), or served over
streamable HTTP in a test's own thread by :func:`http_app`. ``--pid-file PATH`` writes the
process id at start, and ``PATH.busy`` when a ``hold`` call begins, so a test can kill the
server in the middle of a call.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
from pathlib import Path

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

# a 1x1 PNG (a red dot)
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")

WEATHER = {"paris": "light rain, 14 °C", "oslo": "snow, -3 °C", "lima": "sunny, 22 °C"}


def build(name: str = "demo", many: int = 0, pid_file: Path | None = None) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool()
    def weather(city: str) -> str:
        """Today's weather in a city.

        Args:
            city: The city's name, e.g. Paris.
        """
        found = WEATHER.get(city.strip().lower())
        if found is None:
            raise ToolError(f"no weather station in {city!r}; try Paris, Oslo or Lima")
        return f"Weather in {city.strip().title()}: {found}."

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def secret(name: str) -> str:
        """The value of one of the server's environment variables (for tests of env passing)."""
        return os.environ.get(name, "<unset>")

    @server.tool()
    async def hold(seconds: float) -> str:
        """Wait, then answer (a slow tool)."""
        if pid_file is not None:
            Path(f"{pid_file}.busy").write_text(str(os.getpid()))
        await asyncio.sleep(seconds)
        return f"held {seconds:g} s"

    @server.tool()
    def crash() -> str:
        """Exit the server process in the middle of the call."""
        sys.stdout.flush()
        os._exit(3)

    @server.tool()
    def picture() -> Image:
        """A picture of a red dot."""
        return Image(data=PNG, format="png")

    @server.tool()
    def report() -> list[types.ContentBlock]:
        """A short text and a CSV file."""
        csv = base64.b64encode(b"city,rain_mm\nParis,3\nOslo,0\n").decode()
        return [types.TextContent(type="text", text="The report is attached."),
                types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
                    uri="file:///report.csv", mime_type="text/csv", blob=csv))]

    @server.tool()
    async def count(n: int, ctx: Context) -> str:
        """Count to n, reporting progress."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i}")
        return f"counted to {n}"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool named 'extra' and tell the client the list changed."""
        if "extra" not in {t.name for t in await server.list_tools()}:
            server.add_tool(lambda: "extra here", name="extra", description="A tool added later.")
        await ctx.notify_tools_changed()
        try:
            await ctx.session.send_tool_list_changed()  # clients of the older protocol
        except Exception:
            pass
        return "added the tool 'extra'"

    for i in range(many):
        server.add_tool(_numbered(i), name=f"t{i:03d}", description=f"Numbered tool {i}.")
    if pid_file is not None:
        pid_file.write_text(str(os.getpid()))
    return server


def _numbered(i: int):
    def fn(x: int = 0) -> str:
        return f"tool {i} got {x}"
    return fn


def http_app(**kwargs):
    """The server as an ASGI app (streamable HTTP at ``/mcp``), stateful, JSON or SSE."""
    return build(**kwargs).streamable_http_app(streamable_http_path="/mcp")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="demo")
    parser.add_argument("--many", type=int, default=0)
    parser.add_argument("--pid-file", type=Path)
    args = parser.parse_args()
    build(args.name, args.many, args.pid_file).run("stdio")


if __name__ == "__main__":
    main()
