"""The Discord provider (discord.py's :class:`discord.Client` over REST and the gateway).

Receiving: the gateway websocket. discord.py keeps the session alive: it heartbeats, and after a
disconnect, an op 7 RECONNECT or a resumable INVALID_SESSION it RESUMEs, and Discord replays what
the session missed — sometimes events already delivered too. Each message is queued in the
order Discord sent it and handed to the gateway one by one; a replay carries the same message id
and is dropped (here for this process, by the gateway's persistent dedupe across restarts).
A non-resumable INVALID_SESSION makes discord.py IDENTIFY anew (after the 5 s Discord asks for).
Direct messages are for the bot; in servers, messages that mention it or reply to it (see
``inbound.py``), or every message with ``guild_messages: all``.

Sending: Discord markdown (the gateway renders it, 2000 characters a message), edits for
streamed replies, files and images, the typing indicator (``outbound.py``). A 429 on a send is
raised at once, for the outbox's per-chat flood control (``holds.py``); discord.py still paces
by its ``X-RateLimit-*`` buckets and waits out 429s elsewhere. The token never appears in a log.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import discord

from pluto.errors import ProviderError, ProviderUnusable

from pluto.gateway.ports import Intake, Provider, ProviderContext
from pluto.providers.handover import NOT_TAKEN, HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.types import Capabilities, IncomingMessage, OutgoingMessage
from pluto.providers.discord import buttons, holds, outbound
from pluto.providers.discord.errors import LIBRARY_WAIT, provider_error, redact_token_in_logs
from pluto.providers.discord.inbound import USER_MESSAGES, Downloads, to_incoming
from pluto.providers.discord.markup import DISCORD
from pluto.providers.discord.redirect import point_discord_at
from pluto.providers.discord.settings import DiscordSettings, load_settings

log = logging.getLogger(__name__)

MAX_QUEUED = 10_000  # messages received and not yet handed to the gateway
RECENT = 4096  # message ids remembered to drop replays without downloading files again


class _Client(discord.Client):
    """discord.py's client; every user message goes to ``queue``, in the order received."""

    def __init__(self, queue: asyncio.Queue[discord.Message],
                 on_click: Callable[[discord.Interaction], Awaitable[None]] | None = None,
                 **options: Any):
        super().__init__(**options)
        self.queue = queue
        self.on_click = on_click

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        """A button clicked (INTERACTION_CREATE type 3): see ``buttons.py``."""
        if interaction.type == discord.InteractionType.component and self.on_click is not None:
            await self.on_click(interaction)

    async def on_message(self, message: discord.Message) -> None:
        own = self.user is not None and message.author.id == self.user.id
        if own or message.author.bot or message.webhook_id or message.type not in USER_MESSAGES:
            return
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            log.warning("discord: %d messages wait to be handled; message %d dropped",
                        self.queue.qsize(), message.id)

    async def on_ready(self) -> None:
        log.info("discord: connected as %s (id %s) in %d server(s)", self.user,
                 self.user.id if self.user else "?", len(self.guilds))

    async def on_resumed(self) -> None:
        log.info("discord: gateway session resumed")


async def _close(client: discord.Client) -> None:
    # discord.py dispatches on_ready up to guild_ready_timeout after READY, from a task that
    # close() leaves running: a client closed before that would dispatch into a closed client
    ready = getattr(client._connection, "_ready_task", None)  # noqa: SLF001
    if isinstance(ready, asyncio.Task):
        ready.cancel()
    try:
        await client.close()
    except Exception as e:
        log.debug("discord: closing: %s", type(e).__name__)


class DiscordProvider(Provider):
    name = "discord"
    capabilities = Capabilities(max_message_length=2000, markup=DISCORD, can_edit=True,
                                can_send_images=True, can_send_files=True, has_typing=True,
                                has_buttons=True)

    def __init__(self, settings: DiscordSettings, token: str, *, data_dir: Path,
                 approvals: buttons.Check | None = None):
        redact_token_in_logs(token)
        point_discord_at(settings.api_base, settings.gateway_url)
        self.settings = settings
        self._token = token
        self.downloads = Downloads(data_dir, settings.max_download_mb)
        self._queue: asyncio.Queue[discord.Message] = asyncio.Queue(maxsize=MAX_QUEUED)
        self._client: _Client | None = None
        self._lock = asyncio.Lock()
        self._recent: OrderedDict[int, None] = OrderedDict()
        self._closed = False
        self.handover = HandOver(self.name)
        self.approvals = approvals
        self._intake: Intake | None = None
        self._clicked: OrderedDict[int, None] = OrderedDict()

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> DiscordProvider:
        settings, token = load_settings(ctx)
        # discord.py logs every gateway heartbeat and resume at INFO: keep them out of the way
        discord_log = logging.getLogger("discord.gateway")
        discord_log.setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
        return cls(settings, token, data_dir=ctx.data_dir, approvals=ctx.approvals)

    # lifecycle ---------------------------------------------------------------------------

    def _new_client(self) -> _Client:
        intents = discord.Intents.none()
        intents.guilds = intents.guild_messages = intents.dm_messages = True
        intents.message_content = self.settings.message_content_intent
        client = _Client(self._queue, self._on_click, intents=intents,
                         max_ratelimit_timeout=LIBRARY_WAIT,
                         guild_ready_timeout=self.settings.guild_ready_timeout,
                         max_messages=None, chunk_guilds_at_startup=False)
        holds.adopt(client)  # 429s on sends go to the outbox's flood control (holds.py)
        return client

    async def _logged_in(self) -> _Client:
        """The client, logged in (REST works; the gateway connects in :meth:`run`)."""
        async with self._lock:
            if self._closed:
                raise ProviderError("the Discord provider is closed")
            if self._client is not None and not self._client.is_closed():
                return self._client
            client = self._new_client()
            try:
                await client.login(self._token)
            except BaseException as e:
                await _close(client)
                if isinstance(e, outbound.FAILURES):
                    raise self._error(e) from None
                raise
            self._client = client
            return client

    async def probe(self) -> str:
        """A harmless call (GET /users/@me, the login) for ``pluto doctor``: the token works."""
        client = await self._logged_in()
        return f"the bot {client.user} answered (users/@me)"

    def single_owner(self) -> bool:
        return True  # one gateway session per bot (and shard)

    async def run(self, intake: Intake) -> None:
        client = await self._logged_in()
        consumer = asyncio.create_task(self._consume(client, intake), name="discord:inbox")
        self._intake = intake
        try:
            await client.connect(reconnect=True)
        except outbound.FAILURES as e:
            await _close(client)
            raise self._error(e) from None
        finally:
            self._intake = None
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)

    async def close(self) -> None:
        self._closed = True
        if self._client is not None:
            await _close(self._client)

    def _error(self, exc: BaseException) -> ProviderError:
        error = provider_error(exc)
        if (isinstance(exc, discord.LoginFailure)
                or (isinstance(exc, discord.ConnectionClosed) and exc.code == 4004)
                or (isinstance(exc, discord.HTTPException) and exc.status == 401)):
            return ProviderUnusable(f"{error} (check {self.settings.token_env})")
        return error

    # receiving ---------------------------------------------------------------------------

    async def _consume(self, client: _Client, intake: Intake) -> None:
        """Hand queued messages to the gateway in order; a failure is logged, never fatal.
        Discord never delivers a message again: one intake could not record (its storage
        failed) is kept here and tried again with backoff, the later ones waiting behind it;
        after :data:`~pluto.providers.handover.GIVE_UP_AFTER` seconds of outage the person is
        asked to send it again."""
        while True:
            message = await self._queue.get()
            try:
                await self._receive(client, message, intake)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("discord: handling message %d failed", message.id)

    def _replayed(self, message_id: int) -> bool:
        if message_id in self._recent:
            return True
        remember(self._recent, message_id, None, RECENT)
        return False

    async def _receive(self, client: _Client, message: discord.Message, intake: Intake) -> None:
        if client.user is None:
            return
        if self._replayed(message.id):
            log.info("discord: message %d was delivered again; ignored", message.id)
            return
        incoming = to_incoming(message, client.user.id)
        if (not incoming.is_direct and not incoming.mentions_bot
                and self.settings.guild_messages == "mentions"):
            return
        attachments, problems = await self.downloads.fetch(message)
        for problem in problems:
            await self._quiet_notice(incoming, problem)
        if attachments:
            incoming = replace(incoming, attachments=attachments)
        if incoming.text or incoming.attachments:
            try:
                await self.handover.persist(intake.submit, incoming)
            except NotRecorded:  # (logged once per outage by the hand-over)
                self._recent.pop(message.id, None)
                await self._quiet_notice(incoming, NOT_TAKEN)

    async def _on_click(self, interaction: discord.Interaction) -> None:
        """A button clicked: answered within Discord's 3 s, handed over when the clicker may
        decide, then the buttons taken off the request (see ``buttons.py``)."""
        try:
            incoming = await buttons.receive(interaction, self.approvals, self._clicked)
            intake = self._intake
            if incoming is None or intake is None:
                return
            try:
                await self.handover.persist(intake.submit, incoming)
            except NotRecorded:
                await self._quiet_notice(incoming, NOT_TAKEN)
                return
            await buttons.take_off(interaction)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("discord: handling interaction %s failed", interaction.id)

    async def _quiet_notice(self, to: IncomingMessage, text: str) -> None:
        await quiet_notice(
            self.send, notice(to.chat_id, text, reply_to=None if to.is_direct else to.message_id),
            log=log, provider="discord", place=f"channel {to.chat_id}")

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        return await outbound.send(await self._logged_in(), message)

    async def edit(self, message: OutgoingMessage) -> None:
        await outbound.edit(await self._logged_in(), message)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await outbound.typing(await self._logged_in(), chat_id, thread_id)

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        return await outbound.delete(await self._logged_in(), chat_id, platform_id, thread_id)
