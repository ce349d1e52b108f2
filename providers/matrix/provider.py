"""The Matrix provider: a bot account on any homeserver, through mautrix's client API.

Receiving: ``/sync`` long polling in our own loop (so a failure reaches the gateway's
supervisor, and events are handled one after another, in order). The position is stored after
each batch was recorded by intake (``sync_token.py``): a restart resumes where it stopped.
Invitations are accepted (``auto_join``); rooms of two are direct chats; in larger rooms the bot
answers mentions, replies to it and threads it takes part in; a thread is its own session.
Files and images users send are downloaded into the data dir.
Sending: ``org.matrix.custom.html`` with its plain body, images and files (uploaded to the media
repository first), edits (``m.replace``) for streamed replies, the typing indicator, replies in
the thread a message came from. Rate limits (``M_LIMIT_EXCEEDED``) carry the homeserver's
``retry_after_ms``. End-to-end encrypted rooms are not supported: the bot says so in the log
(once per room) and leaves their events alone.
Approvals: no buttons; a request is decided by ``/approve <id>`` / ``/deny <id>``, or by a reply
``approve`` / ``deny`` or a reaction ✅ 👍 / ❌ 👎 on the request message (``approvals.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
from mautrix.api import Method
from mautrix.api import Path as ApiPath
from mautrix.client import ClientAPI
from mautrix.types import RoomID, SyncToken
from mautrix.util.logging import TraceLogger

from pluto.errors import ProviderUnusable
from pluto.gateway.ports import Intake, Provider, ProviderContext
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.buttons import click_message
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.files import (CHUNK, TooLarge, max_bytes, not_downloaded, save_stream,
                                       too_large)
from pluto.providers.kit.loops import Backoff, retry_until_done
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.providers.matrix.approvals import (Request, approval_in, command,
                                             verdict_of_key, verdict_of_reply)
from pluto.providers.matrix.errors import (FAILURES, HomeserverApi, provider_error,
                                          redact_secrets_in_logs)
from pluto.providers.matrix.inbound import (TEXT_TYPES, Event, mentions, to_incoming,
                                            upload_path)
from pluto.providers.matrix.markup import MATRIX_HTML
from pluto.providers.matrix.outbound import Outbound
from pluto.providers.matrix.settings import MatrixSettings, load_settings
from pluto.providers.matrix.sync_token import SyncTokenFile
from pluto.types import Attachment, Capabilities, IncomingMessage, OutgoingMessage

log = logging.getLogger(__name__)

Check = Callable[[str, str, str, str], Awaitable[str | None]]  # ProviderContext.approvals

FILTER = json.dumps({"presence": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]},
                     "room": {"timeline": {"limit": 100}, "ephemeral": {"not_types": ["*"]},
                              "state": {"lazy_load_members": True}}})
REMEMBERED = 4096
MAX_BACKFILL = 1000  # missed messages fetched for one room after a gap


class MatrixProvider(Provider):
    name = "matrix"
    capabilities = Capabilities(max_message_length=4000, markup=MATRIX_HTML, can_edit=True,
                                can_send_images=True, can_send_files=True, has_typing=True)

    def __init__(self, settings: MatrixSettings, token: str, *, data_dir: Path,
                 approvals: Check | None = None):
        redact_secrets_in_logs([token])
        self.settings = settings
        self._token = token
        self.data_dir = data_dir
        self.uploads = data_dir / "uploads" / "matrix"
        self._client: ClientAPI | None = None
        self._session: aiohttp.ClientSession | None = None
        self._identity_lock = asyncio.Lock()
        self.user_id: str | None = None
        self.display_name: str | None = None
        self._members: dict[str, int] = {}  # room → joined members (cached)
        self._encrypted: set[str] = set()
        self._mine: OrderedDict[str, bool] = OrderedDict()  # event → sent by the bot?
        self._threads: OrderedDict[str, None] = OrderedDict()  # threads the bot is part of
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._requests: OrderedDict[str, Request | None] = OrderedDict()  # event → approval
        self.approvals = approvals
        self.handover = HandOver(self.name)
        self.outbound = Outbound(self.client, self._sent)

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> MatrixProvider:
        settings, token = load_settings(ctx)
        return cls(settings, token, data_dir=ctx.data_dir, approvals=ctx.approvals)

    # lifecycle ---------------------------------------------------------------------------

    def client(self) -> ClientAPI:
        if self._client is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10,
                                            sock_read=self.settings.sync_timeout_seconds + 30)
            self._session = aiohttp.ClientSession(timeout=timeout)
            api = HomeserverApi(self.settings.homeserver, self._token,
                                client_session=self._session,
                                # a TraceLogger: mautrix makes it the logger class
                                log=cast(TraceLogger,
                                         logging.getLogger("pluto.providers.matrix.http")))
            self._client = ClientAPI(api=api)
        return self._client

    async def identity(self) -> str:
        """The bot's user id (``whoami``, once) and display name."""
        async with self._identity_lock:
            if self.user_id is None:
                try:
                    who = await self.client().whoami()
                except FAILURES as e:  # typed below
                    error = provider_error(e)
                    if isinstance(error, ProviderUnusable):
                        error = ProviderUnusable(f"{error} (the token in "
                                                 f"{self.settings.access_token_env})")
                    raise error from None
                wanted = self.settings.user_id
                if wanted and who.user_id != wanted:
                    raise ProviderUnusable(f"the token in {self.settings.access_token_env} "
                                           f"belongs to {who.user_id}, not {wanted}")
                try:
                    self.display_name = await self.client().get_displayname(who.user_id)
                except FAILURES as e:  # mentions by id still work
                    log.debug("matrix: no display name: %s", provider_error(e))
                self.user_id = str(who.user_id)
                self.client().mxid = who.user_id  # mautrix puts it in paths (typing)
            return self.user_id

    async def run(self, intake: Intake) -> None:
        me = await self.identity()
        tokens = SyncTokenFile(self.data_dir, me)
        since = await tokens.load()
        log.info("matrix: %s connected to %s (%s)", me, self.settings.homeserver,
                 "resuming" if since else "first start: earlier messages are not answered")
        backoff = Backoff()
        while True:
            data = await retry_until_done(lambda: self._sync(since), failures=FAILURES,
                                          typed=provider_error, backoff=backoff,
                                          what="matrix: sync", log=log)
            try:
                await self._handle_sync(data, intake, since=since)
            except NotRecorded:  # storage failed: the token stays, the same batch comes again
                await self.handover.pause()
                continue
            token = data.get("next_batch")
            if isinstance(token, str) and token:
                since = token
                await tokens.save(token)  # after intake recorded the batch's messages

    async def _sync(self, since: str | None) -> Any:
        """One ``/sync``: at once on a first start (the room state), else a long poll."""
        timeout = int(self.settings.sync_timeout_seconds * 1000) if since else 0
        return await self.client().sync(since=SyncToken(since) if since is not None else None,
                                        timeout=timeout, filter_id=FILTER)  # type: ignore[arg-type]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session, self._client = None, None

    # receiving ---------------------------------------------------------------------------

    async def _handle_sync(self, data: dict[str, Any], intake: Intake, *,
                           since: str | None) -> None:
        rooms = found if isinstance(found := data.get("rooms"), dict) else {}
        for room_id in _dict(rooms.get("invite")):
            await self._invited(room_id)
        for room_id, room in _dict(rooms.get("join")).items():
            room = room if isinstance(room, dict) else {}
            count = _dict(room.get("summary")).get("m.joined_member_count")
            if isinstance(count, int):
                self._members[room_id] = count
            for ev in _events(room.get("state")) + _events(room.get("timeline")):
                self._note_state(room_id, ev)
            if since is None:
                continue  # the history before the bot's first start is not answered
            timeline = _dict(room.get("timeline"))
            gap: list[dict[str, Any]] = []
            if timeline.get("limited") and isinstance(timeline.get("prev_batch"), str):
                gap = await self._backfill(room_id, timeline["prev_batch"], since)
            for ev in gap + _events(timeline):
                if ev.get("type") in ("m.room.message", "m.reaction"):
                    await self._dispatch(Event(room_id, ev), intake)

    async def _backfill(self, room_id: str, prev_batch: str, since: str) -> list[dict[str, Any]]:
        """The events a cut timeline left out (between ``since`` and ``prev_batch``), oldest
        first, so a busy room or a long absence loses no message."""
        found: list[dict[str, Any]] = []
        token: str | None = prev_batch
        while token and len(found) < MAX_BACKFILL:
            try:
                page = await self.client().api.request(
                    Method.GET, ApiPath.v3.rooms[room_id].messages,
                    query_params={"dir": "b", "from": token, "to": since, "limit": "100",
                                  "filter": json.dumps({"types": ["m.room.message",
                                                                  "m.reaction"]})})
            except FAILURES as e:  # what came in the sync is still handled
                log.warning("matrix: could not fetch the messages missed in %s: %s", room_id,
                            provider_error(e))
                break
            chunk = [e for e in page.get("chunk") or [] if isinstance(e, dict)]
            found += chunk
            token = page.get("end") if chunk else None
        if len(found) >= MAX_BACKFILL:
            log.warning("matrix: more than %d messages were missed in %s; the oldest are not "
                        "answered", MAX_BACKFILL, room_id)
        return list(reversed(found))

    async def _invited(self, room_id: str) -> None:
        if not self.settings.auto_join:
            return
        try:
            await self.client().join_room_by_id(RoomID(room_id))
            log.info("matrix: joined %s (invited)", room_id)
        except FAILURES as e:  # one room, not the provider
            log.warning("matrix: could not join %s: %s", room_id, provider_error(e))

    def _note_state(self, room_id: str, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind == "m.room.member":
            self._members.pop(room_id, None)  # counted again when needed
        elif kind in ("m.room.encryption", "m.room.encrypted") and room_id not in self._encrypted:
            self._encrypted.add(room_id)
            log.warning("matrix: room %s is end-to-end encrypted; encrypted rooms are not "
                        "supported, so the bot cannot read or answer messages there", room_id)

    async def _dispatch(self, event: Event, intake: Intake) -> None:
        """Hand one message to the gateway. Reading it may fail (logged, never fatal to
        receiving); intake failing to record it (the database) raises :class:`NotRecorded`:
        the sync token is not advanced, so the batch comes again."""
        if not event.id or event.id in self._seen:
            return
        try:
            if event.raw.get("type") == "m.reaction":
                incoming = await self._reaction(event)
            else:
                incoming = await self._receive(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("matrix: handling event %s in %s failed", event.id, event.room_id)
            incoming = None
        if incoming is not None:
            await self.handover(intake.submit, incoming)
        remember(self._seen, event.id, None, REMEMBERED)

    async def _receive(self, event: Event) -> IncomingMessage | None:
        """The message for the gateway, if the bot should see it."""
        me = await self.identity()
        if event.sender == me or event.is_edit or event.room_id in self._encrypted:
            return None
        if event.msgtype not in TEXT_TYPES and event.file() is None:
            return None
        direct = await self._is_direct(event.room_id)
        addressed = direct or await self._addressed(event, me)
        if not addressed and self.settings.room_messages == "mentions":
            return None
        if event.reply_to and event.msgtype in TEXT_TYPES:
            verdict = verdict_of_reply(event.text())
            request = await self._request(event.room_id, event.reply_to) if verdict else None
            if verdict is not None and request is not None:  # a decision, not a message
                return await self._decision(event, request, command(
                    verdict[0], request.approval_id, verdict[1]), direct)
        if addressed:  # a thread on a message to the bot, or one it was called into
            self._join_thread(event.thread_root or event.id)
        attachments: tuple[Attachment, ...] = ()
        if event.file() is not None:
            attachments, problem = await self._download(event)
            if problem:
                await self._quiet_notice(event, problem)
        incoming = to_incoming(event, bot_id=me, bot_name=self.display_name, direct=direct,
                               addressed=addressed, attachments=attachments)
        return incoming if incoming.text or incoming.attachments else None

    # approvals ---------------------------------------------------------------------------

    async def _reaction(self, event: Event) -> IncomingMessage | None:
        """A ✅ / ❌ reaction on an approval request the bot showed: the decision."""
        me = await self.identity()
        relates = event.relates_to
        target = relates.get("event_id")
        if (event.sender == me or event.room_id in self._encrypted
                or relates.get("rel_type") != "m.annotation" or not isinstance(target, str)):
            return None
        verdict = verdict_of_key(relates.get("key"))
        request = await self._request(event.room_id, target) if verdict else None
        if verdict is None or request is None:
            return None  # a reaction to something else: nothing to do
        return await self._decision(event, request, command(verdict, request.approval_id),
                                    await self._is_direct(event.room_id))

    async def _decision(self, event: Event, request: Request, text: str,
                        direct: bool) -> IncomingMessage | None:
        """A reply or a reaction that decides ``request``, from its author — after asking
        the gateway whether they may (Matrix shows nobody anything privately: a refusal is
        logged, the room sees nothing)."""
        if self.approvals is not None:
            refusal = await self.approvals(self.name, event.room_id, event.sender,
                                           request.approval_id)
            if refusal is not None:
                log.info("matrix: %s's decision on approval %s in %s was not taken: %s",
                         event.sender, request.approval_id, event.room_id, refusal)
                return None
        return click_message(self.name, chat_id=event.room_id, user_id=event.sender,
                             command=text, click_id=event.id, user_name=event.sender,
                             thread_id=request.thread_id, is_direct=direct)

    async def _request(self, room_id: str, event_id: str) -> Request | None:
        """The approval request the bot showed as ``event_id``, if it is one: known from
        sending it, else read from the homeserver (after a restart)."""
        if event_id in self._requests:
            return self._requests[event_id]
        if self._mine.get(event_id) is False:
            return None
        try:
            found = await self.client().api.request(
                Method.GET, ApiPath.v3.rooms[room_id].event[event_id])
        except FAILURES as e:  # not provably a request of the bot's
            log.debug("matrix: event %s not read: %s", event_id, provider_error(e))
            return None
        if not isinstance(found, dict):
            return None
        shown = Event(room_id, found)
        mine = shown.sender == self.user_id
        self._remember(event_id, mine)
        content = _dict(shown.content.get("m.new_content")) or shown.content
        approval = approval_in(str(content.get("body") or "")) if mine else None
        request = Request(approval, shown.thread_root) if approval else None
        remember(self._requests, event_id, request, REMEMBERED)
        return request

    def _note_request(self, event_id: str | None, message: OutgoingMessage) -> None:
        approval = approval_in(message.text)
        if event_id and approval:
            remember(self._requests, event_id, Request(approval, message.thread_id),
                     REMEMBERED)

    async def _addressed(self, event: Event, me: str) -> bool:
        if mentions(event, me, self.display_name):
            return True
        if event.thread_root and (event.thread_root in self._threads
                                  or await self._is_mine(event.room_id, event.thread_root)):
            return True
        return bool(event.reply_to) and await self._is_mine(event.room_id, event.reply_to or "")

    async def _is_direct(self, room_id: str) -> bool:
        count = self._members.get(room_id)
        if count is None:
            try:
                count = len(await self.client().get_joined_members(RoomID(room_id)))
            except FAILURES as e:  # treat it as a room, answer mentions only
                log.warning("matrix: members of %s unknown: %s", room_id, provider_error(e))
                return False
            self._members[room_id] = count
        return count <= 2

    async def _is_mine(self, room_id: str, event_id: str) -> bool:
        known = self._mine.get(event_id)
        if known is None:
            try:
                found = await self.client().get_event(RoomID(room_id), event_id)  # type: ignore[arg-type]
                known = str(found.sender) == self.user_id
            except FAILURES as e:  # not provably the bot's
                log.debug("matrix: event %s not read: %s", event_id, provider_error(e))
                return False
            self._remember(event_id, known)
        return known

    def _join_thread(self, root: str) -> None:
        remember(self._threads, root, None, REMEMBERED)

    def _remember(self, event_id: str, mine: bool) -> None:
        remember(self._mine, event_id, mine, REMEMBERED)

    async def _download(self, event: Event) -> tuple[tuple[Attachment, ...], str | None]:
        found = event.file()
        assert found is not None
        url, name, mime, size, kind = found
        limit = max_bytes(self.settings.max_download_mb)
        if size > limit:
            return (), too_large(name, self.settings.max_download_mb)
        path = upload_path(self.uploads, event, name)
        try:
            got = await self._fetch(url, path, limit)
        except TooLarge:
            return (), too_large(name, self.settings.max_download_mb)
        except FAILURES as e:  # told to the person below
            await asyncio.to_thread(path.unlink, missing_ok=True)
            log.warning("matrix: downloading %s in %s failed: %s", name, event.room_id,
                        provider_error(e))
            return (), not_downloaded(name)
        return (Attachment(filename=name, mime_type=mime, size=got, path=path, kind=kind),), None

    async def _fetch(self, mxc: str, path: Path, limit: int) -> int:
        """An authenticated media download (Matrix 1.11), streamed to ``path``."""
        client = self.client()
        url = client.api.get_download_url(mxc, authenticated=True)
        async with client.api.session.get(url, headers={
                "Authorization": f"Bearer {self._token}"}) as r:
            r.raise_for_status()
            return await save_stream(r.content.iter_chunked(CHUNK), path, limit)

    async def _quiet_notice(self, event: Event, text: str) -> None:
        await quiet_notice(self.send, notice(event.room_id, text, thread_id=event.thread_root),
                           log=log, provider="matrix", place=event.room_id)

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        sent = await self.outbound.send(message)
        self._note_request(sent, message)
        return sent

    async def edit(self, message: OutgoingMessage) -> None:
        await self.outbound.edit(message)
        self._note_request(message.edit_of, message)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self.identity()  # the typing path names the bot
        await self.outbound.typing(chat_id)

    def _sent(self, event_id: str, thread_id: str | None) -> None:
        self._remember(event_id, True)
        if thread_id:
            self._join_thread(thread_id)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _events(section: Any) -> list[dict[str, Any]]:
    events = section.get("events") if isinstance(section, dict) else None
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
