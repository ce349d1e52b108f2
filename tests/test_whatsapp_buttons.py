"""WhatsApp's approval buttons against the fake Cloud API: interactive reply buttons within
WhatsApp's limits, taps in signed webhooks (a forged one refused), a redelivered tap one
decision, a refused tap answered in the person's own chat."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pluto.providers.whatsapp import WhatsAppProvider
from pluto.providers.whatsapp.errors import GraphError
from pluto.settings import ProviderConfig
from pluto.types import Button, OutgoingMessage
from tests.conformance.test_scenarios import approving, request_shown
from tests.conformance.whatsapp_harness import WhatsAppHarness
from tests.fakes.whatsapp_server import sign
from tests.helpers.gateway import provider_context


@pytest.fixture
async def wa(config_dir: Path, data_dir: Path) -> AsyncIterator[WhatsAppHarness]:
    h = WhatsAppHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def asked(h: WhatsAppHarness, *answers: str) -> tuple[Any, Any]:
    deleter = await approving(h, *answers)
    await h.user_says("delete the old log")
    shown = await h.wait_shown(lambda s: (r := request_shown(s)) is not None and
                               r.buttons == ("Approve", "Deny"), what="the request")
    return deleter, request_shown(shown)


def clicks(h: WhatsAppHarness) -> list[str]:
    return [m.text for m in h.received if m.message_id.startswith("click:")]


def tap_payload(h: WhatsAppHarness, message_id: str, button_id: str) -> dict[str, Any]:
    msg = {"from": h.direct_chat, "id": h.fake.wamid(), "timestamp": "1700000000",
           "context": {"from": "15550000000", "id": message_id}, "type": "interactive",
           "interactive": {"type": "button_reply",
                           "button_reply": {"id": button_id, "title": "Approve"}}}
    return h.fake._envelope({"contacts": [{"profile": {"name": "Alice"},  # noqa: SLF001
                                           "wa_id": h.direct_chat}], "messages": [msg]})


async def post(h: WhatsAppHarness, body: bytes, signature: str | None) -> int:
    assert h.fake.webhook_url
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    async with aiohttp.ClientSession() as session, \
            session.post(h.fake.webhook_url, data=body, headers=headers) as r:
        return r.status


async def test_forged_and_foreign_taps_hand_nothing_over(wa: WhatsAppHarness) -> None:
    deleter, ask = await asked(wa, "Deleted.")
    [(_, approve)] = [(t, i) for t, i in _buttons(wa, ask.id) if t == "Approve"]
    body = json.dumps(tap_payload(wa, ask.id, approve)).encode()
    assert await post(wa, body, None) == 401
    assert await post(wa, body, "sha256=" + "0" * 64) == 401
    assert await post(wa, body, sign("not the app secret", body)) == 401
    for foreign in ("rm -rf /", "/approve ../../x", "/deny abc def"):
        signed = json.dumps(tap_payload(wa, ask.id, foreign)).encode()
        assert await post(wa, signed, sign(wa.fake.app_secret, signed)) == 200
    await wa.settled()
    assert clicks(wa) == [] and deleter.calls == []


async def test_a_redelivered_tap_is_one_decision(wa: WhatsAppHarness) -> None:
    deleter, ask = await asked(wa, "Deleted.")
    [approve] = [i for t, i in _buttons(wa, ask.id) if t == "Approve"]
    said = await wa.fake.user_clicks(wa.direct_chat, ask.id, approve)
    await wa.wait_shown(lambda s: any(m.text == "Deleted." for m in s), what="the answer")
    await wa.fake.redeliver(said)  # Meta posts the same webhook again
    await wa.fake.post_webhook(copy.deepcopy(said.delivery.payload))
    await wa.settled()
    assert deleter.calls == ["/srv/old.log"]
    assert [m.text for m in wa.shown()].count("Deleted.") == 1
    assert len(set(clicks(wa))) == 1


async def test_a_refused_tap_is_answered_in_the_persons_chat(wa: WhatsAppHarness) -> None:
    deleter, ask = await asked(wa, "Understood.")
    await wa.click(ask, "Deny")
    await wa.wait_shown(lambda s: any(m.text == "Understood." for m in s), what="the answer")
    before = len(clicks(wa))
    await wa.click(ask, "Approve")  # decided already: refused before it is handed over
    shown = await wa.wait_shown(lambda s: "denied" in s[-1].text and "request" in s[-1].text,
                                what="the refusal")
    await wa.settled()
    assert len(clicks(wa)) == before and deleter.calls == []
    assert shown[-1].buttons == ()


async def test_long_text_and_labels_within_whatsapps_limits(wa: WhatsAppHarness) -> None:
    await wa.start()
    assert wa.gateway is not None
    provider = wa.gateway.providers["whatsapp"]
    await wa.user_says("hi")  # the 24-hour window is open
    await wa.settled()
    before = len(wa.fake.messages_to(wa.direct_chat))
    text = "word " * 400  # 2,000 characters: more than an interactive body takes
    labels = ("Approve this request now", "Deny", "Later", "Never")
    await provider.send(OutgoingMessage(chat_id=wa.direct_chat, text=text, buttons=tuple(
        Button(label, f"/approve abcdef{i + 2}") for i, label in enumerate(labels))))
    sent = wa.fake.messages_to(wa.direct_chat)[before:]
    assert [s.type for s in sent] == ["text", "interactive"]
    assert sent[0].text == text and len(sent[1].text) <= 1024
    buttons = sent[1].payload["interactive"]["action"]["buttons"]
    assert len(buttons) == 3 and all(len(b["reply"]["title"]) <= 20 for b in buttons)
    assert [b["reply"]["id"] for b in buttons] == ["/approve abcdef2", "/approve abcdef3",
                                                   "/approve abcdef4"]
    short = "Delete /srv/old.log?"
    await provider.send(OutgoingMessage(chat_id=wa.direct_chat, text=short,
                                        buttons=(Button("Approve", "/approve abcdefgh"),)))
    assert wa.fake.messages_to(wa.direct_chat)[-1].text == short


async def test_the_fake_refuses_what_the_cloud_api_refuses(wa: WhatsAppHarness) -> None:
    await wa.start()
    assert wa.gateway is not None
    api = wa.gateway.providers["whatsapp"].api  # type: ignore[attr-defined]
    four = [{"title": f"b{i}", "id": f"b{i}"} for i in range(4)]
    for replies, detail in [([{"title": "x" * 21, "id": "a"}], "Button title length invalid"),
                            ([{"title": "ok", "id": "a" * 257}], "Button id length invalid"),
                            (four, "Buttons count invalid")]:
        content = {"type": "button", "body": {"text": "Pick"}, "action": {"buttons": [
            {"type": "reply", "reply": r} for r in replies]}}
        with pytest.raises(GraphError) as caught:
            await api.message(wa.direct_chat, "interactive", content)
        assert (caught.value.status, caught.value.code) == (400, 131009)
        assert detail in caught.value.details


def _buttons(h: WhatsAppHarness, message_id: str) -> list[tuple[str, str]]:
    sent = next(s for s in h.fake.messages_to(h.direct_chat) if s.id == message_id)
    return [(b["reply"]["title"], b["reply"]["id"])
            for b in sent.payload["interactive"]["action"]["buttons"]]


async def test_outside_the_window_the_template_carries_the_commands(wa: WhatsAppHarness) -> None:
    """A request for a person whose 24-hour window closed goes out as the window template,
    which has no buttons: the commands to reply with are written first (kept when cut)."""
    config = {**wa.provider_config(), "window_template": {"name": "pluto_update",
                                                          "language": "en"}}
    provider = WhatsAppProvider.from_context(
        provider_context(ProviderConfig(**config), wa.data_dir, web.Application()))
    try:
        provider._last_in[wa.direct_chat] = (0.0, "wamid.old")  # noqa: SLF001 - window closed
        await provider.send(OutgoingMessage(chat_id=wa.direct_chat, text="Delete it? " * 200,
                                            buttons=(Button("Approve", "/approve abcdefgh"),
                                                     Button("Deny", "/deny abcdefgh"))))
    finally:
        await provider.close()
    [sent] = wa.fake.messages_to(wa.direct_chat)
    assert sent.type == "template"
    assert sent.text.startswith("Reply /approve abcdefgh or /deny abcdefgh: Delete it?")
