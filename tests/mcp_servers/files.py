"""An MCP server that lists and deletes files in one folder (docs/approvals.md's example).

Run over stdio: ``python -m tests.mcp_servers.files --root /srv/reports``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build(root: Path) -> MCPServer:
    server = MCPServer("files", log_level="WARNING")
    root = root.resolve()

    def inside(name: str) -> Path:
        path = (root / name).resolve()
        if not path.is_relative_to(root) or path == root:
            raise ToolError(f"{name!r} is not a file in {root}")
        return path

    @server.tool()
    def list_files() -> list[str]:
        """The files in the folder."""
        return sorted(p.name for p in root.iterdir() if p.is_file())

    @server.tool()
    def delete_file(name: str) -> str:
        """Delete a file in the folder, for good.

        Args:
            name: The file's name, e.g. old.log.
        """
        path = inside(name)
        if not path.is_file():
            raise ToolError(f"there is no file {name!r}")
        path.unlink()
        return f"deleted {name}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    build(parser.parse_args().root).run("stdio")


if __name__ == "__main__":
    main()
