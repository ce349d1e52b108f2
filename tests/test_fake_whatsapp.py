"""The fake WhatsApp Cloud API behaves like the platform where an app can tell (so the
provider's tests mean something): auth, limits, media, signed webhooks and their retries."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.fakes.whatsapp_server import FakeWhatsApp, sign

ALICE = "4915100000001"


@pytest.fixture
async def fake() -> AsyncIterator[FakeWhatsApp]:
    async with FakeWhatsApp(retry_delays=(0.05, 0.05)) as f:
        yield f


@pytest.fixture
async def client(fake: FakeWhatsApp) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {fake.token}"}) as s:
        yield s


class Receiver:
    """A webhook endpoint that answers with the statuses it is given, and keeps what came."""

    def __init__(self, *answers: int):
        self.answers = list(answers)
        self.got: list[tuple[bytes, dict[str, str]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append((await request.read(), dict(request.headers)))
        return web.Response(status=self.answers.pop(0) if self.answers else 200)


@pytest.fixture
async def receiver(fake: FakeWhatsApp) -> AsyncIterator[Receiver]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/hook", r.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.webhook_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]
    yield r
    await runner.cleanup()


async def post(client: aiohttp.ClientSession, fake: FakeWhatsApp, payload: dict[str, Any],
               ) -> tuple[int, dict[str, Any]]:
    async with client.post(f"{fake.url}/v21.0/{fake.phone_number_id}/messages",
                           json=payload) as r:
        return r.status, await r.json()


def text(to: str, body: str) -> dict[str, Any]:
    return {"messaging_product": "whatsapp", "to": to, "type": "text", "text": {"body": body}}


async def test_a_wrong_token_is_error_190(fake: FakeWhatsApp) -> None:
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer nope"}) as s:
        status, body = await post(s, fake, text(ALICE, "hi"))
    assert status == 401 and body["error"]["code"] == 190
    assert fake.sent == []


async def test_text_is_sent_within_its_limit(fake: FakeWhatsApp,
                                             client: aiohttp.ClientSession) -> None:
    fake.age_window(ALICE, 60)
    status, body = await post(client, fake, text(ALICE, "x" * 4096))
    assert status == 200 and body["messages"][0]["id"].startswith("wamid.")
    assert body["contacts"] == [{"input": ALICE, "wa_id": ALICE}]
    status, body = await post(client, fake, text(ALICE, "x" * 4097))
    assert status == 400 and body["error"]["code"] == 100
    status, body = await post(client, fake, text("not-a-number", "hi"))
    assert status == 400
    assert len(fake.sent) == 1


async def test_a_scripted_failure_is_answered_once(fake: FakeWhatsApp,
                                                   client: aiohttp.ClientSession) -> None:
    fake.fail_next(131056)
    status, body = await post(client, fake, text(ALICE, "hi"))
    assert status == 400 and body["error"]["code"] == 131056
    assert "pair rate limit" in body["error"]["message"]
    assert (await post(client, fake, text(ALICE, "hi")))[0] == 200


async def test_media_round_trip_needs_the_token(fake: FakeWhatsApp,
                                                client: aiohttp.ClientSession) -> None:
    form = aiohttp.FormData()
    form.add_field("messaging_product", "whatsapp")
    form.add_field("type", "image/png")
    form.add_field("file", b"PNGDATA", filename="c.png", content_type="image/png")
    async with client.post(f"{fake.url}/v21.0/{fake.phone_number_id}/media", data=form) as r:
        media_id = (await r.json())["id"]
    async with client.get(f"{fake.url}/v21.0/{media_id}") as r:
        meta = await r.json()
    assert meta["sha256"] == hashlib.sha256(b"PNGDATA").hexdigest() and meta["file_size"] == 7
    async with client.get(meta["url"]) as r:
        assert await r.read() == b"PNGDATA"
    async with aiohttp.ClientSession() as anonymous, anonymous.get(meta["url"]) as r:
        assert r.status == 401
    status, body = await post(client, fake, {"messaging_product": "whatsapp", "to": ALICE,
                                             "type": "image", "image": {"id": "404"}})
    assert status == 400 and body["error"]["code"] == 131053


async def test_webhooks_are_signed_and_retried_until_200(fake: FakeWhatsApp,
                                                         receiver: Receiver) -> None:
    receiver.answers = [500, 503]
    said = await fake.user_says(ALICE, "hello")
    await said.delivery.done.wait()
    assert said.delivery.statuses == [500, 503, 200]
    bodies = {body for body, _ in receiver.got}
    assert len(bodies) == 1  # the same payload each time
    body, headers = receiver.got[0]
    assert headers["X-Hub-Signature-256"] == sign(fake.app_secret, body)
    assert headers["X-Hub-Signature"] == "sha1=" + hmac.new(
        fake.app_secret.encode(), body, hashlib.sha1).hexdigest()
    [msg] = json.loads(body)["entry"][0]["changes"][0]["value"]["messages"]
    assert msg == {"from": ALICE, "id": said.id, "timestamp": msg["timestamp"], "type": "text",
                   "text": {"body": "hello"}}


async def test_outside_24_hours_a_message_fails_by_status_webhook(
        fake: FakeWhatsApp, client: aiohttp.ClientSession, receiver: Receiver) -> None:
    fake.age_window(ALICE, 25 * 3600)
    status, body = await post(client, fake, text(ALICE, "late"))
    assert status == 200  # accepted, then reported failed
    await fake.wait_until(lambda: len(receiver.got) == 1, 5, "the status webhook")
    [st] = json.loads(receiver.got[0][0])["entry"][0]["changes"][0]["value"]["statuses"]
    assert st["status"] == "failed" and st["errors"][0]["code"] == 131047
    assert st["id"] == body["messages"][0]["id"]


async def test_read_receipts_need_a_message_the_user_sent(
        fake: FakeWhatsApp, client: aiohttp.ClientSession, receiver: Receiver) -> None:
    said = await fake.user_says(ALICE, "hello")
    read = {"messaging_product": "whatsapp", "status": "read", "message_id": said.id,
            "typing_indicator": {"type": "text"}}
    assert (await post(client, fake, read))[0] == 200
    assert (await post(client, fake, {**read, "message_id": "wamid.unknown"}))[0] == 400
    assert fake.reads == [(said.id, True)]
