"""The WhatsApp provider: the Cloud API, by plain aiohttp (see the README for why not pywa).

Receiving: Meta posts to ``webhook_path`` on the gateway's HTTP server. ``GET`` there is the
subscription handshake (``hub.verify_token`` checked, ``hub.challenge`` echoed); every ``POST``
is checked against ``X-Hub-Signature-256`` before anything else is read. Each message is handed
to intake before the post is answered 200; when intake is full the answer is 503 and Meta
delivers the post again (a redelivery is recognised by its ``wamid``, here and by the gateway's
dedupe). Documents and images are downloaded into the data dir.
Sending: text in WhatsApp's own formatting, images and documents (uploaded first), the read
receipt with the typing indicator; approval buttons as reply buttons, whose taps come back as
the clicker's commands (``buttons.py``). WhatsApp cannot edit a message. Free-form messages reach a
person only within 24 hours of their last message: a reply that would fall outside (known here,
or refused with 131047) is logged and the admin is told; it is never dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from pluto.errors import DeliveryRefused, PlutoError, ProviderError
from pluto import jsonlimits
from pluto.gateway.ports import HttpMount, Intake, Provider, ProviderContext
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.buttons import click_message
from pluto.providers.kit.files import (TooLarge, max_bytes, not_downloaded, read_outgoing,
                                       too_large)
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.providers.kit.signatures import body_signature_ok, same_secret
from pluto.providers.whatsapp.api import GraphApi
from pluto.providers.whatsapp.buttons import (Check, interactive_messages, tapped,
                                              with_commands)
from pluto.providers.whatsapp.errors import (OUTSIDE_WINDOW, GraphError, Waits, provider_error,
                                             redact_secrets_in_logs)
from pluto.providers.whatsapp.inbound import (READABLE, Inbound, Status, media_of, parse,
                                              to_incoming, upload_path)
from pluto.providers.whatsapp.markup import WHATSAPP
from pluto.providers.whatsapp.settings import WhatsAppSecrets, WhatsAppSettings, load_settings
from pluto.types import Attachment, Capabilities, OutgoingMessage

log = logging.getLogger(__name__)

WINDOW = 24 * 3600.0
SENT_KEPT = 1000  # texts remembered for a resend as the window template
MAX_CAPTION = 1024
TYPING_LASTS = 20.0  # WhatsApp shows it up to 25 s, or until the reply
REMEMBERED = 4096  # message ids kept to recognise redeliveries before any work is done
ADMIN_NOTICE_EVERY = 3600.0  # per person, so an admin is told once, not once per chunk
NETWORK = (aiohttp.ClientError, OSError, asyncio.TimeoutError)
CHECK_BUDGET = 5.0  # seconds to ask whether a tap's person may decide


class WhatsAppProvider(Provider):
    name = "whatsapp"
    capabilities = Capabilities(max_message_length=4096, markup=WHATSAPP, can_send_images=True,
                                can_send_files=True, has_typing=True, has_buttons=True)

    def __init__(self, settings: WhatsAppSettings, secrets: WhatsAppSecrets, *, data_dir: Path,
                 http: HttpMount | None, approvals: Check | None = None):
        redact_secrets_in_logs(secrets.values())
        self.settings = settings
        self._secrets = secrets
        self.api = GraphApi(settings.api_url, settings.phone_number_id, secrets.token)
        self.waits = Waits(settings.pair_rate_wait_seconds, settings.throughput_wait_seconds)
        self.uploads = data_dir / "uploads" / "whatsapp"
        self._intake: Intake | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._last_in: dict[str, tuple[float, str]] = {}  # wa_id → (when they wrote, wamid)
        # texts sent lately (wamid → (wa_id, text)): one WhatsApp reports outside the window
        # afterwards goes out again as the window template, when one is set
        self._sent_texts: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._typing: dict[str, tuple[str, float]] = {}  # wa_id → (wamid, when shown)
        self._told_admin: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.handover = HandOver(self.name)
        self.approvals = approvals
        if http is not None:
            http.router.add_get(settings.webhook_path, self._on_verify)
            http.router.add_post(settings.webhook_path, self._on_webhook)

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> WhatsAppProvider:
        settings, secrets = load_settings(ctx)
        return cls(settings, secrets, data_dir=ctx.data_dir, http=ctx.http,
                   approvals=ctx.approvals)

    # lifecycle ---------------------------------------------------------------------------

    async def run(self, intake: Intake) -> None:
        await self._check_number()
        self._intake = intake
        log.info("whatsapp: receiving for number %s at %s", self.settings.phone_number_id,
                 self.settings.webhook_path)
        try:
            await asyncio.Event().wait()  # messages arrive through the webhook until cancelled
        finally:
            self._intake = None

    async def _check_number(self) -> None:
        """The token and the number id work (a rejected token stops the provider for good)."""
        try:
            await self.api.number()
        except GraphError as e:
            error = provider_error(e, self.waits)
            raise type(error)(f"{error} (the token in {self.settings.token_env}, the number "
                              f"{self.settings.phone_number_id})") from None
        except NETWORK as e:  # unreachable: the supervisor retries
            raise provider_error(e, self.waits) from None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.api.close()

    # receiving ---------------------------------------------------------------------------

    async def _on_verify(self, request: web.Request) -> web.Response:
        q = request.query
        if (q.get("hub.mode") == "subscribe"
                and same_secret(q.get("hub.verify_token", ""), self._secrets.verify_token)
                and q.get("hub.challenge")):
            log.info("whatsapp: webhook subscription verified")
            return web.Response(text=q["hub.challenge"])
        return web.Response(status=403, text="verification failed")

    async def _on_webhook(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not body_signature_ok(self._secrets.app_secret, body,
                                 request.headers.get("X-Hub-Signature-256")):
            return web.Response(status=401, text="bad signature")
        intake = self._intake
        if intake is None:
            return web.Response(status=503, text="not ready")  # Meta delivers it again
        try:
            messages, statuses = parse(jsonlimits.loads(body), self.settings.phone_number_id)
        except ValueError:
            return web.Response(status=400, text="not a WhatsApp webhook")
        for status in statuses:
            self._on_status(status)
        try:
            for message in messages:
                if not await self._receive(message, intake):
                    return web.Response(status=503, text="busy")  # Meta delivers it again
        except NotRecorded:  # the storage failed (logged once per outage): delivered again
            return web.Response(status=503, text="not recorded; try again")
        except PlutoError as e:  # (a platform call while reading it): delivered again
            log.warning("whatsapp: a message could not be taken (%s); WhatsApp will deliver "
                        "it again", e)
            return web.Response(status=503, text="try again")
        return web.Response(text="ok")  # every message in it recorded: confirmed

    async def _receive(self, inbound: Inbound, intake: Intake) -> bool:
        """Hand one message to the gateway; False when intake had no room."""
        if inbound.id in self._seen:
            log.debug("whatsapp: message %s arrived again; ignored", inbound.id)
            return True
        self._note_inbound(inbound)
        if inbound.kind == "interactive":
            return await self._on_tap(inbound, intake)
        if inbound.kind not in READABLE:
            if inbound.kind not in ("reaction", "unsupported", "system", "request_welcome"):
                await self._quiet_notice(inbound.wa_id, "I can read text, documents, images and voice "
                                         "notes; please send your question as one of those.")
            self._remember(inbound.id)
            return True
        attachments: tuple[Attachment, ...] = ()
        media = media_of(inbound)
        if media is not None:
            attachments, problem = await self._download(inbound, *media)
            if problem:
                await self._quiet_notice(inbound.wa_id, problem)
        incoming = to_incoming(inbound, attachments)
        if not incoming.text and not incoming.attachments:
            self._remember(inbound.id)
            return True
        if await self.handover(intake.offer, incoming) is None:
            return False
        self._remember(inbound.id)
        return True

    async def _on_tap(self, inbound: Inbound, intake: Intake) -> bool:
        """A tap on a reply button: checked, then handed over as the clicker's command, or
        answered in their chat (WhatsApp has no private notes); False when intake had no room."""
        found = tapped(inbound.raw)
        if found is None:
            log.info("whatsapp: ignored a button reply that is not one of ours (%s)", inbound.id)
            self._remember(inbound.id)
            return True
        command, approval_id = found
        refusal = await self._refusal(inbound.wa_id, approval_id)
        if refusal is not None:
            self._remember(inbound.id)
            await self._quiet_notice(inbound.wa_id, refusal)
            return True
        click = click_message(self.name, chat_id=inbound.wa_id, user_id=inbound.wa_id,
                              command=command, click_id=inbound.id, user_name=inbound.name,
                              is_direct=True)
        if await self.handover(intake.offer, click) is None:
            return False
        self._remember(inbound.id)
        return True

    async def _refusal(self, wa_id: str, approval_id: str) -> str | None:
        if self.approvals is None:
            return None
        try:
            return await asyncio.wait_for(self.approvals(self.name, wa_id, wa_id, approval_id),
                                          CHECK_BUDGET)
        except asyncio.TimeoutError:
            return "That took too long to check; please tap the button again."

    def _note_inbound(self, inbound: Inbound) -> None:
        when = inbound.timestamp or time.time()
        known = self._last_in.get(inbound.wa_id)
        if known is None or when >= known[0]:
            self._last_in[inbound.wa_id] = (when, inbound.id)

    def _remember(self, message_id: str) -> None:
        remember(self._seen, message_id, None, REMEMBERED)

    async def _download(self, inbound: Inbound, media_id: str, name: str, mime: str,
                        kind: str) -> tuple[tuple[Attachment, ...], str | None]:
        path = upload_path(self.uploads, inbound, name)
        try:
            size = await self.api.download(media_id, path,
                                           max_bytes(self.settings.max_download_mb))
        except TooLarge:
            return (), too_large(name, self.settings.max_download_mb)
        except (GraphError, *NETWORK) as e:
            await asyncio.to_thread(path.unlink, missing_ok=True)
            log.warning("whatsapp: downloading %s from %s failed: %s", name, inbound.wa_id,
                        provider_error(e, self.waits))
            return (), not_downloaded(name)
        return (Attachment(filename=name, mime_type=mime, size=size, path=path,
                           kind="image" if kind == "image" else "file"),), None

    def _on_status(self, status: Status) -> None:
        if status.status != "failed":
            return
        codes = [int(e.get("code") or 0) for e in status.errors if str(e.get("code", "")).isdigit()]
        if OUTSIDE_WINDOW in codes:
            sent = self._sent_texts.pop(status.message_id, None)
            if sent is not None and self.settings.window_template is not None:
                self._spawn(self._as_template(*sent))
            else:
                self._spawn(self._window_closed(status.recipient, status.message_id))
        else:
            detail = "; ".join(str(e.get("title") or e.get("message") or e.get("code"))
                               for e in status.errors) or "no reason given"
            log.warning("whatsapp: message %s to %s was not delivered: %s", status.message_id,
                        status.recipient, detail)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _quiet_notice(self, wa_id: str, text: str) -> None:
        await quiet_notice(self.send, notice(wa_id, text), log=log, provider="whatsapp",
                           place=wa_id)

    # the 24-hour window ---------------------------------------------------------------------

    def _outside_window(self, wa_id: str) -> bool:
        known = self._last_in.get(wa_id)
        return known is not None and time.time() - known[0] > WINDOW

    async def _window_closed(self, wa_id: str, what: str) -> None:
        """A reply to ``wa_id`` cannot go out: say so in the log, and to the admin."""
        log.warning("whatsapp: a reply to %s was not delivered (%s): more than 24 hours have "
                    "passed since they last wrote, and WhatsApp only lets a template message "
                    "through until they write again", wa_id, what)
        admin = self.settings.admin_number
        if not admin or admin == wa_id or self._outside_window(admin):
            if not admin:
                log.warning("whatsapp: no admin_number is set; nobody else was told")
            return
        now = time.monotonic()
        if now - self._told_admin.get(wa_id, -ADMIN_NOTICE_EVERY) < ADMIN_NOTICE_EVERY:
            return
        self._told_admin[wa_id] = now
        try:
            await self.api.message(admin, "text", {
                "body": f"Pluto could not deliver a reply to +{wa_id}: their 24-hour WhatsApp "
                        "window is closed. They will get answers again once they write."})
        except (GraphError, *NETWORK) as e:  # the log line above stands either way
            log.warning("whatsapp: could not tell the admin (%s): %s", admin,
                        provider_error(e, self.waits))

    async def _as_template(self, wa_id: str, text: str) -> None:
        """A text WhatsApp refused afterwards (the window had closed) sent as the template."""
        try:
            await self._send_template(wa_id, text)
        except ProviderError as e:
            log.warning("whatsapp: a reply to %s outside the 24-hour window could not go out as "
                        "the window template either: %s", wa_id, e)

    async def _send_template(self, wa_id: str, text: str) -> str:
        """The reply as the window template's one variable: on one line (WhatsApp refuses a
        variable with a newline, a tab or more than four spaces in a row), cut to its cap."""
        template = self.settings.window_template
        assert template is not None
        line = " ".join(text.split())
        if not line:
            raise DeliveryRefused("WhatsApp's 24-hour window with this person is closed, and a "
                                  "template carries text only")
        if len(line) > template.max_chars:
            line = line[:template.max_chars - 1].rstrip() + "…"
        log.info("whatsapp: %s last wrote over 24 hours ago; the reply goes out as the template "
                 "%s", wa_id, template.name)
        try:
            return await self.api.message(wa_id, "template", {
                "name": template.name, "language": {"code": template.language},
                "components": [{"type": "body",
                                "parameters": [{"type": "text", "text": line}]}]})
        except GraphError as e:
            raise provider_error(e, self.waits) from None
        except NETWORK as e:
            raise provider_error(e, self.waits) from None

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        to = message.chat_id
        if not to.isdigit():
            raise DeliveryRefused(f"{to!r} is not a WhatsApp number (wa_id)")
        if self._outside_window(to):
            if self.settings.window_template is not None:
                return await self._send_template(to, with_commands(message.text,
                                                                      message.buttons))
            await self._window_closed(to, f"{message.kind} of run {message.run_id or '-'}")
            raise DeliveryRefused("WhatsApp's 24-hour window with this person is closed")
        try:
            if message.attachments:
                return await self._send_files(message)
            if message.buttons:
                return await self._send_with_buttons(message)
            wamid = await self.api.message(to, "text", {"body": message.text,
                                                         "preview_url": False},
                                           reply_to=message.reply_to)
            if self.settings.window_template is not None:
                remember(self._sent_texts, wamid, (to, message.text), SENT_KEPT)
            return wamid
        except GraphError as e:
            if e.code == OUTSIDE_WINDOW:
                if self.settings.window_template is not None and not message.attachments:
                    return await self._send_template(to, with_commands(message.text,
                                                                      message.buttons))
                await self._window_closed(to, f"{message.kind} of run {message.run_id or '-'}")
            raise provider_error(e, self.waits) from None
        except NETWORK as e:
            raise provider_error(e, self.waits) from None

    async def _send_with_buttons(self, message: OutgoingMessage) -> str:
        """The text with reply buttons (``buttons.py``); the first message's wamid."""
        first: str | None = None
        for kind, content in interactive_messages(message.text, message.buttons):
            sent = await self.api.message(message.chat_id, kind, content,
                                          reply_to=None if first else message.reply_to)
            first = first or sent
        if self.settings.window_template is not None:  # refused afterwards: as the template
            remember(self._sent_texts, sent, (message.chat_id, with_commands(
                message.text, message.buttons)), SENT_KEPT)
        assert first is not None
        return first

    async def _send_files(self, message: OutgoingMessage) -> str:
        caption: str | None = message.text if len(message.text) <= MAX_CAPTION else None
        first: str | None = None
        if message.text and caption is None:
            first = await self.api.message(message.chat_id, "text",
                                           {"body": message.text, "preview_url": False})
        for attachment in message.attachments:
            sent = await self._send_file(message.chat_id, attachment, caption or None)
            first, caption = first or sent, None
        assert first is not None
        return first

    async def _send_file(self, to: str, attachment: Attachment, caption: str | None) -> str:
        data = await read_outgoing(attachment)
        media_id = await self.api.upload(data, attachment.filename, attachment.mime_type)
        if attachment.kind == "image" and attachment.mime_type in ("image/png", "image/jpeg"):
            content: dict[str, str] = {"id": media_id}
            kind = "image"
        elif attachment.mime_type == "audio/ogg":  # OGG/Opus: a voice note (docs/voice.md)
            if caption:  # (an audio message takes none: the text goes first)
                await self.api.message(to, "text", {"body": caption, "preview_url": False})
            return await self.api.message(to, "audio", {"id": media_id})
        else:
            content, kind = {"id": media_id, "filename": attachment.filename}, "document"
        if caption:
            content["caption"] = caption
        return await self.api.message(to, kind, content)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        """The read receipt on the person's last message, and the typing indicator."""
        known = self._last_in.get(chat_id)
        if known is None:
            return
        shown = self._typing.get(chat_id)
        if shown is not None and shown[0] == known[1] and time.monotonic() - shown[1] < TYPING_LASTS:
            return
        self._typing[chat_id] = (known[1], time.monotonic())
        try:
            await self.api.mark_read(known[1], typing=True)
        except (GraphError, *NETWORK) as e:  # a missing indicator is no failure of the reply
            log.debug("whatsapp: typing indicator for %s: %s", chat_id,
                      provider_error(e, self.waits))
