"""The Mattermost provider: a bot account on any Mattermost server, through API v4 (aiohttp).

Receiving: the WebSocket (``/api/v4/websocket``) in our own loop — authenticated by the
``authentication_challenge`` action, then ``posted`` events, whose ``seq`` shows a lost event.
Mattermost sends an event once and never again, so after every (re)connect, and after a gap in
``seq``, the provider fetches what it missed per channel (``GET /channels/{id}/posts?since=``),
from the positions it keeps under the data dir (``position.py``); posts are deduplicated by id.
A post intake could not record (storage failing) is not counted as taken: its channel waits,
and is fetched again with ``since`` after a pause, in order.
Direct messages are always answered; in channels and group messages the bot answers
``@mentions`` and threads it takes part in (``channel_messages``), in a thread under the post
(``reply_in_thread``). Files users send are downloaded into the data dir (capped).
Sending: posts in Mattermost's Markdown (``markup.py``), files (``POST /files`` then a post with
``file_ids``), edits for streamed replies, deletes, the typing indicator over the WebSocket;
approval buttons whose clicks Mattermost posts to ``actions_url`` (``buttons.py``).
A ``429`` carries ``X-Ratelimit-Reset``: the outbox holds the chat that long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable, RateLimited
from pluto.gateway.ports import HttpMount, Intake, Provider, ProviderContext
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.loops import Backoff, retry_until_done
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.providers.mattermost.api import MattermostApi
from pluto.providers.mattermost.buttons import Actions, Check, key_of
from pluto.providers.mattermost.files import Downloads
from pluto.providers.mattermost.errors import FAILURES, provider_error, redact_secrets_in_logs
from pluto.providers.mattermost.inbound import (BadPayload, Post, mentioned_ids, mentions,
                                                post_of, to_incoming)
from pluto.providers.mattermost.known import Known
from pluto.providers.mattermost.markup import MATTERMOST
from pluto.providers.mattermost.outbound import Outbound
from pluto.providers.mattermost.position import Positions
from pluto.providers.mattermost.settings import MattermostSettings, load_settings
from pluto.providers.mattermost.socket import Socket
from pluto.types import Attachment, Capabilities, IncomingMessage, OutgoingMessage

log = logging.getLogger(__name__)

REMEMBERED = 4096
MAX_BACKOFF = 30.0
SAVE_EVERY = 5.0  # seconds: positions saved at once after a hand-over, else at most this often


class MattermostProvider(Provider):
    name = "mattermost"
    # Mattermost takes 16,383 characters a post; replies are cut at 4,000, which reads better
    capabilities = Capabilities(max_message_length=4000, markup=MATTERMOST, can_edit=True,
                                can_send_images=True, can_send_files=True, has_typing=True,
                                has_buttons=True)

    def __init__(self, settings: MattermostSettings, token: str, *, data_dir: Path,
                 http: HttpMount | None = None, approvals: Check | None = None):
        redact_secrets_in_logs([token])
        self.settings = settings
        self._token = token
        self.data_dir = data_dir
        self.api = MattermostApi(settings.api_url, token, settings.request_timeout_seconds)
        self.known = Known(self.api)
        self.downloads = Downloads(self.api, data_dir / "uploads" / "mattermost",
                                   settings.max_download_mb)
        self.handover = HandOver(self.name)
        self._intake: Intake | None = None
        key = key_of(token)
        buttons_at = None
        if http is not None and settings.actions_url and settings.actions_path:
            actions = Actions(self.name, key, self.api, self.known, approvals, self._hand_over)
            http.router.add_post(settings.actions_path, actions.handle)
            buttons_at = (settings.actions_url, key)
        elif settings.actions_url:
            log.warning("mattermost: actions_url is set but the HTTP server is not running "
                        "(pluto serve): approvals are asked as commands to write")
        self.outbound = Outbound(self.api, self.known.sent, settings.token_env, buttons_at)
        self.user_id = ""
        self.username = ""
        self._identity_lock = asyncio.Lock()
        self.positions: Positions | None = None
        self._socket: Socket | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._behind: set[str] = set()  # channels with a post intake could not record
        self._repair_at = 0.0  # monotonic: when they are fetched again
        self._saved_at = 0.0  # monotonic: when the positions were last written

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> MattermostProvider:
        settings, token = load_settings(ctx)
        return cls(settings, token, data_dir=ctx.data_dir, http=ctx.http,
                   approvals=ctx.approvals)

    def _hand_over(self) -> Callable[[IncomingMessage], Awaitable[object]] | None:
        """How a button's click is handed to intake; None while not receiving."""
        intake = self._intake
        if intake is None:
            return None
        return lambda msg: self.handover(intake.submit, msg)

    # lifecycle ---------------------------------------------------------------------------

    async def identity(self) -> str:
        """The bot's user id and username (``GET /users/me``, once)."""
        async with self._identity_lock:
            if not self.user_id:
                try:
                    me = await self.api.me()
                except FAILURES as e:
                    raise provider_error(e, self.settings.token_env) from None
                if not me.get("id") or not me.get("username"):
                    raise ProviderError("Mattermost did not say who the bot is (users/me)")
                self.user_id, self.username = str(me["id"]), str(me["username"])
                self.known.bot_id = self.user_id
            return self.user_id

    async def probe(self) -> str:
        """A harmless call for ``pluto doctor``: the token works."""
        await self.identity()
        return f"the bot @{self.username} answered (users/me)"

    def single_owner(self) -> bool:
        return True  # one WebSocket reader per bot; another instance takes over when it dies

    async def reset(self) -> None:
        await self.api.close()  # a new connection pool with the next call

    async def close(self) -> None:
        await self.api.close()

    async def run(self, intake: Intake) -> None:
        await self.identity()
        await self._load_positions()
        self._intake = intake  # (button clicks come by the HTTP server)
        try:
            await self._receive_all(intake)
        finally:
            self._intake = None

    async def _receive_all(self, intake: Intake) -> None:
        backoff = Backoff(first=1.0, cap=MAX_BACKOFF)
        async with aiohttp.ClientSession() as session:
            while True:
                sock = await retry_until_done(
                    lambda: Socket.open(session, self.settings.websocket_url, self._token),
                    failures=(aiohttp.ClientError, OSError, asyncio.TimeoutError),
                    typed=provider_error, backoff=backoff, log=log,
                    what="mattermost: connecting the WebSocket")
                await self._connected(sock, intake)
                await asyncio.sleep(0.5)  # a server that drops every connection is not hammered

    async def _load_positions(self) -> None:
        positions = Positions(self.data_dir, self.user_id)
        if not await positions.load():
            positions.floor = self.api.server_ms or int(time.time() * 1000)
            try:  # each channel from its last post (the floor's clock counts whole seconds)
                channels = await self.api.channels()
            except FAILURES as e:
                raise provider_error(e, self.settings.token_env) from None
            for channel in channels:
                last = channel.get("last_post_at")
                if isinstance(last, int) and channel.get("id"):
                    positions.channels[str(channel["id"])] = last
            await positions.save()
            log.info("mattermost: first start: posts written before now are not answered")
        self.positions = positions

    async def _connected(self, sock: Socket, intake: Intake) -> None:
        """Catch up, then read events until the socket closes or a call fails."""
        self._socket = sock
        log.info("mattermost: @%s connected to %s", self.username, self.settings.url)
        try:
            await self._catch_up_all(intake)
            await self._read(sock, intake)
            log.warning("mattermost: the WebSocket closed; reconnecting")
        except ProviderUnusable:
            raise
        except (ProviderError, *FAILURES) as e:
            error = e if isinstance(e, ProviderError) else provider_error(e)
            log.warning("mattermost: the connection failed (%s); reconnecting", error)
            if isinstance(error, RateLimited):
                await asyncio.sleep(error.retry_after)
        finally:
            self._socket = None
            await sock.close()

    # receiving ---------------------------------------------------------------------------

    async def _read(self, sock: Socket, intake: Intake) -> None:
        while True:
            if self._behind and time.monotonic() >= self._repair_at:
                await self._repair(intake)
            wait = max(0.01, self._repair_at - time.monotonic()) if self._behind else None
            try:
                event = await sock.next_event(wait)  # until the next repair is due, at most
            except asyncio.TimeoutError:
                continue
            if event is None:
                return
            if sock.gap(event):
                log.warning("mattermost: WebSocket events were lost (seq); fetching what was "
                            "missed")
                await self._catch_up_all(intake)
            if event.get("event") == "posted":
                await self._on_posted(event, intake)

    async def _on_posted(self, event: dict[str, Any], intake: Intake) -> None:
        data = found if isinstance(found := event.get("data"), dict) else {}
        try:
            post = post_of(data.get("post"))
        except BadPayload as e:
            log.warning("mattermost: a posted event was skipped: %s", e)
            return
        self.known.note_channel(post.channel_id, data.get("channel_type"), data.get("team_id"))
        if post.channel_id in self._behind:
            return  # fetched again with the channel's earlier posts, in order
        if not await self._dispatch(post, data, intake):
            self._fell_behind(post.channel_id)

    async def _catch_up_all(self, intake: Intake) -> None:
        """Fetch, per channel, what came while the bot was away."""
        assert self.positions is not None
        try:
            channels = await self.api.channels()
        except FAILURES as e:
            raise provider_error(e, self.settings.token_env) from None
        for channel in channels:
            channel_id = str(channel.get("id") or "")
            last = channel.get("last_post_at")
            self.known.note_channel(channel_id, channel.get("type"), channel.get("team_id"))
            if channel_id in self._behind or (
                    isinstance(last, int) and last > self.positions.of(channel_id)):
                await self._catch_up(channel_id, intake)

    async def _repair(self, intake: Intake) -> None:
        for channel_id in sorted(self._behind):
            await self._catch_up(channel_id, intake)

    async def _catch_up(self, channel_id: str, intake: Intake) -> None:
        """Hand over the channel's posts since its position, in order; stop at the first one
        intake cannot record (the channel stays behind, fetched again later)."""
        assert self.positions is not None
        position = self.positions.of(channel_id)
        try:
            posts = await self.api.posts_since(channel_id, max(0, position - 1))
        except FAILURES as e:
            error = provider_error(e, self.settings.token_env)
            log.warning("mattermost: could not fetch the posts missed in %s: %s", channel_id,
                        error)
            if isinstance(error, DeliveryRefused):  # no longer a member: nothing to fetch
                self._behind.discard(channel_id)
            else:
                self._fell_behind(channel_id, max(1.0, self.handover.backoff()))
            return
        self._behind.discard(channel_id)
        for raw in posts:
            try:
                post = post_of(raw)
            except BadPayload as e:
                log.warning("mattermost: a post missed in %s was skipped: %s", channel_id, e)
                continue
            if post.create_at <= position or post.channel_id != channel_id:
                continue  # handled already, or an older post that changed (an edit, a reaction)
            if not await self._dispatch(post, {}, intake):
                self._fell_behind(channel_id)
                break

    def _fell_behind(self, channel_id: str, wait: float | None = None) -> None:
        self._behind.add(channel_id)
        self._repair_at = time.monotonic() + (self.handover.backoff() if wait is None else wait)

    async def _dispatch(self, post: Post, data: dict[str, Any], intake: Intake) -> bool:
        """Hand one post to the gateway; True once it is taken (recorded, or not for the
        gateway). False when intake could not record it. A post that cannot be read is logged
        and skipped (reading it again cannot help), never fatal to receiving."""
        assert self.positions is not None
        if post.id in self._seen:
            return True
        try:
            incoming = await self._receive(post, data)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one bad post, not the provider
            log.warning("mattermost: post %s in %s could not be read (%s); it is skipped",
                        post.id, post.channel_id, provider_error(e, self.settings.token_env))
            incoming = None
        if incoming is not None:
            try:
                await self.handover(intake.submit, incoming)
            except NotRecorded:
                return False
        remember(self._seen, post.id, None, REMEMBERED)
        if self.positions.advance(post.channel_id, post.create_at) and (
                incoming is not None or time.monotonic() - self._saved_at > SAVE_EVERY):
            self._saved_at = time.monotonic()  # (a post not for the bot may be read twice)
            await self.positions.save()
        return True

    async def _receive(self, post: Post, data: dict[str, Any]) -> IncomingMessage | None:
        """The message for the gateway, if the bot should see it."""
        me = await self.identity()
        if post.user_id == me or not post.from_user:
            return None
        if self.settings.ignore_bots and post.from_bot:
            return None
        kind, team = await self.known.channel(post.channel_id)
        direct = kind == "D"
        addressed = (direct or me in mentioned_ids(data) or mentions(post, self.username)
                     or await self.known.in_thread(post))
        if not addressed and self.settings.channel_messages == "mentions":
            return None
        thread = post.root_id or (None if direct or not self.settings.reply_in_thread
                                  else post.id)
        if addressed and thread:
            self.known.join_thread(thread)
        attachments: tuple[Attachment, ...] = ()
        if post.file_ids:
            attachments, problem = await self.downloads.fetch(post)
            if problem:
                await quiet_notice(self.send, notice(post.channel_id, problem, thread_id=thread),
                                   log=log, provider=self.name, place=post.channel_id)
        sender = str(data.get("sender_name") or "").lstrip("@") or await self.known.user_name(
            post.user_id)
        incoming = to_incoming(post, username=self.username, user_name=sender, direct=direct,
                               addressed=addressed, thread_id=thread, team_id=team,
                               attachments=attachments)
        return incoming if incoming.text or incoming.attachments else None

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        return await self.outbound.send(message)

    async def edit(self, message: OutgoingMessage) -> None:
        await self.outbound.edit(message)

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        return await self.outbound.delete(platform_id)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        sock = self._socket
        if sock is None:
            return  # reconnecting: no indicator this time
        try:
            await sock.typing(chat_id, thread_id)
        except (ProviderError, aiohttp.ClientError, ConnectionError) as e:
            log.debug("mattermost: typing in %s: %s", chat_id, e)
