"""How events reach the provider: a slack-bolt app, fed over HTTP (the Events API, mounted on
the gateway's aiohttp server) or by Socket Mode.

Bolt checks each HTTP request's signature (``v0=`` HMAC-SHA256 of ``v0:<ts>:<body>`` with the
signing secret) and refuses requests older than five minutes (401; so is a post without a
numeric timestamp, before the SDK could fail on it); it answers
``url_verification``; and it acknowledges an event only after the listener ran
(``process_before_response=True``): Slack's 200 (or its Socket Mode ack) confirms the event, so
it is given once intake recorded the message. When it could not be recorded (storage failed:
:class:`~pluto.providers.handover.NotRecorded`), an HTTP post is answered 503 and a Socket Mode
envelope is not acknowledged, and Slack delivers the event again. The signature is checked before anything else is read, so a forged or
malformed request learns nothing (401, then 400 for a signed body that is not an event, or
whose JSON nests deeper than :data:`pluto.jsonlimits.MAX_DEPTH`). Interactivity (a click's
``block_actions``, form-encoded ``payload=``) may be posted to the same URL: it is checked the
same way, then answered by the click's listener (``buttons.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.logger.messages import warning_client_prioritized_and_token_skipped
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from pluto import jsonlimits
from pluto.jsonlimits import JsonTooDeep
from pluto.providers.handover import NotRecorded
from pluto.providers.kit.http import read_limited
from pluto.providers.slack.buttons import ACTION_PATTERN

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024  # Slack's event posts are a few kilobytes
BOLT_LOG = logging.getLogger("pluto.providers.slack.bolt")
Authorize = Callable[[], Awaitable[AuthorizeResult]]
OnEvent = Callable[[dict[str, Any], str | None], Awaitable[None]]  # (payload, retry number)
OnClick = Callable[[dict[str, Any]], Awaitable[None]]  # a block_actions payload, before the ack


class _NotTheTokenNotice(logging.Filter):
    """Bolt reads ``SLACK_BOT_TOKEN`` itself and warns that the client given wins: it does, on
    purpose (the token named by ``bot_token_env`` is used, through ``authorize``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != warning_client_prioritized_and_token_skipped()


BOLT_LOG.addFilter(_NotTheTokenNotice())


def build_app(*, api_base: str, signing_secret: str | None, authorize: Authorize,
              on_event: OnEvent, on_click: OnClick | None = None) -> AsyncApp:
    """The bolt app: message and app_mention events go to ``on_event``, clicks of our buttons
    (``block_actions``) to ``on_click`` (acknowledged once it returned; it must return within
    Slack's 3 s); others are acknowledged and ignored."""
    app = AsyncApp(
        client=AsyncWebClient(base_url=api_base, timeout=30),  # no token: bolt needs none
        signing_secret=signing_secret or "",
        request_verification_enabled=signing_secret is not None,
        authorize=_authorizer(authorize), logger=BOLT_LOG,
        process_before_response=True, name="pluto")

    async def on_message(body: dict[str, Any], request: AsyncBoltRequest) -> None:
        retry = request.headers.get("x-slack-retry-num")  # HTTP only: bolt drops Socket Mode's
        await on_event(body, retry[0] if retry else None)

    async def ignore(body: dict[str, Any]) -> None:
        return None  # another event the app is subscribed to: nothing to do

    async def on_error(error: Exception, body: dict[str, Any],
                       response: BoltResponse | None) -> BoltResponse | None:
        if isinstance(error, NotRecorded):  # logged once per outage by the hand-over
            return BoltResponse(status=503, body="not recorded; try again")  # Slack retries
        log.warning("slack: event %s not handled: %s", _event_id(body), _sentence(error))
        return None

    async def on_action(body: dict[str, Any], ack: AsyncAck) -> None:
        if on_click is not None:
            await on_click(body)  # NotRecorded propagates: no ack (Socket Mode delivers again)
        await ack()

    async def other_action(ack: AsyncAck) -> None:
        await ack()  # not one of our buttons: answered, ignored

    app.action(ACTION_PATTERN)(on_action)
    app.action(re.compile(".*"))(other_action)
    app.event("message")(on_message)
    app.event("app_mention")(on_message)
    app.event(re.compile(".*"))(ignore)
    app.error(on_error)
    return app


def _authorizer(authorize: Authorize) -> Callable[..., Awaitable[AuthorizeResult]]:
    async def authorize_request(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        return await authorize()
    return authorize_request


class HttpEvents:
    """The Events API endpoint (``POST <events_path>``) on the gateway's HTTP server."""

    def __init__(self, app: AsyncApp, signing_secret: str, ready: Callable[[], bool]):
        self.app = app
        self.verifier = SignatureVerifier(signing_secret)
        self.ready = ready

    async def handle(self, request: web.Request) -> web.Response:
        raw = await read_limited(request, MAX_BODY)
        if raw is None:
            return web.Response(status=413, text="too large")
        headers = request.headers
        timestamp = headers.get("X-Slack-Request-Timestamp", "")
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12) or \
                not self.verifier.is_valid(raw, timestamp, headers.get("X-Slack-Signature", "")):
            log.warning("slack: refused an event post with a bad or stale signature")
            return web.json_response({"error": "invalid request"}, status=401)
        try:
            text = raw.decode("utf-8")
            if not jsonlimits.nesting_within(_json_part(text)):  # bolt parses it, recursively
                raise JsonTooDeep("nested too deeply")
            bolt_request = AsyncBoltRequest(body=text, query=request.query_string,
                                            headers={k: v for k, v in headers.items()})
            kind = bolt_request.body.get("type")
        except (ValueError, AttributeError, TypeError, RecursionError):
            log.warning("slack: a signed event post was not a Slack event (not JSON, or nested "
                        "too deeply); refused")
            return web.json_response({"error": "not a Slack event"}, status=400)
        if kind != "url_verification" and not self.ready():
            return web.json_response({"error": "not ready"}, status=503)  # Slack retries
        response = await self.app.async_dispatch(bolt_request)
        return await to_aiohttp_response(response)


def _json_part(text: str) -> str:
    """The JSON of a post: the body itself (events), or its ``payload`` field (interactivity,
    form-encoded)."""
    if text.lstrip().startswith("{"):
        return text
    return dict(parse_qsl(text, keep_blank_values=True)).get("payload", "")


def _event_id(body: Any) -> str:
    return str(body.get("event_id") or "?") if isinstance(body, dict) else "?"


def _sentence(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
