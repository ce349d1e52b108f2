"""The console's sign-in endpoints, and the owner's and auditor's parts of the admin API.

- ``POST /console/login`` ``{"username", "password"}``: a local account signs in; the session
  cookie is set and the answer carries the CSRF token (``GET /console/me`` gives it again).
- ``POST /console/logout``: the session ends (its CSRF token required).
- ``GET /console/oidc/login`` → the provider's sign-in page; ``GET /console/oidc/callback``
  back from it (state checked once, PKCE, the ID token's signature, issuer, audience, expiry
  and nonce checked) → signed in, redirected to ``/console/``.
- ``GET|POST /admin/accounts``, ``PUT|DELETE /admin/accounts/{name}`` (owner)
- ``GET|POST /admin/keys``, ``DELETE /admin/keys/{id}`` (owner): an API key for a role, shown
  once when made
- ``GET /admin/audit?limit=&before=&actor=`` and ``GET /admin/audit.csv``: the audit log

Failed sign-ins are limited per address and per name (a burst of guesses gets 429).
"""

from __future__ import annotations

import csv
import io
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pluto import jsonlimits
from pluto.gateway.console.access import (AUDIT, COOKIE, PRINCIPAL, Principal, authenticate,
                                          clear_session_cookie, csrf_refusal, describe,
                                          new_token, secure, set_session_cookie)
from pluto.gateway.console.accounts import (AccountError, check_name, check_password,
                                            check_role, hash_password, verify_password)
from pluto.gateway.http.server import GATEWAY_KEY

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

LOGIN_BURST = (10, 300.0)  # failed sign-ins per address, and per name: so many in so long
MAX_BODY = 16 * 1024


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=len(raw))
    try:
        data = jsonlimits.loads(raw or b"{}")
    except Exception:
        raise web.HTTPBadRequest(text='{"error": "the body is not JSON"}',
                                 content_type="application/json") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text='{"error": "the body must be a JSON object"}',
                                 content_type="application/json")
    return data


class Failures:
    """Failed sign-ins in the last few minutes, per address and per name (one process's
    count: several instances each allow as many — a bound, not a lock-out)."""

    def __init__(self, limit: int = LOGIN_BURST[0], window: float = LOGIN_BURST[1]):
        self.limit, self.window = limit, window
        self._seen: dict[str, list[float]] = {}

    def blocked(self, *keys: str) -> bool:
        now = time.monotonic()
        for key in keys:
            recent = [t for t in self._seen.get(key, []) if now - t < self.window]
            self._seen[key] = recent
            if len(recent) >= self.limit:
                return True
        return False

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        for key in keys:
            self._seen.setdefault(key, []).append(now)
        if len(self._seen) > 10_000:  # (bounded: the oldest keys go)
            for key in list(self._seen)[:5_000]:
                del self._seen[key]


FAILURES_KEY: web.AppKey[Failures] = web.AppKey("console_failures", Failures)


async def _sign_in(request: web.Request, gw: Gateway, username: str,
                   role: str) -> web.Response:
    token = new_token()
    csrf = secrets.token_urlsafe(24)
    ttl = gw.config.console.session_hours * 3600
    await gw.store.console.open_session(token, username, role, csrf, ttl)
    response = web.json_response({"user": username, "role": role, "csrf": csrf})
    set_session_cookie(response, request, token, int(ttl))
    return response


async def login(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    failures = request.app[FAILURES_KEY]
    data = await _body(request)
    username, password = data.get("username"), data.get("password")
    if not isinstance(username, str) or not isinstance(password, str):
        return _json_error(400, "send {\"username\": ..., \"password\": ...}")
    where = f"addr:{request.remote}"
    who = f"name:{username[:64].lower()}"
    if failures.blocked(where, who):
        log.warning("console: sign-in refused for %r from %s (too many failures)",
                    username[:64], request.remote)
        return _json_error(429, "too many failed sign-ins; wait a few minutes")
    account = await gw.store.console.account(username) if len(username) <= 64 else None
    usable = account is not None and not account.disabled and account.source == "local"
    ok = await verify_password(account.password_hash if usable and account else None, password)
    if not ok or account is None:
        failures.failed(where, who)
        log.warning("console: failed sign-in for %r from %s", username[:64], request.remote)
        return _json_error(401, "wrong name or password")
    log.info("console: %s signed in (%s)", account.username, account.role)
    await gw.store.console.audit(account.username, account.role, "sign-in", "console")
    return await _sign_in(request, gw, account.username, account.role)


async def logout(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    who = await authenticate(request, gw)
    if who is not None and (why := csrf_refusal(request, who)) is not None:
        return _json_error(403, why)
    if (cookie := request.cookies.get(COOKIE)) and len(cookie) <= 128:
        await gw.store.console.close_session(cookie)
    response = web.Response(status=204)
    clear_session_cookie(response, request)
    return response


async def me(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    who = await authenticate(request, gw)
    if who is None:
        oidc = gw.config.console.oidc
        return web.json_response({"error": "not signed in", "oidc": oidc.label if oidc else None},
                                 status=401)
    return web.json_response(describe(who))


# OpenID Connect -------------------------------------------------------------------------------

def _callback_url(request: web.Request) -> str:
    scheme = "https" if secure(request) else "http"
    return f"{scheme}://{request.host}/console/oidc/callback"


async def oidc_login(request: web.Request) -> web.StreamResponse:
    from pluto.gateway.console.oidc import OidcError, provider_for

    gw = request.app[GATEWAY_KEY]
    settings = gw.config.console.oidc
    if settings is None:
        return _json_error(404, "sign-in through OpenID Connect is not configured")
    try:
        provider = provider_for(settings)
        state = secrets.token_urlsafe(24)
        url, pending = await provider.authorization(_callback_url(request), state)
    except OidcError as e:
        log.warning("console: OIDC sign-in could not start: %s", e)
        return _json_error(502, f"the sign-in provider is unavailable: {e}")
    await gw.store.console.start_login(state, pending, ttl=600)
    raise web.HTTPFound(url)


async def oidc_callback(request: web.Request) -> web.StreamResponse:
    from pluto.gateway.console.oidc import OidcError, provider_for

    gw = request.app[GATEWAY_KEY]
    settings = gw.config.console.oidc
    if settings is None:
        return _json_error(404, "sign-in through OpenID Connect is not configured")
    if "error" in request.query:
        return _page(403, "The sign-in provider refused: "
                     f"{request.query.get('error_description') or request.query['error']}")
    state, code = request.query.get("state", ""), request.query.get("code", "")
    pending = await gw.store.console.finish_login(state) if state and len(state) < 200 else None
    if pending is None or not code:
        return _page(400, "This sign-in link is stale or was used already; sign in again.")
    try:
        claims = await provider_for(settings).finish(code, pending, _callback_url(request))
    except OidcError as e:
        log.warning("console: OIDC sign-in refused: %s", e)
        return _page(401, f"The sign-in could not be checked: {e}")
    username = str(claims.get(settings.username_claim) or "")
    if not username or claims.get("email_verified") is False:
        return _page(403, "The sign-in provider did not vouch for your address.")
    role = settings.roles.get(username) or settings.default_role
    if role is None:
        log.warning("console: %s signed in through OIDC but has no role", username)
        return _page(403, f"{username} has no access to this console; ask an owner.")
    await gw.store.console.put_account(username, role, password_hash=None, source="oidc")
    await gw.store.console.audit(username, role, "sign-in", "console (oidc)")
    token = new_token()
    csrf = secrets.token_urlsafe(24)
    ttl = gw.config.console.session_hours * 3600
    await gw.store.console.open_session(token, username, role, csrf, ttl)
    response = web.HTTPFound("/console/")
    set_session_cookie(response, request, token, int(ttl))
    raise response


def _page(status: int, text: str) -> web.Response:
    from html import escape
    return web.Response(status=status, content_type="text/html", text=(
        "<!doctype html><meta charset=utf-8><title>Pluto console</title>"
        f"<p>{escape(text)}</p><p><a href=\"/console/\">Back to the console</a></p>"))


# accounts, keys, the audit log (under /admin: the guard has checked the role) -----------------

def principal(request: web.Request) -> Principal:
    return request[PRINCIPAL]  # type: ignore[no-any-return]


async def list_accounts(request: web.Request) -> web.Response:
    rows = await request.app[GATEWAY_KEY].store.console.accounts()
    return web.json_response({"accounts": [
        {"username": a.username, "role": a.role, "source": a.source,
         "created_at": a.created_at, "disabled": a.disabled} for a in rows]})


async def put_account(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    data = await _body(request)
    try:
        name = check_name(request.match_info.get("name") or str(data.get("username", "")))
        role = check_role(str(data.get("role", "")))
        password = data.get("password")
        hashed = await hash_password(check_password(password)) if isinstance(password, str) \
            else None
    except AccountError as e:
        return _json_error(422, str(e))
    before = await gw.store.console.account(name)
    if before is None and hashed is None:
        return _json_error(422, "a new account needs a password")
    if before is not None and before.role == "owner" and role != "owner" and \
            await gw.store.console.owners() <= 1:
        return _json_error(409, "this is the last owner: make another owner first")
    await gw.store.console.put_account(name, role, password_hash=hashed)
    request[AUDIT] = (f"account {name}", f"role: {before.role if before else '-'} -> {role}"
                        + (" (password set)" if hashed else ""))
    return web.json_response({"username": name, "role": role},
                             status=200 if before else 201)


async def delete_account(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    name = request.match_info["name"]
    found = await gw.store.console.account(name)
    if found is None:
        return _json_error(404, f"no account {name!r}")
    if found.role == "owner" and await gw.store.console.owners() <= 1:
        return _json_error(409, "this is the last owner: make another owner first")
    await gw.store.console.remove_account(name)
    request[AUDIT] = (f"account {name}", f"removed ({found.role})")
    return web.Response(status=204)


async def list_keys(request: web.Request) -> web.Response:
    rows = await request.app[GATEWAY_KEY].store.console.keys()
    return web.json_response({"keys": [
        {"id": k.id, "name": k.name, "role": k.role, "created_by": k.created_by,
         "created_at": k.created_at, "revoked_at": k.revoked_at} for k in rows]})


async def add_key(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    data = await _body(request)
    try:
        name = check_name(str(data.get("name", "")))
        role = check_role(str(data.get("role", "")))
    except AccountError as e:
        return _json_error(422, str(e))
    secret = "pk_" + secrets.token_urlsafe(32)
    made = await gw.store.console.add_key(secrets.token_hex(6), name, role, secret,
                                          principal(request).name)
    request[AUDIT] = (f"key {made.id} ({name})", f"made for role {role}")
    return web.json_response({"id": made.id, "name": name, "role": role, "key": secret,
                              "note": "shown once: keep it now"}, status=201)


async def revoke_key(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    key_id = request.match_info["key_id"]
    if not await gw.store.console.revoke_key(key_id):
        return _json_error(404, f"no live key {key_id!r}")
    request[AUDIT] = (f"key {key_id}", "revoked")
    return web.Response(status=204)


def _limit(request: web.Request) -> int:
    try:
        return max(1, min(1000, int(request.query.get("limit", "100"))))
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "limit must be a whole number"}',
                                 content_type="application/json") from None


async def audit_log(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    before = request.query.get("before")
    entries = await gw.store.console.audit_log(
        limit=_limit(request), before=int(before) if before and before.isdigit() else None,
        actor=request.query.get("actor") or None)
    return web.json_response({"entries": [
        {"id": e.id, "at": e.at, "actor": e.actor, "role": e.role, "action": e.action,
         "target": e.target, "diff": e.diff, "detail": e.detail} for e in entries]})


async def audit_csv(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    entries = await gw.store.console.audit_log(limit=100_000,
                                               actor=request.query.get("actor") or None)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["id", "at", "actor", "role", "action", "target", "diff"])
    for e in reversed(entries):
        writer.writerow([e.id, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.at)), e.actor,
                         e.role, e.action, e.target, e.diff])
    return web.Response(text=out.getvalue(), content_type="text/csv", headers={
        "Content-Disposition": "attachment; filename=pluto-audit.csv"})


def add_admin_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/accounts", list_accounts)
    r.add_post("/accounts", put_account)
    r.add_put("/accounts/{name}", put_account)
    r.add_delete("/accounts/{name}", delete_account)
    r.add_get("/keys", list_keys)
    r.add_post("/keys", add_key)
    r.add_delete("/keys/{key_id}", revoke_key)
    r.add_get("/audit", audit_log)
    r.add_get("/audit.csv", audit_csv)


def mount_console(app: web.Application, gw: Gateway) -> None:
    """The sign-in endpoints under /console (the pages are added by .pages)."""
    app[FAILURES_KEY] = Failures()
    app.router.add_post("/console/login", login)
    app.router.add_post("/console/logout", logout)
    app.router.add_get("/console/me", me)
    app.router.add_get("/console/oidc/login", oidc_login)
    app.router.add_get("/console/oidc/callback", oidc_callback)
    try:  # the pages (gateway/console/pages.py: static files, hashed and compressed)
        from pluto.gateway.console import pages
    except ImportError:
        return
    mount = getattr(pages, "mount", None)
    if mount is not None:
        mount(app)

