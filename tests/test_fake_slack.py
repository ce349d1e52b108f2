"""The fake Slack, driven by the real slack_sdk / slack_bolt over HTTP and websockets."""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack_server import FakeSlack, sign

TS = re.compile(r"^\d{10}\.\d{6}$")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    # slack_sdk reads HTTP(S)_PROXY and ignores NO_PROXY
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def fake():
    async with FakeSlack(event_ack_timeout=1.0, event_retry_delays=(0.0, 0.1, 0.1)) as server:
        server.general = server.add_channel("general")["id"]
        server.dm = server.add_dm()["id"]
        yield server


@pytest.fixture
async def client(fake):
    web_client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    yield web_client
    if web_client.session is not None:  # pragma: no cover - slack_sdk opens a session per call by default
        await web_client.session.close()


class Served:
    """A small aiohttp server in the test (the gateway's role): a bolt app or a raw handler."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, handler) -> str:
        app = web.Application()
        app.router.add_post("/slack/events", handler)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/slack/events"
        return self.url

    async def stop(self) -> None:
        if self.runner:
            await self.runner.cleanup()


@pytest.fixture
async def served():
    server = Served()
    yield server
    await server.stop()


def bolt_handler(app: AsyncApp):
    async def handle(request: web.Request) -> web.Response:
        return await to_aiohttp_response(await app.async_dispatch(await to_bolt_request(request)))
    return handle


# ---------------------------------------------------------------- Web API
async def test_auth_test_and_token_checks(fake, client):
    me = await client.auth_test()
    assert (me["user_id"], me["bot_id"], me["team_id"], me["user"]) == ("U0PLUTOBOT", "B0PLUTOBOT", "T0PLUTOTEAM",
                                                                        "pluto")
    with pytest.raises(SlackApiError) as bad:
        await AsyncWebClient(token="xoxb-wrong", base_url=fake.api_url).auth_test()
    assert bad.value.response.status_code == 200 and bad.value.response["error"] == "invalid_auth"
    with pytest.raises(SlackApiError) as app_token:
        await AsyncWebClient(token=fake.app_token, base_url=fake.api_url).chat_postMessage(channel=fake.dm, text="x")
    assert app_token.value.response["error"] == "not_allowed_token_type"
    with pytest.raises(SlackApiError) as bot_token:
        await client.apps_connections_open(app_token=fake.bot_token)
    assert bot_token.value.response["error"] == "not_allowed_token_type"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.api_url}auth.test") as resp:
            assert (resp.status, await resp.json()) == (200, {"ok": False, "error": "not_authed"})
        async with http.post(f"{fake.api_url}no.such", headers={"Authorization": f"Bearer {fake.bot_token}"}) as resp:
            assert resp.status == 200
            assert await resp.json() == {"ok": False, "error": "unknown_method", "req_method": "no.such"}
        # a form body with the token as a field works too, blocks as a JSON string
        form = {"token": fake.bot_token, "channel": fake.general, "text": "form",
                "blocks": json.dumps([{"type": "section", "text": {"type": "mrkdwn", "text": "*form*"}}])}
        async with http.post(f"{fake.api_url}chat.postMessage", data=form) as resp:
            body = await resp.json()
            assert body["ok"] and body["message"]["blocks"][0]["text"]["text"] == "*form*"
    assert fake.posts(fake.general)[0].blocks[0]["type"] == "section"
    assert "token" not in fake.calls_to("chat.postMessage")[0].params


async def test_post_thread_update_delete_and_errors(fake, client):
    first = await client.chat_postMessage(channel=fake.general, text="hello *world*")
    second = await client.chat_postMessage(channel=fake.general, text="in thread", thread_ts=first["ts"])
    assert TS.match(first["ts"]) and float(second["ts"]) > float(first["ts"])
    assert first["channel"] == fake.general and first["message"]["bot_id"] == fake.bot_id
    assert second["message"]["thread_ts"] == first["ts"]
    posts = await fake.wait_for_posts(fake.general, 2)
    assert [(p.text, p.thread_ts) for p in posts] == [("hello *world*", None), ("in thread", first["ts"])]
    assert fake.message(fake.general, first["ts"])["reply_count"] == 1
    # a user id as channel posts into that user's DM
    to_user = await client.chat_postMessage(channel=fake.default_user, text="dm")
    assert to_user["channel"] == fake.dm

    edited = await client.chat_update(channel=fake.general, ts=first["ts"], text="hello again")
    assert edited["text"] == "hello again"
    assert [(e.ts, e.text, e.previous_text) for e in fake.updates] == [(first["ts"], "hello again", "hello *world*")]
    assert fake.message(fake.general, first["ts"])["text"] == "hello again"

    async def error_of(coro) -> str:
        with pytest.raises(SlackApiError) as info:
            await coro
        assert info.value.response.status_code == 200
        return info.value.response["error"]

    assert await error_of(client.chat_postMessage(channel=fake.general, text="x" * 40_001)) == "msg_too_long"
    assert await error_of(client.chat_postMessage(channel="C0NOPE", text="x")) == "channel_not_found"
    outside = fake.add_channel("random", bot_member=False)["id"]
    assert await error_of(client.chat_postMessage(channel=outside, text="x")) == "not_in_channel"
    secret = fake.add_channel("secret", private=True, bot_member=False)["id"]
    assert await error_of(client.chat_postMessage(channel=secret, text="x")) == "channel_not_found"
    assert await error_of(client.chat_postMessage(channel=fake.general)) == "no_text"
    assert await error_of(client.chat_postMessage(channel=fake.general, text="x",
                                                  blocks=[{"type": "section"}])) == "invalid_blocks"
    assert await error_of(client.chat_update(channel=fake.general, ts="1.000001", text="x")) == "message_not_found"
    said = await fake.user_message(fake.general, "a user's words", deliver=False)
    assert await error_of(client.chat_update(channel=fake.general, ts=said.ts, text="x")) == "cant_update_message"
    assert await error_of(client.chat_delete(channel=fake.general, ts=said.ts)) == "cant_delete_message"

    await client.chat_delete(channel=fake.general, ts=second["ts"])
    assert fake.deletes == [(fake.general, second["ts"])] and fake.message(fake.general, second["ts"]) is None
    await client.reactions_add(channel=fake.general, timestamp=said.ts, name="eyes")
    assert await error_of(client.reactions_add(channel=fake.general, timestamp=said.ts, name="eyes")) == \
        "already_reacted"
    assert fake.reactions == [(fake.general, said.ts, "eyes")]

    info = await client.conversations_info(channel=fake.general)
    assert info["channel"]["name"] == "general" and info["channel"]["is_member"]
    dm_info = await client.conversations_info(channel=fake.dm)
    assert dm_info["channel"]["is_im"] and dm_info["channel"]["user"] == fake.default_user
    user = await client.users_info(user=fake.default_user)
    assert user["user"]["name"] == "alice" and not user["user"]["is_bot"]
    assert await error_of(client.users_info(user="U0NOBODY")) == "user_not_found"
    fake.fail_next("chat.postMessage", "fatal_error")
    assert await error_of(client.chat_postMessage(channel=fake.general, text="x")) == "fatal_error"


async def test_files_upload_v2_and_private_downloads(fake, client):
    parent = await client.chat_postMessage(channel=fake.dm, text="here comes a chart")
    data = b"\x89PNG\r\n\x1a\nnot-really-a-png" * 10
    done = await client.files_upload_v2(channel=fake.dm, thread_ts=parent["ts"], content=data,
                                        filename="chart.png", title="Sales chart", initial_comment="see")
    assert done["file"]["title"] == "Sales chart"
    [upload] = await fake.wait_for_uploads(fake.dm)
    assert (upload.data, upload.filename, upload.title, upload.channel, upload.thread_ts, upload.initial_comment) \
        == (data, "chart.png", "Sales chart", fake.dm, parent["ts"], "see")
    info = await client.files_info(file=upload.file_id)
    assert info["file"]["mimetype"] == "image/png" and fake.dm in info["file"]["ims"]
    assert [c.method for c in fake.calls] == ["chat.postMessage", "files.getUploadURLExternal",
                                              "files.completeUploadExternal", "files.info"]
    # completing twice is refused (the method can be called once)
    with pytest.raises(SlackApiError) as again:
        await client.files_completeUploadExternal(files=[{"id": upload.file_id}], channel_id=fake.dm)
    assert again.value.response["error"] == "file_not_found"

    # a file a user sends: downloadable with the bot token; without it Slack answers its sign-in page
    sent = fake.add_file(b"a,b\n1,2\n", "data.csv")
    msg = await fake.user_message(fake.dm, "what is in it?", files=[sent], deliver=False)
    event = msg.events[0]
    assert (event["subtype"], event["channel_type"], event["files"][0]["name"]) == ("file_share", "im", "data.csv")
    url = event["files"][0]["url_private_download"]
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers={"Authorization": f"Bearer {fake.bot_token}"}) as resp:
            assert (resp.status, resp.content_type, await resp.read()) == (200, "text/csv", b"a,b\n1,2\n")
        async with http.get(url) as resp:
            assert resp.status == 200 and resp.content_type == "text/html" and len(resp.history) == 1


async def test_rate_limit_is_429_with_retry_after_and_the_sdk_retries_it(fake, client):
    fake.rate_limit_next("chat.postMessage", retry_after=1)
    with pytest.raises(SlackApiError) as limited:
        await client.chat_postMessage(channel=fake.general, text="x")
    resp = limited.value.response
    assert (resp.status_code, resp["error"], resp.headers["Retry-After"]) == (429, "ratelimited", "1")

    fake.rate_limit_next("chat.postMessage", retry_after=1)
    patient = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url,
                             retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)])
    started = time.monotonic()
    ok = await patient.chat_postMessage(channel=fake.general, text="after waiting")
    assert ok["ok"] and time.monotonic() - started >= 1.0
    assert [c.status for c in fake.calls_to("chat.postMessage")] == [429, 429, 200]


# ---------------------------------------------------------------- Events API over HTTP
async def test_events_api_signed_posts_to_a_bolt_app(fake, served):
    app = AsyncApp(client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url),
                   signing_secret=fake.signing_secret)
    seen: list[dict] = []

    @app.event("message")
    async def on_message(event, say):
        seen.append(event)
        await say(text=f"echo: {event['text']}", thread_ts=event.get("thread_ts"))

    @app.event("app_mention")
    async def on_mention(event, say):
        seen.append(event)
        await say(text="you called?", thread_ts=event["ts"])

    fake.events_url = await served.start(bolt_handler(app))
    assert await fake.verify_url()

    said = await fake.user_message(fake.dm, "hello &lt;bot&gt;")
    [post] = await fake.wait_for_posts(fake.dm, 1)
    assert post.text == "echo: hello &lt;bot&gt;"
    assert said.deliveries[0].acked and said.deliveries[0].attempts[0].status == 200
    headers = said.deliveries[0].attempts[0].headers
    assert headers["X-Slack-Signature"] == sign(fake.signing_secret, headers["X-Slack-Request-Timestamp"],
                                                json.dumps(said.deliveries[0].payload))

    # the bot's own reply came back as a message event (bot_id set); bolt ignored it
    await fake.wait_until(lambda: len(fake.deliveries) >= 2 and all(d.done for d in fake.deliveries))
    assert fake.deliveries[1].event["bot_id"] == fake.bot_id and len(fake.posts(fake.dm)) == 1

    mention = await fake.user_message(fake.general, f"{fake.bot_mention} how are sales?")
    assert [e["type"] for e in mention.events] == ["app_mention"]        # no message.channels subscription
    [reply] = await fake.wait_for_posts(fake.general, 1)
    assert (reply.text, reply.thread_ts) == ("you called?", mention.ts)
    threaded = await fake.user_message(fake.general, f"{fake.bot_mention} and costs?", thread_ts=mention.ts)
    assert threaded.events[0]["thread_ts"] == mention.ts
    await fake.wait_for_posts(fake.general, 2)
    assert [e["type"] for e in seen] == ["message", "app_mention", "app_mention"]

    assert await fake.send_bad_signature(served.url) == 401
    assert await fake.send_stale(served.url) == 401
    assert len(seen) == 3


async def test_slow_ack_is_retried_with_the_same_event_id(fake, served):
    app = AsyncApp(client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url),
                   signing_secret=fake.signing_secret, process_before_response=True)
    retries: list[tuple[str | None, str | None, str]] = []

    @app.event("message")
    async def slow(body, request, ack):
        await ack()
        retries.append((request.headers.get("x-slack-retry-num", [None])[0],
                        request.headers.get("x-slack-retry-reason", [None])[0], body["event_id"]))
        if len(retries) == 1:
            await asyncio.sleep(0.6)                    # longer than Slack waits

    fake.event_ack_timeout = 0.3
    fake.echo_bot_messages = False
    fake.events_url = await served.start(bolt_handler(app))
    said = await fake.user_message(fake.dm, "slow please")
    delivery = await said.deliveries[0].wait(5)
    assert delivery.acked and [(a.retry_num, a.reason) for a in delivery.attempts] == [(0, "http_timeout"), (1, None)]
    event_id = delivery.event_id
    assert retries == [(None, None, event_id), ("1", "http_timeout", event_id)]

    # errors are retried up to 3 times, unless the app says X-Slack-No-Retry: 1
    statuses: list[int] = []

    async def failing(request: web.Request) -> web.Response:
        statuses.append(int(request.headers.get("X-Slack-Retry-Num", "0")))
        no_retry = {"X-Slack-No-Retry": "1"} if request.headers.get("X-Fake-Stop") else {}
        return web.Response(status=500, headers=no_retry)

    other = Served()
    url = await other.start(failing)
    try:
        gave_up = await fake.send_event({"type": "message", "text": "x", "channel": fake.dm, "ts": fake.next_ts()},
                                        url=url, wait=True)
        assert gave_up.gave_up and statuses == [0, 1, 2, 3]
        assert [a.headers.get("X-Slack-Retry-Reason") for a in gave_up.attempts] == [None] + ["http_error"] * 3
        status, _, _ = await fake.post_signed(url, {"type": "event_callback"}, headers={"X-Fake-Stop": "1"})
        assert status == 500
    finally:
        await other.stop()


# ---------------------------------------------------------------- Socket Mode
async def test_socket_mode_envelopes_acks_redelivery_and_reconnect(fake):
    web_client = AsyncWebClient(base_url=fake.api_url)
    sm = SocketModeClient(app_token=fake.app_token, web_client=web_client)
    received: list[SocketModeRequest] = []
    skip_first_ack = {"on": False}

    async def listener(client: SocketModeClient, req: SocketModeRequest) -> None:
        received.append(req)
        if skip_first_ack["on"] and req.retry_attempt == 0:
            return
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

    sm.socket_mode_request_listeners.append(listener)
    fake.echo_bot_messages = False
    try:
        await sm.connect()
        first = await fake.wait_for_socket(1)
        assert first.sent[0]["type"] == "hello"

        said = await fake.user_message(fake.dm, "over the socket")
        await said.deliveries[0].wait(3)
        assert said.deliveries[0].acked and received[0].type == "events_api"
        assert received[0].payload["event"]["text"] == "over the socket"
        assert (received[0].retry_attempt, received[0].retry_reason) == (0, "")
        assert [(a.envelope_id, a.event_id, a.late) for a in fake.acks] == \
            [(received[0].envelope_id, said.deliveries[0].event_id, False)]

        # no ack within the deadline: redelivered in a new envelope, retry_attempt 1, reason "timeout"
        fake.event_ack_timeout = 0.3
        skip_first_ack["on"] = True
        again = await fake.user_message(fake.dm, "ack me later")
        delivery = await again.deliveries[0].wait(3)
        assert delivery.acked and [a.reason for a in delivery.attempts] == ["timeout", None]
        assert [(r.retry_attempt, r.retry_reason) for r in received[1:]] == [(0, ""), (1, "timeout")]
        assert received[1].envelope_id != received[2].envelope_id
        assert received[1].payload["event_id"] == received[2].payload["event_id"]

        # Slack asks the client to reconnect: it opens a new URL and carries on there
        assert await fake.socket_disconnect("refresh_requested") == 1
        second = await fake.wait_for_socket(2)
        assert second is not first and len(fake.calls_to("apps.connections.open")) == 2
        await fake.wait_until(lambda: not first.is_open, 3, "the old connection to close")
        skip_first_ack["on"] = False
        after = await fake.user_message(fake.dm, "after reconnect")
        await after.deliveries[0].wait(3)
        assert after.deliveries[0].acked and second.sent[-1]["payload"]["event"]["text"] == "after reconnect"
    finally:
        await sm.close()


async def test_bolt_socket_mode_handler_gets_queued_events_and_user_files(fake):
    from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

    app = AsyncApp(client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url))

    @app.event("message")
    async def on_message(event, say, client):
        if event.get("subtype") == "file_share":
            url = event["files"][0]["url_private_download"]
            async with aiohttp.ClientSession() as http:
                async with http.get(url, headers={"Authorization": f"Bearer {client.token}"}) as resp:
                    data = await resp.read()
            await say(f"got {len(data)} bytes of {event['files'][0]['name']}")
        else:
            await say(f"echo: {event['text']}")

    # sent while no app is connected: Slack holds the envelope until a connection opens
    early = await fake.user_message(fake.dm, "anyone there?")
    assert early.deliveries[0].attempts == []
    handler = AsyncSocketModeHandler(app, fake.app_token)
    try:
        await handler.connect_async()
        [post] = await fake.wait_for_posts(fake.dm, 1)
        assert post.text == "echo: anyone there?"
        csv = fake.add_file(b"region,sales\nnorth,10\n", "sales.csv")
        await fake.user_message(fake.dm, "", files=[csv])
        posts = await fake.wait_for_posts(fake.dm, 2)
        assert posts[1].text == "got 22 bytes of sales.csv"
        # the bot's own replies came back as events, were acked, and bolt ignored them
        await fake.wait_until(lambda: all(d.done for d in fake.deliveries) and len(fake.deliveries) == 4)
        assert all(d.acked for d in fake.deliveries) and len(fake.posts(fake.dm)) == 2
    finally:
        await handler.close_async()
