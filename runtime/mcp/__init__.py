"""Tools from outside: each agent's own MCP servers (:class:`~pluto.runtime.mcp.hub.McpHub`).

Importing this package does not import the ``mcp`` SDK; the hub does that in a worker thread
when an agent first needs a server.
"""

from pluto.runtime.mcp.hub import McpHub

__all__ = ["McpHub"]
