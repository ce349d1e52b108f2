"""The console's test chat (docs/console.md): an operator speaks to one agent from its page —
whether or not routes.yaml sends anyone's messages to it — and follows the answer live over the
run feed (``GET /admin/runs/{id}/events``), as the conversations page follows any run.

``POST /admin/agents/{name}/chat`` ``{"text", "conversation"}`` → 202 ``{"run_id",
"session_id", "queued"}``. The message is a message of the provider ``console``: recorded in
the inbox before it is answered 202, then through the pipeline like any other (its session's
lane, commands such as ``/new`` and ``/stop``, fencing, the usage ledger) — only its route is
the console's own (:meth:`ConsoleChat.own_route`: the agent named in its chat id) instead of the
routing table's. Each signed-in person has conversations of their own with each agent
(``conversation``: the page's id for one; a new id starts afresh), in the session
``<agent>/console/<person>/<conversation>``, on the conversations page too.

``console`` sends nothing anywhere (the page reads the run feed); it starts the first time
someone uses the test chat on an instance. With several instances the one that took the message
answers it; were it to die meanwhile, an instance taking over its chat without a test chat of
its own drops the message (logged; the page's stream ends and the person sends it again).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING

from aiohttp import web

from pluto import jsonlimits
from pluto.errors import ConfigError
from pluto.gateway.console.access import PRINCIPAL
from pluto.gateway.http.server import GATEWAY_KEY
from pluto.gateway.ports import Intake, Provider, ProviderContext
from pluto.ids import new_id
from pluto.types import (MARKDOWN, Accepted, Answered, Capabilities, Dropped, IncomingMessage,
                         OutgoingMessage, Refused, Route)

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

log = logging.getLogger(__name__)

NAME = "console"
MAX_TEXT = 20_000  # characters of one message
CONVERSATION = re.compile(r"[A-Za-z0-9_-]{1,40}")


class ConsoleChat(Provider):
    """The test chat's side of the gateway: answers are read from the run feed by the page."""

    name = NAME
    capabilities = Capabilities(max_message_length=1_000_000, markup=MARKDOWN,
                                streams_deltas=True, answers_from_feed=True)

    def __init__(self) -> None:
        self.intake: Intake | None = None
        self.ready = asyncio.Event()

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> ConsoleChat:
        raise ConfigError([("pluto.yaml", None, "providers.console", "the console's test chat "
                            "is not configured: it is there when the console is on")])

    async def run(self, intake: Intake) -> None:
        self.intake = intake
        self.ready.set()
        try:
            await asyncio.Event().wait()  # nothing arrives from a platform: the page posts
        finally:
            self.ready.clear()

    async def send(self, message: OutgoingMessage) -> str | None:
        # a run's answer is in its events; a command's answer or a notice is shown by the
        # page from the run feed too when it has a run, else it is dropped here (logged)
        if message.run_id is None:
            log.info("console test chat %s: %s", message.chat_id, message.text[:200])
        return message.run_id or message.answers

    def own_route(self, msg: IncomingMessage) -> Route | None:
        agent, _, rest = msg.chat_id.partition("/")
        return Route(agent=agent, session_key=f"{agent}/{NAME}/{rest}",
                     rule="the console's test chat")


def chat_id(agent: str, who: str, conversation: str) -> str:
    return f"{agent}/{who}/{conversation}"


async def _provider(gw: Gateway) -> ConsoleChat:
    p = gw.providers.get(NAME)
    if not isinstance(p, ConsoleChat):
        p = ConsoleChat()
        gw.add_provider(p)
    async with asyncio.timeout(10):
        await p.ready.wait()
    return p


def _bad(status: int, error: str) -> web.Response:
    return web.json_response({"error": error}, status=status)


async def _said(request: web.Request) -> tuple[str, str] | web.Response:
    """The message's text and conversation id from the request's body, or the refusal."""
    limit = 4 * MAX_TEXT + 1024  # (JSON escapes: up to 4 bytes a character and the rest)
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        return _bad(413, f"a message holds at most {MAX_TEXT:,} characters")
    try:
        body = jsonlimits.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return _bad(400, "the body is not valid JSON")
    text = body.get("text") if isinstance(body, dict) else None
    conversation = body.get("conversation", "1") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip():
        return _bad(400, 'send {"text": "...", "conversation": "<id>"}')
    if len(text) > MAX_TEXT:
        return _bad(413, f"a message holds at most {MAX_TEXT:,} characters")
    if not isinstance(conversation, str) or not CONVERSATION.fullmatch(conversation):
        return _bad(400, "'conversation' is 1 to 40 letters, digits, '-' or '_'")
    return text, conversation


async def _say(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    agent = request.match_info["name"]
    said = await _said(request)
    if isinstance(said, web.Response):
        return said
    text, conversation = said
    if agent not in gw.registry:
        return _bad(404, f"no agent named {agent!r}")
    try:
        await asyncio.to_thread(gw.registry.get, agent)
    except Exception:  # noqa: BLE001 - said to the person; the problems are on the page
        log.info("console test chat: agent %s does not load", agent, exc_info=True)
        return _bad(409, f"the agent {agent} does not load: fix its files first")
    who = request[PRINCIPAL].name
    provider = await _provider(gw)
    assert provider.intake is not None
    msg = IncomingMessage(provider=NAME, chat_id=chat_id(agent, who, conversation),
                          user_id=who, user_name=who, text=text, message_id=new_id())
    try:
        outcome = await (await provider.intake.submit(msg)).outcome()
    except Exception:  # noqa: BLE001 - not recorded: said so, the person sends it again
        log.exception("console test chat: a message to %s could not be recorded", agent)
        return _bad(503, "the message could not be recorded just now; send it again")
    match outcome:
        case Accepted():
            pass  # taken: its run answers it, on the run feed (below: 202)
        case Answered(text=text, failed=failed):  # a command: /help, /new, /stop ...
            return web.json_response({"answer": text, "failed": failed})
        case Refused(notice=notice, reason=reason) | Dropped(notice=notice, reason=reason):
            return _bad(503, notice or reason)
        case _:  # (a duplicate: each message here has an id of its own)
            return _bad(409, "this message was taken already")
    route = provider.own_route(msg)
    assert route is not None
    session = await gw.store.conversations.session(route.session_key, agent)
    return web.json_response({"run_id": outcome.run_id, "session_id": session.id,
                              "queued": outcome.queued}, status=202)


def add_test_chat_routes(r: web.UrlDispatcher) -> None:
    r.add_post("/agents/{name}/chat", _say)
