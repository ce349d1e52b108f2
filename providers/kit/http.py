"""Request bodies read from the gateway's HTTP server (a webhook, an API call) under a cap."""

from __future__ import annotations

from aiohttp import web

CHUNK = 64 * 1024


async def read_limited(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it is over ``limit`` bytes — read no further than that (a
    chunked body has no length to check first)."""
    if (request.content_length or 0) > limit:
        return None
    body = bytearray()
    async for block in request.content.iter_chunked(CHUNK):
        body += block
        if len(body) > limit:
            return None
    return bytes(body)
