"""A fake WhatsApp Cloud API for tests: the provider talks to it over HTTP, and it posts
signed webhooks to the gateway.

    async with FakeWhatsApp() as fake:
        fake.webhook_url = "http://127.0.0.1:8080/whatsapp/webhook"
        fake.add_user("4915100000001", "Alice")
        said = await fake.user_says("4915100000001", "hello")   # a signed webhook post
        [sent] = await fake.wait_until(lambda: fake.messages_to("4915100000001"))

It behaves like the Graph API where a business app can tell:

- ``Authorization: Bearer <token>`` on every call, else 401 with error 190; paths carry a
  version (``/v21.0/...``); errors are ``{"error": {"message", "type", "code", "error_data":
  {"details"}, "fbtrace_id"}}`` (HTTP 400, 401 for 190).
- ``POST /<version>/<phone_number_id>/messages``: ``text`` (``body`` at most 4,096 characters),
  ``image`` and ``document`` by an uploaded media ``id`` (caption at most 1,024); answers
  ``{"messaging_product", "contacts": [{"input", "wa_id"}], "messages": [{"id": "wamid…"}]}``.
  ``{"status": "read", "message_id", "typing_indicator"}`` marks a user's message read.
- The 24-hour window: a free-form message to a person who has not written in 24 hours is
  accepted, then reported failed by a ``statuses`` webhook with error 131047 (as WhatsApp does).
  Accepted messages get ``sent`` and ``delivered`` statuses by webhook (``status_webhooks``).
- ``POST /<version>/<phone_number_id>/media`` (multipart ``file``, ``type``,
  ``messaging_product``) → ``{"id"}``; ``GET /<version>/<media_id>`` → ``{"url", "mime_type",
  "sha256", "file_size", "id"}``; the URL serves the bytes to the bearer token only.
- ``interactive`` reply-button messages (``type: button``): at most 3 buttons, each title at
  most 20 characters and id at most 256, unique; body text at most 1,024 — else 131009 with
  the Cloud API's details. ``user_clicks()`` posts the ``interactive.button_reply`` a tap sends
  (its ``context.id`` the bot's message).
- ``GET /<version>/<phone_number_id>`` → the number's ``display_phone_number``.
- Webhooks: JSON posts signed ``X-Hub-Signature-256: sha256=<HMAC-SHA256(app secret, body)>``;
  an answer other than 200 (or none) is retried after ``retry_delays`` (WhatsApp retries with
  backoff for up to 7 days), the same payload each time. ``verify()`` runs the subscription
  handshake (``hub.mode``, ``hub.verify_token``, ``hub.challenge``).

Test controls, records and waits are in whatsapp_state.py (``Controls``).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from .whatsapp_state import (MAX_CAPTION, MAX_TEXT, WINDOW, Call, Controls, Delivery,
                             GraphFailure, Said, Sent)

__all__ = ["FakeWhatsApp", "sign", "TOKEN", "APP_SECRET", "VERIFY_TOKEN", "PHONE_NUMBER_ID"]

TOKEN = "EAAGfakePlutoWhatsAppToken0123456789abcdefZZ"
APP_SECRET = "f4k3app5ecret0123456789abcdef01"
VERIFY_TOKEN = "pluto-fake-verify-token-42"
PHONE_NUMBER_ID = "106540352242922"
DISPLAY_NUMBER = "15550001234"
WABA_ID = "102290129340398"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


MAX_BUTTONS, MAX_BUTTON_TITLE, MAX_BUTTON_ID, MAX_INTERACTIVE_BODY = 3, 20, 256, 1024
AUDIO = ("audio/ogg", "audio/mpeg", "audio/mp4", "audio/aac", "audio/amr")  # (OGG: Opus)

class FakeWhatsApp(Controls):
    """One business number on a fake Cloud API. Use ``async with`` or ``start()``/``stop()``."""

    def __init__(self, *, token: str = TOKEN, app_secret: str = APP_SECRET,
                 verify_token: str = VERIFY_TOKEN, phone_number_id: str = PHONE_NUMBER_ID,
                 webhook_url: str | None = None, status_webhooks: bool = True,
                 retry_delays: tuple[float, ...] = (0.1, 0.3, 1.0)) -> None:
        super().__init__()
        self.token, self.app_secret, self.verify_token = token, app_secret, verify_token
        self.phone_number_id = phone_number_id
        self.webhook_url = webhook_url
        self.status_webhooks = status_webhooks
        self.retry_delays = retry_delays
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    # lifecycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeWhatsApp:
        app = web.Application(client_max_size=128 * 1024 * 1024)
        app.router.add_get("/media-files/{media_id}", self._handle_download)
        app.router.add_route("*", "/{version:v[0-9]+\\.[0-9]+}/{path:.*}", self._handle_api)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        return self

    async def stop(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeWhatsApp:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # the Graph API ------------------------------------------------------------------------

    async def _handle_api(self, request: web.Request) -> web.Response:
        path = request.match_info["path"].strip("/")
        call = Call(request.method, path, None)
        self.calls.append(call)
        try:
            if request.headers.get("Authorization", "") != f"Bearer {self.token}":
                raise GraphFailure(190)
            parts = path.split("/")
            if request.method == "GET" and len(parts) == 1:
                body = self._get_node(parts[0])
            elif request.method == "POST" and parts == [self.phone_number_id, "messages"]:
                call.payload = await self._json(request)
                body = await self._messages(call.payload)
            elif request.method == "POST" and parts == [self.phone_number_id, "media"]:
                body = await self._upload(request)
            else:
                raise GraphFailure(100, f"Unsupported {request.method} request: {path}")
            status, headers = 200, {}
        except GraphFailure as failure:
            body, status, headers = failure.body(), failure.status, failure.headers
        call.status = status
        self._notify()
        return web.json_response(body, status=status, headers=headers)

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        try:
            payload = await request.json()
        except ValueError:
            raise GraphFailure(100, "the body is not JSON") from None
        if not isinstance(payload, dict):
            raise GraphFailure(100, "the body is not a JSON object")
        return payload

    def _get_node(self, node: str) -> dict[str, Any]:
        if node == self.phone_number_id:
            return {"id": node, "display_phone_number": DISPLAY_NUMBER,
                    "verified_name": "Pluto Test"}
        if node in self.media:
            data, mime, _ = self.media[node]
            return {"messaging_product": "whatsapp", "id": node, "mime_type": mime,
                    "sha256": hashlib.sha256(data).hexdigest(), "file_size": len(data),
                    "url": f"{self.url}/media-files/{node}?ext=1&hash=fake"}
        raise GraphFailure(100, f"Unsupported get request. Object with ID '{node}' does not "
                                "exist")

    async def _messages(self, p: dict[str, Any]) -> dict[str, Any]:
        if p.get("messaging_product") != "whatsapp":
            raise GraphFailure(100, "The parameter messaging_product is required.")
        if p.get("status") == "read":
            wamid = str(p.get("message_id") or "")
            if wamid not in self.inbound_ids:
                raise GraphFailure(100, f"Invalid message_id {wamid}")
            self.reads.append((wamid, bool(p.get("typing_indicator"))))
            return {"success": True}
        to = str(p.get("to") or "").lstrip("+")
        if not to.isdigit():
            raise GraphFailure(100, "Invalid parameter 'to'")
        kind = p.get("type") or "text"
        content = p.get(kind)
        if kind not in ("text", "image", "document", "audio", "template", "interactive") or \
                not isinstance(content, dict):
            raise GraphFailure(100, f"Invalid parameter type or missing {kind} object")
        failure = self._take_failure(p)
        if failure is not None:
            raise failure
        if kind == "template":  # (reaches a person outside the 24-hour window too)
            text = self._template(content)
            wamid = self.wamid()
            self.sent.append(Sent(wamid, to, kind, text, None, None, None, None,
                                  copy.deepcopy(p)))
            for status in ("sent", "delivered"):
                self._status_later(wamid, to, status)
            return {"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                    "messages": [{"id": wamid}]}
        if kind == "interactive":
            text, media_id, data, filename = check_interactive(content), None, None, None
        else:
            text, media_id, data, filename = self._content(kind, content)
        wamid = self.wamid()
        context = p.get("context") if isinstance(p.get("context"), dict) else {}
        self.sent.append(Sent(wamid, to, kind, text, media_id, data, filename,
                              context.get("message_id"), copy.deepcopy(p)))
        if time.time() - self.last_inbound.get(to, float("-inf")) > WINDOW:
            self._status_later(wamid, to, "failed", GraphFailure(131047, "Message failed to send "
                               "because more than 24 hours have passed since the customer last "
                               "replied to this number."))
        else:
            for status in ("sent", "delivered"):
                self._status_later(wamid, to, status)
        return {"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": wamid}]}

    def _template(self, c: dict[str, Any]) -> str:
        """An approved template (``self.templates``: name → language) with one body variable,
        checked as WhatsApp checks it; the text the person reads."""
        name = c.get("name")
        language = (c.get("language") or {}).get("code") if isinstance(c.get("language"), dict) \
            else None
        if name not in self.templates or self.templates[name] != language:
            raise GraphFailure(132001, f"Template name does not exist in the translation "
                                       f"({name} / {language})")
        components = c.get("components") or []
        params = [prm for comp in components if isinstance(comp, dict) and comp.get("type") ==
                  "body" for prm in comp.get("parameters") or []]
        if len(params) != 1 or not isinstance(params[0], dict) or params[0].get("type") != "text":
            raise GraphFailure(132000, "Number of parameters does not match the expected number "
                                       "of params")
        value = params[0].get("text")
        if not isinstance(value, str) or not value.strip() or len(value) > 1024 or \
                "\n" in value or "\t" in value or "     " in value:
            raise GraphFailure(132018, "There was an issue with the parameters in your template.")
        return value

    def _content(self, kind: str, c: dict[str, Any]
                 ) -> tuple[str, str | None, bytes | None, str | None]:
        if kind == "text":
            body = c.get("body")
            if not isinstance(body, str) or not body.strip():
                raise GraphFailure(100, "The parameter text['body'] is required.")
            if len(body) > MAX_TEXT:
                raise GraphFailure(100, f"Param text['body'] must be at most {MAX_TEXT} "
                                        "characters long.")
            return body, None, None, None
        caption = str(c.get("caption") or "")
        if len(caption) > MAX_CAPTION:
            raise GraphFailure(100, f"Param {kind}['caption'] must be at most {MAX_CAPTION} "
                                    "characters long.")
        media_id = str(c.get("id") or "")
        if media_id not in self.media:
            raise GraphFailure(131053, f"Media id {media_id} was not uploaded")
        data, mime, name = self.media[media_id]
        if kind == "image" and mime not in ("image/png", "image/jpeg"):
            raise GraphFailure(131053, f"{mime} is not an image type WhatsApp sends")
        if kind == "audio" and (caption or mime.split(";")[0] not in AUDIO):
            raise GraphFailure(131053, f"an audio message takes no caption and one of {AUDIO}"
                                       f" (got {mime})")
        if kind == "audio" and mime.startswith("audio/ogg") and not data.startswith(b"OggS"):
            raise GraphFailure(131053, "the audio is not OGG")
        return caption, media_id, data, str(c.get("filename") or name)

    async def _upload(self, request: web.Request) -> dict[str, Any]:
        if not request.content_type.startswith("multipart/"):
            raise GraphFailure(100, "the upload must be multipart/form-data")
        form = await request.post()
        upload = form.get("file")
        if form.get("messaging_product") != "whatsapp" or not hasattr(upload, "file"):
            raise GraphFailure(100, "messaging_product and file are required")
        data = upload.file.read()  # type: ignore[union-attr]
        mime = str(form.get("type") or upload.content_type)  # type: ignore[union-attr]
        media_id = str(900000000000000 + next(self._seq))
        self.media[media_id] = (data, mime, upload.filename)  # type: ignore[union-attr]
        return {"id": media_id}

    async def _handle_download(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization", "") != f"Bearer {self.token}":
            return web.Response(status=401, text="Unauthorized")
        found = self.media.get(request.match_info["media_id"])
        if found is None:
            return web.Response(status=404, text="Not found")
        return web.Response(body=found[0], content_type=found[1])

    # webhooks ------------------------------------------------------------------------------

    def _envelope(self, value: dict[str, Any]) -> dict[str, Any]:
        return {"object": "whatsapp_business_account", "entry": [{"id": WABA_ID, "changes": [{
            "field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": {"display_phone_number": DISPLAY_NUMBER,
                             "phone_number_id": self.phone_number_id}, **value}}]}]}

    def _status_later(self, wamid: str, to: str, status: str,
                      failure: GraphFailure | None = None) -> None:
        if not self.status_webhooks or not self.webhook_url or self._closing:
            return
        st: dict[str, Any] = {"id": wamid, "status": status, "timestamp": str(int(time.time())),
                              "recipient_id": to}
        if failure is not None:
            st["errors"] = [failure.as_status_error()]
        self._spawn(self.post_webhook(self._envelope({"statuses": [st]})))

    async def user_says(self, wa_id: str, text: str = "", *, document: tuple[str, bytes] | None = None,
                        image: bytes | None = None, voice: bytes | None = None,
                        reply_to: str | None = None, kind: str | None = None) -> Said:
        """A person writes to the business number: a signed webhook post (awaited)."""
        name = self.users.setdefault(wa_id, "Alice")
        wamid = self.wamid()
        msg: dict[str, Any] = {"from": wa_id, "id": wamid, "timestamp": str(int(time.time()))}
        if document is not None:
            media_id = str(800000000000000 + next(self._seq))
            self.media[media_id] = (document[1], _mime(document[0]), document[0])
            msg |= {"type": "document", "document": {
                "id": media_id, "filename": document[0], "mime_type": _mime(document[0]),
                "sha256": hashlib.sha256(document[1]).hexdigest(), **({"caption": text} if text else {})}}
        elif image is not None:
            media_id = str(800000000000000 + next(self._seq))
            self.media[media_id] = (image, "image/jpeg", "photo.jpg")
            msg |= {"type": "image", "image": {"id": media_id, "mime_type": "image/jpeg",
                                                **({"caption": text} if text else {})}}
        elif voice is not None:  # a voice note recorded in WhatsApp: OGG/Opus, no caption
            media_id = str(800000000000000 + next(self._seq))
            self.media[media_id] = (voice, "audio/ogg; codecs=opus", "voice.ogg")
            msg |= {"type": "audio", "audio": {"id": media_id, "mime_type": "audio/ogg; codecs=opus",
                                                "sha256": hashlib.sha256(voice).hexdigest(),
                                                "voice": True}}
        elif kind is not None:
            msg |= {"type": kind, kind: {}}
        else:
            msg |= {"type": "text", "text": {"body": text}}
        if reply_to:
            msg["context"] = {"from": DISPLAY_NUMBER, "id": reply_to}
        self.last_inbound[wa_id] = time.time()
        self.inbound_ids[wamid] = wa_id
        payload = self._envelope({"contacts": [{"profile": {"name": name}, "wa_id": wa_id}],
                                  "messages": [msg]})
        delivery = await self.post_webhook(payload, wait=False)
        return Said(wa_id, wamid, delivery)

    async def user_clicks(self, wa_id: str, message_id: str, button_id: str) -> Said:
        """A person taps a reply button under the bot's interactive message ``message_id``: an
        ``interactive.button_reply`` message in a signed webhook post (awaited)."""
        sent = next((s for s in self.sent if s.id == message_id and s.to == wa_id), None)
        buttons = (sent.payload.get("interactive") or {}).get("action", {}).get("buttons", []) \
            if sent is not None and sent.type == "interactive" else []
        reply = next((b["reply"] for b in buttons if b["reply"]["id"] == button_id), None)
        if reply is None:
            raise ValueError(f"fake WhatsApp: no button {button_id!r} under {message_id}")
        wamid = self.wamid()
        msg = {"from": wa_id, "id": wamid, "timestamp": str(int(time.time())),
               "context": {"from": DISPLAY_NUMBER, "id": message_id}, "type": "interactive",
               "interactive": {"type": "button_reply",
                               "button_reply": {"id": reply["id"], "title": reply["title"]}}}
        self.last_inbound[wa_id] = time.time()
        self.inbound_ids[wamid] = wa_id
        name = self.users.setdefault(wa_id, "Alice")
        payload = self._envelope({"contacts": [{"profile": {"name": name}, "wa_id": wa_id}],
                                  "messages": [msg]})
        return Said(wa_id, wamid, await self.post_webhook(payload, wait=True))

    async def redeliver(self, said: Said) -> Delivery:
        """The same post again (WhatsApp does this when it saw no 200 in time)."""
        return await self.post_webhook(copy.deepcopy(said.delivery.payload), wait=False)

    async def post_webhook(self, payload: dict[str, Any], *, wait: bool = True) -> Delivery:
        """Post ``payload`` signed, retrying on failure; with ``wait``, until it is settled,
        else once the first attempt is answered."""
        delivery = Delivery(payload)
        self.deliveries.append(delivery)
        first = asyncio.Event()
        task = self._spawn(self._deliver(delivery, first))
        if wait:
            await asyncio.shield(task)
        else:
            await first.wait()
        return delivery

    async def _deliver(self, delivery: Delivery, first: asyncio.Event) -> None:
        body = json.dumps(delivery.payload).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "facebookexternalua",
                   "X-Hub-Signature-256": sign(self.app_secret, body),
                   "X-Hub-Signature": "sha1=" + hmac.new(self.app_secret.encode(), body,
                                                         hashlib.sha1).hexdigest()}
        try:
            for delay in (0.0, *self.retry_delays):
                if delay:
                    await asyncio.sleep(delay)
                status = await self._post(body, headers)
                delivery.statuses.append(status)
                first.set()
                self._notify()
                if status == 200:
                    break
        finally:
            first.set()
            delivery.done.set()

    async def _post(self, body: bytes, headers: dict[str, str]) -> int:
        if not self.webhook_url or self._session is None:
            return 0
        try:
            async with self._session.post(self.webhook_url, data=body, headers=headers) as r:
                await r.read()
                return r.status
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return 0

    async def verify(self, challenge: str = "1158201444", token: str | None = None
                     ) -> tuple[int, str]:
        """The subscription handshake Meta runs when the callback URL is saved."""
        assert self._session is not None and self.webhook_url
        params = {"hub.mode": "subscribe", "hub.challenge": challenge,
                  "hub.verify_token": self.verify_token if token is None else token}
        async with self._session.get(self.webhook_url, params=params) as r:
            return r.status, await r.text()


def check_interactive(c: dict[str, Any]) -> str:
    """An interactive reply-button message checked as the Cloud API checks it; its body."""
    def bad(details: str) -> GraphFailure:
        return GraphFailure(131009, details)
    if c.get("type") != "button":
        raise GraphFailure(100, "Invalid parameter: interactive['type'] (the fake takes button)")
    body = c.get("body")
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise GraphFailure(100, "The parameter interactive['body']['text'] is required.")
    if len(text) > MAX_INTERACTIVE_BODY:
        raise bad(f"Body text length invalid. Min length: 1, Max length: {MAX_INTERACTIVE_BODY}")
    action = c.get("action")
    buttons = action.get("buttons") if isinstance(action, dict) else None
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= MAX_BUTTONS:
        raise bad(f"Buttons count invalid. Min: 1, Max: {MAX_BUTTONS}")
    ids, titles = set(), set()
    for b in buttons:
        reply = b.get("reply") if isinstance(b, dict) and b.get("type") == "reply" else None
        if not isinstance(reply, dict):
            raise GraphFailure(100, "Invalid parameter: each button needs type reply and reply")
        bid, title = reply.get("id"), reply.get("title")
        if not isinstance(bid, str) or not 1 <= len(bid) <= MAX_BUTTON_ID:
            raise bad(f"Button id length invalid. Min length: 1, Max length: {MAX_BUTTON_ID}")
        if not isinstance(title, str) or not 1 <= len(title) <= MAX_BUTTON_TITLE:
            raise bad(f"Button title length invalid. Min length: 1, Max length: "
                      f"{MAX_BUTTON_TITLE}")
        if bid in ids or title in titles:
            raise bad("Button title and id must be unique")
        ids.add(bid)
        titles.add(title)
    return text


def _mime(filename: str) -> str:
    ext = filename.rsplit(".", 1)[-1].lower()
    return {"csv": "text/csv", "pdf": "application/pdf", "png": "image/png", "jpg": "image/jpeg",
            "txt": "text/plain", "json": "application/json"}.get(ext, "application/octet-stream")
