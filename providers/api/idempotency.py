"""``Idempotency-Key`` on the API's ``POST`` of tasks and steps (IETF httpapi draft
"The Idempotency-Key HTTP Header Field").

A client sends ``Idempotency-Key: "<key>"`` (a structured-field string; a bare token is taken
too) and may send the same request again — after a connection reset, a timeout — without the
task or step being made twice:

- the same key with the same request (method, path and JSON body; the ``wait`` query aside)
  → the first answer again, status and body (``Idempotent-Replayed: true``), no second run;
- the same key with another request → 422 ``idempotency_key_reused``;
- the same key while its first request is still being answered → 409 ``idempotency_key_in_use``;
- a malformed key → 400. A request refused before anything is made (400, 403, 404) keeps no
  key: it can be corrected and sent again with the same key.

Keys are scoped per API key (the caller) and kept 24 h in the database (both engines), so a
retry reaching another instance, or the same one after a restart, is answered the same; they
are pruned hourly. An attempt that dies between making its step and answering leaves the key
held for ``LOCK_SECONDS``; a retry after that is answered with the step it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pluto.ids import new_id
from pluto.providers.api.auth import CALLER
from pluto.providers.api.views import ApiError, bad
from pluto.storage.ports import IdempotencyStore

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255
LOCK_SECONDS = 120.0  # an answer takes at most ~60 s (``wait``): past this, its attempt died
PRUNE_EVERY = 3600.0
# a structured-field string without escapes, or a bare token: what the OpenAPI document says
PATTERN = f'^("[ !#-\\[\\]-~]{{1,{MAX_KEY_CHARS}}}"|[!#-+\\--~]{{1,{MAX_KEY_CHARS}}})$'
_KEY = re.compile(PATTERN)

Made = Callable[[str], Awaitable[None]]  # an attempt says what it made ("task/step")
Make = Callable[[Made], Awaitable[web.Response]]
Resume = Callable[[str], Awaitable[web.Response]]  # the answer for a resource made before


def key_of(request: web.Request) -> str | None:
    """The request's idempotency key, None without one; 400 when it is malformed."""
    values = request.headers.getall(HEADER, [])
    if not values:
        return None
    raw = values[0].strip()
    if len(values) > 1:
        raise bad(f"Send one '{HEADER}' header, not {len(values)}.")
    if not _KEY.fullmatch(raw):
        raise bad(f"'{HEADER}' must be a string of 1 to {MAX_KEY_CHARS} visible ASCII "
                  f"characters, e.g. {HEADER}: \"8e03978e-40d5-43e8-bc93-6894a57f9324\".")
    return raw[1:-1] if raw.startswith('"') else raw


def fingerprint(request: web.Request, body: dict[str, Any]) -> str:
    """What makes two requests the same: method, path and JSON body (key order aside)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{request.method} {request.path}\n{canonical}".encode(
        "utf-8", "surrogatepass")).hexdigest()


class Idempotency:
    def __init__(self, store: IdempotencyStore | None):
        self.store = store

    async def once(self, request: web.Request, body: dict[str, Any], make: Make,
                   resume: Resume) -> web.Response:
        """``make``'s answer, made at most once per key: a retry gets the first answer."""
        key = key_of(request)
        if key is None or self.store is None:
            return await make(_nothing)
        scope, token = request[CALLER] or "", new_id()
        record = await self.store.begin(scope, key, fingerprint(request, body), token,
                                        lock=LOCK_SECONDS)
        if record is not None:
            return await self._again(scope, key, token, record, resume)
        store = self.store

        async def made(resource: str) -> None:
            await store.made(scope, key, token, resource)

        try:
            response = await make(made)
        except BaseException:
            with contextlib.suppress(Exception):  # (else the key frees itself after its lock)
                await asyncio.shield(store.release(scope, key, token))
            raise
        await self._keep(scope, key, token, response)
        return response

    async def _again(self, scope: str, key: str, token: str, record: Any,
                     resume: Resume) -> web.Response:
        assert self.store is not None
        if not record.same:
            raise ApiError(422, "idempotency_key_reused", f"This {HEADER} was used with "
                           "another request (a different body or path); a new request needs "
                           "a new key.")
        if record.status is not None:
            return web.Response(status=record.status, text=record.response,
                                content_type="application/json",
                                headers={"Idempotent-Replayed": "true"})
        if (record.abandoned and record.resource is not None
                and await self.store.adopt(scope, key, token, lock=LOCK_SECONDS)):
            response = await resume(record.resource)  # its attempt died after making it
            await self._keep(scope, key, token, response)
            return response
        raise ApiError(409, "idempotency_key_in_use", f"A request with this {HEADER} is "
                       "still being answered; send it again once that is done.")

    async def _keep(self, scope: str, key: str, token: str, response: web.Response) -> None:
        """Keep the answer for retries. The work is done whatever happens here: a storage
        error is logged and the answer given all the same (a retry then finds the key held,
        409, until its hold runs out and it is answered with the step made)."""
        assert self.store is not None
        try:
            kept = await self.store.answered(scope, key, token, response.status,
                                             response.text or "")
        except Exception as e:  # noqa: BLE001 - the client still gets what was made
            log.warning("api: the answer to an %s request could not be kept for its retries: "
                        "%s", HEADER, e)
            return
        if not kept:
            log.warning("api: the answer to an %s request was not kept (its key was taken "
                        "over meanwhile)", HEADER)

    async def keep_pruned(self) -> None:
        """Forget keys past their 24 h, hourly, for as long as the API runs."""
        while True:
            if self.store is not None:
                try:
                    if pruned := await self.store.prune():
                        log.info("api: %d idempotency key(s) past 24 h forgotten", pruned)
                except Exception as e:  # noqa: BLE001 - an expired key is ignored anyway
                    log.warning("api: idempotency keys could not be pruned: %s", e)
            await asyncio.sleep(PRUNE_EVERY)


async def _nothing(resource: str) -> None:
    return None
