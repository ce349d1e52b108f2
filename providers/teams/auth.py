"""Who may post to the bot, and how the bot proves itself to the Bot Connector.

Incoming: every activity comes with ``Authorization: Bearer <JWT>`` signed (RS256) by the Bot
Framework with a key listed at the ``jwks_uri`` of its OpenID metadata. :class:`Verifier`
checks the signature, the issuer, the audience (the app id), expiry and not-before (with a
small clock skew), the key's endorsement of the activity's channel, and that the activity's
``serviceUrl`` is the token's ``serviceurl`` claim. Keys are cached; an unknown ``kid`` fetches
them again, at most once per ``refresh_every`` seconds.

Outgoing: :class:`AppToken` gets an access token by the OAuth client-credentials grant and
keeps it until shortly before it expires.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt

from pluto import jsonlimits
from pluto.errors import PlutoError, ProviderError, ProviderUnusable

KEYS_LAST = 24 * 3600.0  # keys are fetched again after this anyway
MAX_KEYS = 64
MAX_DOCUMENT = 512 * 1024  # metadata, key sets and token answers are small
TOKEN_MARGIN = 300.0  # an access token is renewed this long before it expires
SessionFactory = Callable[[], aiohttp.ClientSession]


class Unauthorized(PlutoError):
    """An activity whose token does not prove it comes from the Bot Framework (401)."""


class KeysUnavailable(PlutoError):
    """The signing keys could not be fetched: nothing can be verified now (503)."""


@dataclass(frozen=True, slots=True)
class _Key:
    key: Any
    endorsements: tuple[str, ...] | None


async def fetch_json(session: aiohttp.ClientSession, method: str, url: str,
                     **kw: Any) -> tuple[int, Any, Mapping[str, str]]:
    """The status, JSON body (None when it is not JSON) and headers of a small document."""
    async with session.request(method, url, **kw) as r:
        raw = await r.content.read(MAX_DOCUMENT + 1)
        if len(raw) > MAX_DOCUMENT or not raw:
            return r.status, None, r.headers
        try:
            return r.status, jsonlimits.loads(raw), r.headers
        except (ValueError, UnicodeDecodeError):
            return r.status, None, r.headers


@dataclass(frozen=True, slots=True)
class Verified:
    claims: dict[str, Any]
    endorsements: tuple[str, ...] | None

    def check(self, service_url: str, channel_id: str) -> None:
        """The activity is the one the token was issued for: its channel endorsed by the key,
        its ``serviceUrl`` the token's ``serviceurl`` claim."""
        if self.endorsements is not None and channel_id not in self.endorsements:
            raise Unauthorized(f"the signing key is not endorsed for channel {channel_id!r}")
        if _service(self.claims.get("serviceurl")) != _service(service_url):
            raise Unauthorized("the activity's serviceUrl is not the token's")


class Verifier:
    def __init__(self, session: SessionFactory, *, metadata_url: str, app_id: str,
                 issuer: str, leeway: float, refresh_every: float = 30.0):
        self.session, self.metadata_url = session, metadata_url
        self.refresh_every = refresh_every
        self.app_id, self.issuer, self.leeway = app_id, issuer, leeway
        self._keys: dict[str, _Key] = {}
        self._fetched = float("-inf")  # monotonic
        self._lock = asyncio.Lock()

    async def warm(self) -> None:
        """Fetch the keys now (so the first activity waits for nothing)."""
        async with self._lock:
            await self._refresh()

    async def verify(self, header: str) -> Verified:
        """The token's claims; :class:`Unauthorized` for any token that is not good (then
        :meth:`Verified.check` the activity it came with)."""
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("no bearer token")
        try:
            head = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthorized("not a JWT") from None
        if head.get("alg") != "RS256":
            raise Unauthorized("the token is not signed with RS256")
        key = await self._key(str(head.get("kid") or ""))
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=["RS256"], audience=self.app_id,
                issuer=self.issuer, leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as e:
            raise Unauthorized(f"the token was refused ({type(e).__name__})") from None
        return Verified(claims, key.endorsements)

    async def _key(self, kid: str) -> _Key:
        found = self._keys.get(kid)
        stale = time.monotonic() - self._fetched > KEYS_LAST
        if found is not None and not stale:
            return found
        async with self._lock:
            if kid not in self._keys and time.monotonic() - self._fetched >= self.refresh_every \
                    or stale:
                await self._refresh()
        found = self._keys.get(kid)
        if found is None:
            raise Unauthorized("the token's key is not one of the Bot Framework's")
        return found

    async def _refresh(self) -> None:
        try:
            status, meta, _ = await fetch_json(self.session(), "GET", self.metadata_url)
            uri = meta.get("jwks_uri") if isinstance(meta, dict) else None
            if status != 200 or not isinstance(uri, str):
                raise KeysUnavailable("the OpenID metadata names no jwks_uri")
            status, doc, _ = await fetch_json(self.session(), "GET", uri)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise KeysUnavailable(f"the signing keys could not be fetched "
                                  f"({type(e).__name__})") from None
        keys = doc.get("keys") if isinstance(doc, dict) else None
        if status != 200 or not isinstance(keys, list):
            raise KeysUnavailable("the key set could not be read")
        self._keys = dict(list(_parse_keys(keys).items())[:MAX_KEYS])
        self._fetched = time.monotonic()


def _parse_keys(keys: list[Any]) -> dict[str, _Key]:
    found: dict[str, _Key] = {}
    for jwk in keys:
        if not isinstance(jwk, dict) or jwk.get("kty") != "RSA" or not jwk.get("kid"):
            continue
        try:
            key = jwt.PyJWK(jwk, algorithm="RS256").key
        except (jwt.PyJWTError, ValueError, TypeError):
            continue
        endorsed = jwk.get("endorsements")
        endorsements = tuple(str(e) for e in endorsed) if isinstance(endorsed, list) else None
        found[str(jwk["kid"])] = _Key(key, endorsements)
    return found


def _service(url: Any) -> str:
    return str(url or "").strip().rstrip("/").lower()


class AppToken:
    """The bot's access token for the Bot Connector (client credentials), cached."""

    def __init__(self, session: SessionFactory, *, token_url: str, app_id: str, password: str,
                 scope: str, on_token: Callable[[str], None]):
        self.session, self.token_url = session, token_url
        self._form = {"grant_type": "client_credentials", "client_id": app_id,
                      "client_secret": password, "scope": scope}
        self._on_token = on_token  # masks each new token in the logs
        self._token: str | None = None
        self._until = 0.0  # monotonic
        self._lock = asyncio.Lock()

    def invalidate(self, token: str) -> None:
        if self._token == token:
            self._token = None

    async def get(self) -> str:
        if self._token is not None and time.monotonic() < self._until:
            return self._token
        async with self._lock:
            if self._token is None or time.monotonic() >= self._until:
                await self._fetch()
            assert self._token is not None
            return self._token

    async def _fetch(self) -> None:
        try:
            status, body, _ = await fetch_json(self.session(), "POST", self.token_url,
                                            data=self._form)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise ProviderError(f"could not reach the Microsoft login service "
                                f"({type(e).__name__})") from None
        body = body if isinstance(body, dict) else {}
        token = body.get("access_token")
        if status in (400, 401) and body.get("error") in ("invalid_client",
                                                          "unauthorized_client"):
            raise ProviderUnusable("Microsoft refused the bot's app id or password "
                                   f"({body.get('error')})")
        if status != 200 or not isinstance(token, str) or not token:
            raise ProviderError(f"the Microsoft login service answered HTTP {status} "
                                f"({str(body.get('error') or 'no token')[:80]})")
        try:
            lasts = float(body.get("expires_in") or 3600)
        except (TypeError, ValueError):
            lasts = 3600.0
        self._on_token(token)
        self._token = token
        self._until = time.monotonic() + max(lasts - TOKEN_MARGIN, lasts / 2)
