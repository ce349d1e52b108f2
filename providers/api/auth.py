"""The HTTP API's settings (``providers.api`` in ``pluto.yaml``) and its bearer-key guard."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from pluto.errors import ConfigError
from pluto.providers.api.views import ApiError, only_query
from pluto.gateway.ports import provider_settings

log = logging.getLogger(__name__)

MIN_KEY_CHARS = 16
CALLER: web.RequestKey[str | None] = web.RequestKey("pluto_api_caller", str)  # type: ignore[arg-type]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    keys_env: str = Field(default="PLUTO_API_KEYS", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_input_chars: int = Field(default=32_000, ge=1, le=1_000_000)


def load_settings(raw: dict[str, Any]) -> ApiSettings:
    return provider_settings(ApiSettings, raw, "api")


def load_keys(settings: ApiSettings) -> list[bytes]:
    """SHA-256 digests of the keys in the named variable (comma-separated; never logged)."""
    keys = [k.strip() for k in (os.environ.get(settings.keys_env) or "").split(",") if k.strip()]
    if any(len(k) < MIN_KEY_CHARS for k in keys):
        raise ConfigError([("pluto.yaml", None, "providers.api.keys_env",
                            f"every API key must have at least {MIN_KEY_CHARS} characters")])
    return [hashlib.sha256(k.encode()).digest() for k in keys]


class Guard:
    """Wraps a handler: a valid bearer key first, then the handler, whose failures become one
    JSON error (never a stack trace)."""

    def __init__(self, keys: list[bytes], ready: asyncio.Event):
        self._keys = keys
        self._ready = ready

    def caller(self, request: web.Request) -> str | None:
        """Who sent the request: ``key-<12 hex>`` (from the key's hash), or None when its key
        is missing or unknown. Every configured key is compared, in constant time."""
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = hashlib.sha256(key.strip().encode()).digest()
        found = False
        for known in self._keys:
            found |= hmac.compare_digest(digest, known)
        return f"key-{digest[:6].hex()}" if found else None

    def __call__(self, handler: Handler, query: tuple[str, ...] = ()) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                request[CALLER] = self.caller(request)
                if request[CALLER] is None:
                    raise ApiError(401, "unauthorized", "A valid API key is required: send "
                                   "'Authorization: Bearer <key>'." if self._keys else
                                   "The HTTP API has no keys configured on this gateway.")
                try:
                    async with asyncio.timeout(10):
                        await self._ready.wait()
                except TimeoutError:
                    raise ApiError(503, "unavailable", "The API is starting; try again.") from None
                only_query(request, *query)
                return await handler(request)
            except ApiError as e:
                return e.response()
            except web.HTTPException:
                raise  # aiohttp's own answers (413 for a body over client_max_size): as they are
            except Exception:
                log.exception("api: %s %s failed", request.method, request.path)
                return ApiError(500, "internal", "Something went wrong on our side; the error "
                                "has been logged.").response()
        return guarded
