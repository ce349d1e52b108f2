"""The Telegram provider (python-telegram-bot's :class:`telegram.Bot` over the Bot API).

Receiving: long polling (``getUpdates`` in our own loop, so a failure reaches the gateway's
supervisor) or a webhook mounted on the gateway's HTTP server with Telegram's secret-token
header checked. Each update is handled in order; its offset is confirmed only after the gateway
took the message, and a redelivery is caught by the gateway's dedupe.
Sending: HTML (the gateway renders it), photos and documents, edits for streamed replies, the
typing indicator. Errors become :class:`ProviderError`s: flood control with its retry-after,
blocked bots and unknown chats as permanent. The bot token never appears in a log line.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from telegram import Bot, BotCommand, CallbackQuery, Message, Update
from telegram.error import InvalidToken, TelegramError, TimedOut
from telegram.request import HTTPXRequest

from pluto import jsonlimits
from pluto.errors import ProviderUnusable

from pluto.gateway.ports import HttpMount, Intake, Provider, ProviderContext, Ticket
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.loops import Backoff, retry_until_done
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.providers.kit.signatures import same_secret
from pluto.types import Capabilities, IncomingMessage, OutgoingMessage
from pluto.providers.telegram.buttons import Check, Clicks
from pluto.providers.telegram.errors import provider_error, redact_token_in_logs
from pluto.providers.telegram.inbound import Downloads, command_target, to_incoming
from pluto.providers.telegram.markup import TELEGRAM_HTML
from pluto.providers.telegram.outbound import Outbound
from pluto.providers.telegram.request import SendRequest
from pluto.providers.telegram.settings import TelegramSettings, load_settings

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
HandOverTo = Callable[[IncomingMessage], Awaitable[Ticket | None]]  # intake.submit / offer
UPDATES = ["message", "callback_query"]
SEND_POOL = 8  # connections for sends, edits and typing
COMMANDS = [BotCommand("help", "what I can do"), BotCommand("new", "start a fresh conversation"),
            BotCommand("stop", "stop the answer in progress")]


class TelegramProvider(Provider):
    name = "telegram"
    capabilities = Capabilities(max_message_length=4096, markup=TELEGRAM_HTML, can_edit=True,
                                can_send_images=True, can_send_files=True, has_typing=True,
                                has_buttons=True)

    def __init__(self, settings: TelegramSettings, token: str, *, data_dir: Path,
                 webhook_secret: str | None = None,
                 http_app: HttpMount | web.Application | None = None,
                 send_pool: int = SEND_POOL, approvals: Check | None = None):
        redact_token_in_logs(token)
        self.settings = settings
        self._token = token
        self._send_pool = send_pool
        # one long poll at a time: nothing ever queues behind it, so cancelling it (a restart)
        # cannot strand a pool slot; kept across reset()
        self._updates_request = HTTPXRequest(connection_pool_size=1)
        self.bot = self._new_bot()
        self.outbound = Outbound(self.bot)
        self.downloads = Downloads(data_dir, settings.max_download_mb)
        self.clicks = Clicks(approvals)
        self.secret = webhook_secret or ""
        self._intake: Intake | None = None
        self._init_lock = asyncio.Lock()
        self._connected = False
        if http_app is not None and settings.mode == "webhook":
            http_app.router.add_post(settings.webhook_path, self._on_webhook)

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> TelegramProvider:
        settings, token, secret = load_settings(ctx)
        return cls(settings, token, data_dir=ctx.data_dir, webhook_secret=secret,
                   http_app=ctx.http, approvals=ctx.approvals)

    # lifecycle ---------------------------------------------------------------------------

    def _new_bot(self) -> Bot:
        """A Bot whose sends go through :class:`SendRequest` (a cancelled call never wedges
        the pool: encode/httpcore#1093)."""
        return Bot(self._token, base_url=self.settings.api_url,
                   base_file_url=self.settings.file_url,
                   request=SendRequest(self._send_pool),
                   get_updates_request=self._updates_request)

    async def reset(self) -> None:
        """Rebuild the send client (the watchdog found every send failing): a new Bot and
        connection pool, connected (getMe) before it replaces the old one, which is shut down."""
        fresh = self._new_bot()
        try:
            await fresh.initialize()
        except TelegramError as e:
            await _shut_send_side(fresh)
            raise provider_error(e) from None
        old, self.bot = self.bot, fresh
        self.outbound.bot = fresh
        self._connected = True
        await _shut_send_side(old)

    async def _ready(self) -> None:
        """Connect once (getMe: the bot's id and username, needed to see mentions)."""
        async with self._init_lock:
            if self._connected:
                return
            try:
                await self.bot.initialize()
                self._connected = True
            except InvalidToken:
                raise ProviderUnusable(f"Telegram rejected the bot token (check "
                                       f"{self.settings.token_env})") from None
            except TelegramError as e:
                raise provider_error(e) from None

    async def probe(self) -> str:
        """A harmless call (getMe) for ``pluto doctor``: the token works."""
        await self._ready()
        return f"the bot @{self.bot.username} answered (getMe)"

    def single_owner(self) -> bool:
        return self.settings.mode != "webhook"  # one getUpdates consumer per token

    async def run(self, intake: Intake) -> None:
        await self._ready()
        try:
            await self.bot.set_my_commands(COMMANDS)
        except TelegramError as e:
            log.warning("telegram: could not set the command menu: %s", provider_error(e))
        log.info("telegram: @%s connected (%s)", self.bot.username, self.settings.mode)
        if self.settings.mode == "webhook":
            await self._serve_webhook(intake)
        else:
            await self._poll(intake)

    async def _serve_webhook(self, intake: Intake) -> None:
        await self._call(self.bot.set_webhook(self.settings.webhook_url, secret_token=self.secret,
                                              allowed_updates=UPDATES))
        self._intake = intake
        try:
            await asyncio.Event().wait()  # updates arrive through _on_webhook until cancelled
        finally:
            self._intake = None

    async def _poll(self, intake: Intake) -> None:
        await self._call(self.bot.delete_webhook())  # getUpdates fails while one is set
        offset: int | None = None
        backoff = Backoff()
        timeout = dtm.timedelta(seconds=self.settings.poll_timeout)
        while True:
            updates = await retry_until_done(
                lambda: self.bot.get_updates(offset=offset, timeout=timeout,
                                             allowed_updates=UPDATES),
                failures=(TelegramError,), at_once=(TimedOut,), typed=provider_error,
                backoff=backoff, what="telegram: polling", log=log)
            for update in updates:  # each is recorded by intake before it is confirmed
                if not await self._dispatch(update, intake.submit):
                    break  # not recorded: neither it nor a later one is confirmed
                offset = update.update_id + 1  # confirmed with the next getUpdates
            else:
                continue
            await self.handover.pause()  # storage fails: the same updates come again, later

    async def close(self) -> None:
        try:
            self._connected = False
            await self.bot.shutdown()
        except Exception as e:
            log.debug("telegram: closing: %s", e)

    # receiving ---------------------------------------------------------------------------

    async def _on_webhook(self, request: web.Request) -> web.Response:
        if not same_secret(request.headers.get(SECRET_HEADER, ""), self.secret):
            return web.Response(status=401, text="wrong secret token")
        intake = self._intake
        if intake is None:
            return web.Response(status=503, text="not ready")  # Telegram retries later
        try:
            update = Update.de_json(await request.json(loads=jsonlimits.loads), self.bot)
        except Exception:
            return web.Response(status=400, text="not a Telegram update")
        if not await self._dispatch(update, intake.offer):  # Telegram delivers it again
            return web.Response(status=503, text="busy" if not self.handover.failing
                                else "not recorded; try again")
        return web.Response(text="ok")

    @functools.cached_property
    def handover(self) -> HandOver:
        """The hand-overs to intake, and the state of a storage outage."""
        return HandOver(self.name)

    async def _dispatch(self, update: Update, hand_over: HandOverTo) -> bool:
        """Hand one update to the gateway; True once it may be confirmed (recorded, or not
        for the gateway). False when it was not recorded — intake had no room, or its storage
        failed — so Telegram must deliver it again. Failing to read an update is logged and
        skipped (reading it again cannot help), never fatal to receiving."""
        message = update.message
        query = update.callback_query
        if query is None and (message is None or message.from_user is None
                              or message.from_user.is_bot):
            return True
        try:
            if query is not None:
                return await self._click(query, hand_over)
            assert message is not None
            return await self._receive(message, hand_over)
        except NotRecorded:
            return False
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("telegram: handling update %d failed", update.update_id)
            return True

    async def _receive(self, message: Message, hand_over: HandOverTo) -> bool:
        bot_id, username = self.bot.id, self.bot.username
        target = command_target(message)
        if target and target.lower() != username.lower():
            return True  # a command for another bot in the group
        incoming = to_incoming(message, bot_id, username)
        if (not incoming.is_direct and not incoming.mentions_bot
                and self.settings.group_messages == "mentions"):
            return True
        attachments, problem = await self.downloads.fetch(self.bot, message)
        if problem:
            await self._quiet_notice(incoming.chat_id, problem, incoming.thread_id)
        if attachments:
            incoming = to_incoming(message, bot_id, username, attachments)
        if incoming.text or incoming.attachments:
            return await self.handover(hand_over, incoming) is not None
        return True

    async def _click(self, query: CallbackQuery, hand_over: HandOverTo) -> bool:
        """A button pressed: answered in time, handed over when the clicker may decide, then
        the keyboard taken off the request (see ``buttons.py``)."""
        incoming = await self.clicks.receive(self.bot, query)
        if incoming is None:
            return True
        if await self.handover(hand_over, incoming) is None:
            return False
        await self.clicks.take_off(self.bot, query)
        return True

    async def _quiet_notice(self, chat_id: str, text: str, thread_id: str | None) -> None:
        await quiet_notice(self.send, notice(chat_id, text, thread_id=thread_id), log=log,
                           provider="telegram", place=f"chat {chat_id}")

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        await self._ready()
        return await self.outbound.send(message)

    async def edit(self, message: OutgoingMessage) -> None:
        await self._ready()
        await self.outbound.edit(message)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self._ready()
        await self.outbound.typing(chat_id, thread_id)

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        await self._ready()
        return await self.outbound.delete(chat_id, platform_id)

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except TelegramError as e:
            raise provider_error(e) from None


async def _shut_send_side(bot: Bot) -> None:
    """Close a Bot's send pool only (the long-poll request is shared with its successor)."""
    try:
        await bot.request.shutdown()
    except Exception as e:  # noqa: BLE001 - a pool being thrown away
        log.debug("telegram: closing the old send pool: %s", e)
