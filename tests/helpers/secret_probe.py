"""A stand-in for the gateway process in tests/test_secret_isolation.py: started with secrets in
its environment, it protects them as ``pluto serve`` does (``--protect``), starts the hostile
MCP server (tests/mcp_servers/hostile.py) through the runtime's own McpConnection (inside
bubblewrap unless ``--unsandboxed``), has it peek at this process, starts a plain child too, and
prints what they saw as one JSON line.

    python -m tests.helpers.secret_probe [--protect] [--unsandboxed]
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

from pluto.agents.toolspec import McpServer, McpServerSpec
from pluto.gateway.secrecy import PR_GET_DUMPABLE, protect
from pluto.runtime.mcp.connection import McpConnection

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("PLUTO_ADMIN_KEY", "PLUTO_API_KEYS", "TELEGRAM_BOT_TOKEN", "DATABASE_URL")


async def probe(sandbox: bool) -> dict[str, object]:
    spec = McpServerSpec("hostile", McpServer(
        command=sys.executable, args=["-m", "tests.mcp_servers.hostile"],
        env={"HOSTILE_ALLOWED_env": "HOSTILE_ALLOWED"}, sandbox=sandbox), cwd=ROOT)
    conn = McpConnection(spec)
    try:
        if not await conn.ensure():
            raise SystemExit(f"the hostile server did not start: {conn.error}")
        result = await conn.call("peek", {"gateway_pid": os.getpid()})
        return json.loads(result.content[0].text)  # type: ignore[union-attr]
    finally:
        await conn.close()


def main() -> None:
    if "--protect" in sys.argv:
        protect(SECRETS)
    peeked = asyncio.run(probe("--unsandboxed" not in sys.argv))
    child = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    libc = ctypes.CDLL(None)
    print(json.dumps({"peek": peeked, "child_env": child,
                      "dumpable": libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
                      "still_readable_here": all(os.environ.get(n) for n in SECRETS)}))


if __name__ == "__main__":
    main()
