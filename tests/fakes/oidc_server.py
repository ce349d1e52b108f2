"""A fake OpenID Connect provider on 127.0.0.1: discovery, an authorization endpoint that signs
in a chosen person at once, a token endpoint (PKCE S256 and the client's secret checked, each
code usable once and for a minute), and its signing keys (RS256) — what the console's sign-in
talks to in tests. ``tamper`` makes it misbehave the ways real ones (or attackers) do."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from joserfc import jwt
from joserfc.jwk import RSAKey


class FakeOidc:
    def __init__(self, client_id: str = "pluto-console", client_secret: str = "s3cret-client"):
        self.client_id, self.client_secret = client_id, client_secret
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1", "use": "sig"})
        self.other = RSAKey.generate_key(2048, parameters={"kid": "k1", "use": "sig"})
        self.person: dict[str, Any] = {"sub": "u-1", "email": "ana@example.com",
                                       "email_verified": True}
        self.tamper: str | None = None  # bad-signature | wrong-nonce | wrong-audience | expired
        self.codes: dict[str, dict[str, Any]] = {}
        self.token_calls = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    @property
    def issuer(self) -> str:
        return self.url

    async def __aenter__(self) -> FakeOidc:
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/authorize", self._authorize)
        app.router.add_post("/token", self._token)
        app.router.add_get("/jwks", self._jwks)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response({
            "issuer": self.issuer, "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"]})

    async def _jwks(self, request: web.Request) -> web.Response:
        return web.json_response({"keys": [self.key.as_dict(private=False)]})

    async def _authorize(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        if q.get("client_id") != self.client_id or q.get("response_type") != "code":
            return web.Response(status=400, text="unknown client or response type")
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return web.Response(status=400, text="PKCE S256 is required")
        code = secrets.token_urlsafe(16)
        self.codes[code] = {"challenge": q["code_challenge"], "nonce": q.get("nonce"),
                            "redirect_uri": q.get("redirect_uri"), "at": time.time()}
        raise web.HTTPFound(f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q.get('state', '')})}")

    async def _token(self, request: web.Request) -> web.Response:
        self.token_calls += 1
        form = await request.post()
        issued = self.codes.pop(str(form.get("code", "")), None)
        if issued is None or time.time() - issued["at"] > 60:
            return web.json_response({"error": "invalid_grant"}, status=400)
        if form.get("client_id") != self.client_id or \
                form.get("client_secret") != self.client_secret:
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("redirect_uri") != issued["redirect_uri"]:
            return web.json_response({"error": "invalid_grant"}, status=400)
        verifier = str(form.get("code_verifier", ""))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()
                                             ).rstrip(b"=").decode()
        if challenge != issued["challenge"]:
            return web.json_response({"error": "invalid_grant",
                                      "error_description": "PKCE"}, status=400)
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": self.client_id, "iat": now, "exp": now + 300,
                  "nonce": issued["nonce"], **self.person}
        if self.tamper == "wrong-nonce":
            claims["nonce"] = "not-yours"
        elif self.tamper == "wrong-audience":
            claims["aud"] = "another-client"
        elif self.tamper == "expired":
            claims["exp"] = now - 3600
        signer = self.other if self.tamper == "bad-signature" else self.key
        token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, signer)
        return web.json_response({"access_token": "at-" + secrets.token_hex(8),
                                  "token_type": "Bearer", "expires_in": 300, "id_token": token})
