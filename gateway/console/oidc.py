"""Sign-in through an OpenID Connect provider: the authorization code flow with PKCE (authlib),
the ID token checked with the provider's published keys (joserfc, authlib's JOSE library).

The provider's discovery document and keys are fetched when first needed and kept an hour (a
key id not among them makes one fetch again, at most once a minute: a rotated key). Every
call has a timeout; a provider that does not answer is a clear error, never a hang.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from pluto.errors import PlutoError
from pluto.settings import OidcConfig

TIMEOUT = 10.0
KEEP = 3600.0


class OidcError(PlutoError):
    """The provider could not be reached, or what it sent does not hold up."""


class OidcProvider:
    def __init__(self, settings: OidcConfig):
        self.settings = settings
        self._meta: dict[str, Any] | None = None
        self._meta_at = 0.0
        self._keys: Any = None
        self._keys_at = 0.0

    def _client(self, redirect_uri: str) -> Any:
        import os

        from authlib.integrations.httpx_client import AsyncOAuth2Client

        s = self.settings
        secret = os.environ.get(s.client_secret_env, "") if s.client_secret_env else None
        return AsyncOAuth2Client(client_id=s.client_id, client_secret=secret or None,
                                 scope=s.scopes, redirect_uri=redirect_uri,
                                 code_challenge_method="S256", timeout=TIMEOUT,
                                 token_endpoint_auth_method="client_secret_post" if secret
                                 else "none")

    async def _get(self, url: str) -> Any:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=TIMEOUT) as http:
                response = await http.get(url)
                response.raise_for_status()
                return response.json()
        except (httpx.HTTPError, ValueError) as e:
            raise OidcError(f"{url} did not answer well ({type(e).__name__})") from None

    async def metadata(self) -> dict[str, Any]:
        if self._meta is None or time.monotonic() - self._meta_at > KEEP:
            issuer = self.settings.issuer.rstrip("/")
            meta = await self._get(f"{issuer}/.well-known/openid-configuration")
            if not isinstance(meta, dict) or meta.get("issuer", "").rstrip("/") != issuer:
                raise OidcError("the discovery document names another issuer")
            for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(meta.get(field), str):
                    raise OidcError(f"the discovery document has no {field}")
            self._meta, self._meta_at = meta, time.monotonic()
        return self._meta

    async def _key_set(self, refresh: bool = False) -> Any:
        from joserfc.jwk import KeySet

        stale = time.monotonic() - self._keys_at > (60 if refresh else KEEP)
        if self._keys is None or stale:
            meta = await self.metadata()
            try:
                self._keys = KeySet.import_key_set(await self._get(meta["jwks_uri"]))
            except (ValueError, KeyError, TypeError) as e:
                raise OidcError(f"the provider's keys are unreadable ({e})") from None
            self._keys_at = time.monotonic()
        return self._keys

    async def authorization(self, redirect_uri: str, state: str) -> tuple[str, dict[str, Any]]:
        """The provider's sign-in URL, and what the callback needs to check its answer."""
        meta = await self.metadata()
        nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
        client = self._client(redirect_uri)
        try:
            url, _ = client.create_authorization_url(
                meta["authorization_endpoint"], state=state, nonce=nonce,
                code_verifier=verifier)
        finally:
            await client.aclose()
        return url, {"nonce": nonce, "verifier": verifier}

    async def finish(self, code: str, pending: dict[str, Any],
                     redirect_uri: str) -> dict[str, Any]:
        """The code exchanged, the ID token checked: its claims."""
        meta = await self.metadata()
        client = self._client(redirect_uri)
        try:
            token = await client.fetch_token(meta["token_endpoint"], code=code,
                                             code_verifier=pending["verifier"])
        except Exception as e:  # (authlib raises its own, httpx's, or a JSON error)
            raise OidcError(f"the code was not accepted ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
        finally:
            await client.aclose()
        id_token = token.get("id_token") if isinstance(token, dict) else None
        if not isinstance(id_token, str):
            raise OidcError("the provider sent no ID token")
        return await self._claims(id_token, pending["nonce"])

    async def _claims(self, id_token: str, nonce: str) -> dict[str, Any]:
        from joserfc import jwt
        from joserfc.errors import JoseError

        for refresh in (False, True):
            keys = await self._key_set(refresh)
            try:
                decoded = jwt.decode(id_token, keys, algorithms=["RS256", "ES256", "PS256"])
                break
            except JoseError as e:
                if refresh:
                    raise OidcError(f"the ID token's signature does not hold ({e.error})") \
                        from None
            except ValueError as e:
                raise OidcError(f"the ID token is malformed ({e})") from None
        claims = dict(decoded.claims)
        registry = jwt.JWTClaimsRegistry(
            iss={"essential": True, "value": self.settings.issuer.rstrip("/")},
            aud={"essential": True, "value": self.settings.client_id},
            exp={"essential": True}, nonce={"essential": True, "value": nonce}, leeway=60)
        try:
            registry.validate(claims)
        except JoseError as e:
            raise OidcError(f"the ID token does not hold ({e.error}: {e.description})") \
                from None
        return claims


_PROVIDERS: dict[int, OidcProvider] = {}


def provider_for(settings: OidcConfig) -> OidcProvider:
    """One provider (its cached discovery and keys) per configuration in force."""
    found = _PROVIDERS.get(id(settings))
    if found is None or found.settings is not settings:
        if len(_PROVIDERS) > 8:
            _PROVIDERS.clear()
        found = _PROVIDERS[id(settings)] = OidcProvider(settings)
    return found
