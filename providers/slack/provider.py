"""The Slack provider: a bot in one workspace, through slack-bolt (async) and the Web API.

Receiving, chosen by ``mode``: the Events API over HTTP, mounted on the gateway's aiohttp
server (``events.py``), or Socket Mode with the app-level token. Either way an event is
acknowledged once intake recorded its message (a storage error: 503 / no ack, and Slack
delivers it again); copies of a message (``app_mention`` + ``message``, a
redelivery) start one run (``inbound.py``; the gateway's dedupe keeps that across restarts).
Direct messages are always for the bot; in channels, mentions and threads it takes part in.
Sending (``outbound.py``): mrkdwn into the message's thread, edits for streamed replies, files
through the external upload flow. Errors become :class:`ProviderError`s: 429s with Slack's
``Retry-After`` for the outbox to honour, gone channels and bad tokens as permanent.
The tokens and the signing secret never appear in a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from pluto.errors import ProviderError, ProviderUnusable

from pluto.gateway.ports import HttpMount, Intake, Provider, ProviderContext
from pluto.providers.kit.notices import notice, quiet_notice
from pluto.providers.handover import HandOver, NotRecorded
from pluto.types import Attachment, Capabilities, OutgoingMessage
from pluto.providers.slack.buttons import Check, Clicks
from pluto.providers.slack.errors import provider_error, redact_secrets_in_logs
from pluto.providers.slack.events import HttpEvents, build_app
from pluto.providers.slack.files import Downloads, FileProblem
from pluto.providers.slack.inbound import (
    Addressed,
    Identity,
    RecentKeys,
    Threads,
    is_direct,
    is_from_people,
    mentions,
    message_key,
    to_incoming,
)
from pluto.providers.slack.markup import SLACK_MRKDWN
from pluto.providers.slack.outbound import Outbound
from pluto.providers.slack.settings import SlackSecrets, SlackSettings, load_settings
from pluto.providers.slack.socket_mode import serve_socket_mode

log = logging.getLogger(__name__)


class SlackProvider(Provider):
    name = "slack"
    # Slack takes 40,000 characters, but its clients fold long messages and its guidance is to
    # keep a message under 4,000: a long answer reads better as a few messages of ~3,900.
    capabilities = Capabilities(max_message_length=3900, markup=SLACK_MRKDWN, can_edit=True,
                                can_send_images=True, can_send_files=True, has_buttons=True)

    def __init__(self, settings: SlackSettings, secrets: SlackSecrets, *, data_dir: Path,
                 http_app: HttpMount | web.Application | None = None,
                 approvals: Check | None = None):
        redact_secrets_in_logs(secrets.values())
        self.settings = settings
        self._secrets = secrets
        self.client = AsyncWebClient(token=secrets.bot_token, base_url=settings.api_base,
                                     timeout=30)  # sends: the outbox retries, honouring 429s
        self.reader = AsyncWebClient(  # lookups while receiving (after the ack): wait out 429s
            token=secrets.bot_token, base_url=settings.api_base, timeout=30, retry_handlers=[
                AsyncConnectionErrorRetryHandler(), AsyncRateLimitErrorRetryHandler(
                    max_retry_count=2)])
        self.threads = Threads()
        self.recent = RecentKeys()
        self.outbound = Outbound(self.client, self.threads.join)
        self.downloads = Downloads(data_dir, settings.max_download_mb, secrets.bot_token,
                                   settings.api_base)
        self.clicks = Clicks(self.name, self.reader, approvals, self._after_ack)
        self.app = build_app(api_base=settings.api_base,
                             signing_secret=secrets.signing_secret if settings.mode == "http"
                             else None, authorize=self._authorize, on_event=self._on_event,
                             on_click=self._on_click)
        redact_secrets_in_logs(secrets.values())  # bolt made its loggers just now
        self._intake: Intake | None = None
        self._identity_lock = asyncio.Lock()
        self._who: Identity | None = None
        self._handling: set[asyncio.Task[Any]] = set()
        self._recording: dict[str, asyncio.Future[bool]] = {}  # key → recorded (being handed)
        self.handover = HandOver(self.name)
        if http_app is not None and settings.mode == "http" and secrets.signing_secret:
            endpoint = HttpEvents(self.app, secrets.signing_secret, lambda: self._intake is not None)
            http_app.router.add_post(settings.events_path, endpoint.handle)

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> SlackProvider:
        settings, secrets = load_settings(ctx)
        return cls(settings, secrets, data_dir=ctx.data_dir,
                   http_app=ctx.http, approvals=ctx.approvals)

    # lifecycle ---------------------------------------------------------------------------

    async def identity(self) -> Identity:
        """Who the bot is (``auth.test``, once): needed to see mentions and its own threads."""
        async with self._identity_lock:
            if self._who is None:
                try:
                    found = await self.reader.auth_test()
                except SlackApiError as e:
                    raise _named(provider_error(e), self.settings.bot_token_env) from None
                except (SlackClientError, OSError, asyncio.TimeoutError) as e:
                    raise provider_error(e) from None
                self._who = Identity(user_id=str(found.get("user_id") or ""),
                                     bot_id=str(found.get("bot_id") or ""),
                                     team_id=str(found.get("team_id") or ""))
            return self._who

    async def probe(self) -> str:
        """A harmless call (auth.test) for ``pluto doctor``: the bot token works."""
        who = await self.identity()
        return f"team {who.team_id} as {who.user_id} (auth.test)"

    def single_owner(self) -> bool:
        return self.settings.mode != "http"  # Socket Mode: a few sockets per app, one holder

    async def run(self, intake: Intake) -> None:
        self._intake = intake  # events that arrive while connecting wait for the identity
        try:
            who = await self.identity()
            log.info("slack: connected to team %s as %s (%s mode)", who.team_id, who.user_id,
                     self.settings.mode)
            if self.settings.mode == "socket":
                assert self._secrets.app_token is not None
                await serve_socket_mode(self.app, self.client, self._secrets.app_token,
                                        self.settings.app_token_env)
            else:
                await asyncio.Event().wait()  # events arrive through the HTTP endpoint
        finally:
            self._intake = None

    async def close(self) -> None:
        for task in list(self._handling):
            task.cancel()
        await asyncio.gather(*self._handling, return_exceptions=True)
        await self.downloads.close()

    # receiving ---------------------------------------------------------------------------

    async def _authorize(self) -> AuthorizeResult:
        who = await self.identity()  # a failure answers 500: Slack delivers the event again
        return AuthorizeResult(enterprise_id=None, team_id=who.team_id, bot_user_id=who.user_id,
                               bot_id=who.bot_id)

    async def _on_event(self, body: dict[str, Any], retry: str | None) -> None:
        """One event, before Slack is answered (its 2xx or ack confirms the event).
        :class:`NotRecorded` propagates: the message is not in the inbox, so Slack must deliver
        it again (503, no ack). Any other failure is logged, never fatal."""
        event = body.get("event")
        if not isinstance(event, dict) or not is_from_people(event):
            return
        key = message_key(str(event["channel"]), str(event["ts"]))
        if not self.recent.claim(key):
            await self._copy_of(key, retry, event)
            return
        recorded = self._recording[key] = asyncio.get_running_loop().create_future()
        task = asyncio.current_task()
        if task is not None:
            self._handling.add(task)
        try:
            await self._receive(event, body)
        except BaseException as e:
            self.recent.release(key)  # let a redelivery try again
            recorded.set_result(False)
            if isinstance(e, NotRecorded | asyncio.CancelledError):
                raise
            log.exception("slack: handling message %s failed", key)
        finally:
            if not recorded.done():
                recorded.set_result(True)
            self._recording.pop(key, None)
            if task is not None:
                self._handling.discard(task)

    async def _on_click(self, body: dict[str, Any]) -> None:
        """A click of a button of ours, before Slack's ack (within its 3 s). :class:`NotRecorded`
        propagates (no ack: a Socket Mode envelope comes again); anything else is logged."""
        intake = self._intake
        try:
            await self.clicks.on_click(
                body, None if intake is None else (lambda m: self.handover(intake.submit, m)))
        except (NotRecorded, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("slack: handling a click failed")

    def _after_ack(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Work a click may leave for after its ack (a refusal shown, buttons taken off)."""
        task = asyncio.create_task(work)
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)
        return task

    async def _copy_of(self, key: str, retry: str | None, event: dict[str, Any]) -> None:
        """Another copy of a message (a retry, the ``app_mention`` of a ``message``): it is
        confirmed as the first one is — once that one was recorded, never before."""
        first = self._recording.get(key)
        if first is not None and not await asyncio.shield(first):
            raise NotRecorded("the message could not be recorded")
        log.debug("slack: message %s arrived again (%s); ignored", key,
                  f"retry {retry}" if retry else event.get("type"))

    async def _receive(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        intake = self._intake
        if intake is None:
            return
        who = await self.identity()
        addressed = await self._addressed(event, who)
        if addressed is None:
            return
        attachments: tuple[Attachment, ...] = ()
        problems: list[str] = []
        if event.get("files"):
            attachments, problems = await self.downloads.fetch(event, self._file_info)
        for problem in problems:
            await self._quiet_notice(str(event["channel"]), problem, addressed.thread_ts)
        incoming = to_incoming(event, who, addressed, team_id=body.get("team_id"),
                               attachments=attachments)
        if incoming.text or incoming.attachments:
            await self.handover(intake.submit, incoming)  # NotRecorded: not confirmed

    async def _addressed(self, event: dict[str, Any], who: Identity) -> Addressed | None:
        """Whether the bot should see the message, and where an answer goes."""
        channel, ts = str(event["channel"]), str(event["ts"])
        thread_ts = str(event["thread_ts"]) if event.get("thread_ts") else None
        if is_direct(event):
            return Addressed(direct=True, mentioned=True, thread_ts=thread_ts)
        mentioned = (event.get("type") == "app_mention"
                     or mentions(str(event.get("text") or ""), who.user_id))
        if thread_ts and thread_ts != ts and not mentioned:
            mentioned = await self._in_thread(channel, thread_ts, event, who)
        if not mentioned and self.settings.channel_messages == "mentions":
            return None
        reply_ts = thread_ts or (ts if self.settings.reply_in_thread else None)
        if mentioned and reply_ts:
            self.threads.join(channel, reply_ts)
        return Addressed(direct=False, mentioned=mentioned, thread_ts=reply_ts)

    async def _in_thread(self, channel: str, thread_ts: str, event: dict[str, Any],
                         who: Identity) -> bool:
        """Whether the bot takes part in a thread: it started it, wrote or was mentioned in it."""
        if event.get("parent_user_id") == who.user_id:
            self.threads.join(channel, thread_ts)
            return True
        known = self.threads.known(channel, thread_ts)
        if known is not None:
            return known
        try:
            found = await self.reader.conversations_replies(channel=channel, ts=thread_ts,
                                                            limit=200)
        except (SlackClientError, OSError, asyncio.TimeoutError) as e:
            log.warning("slack: could not read thread %s in %s: %s", thread_ts, channel,
                        provider_error(e))
            return False
        return self.threads.learn(channel, thread_ts, list(found.get("messages") or []), who)

    async def _file_info(self, file_id: str) -> dict[str, Any]:
        try:
            found = await self.reader.files_info(file=file_id)
        except (SlackClientError, OSError, asyncio.TimeoutError) as e:
            log.warning("slack: files.info for %s failed: %s", file_id, provider_error(e))
            raise FileProblem("I could not read a file you sent; please send it again.") from None
        info = found.get("file")
        return info if isinstance(info, dict) else {}

    async def _quiet_notice(self, chat_id: str, text: str, thread_id: str | None) -> None:
        await quiet_notice(self.send, notice(chat_id, text, thread_id=thread_id), log=log,
                           provider="slack", place=f"channel {chat_id}")

    # sending -----------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> str | None:
        return await self.outbound.send(message)

    async def edit(self, message: OutgoingMessage) -> None:
        await self.outbound.edit(message)

    async def delete(self, chat_id: str, platform_id: str,
                     thread_id: str | None = None) -> bool:
        return await self.outbound.delete(chat_id, platform_id)


def _named(error: ProviderError, env: str) -> ProviderError:
    """The bot token refused: say which environment variable holds it."""
    if isinstance(error, ProviderUnusable):
        return ProviderUnusable(f"{error} (the bot token in {env})")
    return error
