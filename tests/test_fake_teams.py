"""The fake Teams behaves like the Bot Framework: its keys verify the activities it signs, its
token endpoint refuses a wrong secret, its Connector lets in only tokens it issued, refuses
what Teams refuses (429 with Retry-After, 413 over 28 KB, 400, 404), and its sender delivers
again on 5xx and timeouts, not on 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web

from tests.fakes.teams_server import APP_ID, APP_PASSWORD, FakeTeams

CHAT = "a:1alice"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    async with FakeTeams(retry_delays=(0.05, 0.1), timeout=0.5) as f:
        f.add_conversation(CHAT, "personal")
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def token(fake: FakeTeams, http: aiohttp.ClientSession, secret: str = APP_PASSWORD,
                client: str = APP_ID) -> tuple[int, dict[str, Any]]:
    form = {"grant_type": "client_credentials", "client_id": client, "client_secret": secret,
            "scope": "https://api.botframework.com/.default"}
    async with http.post(fake.token_url, data=form) as r:
        return r.status, await r.json()


async def connector(fake: FakeTeams, http: aiohttp.ClientSession, method: str, path: str,
                    body: Any = None, bearer: str | None = None) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    url = f"{fake.service_url}v3/conversations/{path}"
    async with http.request(method, url, json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers


async def test_the_token_endpoint_issues_tokens_to_the_right_secret_only(
        fake: FakeTeams, http: aiohttp.ClientSession) -> None:
    status, body = await token(fake, http)
    assert status == 200 and body["token_type"] == "Bearer" and body["expires_in"] > 3000
    status, body = await token(fake, http, secret="wrong")
    assert (status, body["error"]) == (401, "invalid_client")
    status, body = await token(fake, http, client="00000000-0000-0000-0000-000000000000")
    assert (status, body["error"]) == (400, "unauthorized_client")


async def test_the_connector_lets_in_only_tokens_it_issued(fake: FakeTeams,
                                                           http: aiohttp.ClientSession) -> None:
    message = {"type": "message", "text": "hi"}
    assert (await connector(fake, http, "POST", f"{CHAT}/activities", message))[0] == 401
    assert (await connector(fake, http, "POST", f"{CHAT}/activities", message,
                            "made-up"))[0] == 401
    _, issued = await token(fake, http)
    status, body, _ = await connector(fake, http, "POST", f"{CHAT}/activities", message,
                                      issued["access_token"])
    assert status == 200 and [s.id for s in fake.bot_messages(CHAT)] == [body["id"]]
    fake.expire_tokens()
    assert (await connector(fake, http, "POST", f"{CHAT}/activities", message,
                            issued["access_token"]))[0] == 401


async def test_the_connector_refuses_what_teams_refuses(fake: FakeTeams,
                                                        http: aiohttp.ClientSession) -> None:
    _, issued = await token(fake, http)
    bearer = issued["access_token"]

    async def post(body: Any, conversation: str = CHAT) -> tuple[int, Any]:
        status, got, _ = await connector(fake, http, "POST", f"{conversation}/activities", body,
                                         bearer)
        return status, got

    assert await post({"type": "message", "text": "x" * 30_000}) == (
        413, {"error": {"code": "MessageSizeTooBig", "message": "Message size too big."}})
    assert (await post({"type": "message"}))[0] == 400
    assert (await post({"type": "message", "text": "hi"}, "19:unknown@thread.v2"))[0] == 404
    assert (await connector(fake, http, "PUT", f"{CHAT}/activities/404",
                            {"type": "message", "text": "x"}, bearer))[0] == 404


async def test_updates_and_deletes(fake: FakeTeams, http: aiohttp.ClientSession) -> None:
    _, issued = await token(fake, http)
    bearer = issued["access_token"]
    _, sent, _ = await connector(fake, http, "POST", f"{CHAT}/activities",
                                 {"type": "message", "text": "Hel"}, bearer)
    status, _, _ = await connector(fake, http, "PUT", f"{CHAT}/activities/{sent['id']}",
                                   {"type": "message", "text": "Hello"}, bearer)
    assert status == 200
    [shown] = fake.bot_messages(CHAT)
    assert (shown.text, shown.edits) == ("Hello", 1)
    assert (await connector(fake, http, "DELETE", f"{CHAT}/activities/{sent['id']}", None,
                            bearer))[0] == 200
    assert fake.bot_messages(CHAT) == []


async def test_a_throttled_conversation_is_429_with_retry_after(
        fake: FakeTeams, http: aiohttp.ClientSession) -> None:
    _, issued = await token(fake, http)
    fake.hold(CHAT, after=1, retry_after=5)
    message = {"type": "message", "text": "hi"}
    first = await connector(fake, http, "POST", f"{CHAT}/activities", message,
                            issued["access_token"])
    assert first[0] == 200
    for _ in range(2):  # the window stays shut for every message until it ends
        status, _, headers = await connector(fake, http, "POST", f"{CHAT}/activities", message,
                                             issued["access_token"])
        assert status == 429 and headers["Retry-After"] == "5"
    assert len(fake.refused) == 2 and len(fake.bot_messages(CHAT)) == 1


class Endpoint:
    """A bot's messaging endpoint in the test: answers with the statuses it is given."""

    def __init__(self, statuses: list[int | None]):
        self.statuses = statuses
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.never = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append((request.headers["Authorization"], await request.json()))
        status = self.statuses.pop(0) if self.statuses else 200
        if status is None:  # no answer: the sender times out
            await self.never.wait()
        return web.Response(status=status or 200)


@pytest.fixture
async def endpoint(fake: FakeTeams) -> AsyncIterator[Endpoint]:
    bot = Endpoint([])
    app = web.Application()
    app.router.add_post("/api/messages", bot.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.endpoint_url = f"http://127.0.0.1:{port}/api/messages"
    yield bot
    bot.never.set()
    await runner.cleanup()


async def test_activities_are_signed_with_the_published_key(fake: FakeTeams,
                                                             endpoint: Endpoint,
                                                             http: aiohttp.ClientSession) -> None:
    said = await fake.user_says(CHAT, "hello")
    await said.delivery.done.wait()
    [(auth, activity)] = endpoint.got
    async with http.get(fake.openid_url) as r:
        jwks_uri = (await r.json())["jwks_uri"]
    async with http.get(jwks_uri) as r:
        [jwk] = (await r.json())["keys"]
    claims = jwt.decode(auth.removeprefix("Bearer "), jwt.PyJWK(jwk).key, algorithms=["RS256"],
                        audience=APP_ID, issuer="https://api.botframework.com")
    assert claims["serviceurl"] == activity["serviceUrl"] == fake.service_url
    assert activity["text"] == "hello" and activity["recipient"]["id"] == f"28:{APP_ID}"
    assert "msteams" in jwk["endorsements"]


async def test_the_sender_delivers_again_on_5xx_and_timeouts_not_on_4xx(
        fake: FakeTeams, endpoint: Endpoint) -> None:
    endpoint.statuses = [503, None, 200]
    said = await fake.user_says(CHAT, "again")
    await said.delivery.done.wait()
    assert said.delivery.statuses == [503, 0, 200]
    assert len({a["id"] for _, a in endpoint.got}) == 1  # the same activity each time
    endpoint.statuses = [401]
    said = await fake.user_says(CHAT, "refused")
    await said.delivery.done.wait()
    assert said.delivery.statuses == [401]
