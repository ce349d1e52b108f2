"""Real MCP servers for the tests, built with the SDK's own server API (``MCPServer``)."""
