"""Who is asking, and what they may do (docs/console.md, "Roles").

Four roles, each able to do what the ones before it can:

- **viewer** sees what runs, what fails and what it costs: the overview, runs without their
  texts, usage, the routing table, agents, schedules, the audit log of changes — never a
  conversation's text nor any secret;
- **operator** also reads conversations and follows runs live, previews datasets' rows,
  approves pairing requests and manages schedules;
- **admin** also changes the configuration: routes, agents, budgets, datasets, reloads;
- **owner** also manages accounts and API keys.

The console and the admin API are one: a request is signed in by a session cookie (set at
sign-in: ``HttpOnly``, ``SameSite=Strict``, ``Secure`` on HTTPS, expiring) or carries
``Authorization: Bearer <key>`` — the admin key from ``admin.api_key_env`` (owner) or a key an
owner made for a role. A change sent with a cookie must carry the session's CSRF token in
``X-CSRF-Token``: a page on another site can make a browser send the cookie, never the token.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

Role = Literal["viewer", "operator", "admin", "owner"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin", "owner")
RANK = {role: i for i, role in enumerate(ROLES)}
COOKIE = "pluto_session"
SESSION_SECONDS = 8 * 3600
MIN_ADMIN_KEY = 16
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# (method or "*", path pattern under /admin) -> the least role; the first match wins. A path
# no rule names: reading needs a viewer, a change an admin.
_RULES: list[tuple[str, str, Role]] = [
    ("*", r"/admin/(accounts|keys)(/.*)?", "owner"),
    ("GET", r"/admin/runs/[^/]+(/events)?", "operator"),  # a run's texts and events
    ("GET", r"/admin/conversations(/.*)?", "operator"),
    ("GET", r"/admin/datasets/[^/]+/preview", "operator"),  # the data itself
    ("GET", r"/admin/memory(/.*)?", "operator"),  # people's notes
    ("GET", r"/admin/(pairing)(/.*)?", "operator"),  # who asked to pair: people's ids
    ("POST", r"/admin/pairing/approve", "operator"),
    ("DELETE", r"/admin/pairing/.*", "operator"),
    ("*", r"/admin/schedules(/.*)?", "operator"),
    ("POST", r"/admin/agents/[^/]+/chat", "operator"),  # the test chat: runs, changes nothing
    ("POST", r"/admin/routes/(explain|check)", "viewer"),  # explains and checks change nothing
    ("POST", r"/admin/usage/budgets/check", "viewer"),
    ("GET", r"/admin/audit(\.csv)?", "viewer"),
]
RULES: list[tuple[str, re.Pattern[str], Role]] = [(m, re.compile(p), r) for m, p, r in _RULES]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: ``name`` as the audit log records it."""

    name: str
    role: Role
    via: Literal["session", "key", "admin-key"]
    csrf: str | None = None  # the session's CSRF token (sessions only)

    def may(self, role: Role) -> bool:
        return RANK[self.role] >= RANK[role]


PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
# what a change's audit line says beyond the path: (its target, its diff)
AUDIT: web.RequestKey[tuple[str, str]] = web.RequestKey("audit", tuple)  # type: ignore[arg-type]


def required(method: str, path: str) -> Role:
    for m, pattern, role in RULES:
        if m in ("*", method) and pattern.fullmatch(path):
            return role
    return "viewer" if method in SAFE_METHODS else "admin"


def admin_key(gw: Gateway) -> tuple[str | None, str]:
    """The admin key (the owner's key from the environment), or None and why it is off."""
    env = gw.config.admin.api_key_env
    if not env:
        return None, ("no admin key: set admin.api_key_env in pluto.yaml to the name of an "
                      "environment variable holding a key of 16+ characters, or sign in with "
                      "an account (pluto admin add)")
    key = os.environ.get(env, "")
    if not key:
        return None, f"no admin key: the environment variable {env} is not set"
    if len(key) < MIN_ADMIN_KEY:
        return None, f"no admin key: the key in {env} is shorter than 16 characters"
    return key, ""


async def authenticate(request: web.Request, gw: Gateway) -> Principal | None:
    """The request's principal, or None (not signed in, a wrong or revoked key)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        token = token.strip()
        key, _ = admin_key(gw)
        if key is not None and hmac.compare_digest(token.encode(), key.encode()):
            return Principal("admin-key", "owner", "admin-key")
        made = await gw.store.console.key(token)
        if made is not None and made.role in RANK:
            return Principal(f"key:{made.name}", made.role, "key")
        return None
    cookie = request.cookies.get(COOKIE)
    if cookie and len(cookie) <= 128:
        signed = await gw.store.console.session(cookie)
        if signed is not None and signed.role in RANK:
            return Principal(signed.username, signed.role, "session", signed.csrf)
    return None


def csrf_refusal(request: web.Request, who: Principal) -> str | None:
    """Why a change sent with a session cookie is refused (None: its token is right)."""
    if who.via != "session" or request.method in SAFE_METHODS:
        return None
    sent = request.headers.get("X-CSRF-Token", "")
    if not sent or who.csrf is None or not hmac.compare_digest(sent.encode(),
                                                               who.csrf.encode()):
        return "the CSRF token is missing or wrong (send X-CSRF-Token from /console/me)"
    return None


def secure(request: web.Request) -> bool:
    """Whether the browser reached us over HTTPS (directly, or through a proxy that says so
    from the loopback: a header from anyone else proves nothing)."""
    if request.secure:
        return True
    proto = request.headers.get("X-Forwarded-Proto", "")
    return proto.lower() == "https" and (request.remote or "") in ("127.0.0.1", "::1")


def set_session_cookie(response: web.StreamResponse, request: web.Request, token: str,
                       max_age: int = SESSION_SECONDS) -> None:
    response.set_cookie(COOKIE, token, max_age=max_age, path="/", httponly=True,
                        secure=secure(request), samesite="Strict")


def clear_session_cookie(response: web.StreamResponse, request: web.Request) -> None:
    response.set_cookie(COOKIE, "", max_age=0, path="/", httponly=True,
                        secure=secure(request), samesite="Strict")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def describe(who: Principal) -> dict[str, Any]:
    return {"user": who.name, "role": who.role, "csrf": who.csrf,
            "can": {role: who.may(role) for role in ROLES}}
