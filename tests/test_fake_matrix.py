"""The fake homeserver behaves like one where a client can tell (so the provider's tests mean
something): auth, sync tokens and long polls, cut timelines and back-pagination, idempotent
sends, edits, authenticated media, rate limits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakes.matrix_server import SERVER, FakeMatrix, MatrixFailure

DM = f"!dm:{SERVER}"


@pytest.fixture
async def fake() -> AsyncIterator[FakeMatrix]:
    async with FakeMatrix() as f:
        f.add_room(DM, members=[f.alice, f.bot_id])
        yield f


@pytest.fixture
async def client(fake: FakeMatrix) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=fake.url,
                                     headers={"Authorization": f"Bearer {fake.token}"}) as s:
        yield s


async def call(s: aiohttp.ClientSession, method: str, path: str, **kw: Any
               ) -> tuple[int, dict[str, Any]]:
    async with s.request(method, f"/_matrix/{path}", **kw) as r:
        return r.status, await r.json(content_type=None)


async def test_tokens_are_checked(fake: FakeMatrix) -> None:
    async with aiohttp.ClientSession(base_url=fake.url) as s:
        assert (await call(s, "GET", "client/v3/account/whoami"))[1]["errcode"] == \
            "M_MISSING_TOKEN"
        status, body = await call(s, "GET", "client/v3/account/whoami",
                                  headers={"Authorization": "Bearer nope"})
        assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
        assert (await call(s, "GET", "client/versions"))[0] == 200


async def test_sync_resumes_from_its_token_and_long_polls(fake: FakeMatrix,
                                                          client: aiohttp.ClientSession) -> None:
    _, first = await call(client, "GET", "client/v3/sync")
    assert DM in first["rooms"]["join"]
    since = first["next_batch"]
    waiting = asyncio.create_task(call(client, "GET", "client/v3/sync",
                                       params={"since": since, "timeout": "5000"}))
    [held] = await fake.wait_until(lambda: [c for c in fake.calls if c.path == "client/v3/sync"
                                            and c.query.get("since") == since])
    assert held.status == 0 and not waiting.done()  # the server has it: nothing new yet, it waits
    event = fake.user_says(DM, "hello")
    _, second = await waiting
    [got] = second["rooms"]["join"][DM]["timeline"]["events"]
    assert got["event_id"] == event["event_id"] and got["content"]["body"] == "hello"
    _, third = await call(client, "GET", "client/v3/sync",
                          params={"since": second["next_batch"], "timeout": "0"})
    assert third["rooms"]["join"] == {}


async def test_a_cut_timeline_and_paging_back(fake: FakeMatrix,
                                              client: aiohttp.ClientSession) -> None:
    _, first = await call(client, "GET", "client/v3/sync")
    for i in range(15):
        fake.user_says(DM, f"m{i}")
    flt = json.dumps({"room": {"timeline": {"limit": 5}}})
    _, cut = await call(client, "GET", "client/v3/sync",
                        params={"since": first["next_batch"], "filter": flt})
    timeline = cut["rooms"]["join"][DM]["timeline"]
    assert timeline["limited"] and [e["content"]["body"] for e in timeline["events"]] == [
        f"m{i}" for i in range(10, 15)]
    _, page = await call(client, "GET", f"client/v3/rooms/{DM}/messages",
                         params={"dir": "b", "from": timeline["prev_batch"],
                                 "to": first["next_batch"], "limit": "100"})
    assert [e["content"]["body"] for e in page["chunk"]] == [f"m{i}" for i in range(9, -1, -1)]
    assert "end" not in page


async def test_sends_are_idempotent_and_edits_only_ones_own(fake: FakeMatrix,
                                                           client: aiohttp.ClientSession) -> None:
    body = {"msgtype": "m.text", "body": "hi"}
    _, a = await call(client, "PUT", f"client/v3/rooms/{DM}/send/m.room.message/t1", json=body)
    _, b = await call(client, "PUT", f"client/v3/rooms/{DM}/send/m.room.message/t1", json=body)
    assert a == b and len(fake.bot_messages(DM)) == 1
    theirs = fake.user_says(DM, "mine")
    edit = {"msgtype": "m.text", "body": "* x", "m.new_content": {"msgtype": "m.text", "body": "x"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": theirs["event_id"]}}
    status, err = await call(client, "PUT", f"client/v3/rooms/{DM}/send/m.room.message/t2",
                             json=edit)
    assert (status, err["errcode"]) == (403, "M_FORBIDDEN")
    edit["m.relates_to"]["event_id"] = a["event_id"]
    assert (await call(client, "PUT", f"client/v3/rooms/{DM}/send/m.room.message/t3",
                       json=edit))[0] == 200
    [original] = fake.bot_messages(DM)
    assert fake.current(original)["body"] == "x"


async def test_media_needs_the_token_and_rate_limits_say_how_long(
        fake: FakeMatrix, client: aiohttp.ClientSession) -> None:
    _, up = await call(client, "POST", "media/v3/upload", data=b"DATA",
                       params={"filename": "a.bin"}, headers={"Content-Type": "text/plain"})
    media = up["content_uri"].rsplit("/", 1)[-1]
    async with client.get(f"/_matrix/client/v1/media/download/{SERVER}/{media}") as r:
        assert await r.read() == b"DATA"
    async with aiohttp.ClientSession(base_url=fake.url) as anonymous:
        status, _ = await call(anonymous, "GET", f"client/v1/media/download/{SERVER}/{media}")
        assert status == 401
    fake.fail_next(MatrixFailure("M_LIMIT_EXCEEDED", "Too many", 429, retry_after_ms=1500))
    async with client.get("/_matrix/client/v3/account/whoami") as r:
        assert r.status == 429 and r.headers["Retry-After"] == "2"
        assert (await r.json())["retry_after_ms"] == 1500
