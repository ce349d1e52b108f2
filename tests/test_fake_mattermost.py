"""The fake Mattermost behaves like the server where a client can tell (so the provider's tests
mean something): tokens, the WebSocket login, hello and ``seq``, events sent once, ``since``
catch-up, posts, threads, edits by the author only, files, the message limit, 429 windows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakes.mattermost_server import FakeMattermost

API = "/api/v4"


@pytest.fixture
async def fake() -> AsyncIterator[FakeMattermost]:
    async with FakeMattermost() as f:
        yield f


@pytest.fixture
async def client(fake: FakeMattermost) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=fake.url,
                                     headers={"Authorization": f"Bearer {fake.token}"}) as s:
        yield s


async def call(s: aiohttp.ClientSession, method: str, path: str, **kw: Any
               ) -> tuple[int, Any, Any]:
    async with s.request(method, f"{API}{path}", **kw) as r:
        text = await r.text()
        try:
            body = json.loads(text)
        except ValueError:
            body = text
        return r.status, body, r.headers


async def login(s: aiohttp.ClientSession, token: str) -> aiohttp.ClientWebSocketResponse:
    ws = await s.ws_connect(f"{API}/websocket", headers={"Authorization": ""})
    await ws.send_json({"seq": 1, "action": "authentication_challenge",
                        "data": {"token": token}})
    return ws


async def test_a_token_is_required(fake: FakeMattermost) -> None:
    async with aiohttp.ClientSession(base_url=fake.url) as s:
        status, body, _ = await call(s, "GET", "/users/me")
        assert (status, body["id"]) == (401, "api.context.session_expired.app_error")
        status, _, _ = await call(s, "GET", "/users/me",
                                  headers={"Authorization": "Bearer nope"})
        assert status == 401
        ws = await login(s, "nope")
        reply = await ws.receive_json()
        assert reply["status"] == "FAIL" and reply["seq_reply"] == 1
        assert (await ws.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert not fake.sockets


async def test_the_socket_says_hello_then_events_with_a_growing_seq(
        fake: FakeMattermost, client: aiohttp.ClientSession) -> None:
    dm = fake.add_direct(fake.alice)
    ws = await login(client, fake.token)
    assert (await ws.receive_json())["status"] == "OK"
    hello = await ws.receive_json()
    assert (hello["event"], hello["seq"]) == ("hello", 0)
    post = await fake.user_says(dm, "hi")
    event = await ws.receive_json()
    assert (event["event"], event["seq"], event["data"]["channel_type"]) == ("posted", 1, "D")
    assert json.loads(event["data"]["post"])["id"] == post["id"]  # the post is a JSON string
    await ws.send_json({"seq": 2, "action": "user_typing", "data": {"channel_id": dm}})
    assert (await ws.receive_json())["seq_reply"] == 2
    assert fake.typing == [(dm, "")]
    await ws.close()


async def test_an_event_is_sent_once_and_missed_posts_come_by_since(
        fake: FakeMattermost, client: aiohttp.ClientSession) -> None:
    dm = fake.add_direct(fake.alice)
    first = await fake.user_says(dm, "before")
    ws = await login(client, fake.token)
    await ws.receive_json(), await ws.receive_json()  # OK, hello
    await fake.disconnect()
    missed = await fake.user_says(dm, "while away")  # no socket: nothing keeps it
    ws = await login(client, fake.token)
    await ws.receive_json()
    assert (await ws.receive_json())["event"] == "hello"  # and no replay after it
    _, page, _ = await call(client, "GET", f"/channels/{dm}/posts",
                            params={"since": str(first["create_at"])})
    assert page["order"] == [missed["id"]]
    fake.touch(first["id"])  # a reaction changes the old post: since returns it again
    _, page, _ = await call(client, "GET", f"/channels/{dm}/posts",
                            params={"since": str(first["create_at"])})
    assert set(page["order"]) == {first["id"], missed["id"]}
    await ws.close()


async def test_posts_threads_edits_and_deletes(fake: FakeMattermost,
                                               client: aiohttp.ClientSession) -> None:
    town = fake.add_channel("town", [fake.alice, fake.bot])
    root = await fake.user_says(town, "a question")
    status, post, _ = await call(client, "POST", "/posts", json={
        "channel_id": town, "message": "an answer", "root_id": root["id"]})
    assert status == 201 and post["root_id"] == root["id"]
    status, body, _ = await call(client, "POST", "/posts", json={
        "channel_id": town, "message": "x", "root_id": post["id"]})  # a reply to a reply
    assert (status, body["id"]) == (400, "api.post.create_post.root_id.app_error")
    status, _, _ = await call(client, "POST", "/posts", json={"channel_id": town,
                                                             "message": "x" * 16384})
    assert status == 400
    assert (await call(client, "PUT", f"/posts/{post['id']}/patch",
                       json={"message": "better"}))[0] == 200
    assert fake.posts[post["id"]]["message"] == "better" and fake.edits[post["id"]] == ["better"]
    assert (await call(client, "PUT", f"/posts/{root['id']}/patch",
                       json={"message": "mine now"}))[0] == 403  # the author only
    assert (await call(client, "DELETE", f"/posts/{post['id']}"))[0] == 200
    assert (await call(client, "GET", f"/posts/{post['id']}"))[0] == 404
    other = fake.add_channel("secret", [fake.alice], kind="P")
    assert (await call(client, "POST", "/posts", json={"channel_id": other,
                                                      "message": "hi"}))[0] == 403


async def test_files_are_uploaded_then_attached_once(fake: FakeMattermost,
                                                     client: aiohttp.ClientSession) -> None:
    dm = fake.add_direct(fake.alice)
    form = aiohttp.FormData()
    form.add_field("channel_id", dm)
    form.add_field("files", b"a,b\n1,2\n", filename="t.csv", content_type="text/csv")
    status, body, _ = await call(client, "POST", "/files", data=form)
    [info] = body["file_infos"]
    assert status == 201 and info["size"] == 8
    status, post, _ = await call(client, "POST", "/posts", json={
        "channel_id": dm, "message": "", "file_ids": [info["id"]]})
    assert status == 201
    status, _, _ = await call(client, "POST", "/posts", json={
        "channel_id": dm, "message": "again", "file_ids": [info["id"]]})
    assert status == 400  # a file is attached to one post
    async with client.get(f"{API}/files/{info['id']}") as r:
        assert await r.read() == b"a,b\n1,2\n"


async def test_a_rate_limit_window_answers_429_with_the_seconds_left(
        fake: FakeMattermost, client: aiohttp.ClientSession) -> None:
    dm = fake.add_direct(fake.alice)
    fake.throttle(3, when=lambda c: c.path == "posts")
    status, body, headers = await call(client, "POST", "/posts", json={"channel_id": dm,
                                                                      "message": "hi"})
    assert status == 429 and body.startswith("limit exceeded")
    assert headers["X-Ratelimit-Reset"] == "3" and headers["X-Ratelimit-Remaining"] == "0"
    assert (await call(client, "GET", "/users/me"))[0] == 200  # only what the window covers
    assert len(fake.refused) == 1
