"""The HTTP API's settings (``providers.api`` in ``pluto.yaml``) and its bearer-key guard.

Keys come from the environment variable named by ``keys_env``, comma-separated; each is a bare
key (named ``key-<12 hex>`` after its hash) or ``name:key`` (a name of letters, digits, ``_.-``).
A key's name is who the API says made a task: tasks belong to the key that made them and no
other key sees them, except the keys named in ``admin_keys``, which see every task.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from pluto.errors import ConfigError
from pluto.providers.api.views import ApiError, only_query
from pluto.gateway.ports import provider_settings

log = logging.getLogger(__name__)

MIN_KEY_CHARS = 16
KEY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
CALLER: web.RequestKey[str | None] = web.RequestKey("pluto_api_caller", str)
IS_ADMIN: web.RequestKey[bool] = web.RequestKey("pluto_api_admin", bool)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: bytes  # SHA-256 of the key (the key itself is never kept)


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    keys_env: str = Field(default="PLUTO_API_KEYS", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_input_chars: int = Field(default=32_000, ge=1, le=1_000_000)
    admin_keys: list[str] = Field(default_factory=list)  # names of keys that see every task


def load_settings(raw: dict[str, Any]) -> ApiSettings:
    return provider_settings(ApiSettings, raw, "api")


def load_keys(settings: ApiSettings) -> list[ApiKey]:
    """The keys in the named variable (``key`` or ``name:key``, comma-separated), as names and
    SHA-256 digests; the keys themselves are never kept or logged."""
    keys: list[ApiKey] = []
    for entry in (os.environ.get(settings.keys_env) or "").split(","):
        if not entry.strip():
            continue
        name, sep, key = entry.strip().partition(":")
        if not sep or not KEY_NAME.fullmatch(name):
            name, key = "", entry.strip()
        key = key.strip()
        if len(key) < MIN_KEY_CHARS:
            raise ConfigError([("pluto.yaml", None, "providers.api.keys_env",
                                f"every API key must have at least {MIN_KEY_CHARS} characters")])
        digest = hashlib.sha256(key.encode()).digest()
        keys.append(ApiKey(name or f"key-{digest[:6].hex()}", digest))
    names = [k.name for k in keys]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError([("pluto.yaml", None, "providers.api.keys_env",
                            f"two API keys have the same name: {dupes[0]}")])
    if unknown := [n for n in settings.admin_keys if n not in names]:
        log.warning("api: providers.api.admin_keys names no key in $%s: %s",
                    settings.keys_env, ", ".join(unknown))
    return keys


class Guard:
    """Wraps a handler: a valid bearer key first, then the handler, whose failures become one
    JSON error (never a stack trace)."""

    def __init__(self, keys: list[ApiKey], ready: asyncio.Event,
                 admin_keys: Collection[str] = ()):
        self._keys = keys
        self._ready = ready
        self._admins = frozenset(admin_keys)

    def caller(self, request: web.Request) -> str | None:
        """Who sent the request: its key's name, or None when its key is missing or unknown.
        Every configured key is compared, in constant time."""
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = hashlib.sha256(key.strip().encode()).digest()
        found = None
        for known in self._keys:
            if hmac.compare_digest(digest, known.digest):
                found = known.name
        return found

    def __call__(self, handler: Handler, query: tuple[str, ...] = ()) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                request[CALLER] = self.caller(request)
                request[IS_ADMIN] = request[CALLER] in self._admins
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
