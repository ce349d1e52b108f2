"""A fake Microsoft Teams (the Bot Framework as a bot sees it) for tests.

    async with FakeTeams() as fake:
        fake.endpoint_url = "http://127.0.0.1:8080/teams/messages"
        fake.add_conversation("a:1alice", "personal")
        said = await fake.user_says("a:1alice", "hello")   # a signed activity, posted
        [sent] = await fake.wait_until(lambda: fake.bot_messages("a:1alice"))

It behaves like the Bot Framework where a bot can tell:

- **OpenID metadata** at ``/v1/.well-known/openidconfiguration`` naming ``jwks_uri``; the key
  set (one RSA key made per fake, ``kid``, ``endorsements``) at ``/v1/keys``.
- **Tokens**: ``POST /botframework.com/oauth2/v2.0/token`` (form: ``grant_type=
  client_credentials``, ``client_id``, ``client_secret``, ``scope=https://api.botframework.com/
  .default``) → ``{"token_type", "expires_in", "access_token"}``; a wrong secret is 401
  ``invalid_client`` (AADSTS7000215), an unknown app 400 ``unauthorized_client``.
- **The Connector** under ``service_url`` (``/amer/``): ``POST v3/conversations/{id}/activities``
  (and ``/activities/{replyToId}``), ``PUT …/activities/{id}``, ``DELETE …/activities/{id}``.
  Only a token it issued and that has not expired is let in (401 otherwise); an unknown
  conversation or activity is 404; a body over ``max_bytes`` (28 KB, as Teams) is 413
  ``MessageSizeTooBig``; a message with neither text nor attachments is 400. Throttling: while a
  conversation is held (``throttle``, or ``hold`` after N messages) every call to it is 429 with
  ``Retry-After``, the seconds left.
- **Activities to the bot** are posted to ``endpoint_url`` with ``Authorization: Bearer <JWT>``
  (RS256, ``iss`` https://api.botframework.com, ``aud`` the app id, ``serviceurl``, ``nbf``,
  ``exp``). An answer of 5xx, or none within ``timeout``, is retried after ``retry_delays``, the
  same activity each time, as the Bot Connector does; a 2xx or 4xx ends it.
- **Card buttons** (Universal Actions): a message may carry an Adaptive Card whose
  ``actions`` are ``Action.Execute`` (card ``version`` >= 1.4, a ``title``, a ``verb``, ``data``
  an object; at most 6 shown) or ``Action.Submit``; anything else is 400 ``BadArgument``. A
  click on an Execute button (``click``) posts a signed ``invoke`` named
  ``adaptiveCard/action`` (``value.action`` = the action, ``replyToId`` = the card's message)
  from the chosen person, once (the Connector does not retry invokes). Its HTTP answer must come
  within :data:`INVOKE_DEADLINE` seconds, with status 200 and an invoke response
  (``{"statusCode": 200, "type": <card | message>, "value": …}``); otherwise the clicker sees
  "Something went wrong" and the fake records it in ``invoke_failures``. A ``message`` answer
  is what Teams shows that person alone (``notes[user]``); a card answer replaces the card for
  them alone (``private_cards[user]``). Clicking a Submit button posts a ``message`` activity
  with ``value`` = its data.
- **Files** a user sends: a ``file.download.info`` attachment whose ``downloadUrl`` serves the
  bytes to anyone holding the URL; pasted images: a ``contentUrl`` on the Connector, served to
  the bot's token only.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes.changes import Changes


__all__ = ["FakeTeams", "APP_ID", "APP_PASSWORD", "BOT_NAME", "Sent", "Said", "Delivery"]

APP_ID = "5b1e0c3e-7a2d-4c1f-9a5e-0d1f2c3b4a5e"
APP_PASSWORD = "fAk3~Teams.Secret_0123456789abcdefXYZ"
BOT_NAME = "Pluto"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
ISSUER = "https://api.botframework.com"
SCOPE = "https://api.botframework.com/.default"
MAX_BYTES = 28 * 1024
CARD = "application/vnd.microsoft.card.adaptive"
INVOKE_MESSAGE = "application/vnd.microsoft.activity.message"
INVOKE_DEADLINE = 5.0  # seconds Teams waits for an invoke's answer
MAX_ACTIONS = 6
FILE_INFO = "application/vnd.microsoft.teams.file.download.info"


@dataclass
class Sent:
    """A message (or typing activity) the bot sent and the Connector accepted."""

    id: str
    conversation: str
    type: str
    text: str
    attachments: list[dict[str, Any]]
    reply_to: str | None
    payload: dict[str, Any]
    time: float = field(default_factory=time.monotonic)
    edits: int = 0
    deleted: bool = False


@dataclass
class Delivery:
    """One activity posted to the bot (and its retries)."""

    activity: dict[str, Any]
    statuses: list[int] = field(default_factory=list)  # each attempt's HTTP status (0: none)
    bodies: list[Any] = field(default_factory=list)  # each attempt's answer (JSON, or text)
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Said:
    conversation: str
    id: str
    delivery: Delivery


@dataclass
class Call:
    method: str
    path: str
    status: int = 0
    time: float = field(default_factory=time.monotonic)


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}

    def response(self) -> web.Response:
        body = {"message": self.message} if self.status == 401 else {
            "error": {"code": self.code, "message": self.message}}
        return web.json_response(body, status=self.status, headers=self.headers)


class FakeTeams(Changes):
    """One Azure Bot in a fake Teams tenant. Use ``async with`` or ``start()``/``stop()``."""

    FAKE = "Teams"

    def __init__(self, *, app_id: str = APP_ID, app_password: str = APP_PASSWORD,
                 endpoint_url: str | None = None, max_bytes: int = MAX_BYTES,
                 retry_delays: tuple[float, ...] = (0.1, 0.3, 1.0), timeout: float = 15.0,
                 token_lifetime: int = 3599):
        self.app_id, self.app_password = app_id, app_password
        self.bot_id = f"28:{app_id}"
        self.endpoint_url = endpoint_url
        self.max_bytes, self.retry_delays, self.timeout = max_bytes, retry_delays, timeout
        self.token_lifetime = token_lifetime
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "fake-" + secrets.token_hex(8)
        self.conversations: dict[str, str] = {}  # id → personal | groupChat | channel
        self.users: dict[str, str] = {}  # name → id
        self.sent: list[Sent] = []
        self.deliveries: list[Delivery] = []
        self.calls: list[Call] = []
        self.token_requests: list[tuple[float, int]] = []  # (time, status)
        self.tokens: dict[str, float] = {}  # issued access token → expiry (monotonic)
        self.files: dict[str, tuple[bytes, bool]] = {}  # id → (bytes, needs the bot's token)
        self.throttled: dict[str, float] = {}  # conversation → until (monotonic)
        self.holds: dict[str, tuple[int, float]] = {}  # conversation → (after n, seconds)
        self.refused: list[float] = []  # messages refused with 429 (monotonic)
        self.notes: dict[str, list[str]] = {}  # person → invoke answers shown to them alone
        self.private_cards: dict[str, list[dict[str, Any]]] = {}  # person → cards (theirs)
        self.invoke_failures: list[str] = []  # clicks Teams showed "Something went wrong" for
        self.port = 0
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # lifecycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        return f"{self.url}/amer/"

    @property
    def openid_url(self) -> str:
        return f"{self.url}/v1/.well-known/openidconfiguration"

    @property
    def token_url(self) -> str:
        return f"{self.url}/botframework.com/oauth2/v2.0/token"

    async def start(self) -> FakeTeams:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_get("/v1/.well-known/openidconfiguration", self._openid)
        app.router.add_get("/v1/keys", self._keys)
        app.router.add_post("/botframework.com/oauth2/v2.0/token", self._token)
        app.router.add_get("/files/{fid}", self._file)
        app.router.add_get("/amer/v3/attachments/{fid}/views/original", self._file)
        base = "/amer/v3/conversations/{cid}/activities"
        app.router.add_post(base, self._connector)
        app.router.add_route("*", base + "/{aid}", self._connector)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeTeams:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # waits --------------------------------------------------------------------------------

    # login and keys ------------------------------------------------------------------------

    async def _openid(self, request: web.Request) -> web.Response:
        self.calls.append(Call("GET", "openid", 200))
        return web.json_response({
            "issuer": ISSUER, "authorization_endpoint": "https://invalid.botframework.com",
            "jwks_uri": f"{self.url}/v1/keys", "id_token_signing_alg_values_supported":
            ["RS256"], "token_endpoint_auth_methods_supported": ["private_key_jwt"]})

    def public_jwk(self, kid: str | None = None) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {**jwk, "kid": kid or self.kid, "use": "sig", "x5t": kid or self.kid,
                "endorsements": ["msteams", "webchat", "emulator"]}

    async def _keys(self, request: web.Request) -> web.Response:
        self.calls.append(Call("GET", "keys", 200))
        return web.json_response({"keys": [self.public_jwk()]})

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        status, body = 200, {}
        if form.get("grant_type") != "client_credentials" or form.get("scope") != SCOPE:
            status, body = 400, {"error": "invalid_request", "error_description":
                                 "AADSTS900144: The request body must contain grant_type "
                                 "client_credentials and the Bot Framework scope."}
        elif form.get("client_id") != self.app_id:
            status, body = 400, {"error": "unauthorized_client", "error_description":
                                 "AADSTS700016: Application not found in the directory."}
        elif form.get("client_secret") != self.app_password:
            status, body = 401, {"error": "invalid_client", "error_description":
                                 "AADSTS7000215: Invalid client secret provided."}
        else:
            token = "eyJfake." + secrets.token_urlsafe(32)
            self.tokens[token] = time.monotonic() + self.token_lifetime
            body = {"token_type": "Bearer", "expires_in": self.token_lifetime,
                    "ext_expires_in": self.token_lifetime, "access_token": token}
        self.token_requests.append((time.monotonic(), status))
        self._notify()
        return web.json_response(body, status=status)

    def expire_tokens(self) -> None:
        """Every access token issued so far stops working (revoked, or expired early)."""
        self.tokens.clear()

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        until = self.tokens.get(token)
        return scheme == "Bearer" and until is not None and time.monotonic() < until

    # the Connector -------------------------------------------------------------------------

    async def _connector(self, request: web.Request) -> web.Response:
        call = Call(request.method, request.path)
        self.calls.append(call)
        try:
            body = await self._operate(request)
            call.status, response = 200, web.json_response(body)
        except Refused as refused:
            call.status, response = refused.status, refused.response()
        self._notify()
        return response

    async def _operate(self, request: web.Request) -> dict[str, Any]:
        if not self._authorized(request):
            raise Refused(401, "Unauthorized", "Authorization has been denied for this request.")
        cid, aid = request.match_info["cid"], request.match_info.get("aid")
        if cid.split(";messageid=")[0] not in self.conversations:
            raise Refused(404, "ConversationNotFound", "Conversation not found.")
        payload = None if request.method == "DELETE" else await self._payload(request)
        self._throttle(cid, payload)
        if request.method == "POST":
            assert payload is not None
            return {"id": self._post(cid, payload, aid)}
        found = next((s for s in self.sent if s.id == aid and s.conversation == cid
                      and not s.deleted), None)
        if found is None or request.method not in ("PUT", "DELETE"):
            raise Refused(404, "ActivityNotFound", "The activity was not found.")
        if request.method == "DELETE":
            found.deleted = True
            return {}
        assert payload is not None
        found.text, found.edits = str(payload.get("text") or ""), found.edits + 1
        found.attachments = list(payload.get("attachments") or [])
        return {"id": found.id}

    async def _payload(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if len(raw) > self.max_bytes:
            raise Refused(413, "MessageSizeTooBig", "Message size too big.")
        try:
            payload = json.loads(raw)
        except ValueError:
            raise Refused(400, "BadSyntax", "The request body is not JSON.") from None
        if not isinstance(payload, dict) or payload.get("type") not in ("message", "typing"):
            raise Refused(400, "BadArgument", "Unknown activity type.")
        if payload["type"] == "message" and not payload.get("text") \
                and not payload.get("attachments"):
            raise Refused(400, "BadArgument", "Activity must have text or attachments.")
        for item in payload.get("attachments") or []:
            if isinstance(item, dict) and item.get("contentType") == CARD:
                _check_card(item.get("content"))
        return payload

    def _throttle(self, cid: str, payload: dict[str, Any] | None) -> None:
        now = time.monotonic()
        message = payload is not None and payload.get("type") == "message"
        rule = self.holds.get(cid)
        if message and rule is not None and len(self.bot_messages(cid)) >= rule[0]:
            del self.holds[cid]
            self.throttled[cid] = now + rule[1]
        until = self.throttled.get(cid, 0.0)
        if now < until:
            if message:
                self.refused.append(now)
            raise Refused(429, "Throttled", "Too many requests.",
                          {"Retry-After": str(math.ceil(until - now))})

    def _post(self, cid: str, payload: dict[str, Any], reply_to: str | None) -> str:
        aid = f"{int(time.time() * 1000)}{next(self._ids):04d}"
        self.sent.append(Sent(aid, cid, str(payload["type"]), str(payload.get("text") or ""),
                              list(payload.get("attachments") or []), reply_to,
                              copy.deepcopy(payload)))
        return aid

    async def _file(self, request: web.Request) -> web.Response:
        found = self.files.get(request.match_info["fid"])
        if found is None:
            return web.Response(status=404)
        if found[1] and not self._authorized(request):
            return web.Response(status=401)
        return web.Response(body=found[0], content_type="application/octet-stream")

    # controls and records ------------------------------------------------------------------

    def add_conversation(self, cid: str, kind: str = "personal") -> None:
        self.conversations[cid] = kind

    def throttle(self, conversation: str, seconds: float) -> None:
        self.throttled[conversation] = time.monotonic() + seconds

    def hold(self, conversation: str, *, after: int, retry_after: float) -> None:
        """Once the bot has ``after`` messages there, its next one opens a 429 window."""
        self.holds[conversation] = (after, retry_after)

    def bot_messages(self, conversation: str) -> list[Sent]:
        """The bot's messages in a conversation (a channel's threads included), in order."""
        return [s for s in self.sent if s.type == "message" and not s.deleted
                and (s.conversation == conversation
                     or s.conversation.startswith(conversation + ";messageid="))]

    @staticmethod
    def buttons(sent: Sent, *, as_posted: bool = False) -> list[dict[str, Any]]:
        """The actions shown under a message now (or as it was first posted)."""
        items = sent.payload.get("attachments") if as_posted else sent.attachments
        return [a for item in items or [] if isinstance(item, dict)
                and item.get("contentType") == CARD
                for a in ((item.get("content") or {}).get("actions") or [])[:MAX_ACTIONS]]

    async def click(self, sent: Sent, title: str, *, user: str = "Alice",
                    as_posted: bool = False) -> Delivery:
        """``user`` clicks the button ``title`` under ``sent`` (as shown now, or as first
        posted: a client that has not refreshed): Teams posts the click, signed, and waits for
        its answer."""
        action = next((a for a in self.buttons(sent, as_posted=as_posted)
                       if a.get("title") == title), None)
        if action is None:
            raise AssertionError(f"no button {title!r} under {sent.id}")
        activity = self.activity(sent.conversation, "", user=user)
        activity.pop("text")
        activity.pop("textFormat")
        activity["replyToId"] = sent.id
        if action["type"] == "Action.Submit":
            activity["value"] = copy.deepcopy(action.get("data"))
            return await self.post_activity(activity)
        activity |= {"type": "invoke", "name": "adaptiveCard/action", "value": {
            "action": {"type": "Action.Execute", "title": title, "verb": action.get("verb"),
                       "data": copy.deepcopy(action.get("data"))}, "trigger": "manual"}}
        delivery = Delivery(activity)
        self.deliveries.append(delivery)
        started = time.monotonic()
        status, body = await self._attempt(json.dumps(activity).encode(), {
            "Content-Type": "application/json; charset=utf-8",
            "Authorization": f"Bearer {self.token_for()}"})
        delivery.statuses.append(status)
        delivery.bodies.append(body)
        delivery.done.set()
        took = time.monotonic() - started
        if took > INVOKE_DEADLINE:
            self.invoke_failures.append(f"{title} by {user}: answered after {took:.1f} s")
        elif status != 200 or not isinstance(body, dict) or body.get("statusCode") != 200:
            self.invoke_failures.append(f"{title} by {user}: HTTP {status} {body!r}"[:300])
        elif body.get("type") == INVOKE_MESSAGE and isinstance(body.get("value"), str):
            self.notes.setdefault(user, []).append(body["value"])
        elif body.get("type") == CARD and isinstance(body.get("value"), dict):
            self.private_cards.setdefault(user, []).append(body["value"])
        else:
            self.invoke_failures.append(f"{title} by {user}: not an invoke response {body!r}")
        self._notify()
        return delivery

    def typing(self, conversation: str) -> list[Sent]:
        return [s for s in self.sent if s.type == "typing" and s.conversation == conversation]

    # activities to the bot -----------------------------------------------------------------

    def token_for(self, *, key: rsa.RSAPrivateKey | None = None, kid: str | None = None,
                  **claims: Any) -> str:
        """A token as the Bot Framework signs it; ``claims`` override (forgeries in tests)."""
        now = int(time.time())
        body = {"serviceurl": self.service_url, "nbf": now - 5, "exp": now + 3600,
                "iss": ISSUER, "aud": self.app_id} | claims
        return jwt.encode({k: v for k, v in body.items() if v is not None}, key or self.key,
                          algorithm="RS256", headers={"kid": kid or self.kid})

    def activity(self, conversation: str, text: str, *, user: str = "Alice",
                 mention: bool = False, reply_to: Sent | None = None,
                 document: tuple[str, bytes] | None = None,
                 image: bytes | None = None) -> dict[str, Any]:
        kind = self.conversations.get(conversation.split(";messageid=")[0], "personal")
        now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        uid = self.users.setdefault(user, f"29:1{uuid.uuid5(uuid.NAMESPACE_DNS, user).hex}")
        entities: list[dict[str, Any]] = [{"type": "clientInfo", "locale": "en-US"}]
        if mention:
            tag = f"<at>{BOT_NAME}</at>"
            text = f"{tag} {text}"
            entities.append({"type": "mention", "text": tag,
                             "mentioned": {"id": self.bot_id, "name": BOT_NAME}})
        activity: dict[str, Any] = {
            "type": "message", "id": f"{int(time.time() * 1000)}{next(self._ids):04d}",
            "timestamp": now, "localTimestamp": now, "serviceUrl": self.service_url,
            "channelId": "msteams", "textFormat": "plain", "text": text, "locale": "en-US",
            "from": {"id": uid, "name": user, "aadObjectId": str(uuid.uuid5(
                uuid.NAMESPACE_URL, user))},
            "conversation": {"id": conversation, "conversationType": kind, "tenantId": TENANT,
                             "isGroup": kind != "personal"},
            "recipient": {"id": self.bot_id, "name": BOT_NAME}, "entities": entities,
            "channelData": {"tenant": {"id": TENANT}}, "attachments": []}
        if reply_to is not None:
            activity["attachments"].append(self._quote(reply_to))
        if document is not None:
            activity["attachments"].append(self._document(*document))
        if image is not None:
            fid = secrets.token_hex(8)
            self.files[fid] = (image, True)
            activity["attachments"].append({"contentType": "image/png", "contentUrl":
                                            f"{self.service_url}v3/attachments/{fid}/views/"
                                            "original"})
        return activity

    def _quote(self, sent: Sent) -> dict[str, Any]:
        return {"contentType": "text/html", "content": (
            f'<blockquote itemscope="" itemtype="http://schema.skype.com/Reply" '
            f'itemid="{sent.id}"><strong itemprop="mri" itemid="{self.bot_id}">{BOT_NAME}'
            f'</strong><span itemprop="time" itemid="{sent.id}"></span>'
            f'<p itemprop="preview">{sent.text[:40]}</p></blockquote><p>…</p>')}

    def _document(self, name: str, data: bytes) -> dict[str, Any]:
        fid = secrets.token_hex(8)
        self.files[fid] = (data, False)
        return {"contentType": FILE_INFO, "name": name,
                "contentUrl": f"https://contoso.sharepoint.com/personal/alice/{name}",
                "content": {"downloadUrl": f"{self.url}/files/{fid}?tempauth=fake",
                            "uniqueId": fid, "fileType": name.rsplit(".", 1)[-1]}}

    async def user_says(self, conversation: str, text: str = "", **kw: Any) -> Said:
        """A person writes: the activity posted, signed (returns after the first attempt)."""
        activity = self.activity(conversation, text, **kw)
        delivery = await self.post_activity(activity)
        return Said(conversation, activity["id"], delivery)

    async def redeliver(self, said: Said) -> Delivery:
        return await self.post_activity(copy.deepcopy(said.delivery.activity))

    async def post_activity(self, activity: dict[str, Any], *, token: str | None = None,
                            wait: bool = False) -> Delivery:
        """Post ``activity`` with ``token`` (a good one by default), retrying 5xx and
        timeouts; with ``wait`` until the last attempt, else until the first is answered."""
        delivery = Delivery(activity)
        self.deliveries.append(delivery)
        first = asyncio.Event()
        task = asyncio.ensure_future(self._deliver(delivery, first, token))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await (asyncio.shield(task) if wait else first.wait())
        return delivery

    async def _deliver(self, delivery: Delivery, first: asyncio.Event,
                       token: str | None) -> None:
        body = json.dumps(delivery.activity).encode()
        try:
            for delay in (0.0, *self.retry_delays):
                if delay:
                    await asyncio.sleep(delay)
                headers = {"Content-Type": "application/json; charset=utf-8",
                           "Authorization": f"Bearer {token or self.token_for()}"}
                status, answer = await self._attempt(body, headers)
                delivery.statuses.append(status)
                delivery.bodies.append(answer)
                first.set()
                self._notify()
                if 200 <= status < 500:
                    break
        finally:
            first.set()
            delivery.done.set()

    async def _attempt(self, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        if not self.endpoint_url or self._session is None:
            return 0, None
        try:
            async with self._session.post(self.endpoint_url, data=body, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                raw = await r.read()
                try:
                    answer: Any = json.loads(raw) if raw else None
                except ValueError:
                    answer = raw.decode(errors="replace")
                return r.status, answer
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return 0, None


def _check_card(card: Any) -> None:
    """What Teams refuses of an Adaptive Card's actions."""
    if not isinstance(card, dict) or card.get("type") != "AdaptiveCard":
        raise Refused(400, "BadArgument", "The card is not an AdaptiveCard.")
    actions = card.get("actions") or []
    if not isinstance(actions, list):
        raise Refused(400, "BadArgument", "The card's actions are not an array.")
    for action in actions:
        kind = action.get("type") if isinstance(action, dict) else None
        if kind not in ("Action.Execute", "Action.Submit", "Action.OpenUrl"):
            raise Refused(400, "BadArgument", f"Unknown card action {kind!r}.")
        if not isinstance(action.get("title"), str) or not action["title"].strip():
            raise Refused(400, "BadArgument", "A card action needs a title.")
        if kind == "Action.Execute":
            try:
                major, minor = (int(p) for p in str(card.get("version")).split(".")[:2])
            except ValueError:
                major, minor = 0, 0
            if (major, minor) < (1, 4):
                raise Refused(400, "BadArgument", "Action.Execute needs card version 1.4.")
            if not isinstance(action.get("verb"), str) or not isinstance(
                    action.get("data", {}), dict):
                raise Refused(400, "BadArgument", "Action.Execute needs a verb and data.")


def inline_image(sent: Sent) -> bytes | None:
    """The bytes of an image the bot sent inline (a ``data:`` URI)."""
    for item in sent.attachments:
        url = str(item.get("contentUrl") or "")
        if url.startswith("data:") and ";base64," in url:
            return base64.b64decode(url.split(";base64,", 1)[1])
    return None


def card_tables(sent: Sent) -> list[list[list[str]]]:
    """The tables of the Adaptive Cards of a message: rows of cell texts."""
    tables = []
    for item in sent.attachments:
        if item.get("contentType") != CARD:
            continue
        for element in (item.get("content") or {}).get("body") or []:
            if element.get("type") == "Table":
                tables.append([[" ".join(str(b.get("text") or "") for b in cell["items"])
                                for cell in row["cells"]] for row in element["rows"]])
    return tables
