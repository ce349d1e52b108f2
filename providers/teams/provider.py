"""The Teams provider: the Bot Framework protocol over plain aiohttp.

Receiving: the Bot Connector posts activities to ``messaging_path`` on the gateway's HTTP
server. The bearer token is verified before anything else is believed (``auth.py``): a bad one
is answered 401 and nothing is recorded. A message is handed to intake before the post is
answered 200; when intake is full or its storage fails the answer is 503, and the Connector
delivers the activity again (recognised by its id, here and by the gateway's dedupe). In
group chats and channels only messages that mention the bot, or quote one of its messages,
are taken (``group_messages: all`` takes every one Teams delivers). Files come as attachments
and are downloaded into the data dir, within ``max_download_mb``.
Sending: Markdown text, tables as Adaptive Cards (``markup.py``), small images inline, updates
of a message for streamed replies, deletes, the typing indicator; to the conversation's
``serviceUrl`` as the last verified activity named it (``conversations.py``), so proactive
messages (schedules) reach a conversation after a restart too.
Approvals: an approval request carries an Adaptive Card of ``Action.Execute`` buttons; a click
is an ``adaptiveCard/action`` invoke, checked like any activity, refused privately in the
invoke response (Teams shows it to the clicker alone), else handed over as the clicker's
command (``buttons.py``, where the choice of Execute over Submit is explained).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from pluto import jsonlimits
from pluto.errors import DeliveryRefused, ProviderError
from pluto.gateway.logs import MaskSecrets
from pluto.gateway.ports import HttpMount, Intake, Provider, ProviderContext
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.buttons import click_message
from pluto.providers.kit.files import (TooLarge, max_bytes, not_downloaded, read_outgoing,
                                       safe_filename, save_stream, too_large)
from pluto.providers.kit.http import read_limited
from pluto.providers.kit.payload import dict_at
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.providers.teams.auth import (AppToken, KeysUnavailable, Unauthorized, Verifier)
from pluto.providers.teams.buttons import (CHECK_BUDGET, INVOKE, NOT_OURS, TOO_SLOW,
                                          buttons_card, click_of, note, taken, without_buttons)
from pluto.providers.teams.connector import NETWORK, Connector, provider_error
from pluto.providers.teams.conversations import Conversations
from pluto.providers.teams.inbound import (Activity, BadActivity, FileIn, activity_part,
                                           files_of, message_id, parse, to_incoming, user_of)
from pluto.providers.teams.markup import TEAMS, lift_tables, table_card
from pluto.providers.teams.settings import TeamsSecrets, TeamsSettings, load_settings
from pluto.types import Attachment, Capabilities, IncomingMessage, OutgoingMessage

log = logging.getLogger(__name__)

Check = Callable[[str, str, str, str], Awaitable[str | None]]  # ProviderContext.approvals

TIMEOUT = aiohttp.ClientTimeout(total=30, connect=10)
MAX_BODY = 1024 * 1024  # an activity is a few kilobytes
REMEMBERED = 4096  # activity ids kept to recognise redeliveries before any work is done
INLINE_IMAGES = ("image/png", "image/jpeg", "image/gif")
_MASK = MaskSecrets(placeholder="<secret>")


class TeamsProvider(Provider):
    name = "teams"
    capabilities = Capabilities(max_message_length=4000, markup=TEAMS, can_edit=True,
                                can_send_images=True, has_typing=True, has_buttons=True)

    def __init__(self, settings: TeamsSettings, secrets: TeamsSecrets, *, data_dir: Path,
                 http: HttpMount | None, approvals: Check | None = None):
        _MASK.add(secrets.app_password)
        _MASK.attach("pluto.providers.teams", "aiohttp.client")
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self.verifier = Verifier(self._http, metadata_url=settings.openid_metadata_url,
                                 app_id=settings.app_id, issuer=settings.issuer,
                                 leeway=settings.clock_skew_seconds,
                                 refresh_every=settings.key_refresh_min_seconds)
        self.token = AppToken(self._http, token_url=settings.token_url, app_id=settings.app_id,
                              password=secrets.app_password, scope=settings.token_scope,
                              on_token=_MASK.add)
        self.connector = Connector(self._http, self.token, settings.rate_limit_wait_seconds)
        self.conversations = Conversations(data_dir)
        self.uploads = data_dir / "uploads" / "teams"
        self.handover = HandOver(self.name)
        self._intake: Intake | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.approvals = approvals
        # messages with buttons: activity id → (serviceUrl, conversation, the activity sent)
        self._cards: OrderedDict[str, tuple[str, str, dict[str, Any]]] = OrderedDict()
        self._later: set[asyncio.Task[None]] = set()
        if http is not None:
            http.router.add_post(settings.messaging_path, self._on_activity)

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> TeamsProvider:
        settings, secrets = load_settings(ctx)
        return cls(settings, secrets, data_dir=ctx.data_dir, http=ctx.http,
                   approvals=ctx.approvals)

    # lifecycle ---------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=TIMEOUT)
        return self._session

    async def _connect(self) -> None:
        """The signing keys fetched and an access token got (a refused app password stops
        the provider for good; an unreachable service is retried by the supervisor)."""
        try:
            await self.verifier.warm()
        except KeysUnavailable as e:
            raise ProviderError(f"Teams: {e}") from None
        await self.token.get()

    async def probe(self) -> str:
        await self._connect()
        return "the Bot Framework keys were fetched and an access token was issued"

    async def run(self, intake: Intake) -> None:
        await self._connect()
        self._intake = intake
        log.info("teams: receiving activities for app %s at %s", self.settings.app_id,
                 self.settings.messaging_path)
        try:
            await asyncio.Event().wait()  # activities arrive at the endpoint until cancelled
        finally:
            self._intake = None

    async def reset(self) -> None:
        old, self._session = self._session, None
        if old is not None:
            await old.close()

    async def close(self) -> None:
        for task in list(self._later):
            task.cancel()
        await asyncio.gather(*self._later, return_exceptions=True)
        await self.reset()

    # receiving ---------------------------------------------------------------------------

    async def _on_activity(self, request: web.Request) -> web.StreamResponse:
        try:
            verified = await self.verifier.verify(request.headers.get("Authorization", ""))
        except Unauthorized as e:
            log.info("teams: an activity was refused: %s", e)
            return web.Response(status=401, text="unauthorized")
        except KeysUnavailable as e:
            log.warning("teams: cannot verify activities now: %s", e)
            return web.Response(status=503, text="try again")
        body = await read_limited(request, MAX_BODY)
        if body is None:
            return web.Response(status=413, text="too large")
        try:
            activity = parse(jsonlimits.loads(body))
            verified.check(activity.service_url, activity.channel_id)
        except (BadActivity, ValueError, UnicodeDecodeError) as e:
            return web.Response(status=400, text=f"not a Bot Framework activity: {e}"[:200])
        except Unauthorized as e:
            log.info("teams: an activity was refused: %s", e)
            return web.Response(status=401, text="unauthorized")
        return await self._take(activity)

    async def _take(self, activity: Activity) -> web.StreamResponse:
        intake = self._intake
        if intake is None:
            return web.Response(status=503, text="not ready")  # delivered again
        chat, _ = activity.chat_and_thread
        if chat:
            await self.conversations.remember(chat, activity.service_url)
        if activity.type == "invoke" and activity.raw.get("name") == INVOKE:
            return await self._click(activity, intake)
        if activity.type != "message":
            return web.json_response({}) if activity.type == "invoke" else web.Response()
        try:
            if not await self._receive(activity, intake):
                return web.Response(status=503, text="busy")
        except NotRecorded:  # the storage failed (logged once per outage): delivered again
            return web.Response(status=503, text="not recorded; try again")
        return web.Response(status=200)

    async def _receive(self, activity: Activity, intake: Intake) -> bool:
        """Hand one message to the gateway; False when intake had no room."""
        key = message_id(activity)
        if key in self._seen or activity.sender.get("id") == activity.bot_id:
            return True
        incoming = to_incoming(activity)
        if (not incoming.is_direct and not incoming.mentions_bot
                and self.settings.group_messages == "mentions"):
            self._remember(key)
            return True
        files = files_of(activity)
        if files:
            attachments = await self._downloads(activity, incoming, files)
            incoming = to_incoming(activity, attachments)
        if incoming.text or incoming.attachments:
            if await self.handover(intake.offer, incoming) is None:
                return False
        self._remember(key)
        return True

    async def _click(self, activity: Activity, intake: Intake) -> web.StreamResponse:
        """A click on one of our buttons (see ``buttons.py``): checked, handed over, answered
        with what the clicker alone sees."""
        found = click_of(activity.raw)
        chat, thread = activity.chat_and_thread
        user_id = user_of(activity)
        if found is None or not chat or not user_id or not activity.id:
            log.warning("teams: ignored a card action that is not one of our buttons")
            return web.json_response(note(NOT_OURS))
        command, approval_id = found
        refusal = await self._refusal(chat, user_id, approval_id)
        if refusal is not None:
            log.info("teams: a click on approval %s by %s was refused: %s", approval_id,
                     user_id[:80], refusal)
            return web.json_response(note(refusal))
        sender = activity.sender
        name = sender.get("name")
        team = dict_at(dict_at(activity.raw, "channelData"), "team").get("id")
        incoming = click_message(
            self.name, chat_id=chat, user_id=user_id, command=command, click_id=activity.id,
            user_name=name[:256] if isinstance(name, str) and name else None, thread_id=thread,
            guild_id=team[:256] if isinstance(team, str) and team else None,
            is_direct=activity.kind == "personal")
        try:
            if await self.handover(intake.offer, incoming) is None:
                return web.Response(status=503, text="busy")
        except NotRecorded:
            return web.Response(status=503, text="not recorded; try again")
        card = activity.raw.get("replyToId")
        if isinstance(card, str) and card in self._cards:
            task = asyncio.get_running_loop().create_task(self._take_off(card))
            self._later.add(task)
            task.add_done_callback(self._later.discard)
        return web.json_response(taken(command))

    async def _refusal(self, chat: str, user_id: str, approval_id: str) -> str | None:
        if self.approvals is None:
            return None
        try:
            return await asyncio.wait_for(self.approvals(self.name, chat, user_id, approval_id),
                                          CHECK_BUDGET)
        except asyncio.TimeoutError:
            return TOO_SLOW

    async def _take_off(self, activity_id: str) -> None:
        """The request message again, without its buttons (best effort)."""
        found = self._cards.pop(activity_id, None)
        if found is None:
            return
        service, conversation, sent = found
        try:
            await self.connector.update(service, conversation, activity_id,
                                        without_buttons(sent))
        except ProviderError as e:
            log.info("teams: could not take the buttons off %s: %s", activity_id, e)

    def _remember(self, key: str) -> None:
        self._seen[key] = None
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)

    async def _downloads(self, activity: Activity, incoming: IncomingMessage,
                         files: list[FileIn]) -> tuple[Attachment, ...]:
        got: list[Attachment] = []
        for n, found in enumerate(files):
            short = hashlib.sha256(f"{message_id(activity)}|{n}".encode()).hexdigest()[:12]
            path = self.uploads / short[:2] / f"{short}-{safe_filename(found.name)}"
            size, problem = await self._download(found, path)
            if problem is None:
                got.append(Attachment(filename=safe_filename(found.name), mime_type=found.mime,
                                      size=size, path=path,
                                      kind="image" if found.kind == "image" else "file"))
            else:
                await quiet_notice(self.send, notice(incoming.chat_id, problem,
                                                     thread_id=incoming.thread_id),
                                   log=log, provider=self.name, place=incoming.chat_id[:80])
        return tuple(got)

    async def _download(self, found: FileIn, path: Path) -> tuple[int, str | None]:
        """The size once the file is in ``path``, or what to tell the person."""
        limit = max_bytes(self.settings.max_download_mb)
        try:
            headers = {"Authorization": f"Bearer {await self.token.get()}"} \
                if found.with_token else {}
            async with self._http().get(found.url, headers=headers) as r:
                if r.status >= 400:
                    raise ProviderError(f"HTTP {r.status}")
                if (r.content_length or 0) > limit:
                    raise TooLarge()
                return await save_stream(r.content.iter_chunked(64 * 1024), path, limit), None
        except TooLarge:
            return 0, too_large(found.name, self.settings.max_download_mb)
        except (ProviderError, *NETWORK) as e:
            log.warning("teams: downloading %s failed: %s", found.name, provider_error(e, 1.0))
            return 0, not_downloaded(found.name)

    # sending -----------------------------------------------------------------------------

    async def _target(self, chat_id: str, thread_id: str | None) -> tuple[str, str]:
        """The conversation's serviceUrl and its id (a channel's with the thread)."""
        url = await self.conversations.service_url(chat_id) or self.settings.service_url
        if not url:
            raise DeliveryRefused(f"no serviceUrl is known for the Teams conversation "
                                  f"{chat_id[:80]} (it has not written to the bot; set "
                                  f"providers.teams.service_url for proactive messages)")
        return url, f"{chat_id};messageid={thread_id}" if thread_id else chat_id

    async def send(self, message: OutgoingMessage) -> str | None:
        service, conversation = await self._target(message.chat_id, message.thread_id)
        first: str | None = None
        if message.text:
            activity = _activity(message.text)
            if message.buttons:
                activity["attachments"] = [*activity.get("attachments", []),
                                           buttons_card(message.buttons)]
            first = await self.connector.post(service, conversation, activity,
                                              message.thread_id)
            if message.buttons and first:
                remember(self._cards, first, (service, conversation, activity), REMEMBERED)
        for attachment in message.attachments:
            sent = await self.connector.post(service, conversation,
                                             await self._file_activity(attachment),
                                             message.thread_id)
            first = first or sent
        return first

    async def _file_activity(self, attachment: Attachment) -> dict[str, Any]:
        """A small image inline; anything else as a line saying it cannot be attached."""
        cap = self.settings.max_inline_image_kb * 1024
        if attachment.kind == "image" and attachment.mime_type in INLINE_IMAGES:
            try:
                data: bytes | None = await read_outgoing(attachment, cap)
            except DeliveryRefused:  # over the cap (or gone): named in a line instead
                data = None
            if data is not None:
                uri = f"data:{attachment.mime_type};base64,{base64.b64encode(data).decode()}"
                return {"type": "message", "attachments": [{
                    "contentType": attachment.mime_type, "contentUrl": uri,
                    "name": attachment.filename}]}
        return _activity(f"({attachment.filename} cannot be attached here: Teams takes only "
                         f"small images from a bot.)")

    async def edit(self, message: OutgoingMessage) -> None:
        assert message.edit_of is not None
        service, conversation = await self._target(message.chat_id, message.thread_id)
        await self.connector.update(service, conversation, activity_part(message.edit_of),
                                    _activity(message.text))

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        service, conversation = await self._target(chat_id, thread_id)
        await self.connector.delete(service, conversation, activity_part(platform_id))
        return True

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        try:
            service, conversation = await self._target(chat_id, thread_id)
            await self.connector.post(service, conversation, {"type": "typing"})
        except ProviderError as e:  # a missing indicator is no failure of the reply
            log.debug("teams: typing indicator for %s: %s", chat_id[:80], e)


def _activity(text: str) -> dict[str, Any]:
    """A message activity: Markdown text, and each table an Adaptive Card."""
    lifted = lift_tables(text)
    activity: dict[str, Any] = {"type": "message", "textFormat": "markdown"}
    if lifted.text or not lifted.tables:
        activity["text"] = lifted.text
    if lifted.tables:
        activity["attachments"] = [table_card(rows, header) for rows, header in lifted.tables]
    return activity
