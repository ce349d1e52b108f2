"""The Slack provider against the fake Slack: what only Slack has (signed event posts, retries,
app_mention + message copies, threads, Socket Mode reconnects, its error codes)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.errors import ConfigError
from pluto.settings import ProviderConfig
from pluto.errors import ProviderError
from tests.helpers.gateway import permanent, provider_context

from pluto.types import Attachment, OutgoingMessage
from pluto.providers.slack import SlackProvider
from pluto.providers.slack.inbound import plain_text
from pluto.runtime.testing import ScriptedModel
from tests.conformance.slack_harness import (
    APP_TOKEN_ENV,
    BOT_TOKEN_ENV,
    SlackHarness,
    SlackHttpHarness,
    SlackSocketHarness,
)

MODES = {"http": SlackHttpHarness, "socket": SlackSocketHarness}


@pytest.fixture(params=sorted(MODES))
async def slack(request: pytest.FixtureRequest, config_dir: Path,
                data_dir: Path) -> AsyncIterator[SlackHarness]:
    h = MODES[request.param](config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def http(config_dir: Path, data_dir: Path) -> AsyncIterator[SlackHttpHarness]:
    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        await h.start()
        yield h
    finally:
        await h.close()


async def settled(h: SlackHarness) -> None:
    """Until Slack stopped delivering (every delivery acknowledged or given up)."""
    await h.fake.wait_until(lambda: all(d.done for d in h.fake.deliveries), 10, "deliveries")
    await h.settled()  # and anything they caused has happened (the gateway is idle)


# ---------------------------------------------------------------- redelivery


async def test_an_event_delivered_three_times_over_http_gets_one_reply(http) -> None:
    said = await http.user_says("only once please")
    await http.wait_texts(["echo: only once please"])
    payload = said.ref.deliveries[0].payload
    assert http.fake.events_url
    for retry in ("1", "2"):  # Slack's retries: the same event_id, X-Slack-Retry-Num
        status, _, _ = await http.fake.post_signed(http.fake.events_url, payload, headers={
            "X-Slack-Retry-Num": retry, "X-Slack-Retry-Reason": "http_timeout"})
        assert status == 200
    await settled(http)
    assert [s.text for s in http.shown()] == ["echo: only once please"]
    assert len(http.model.calls) == 1


async def test_an_envelope_redelivered_twice_in_socket_mode_gets_one_reply(
        config_dir: Path, data_dir: Path) -> None:
    h = SlackSocketHarness(config_dir=config_dir, data_dir=data_dir)
    h.fake.event_ack_timeout = 0  # Slack gives up waiting for each ack: it sends it again …
    h.fake.event_retry_delays = (0.0, 0.0)  # … twice
    await h.open()
    try:
        await h.start()
        said = await h.user_says("socket once")
        delivery = await said.ref.deliveries[0].wait(10)
        assert [a.retry_num for a in delivery.attempts] == [0, 1, 2]
        await h.fake.wait_until(lambda: len([a for a in h.fake.acks
                                             if a.event_id == delivery.event_id]) == 3)
        await h.wait_texts(["echo: socket once"])
        await settled(h)  # every envelope reached the app, which acknowledged it (late)
        assert [s.text for s in h.shown()] == ["echo: socket once"]
        assert len(h.model.calls) == 1
    finally:
        await h.close()


async def test_a_redelivery_after_a_restart_gets_no_second_reply(slack) -> None:
    await slack.start()
    said = await slack.user_says("before the restart")
    await slack.wait_texts(["echo: before the restart"])
    await slack.restart()  # a new provider: its memory of recent messages is gone
    await slack.redeliver(said)
    await slack.user_says("after")
    await slack.wait_texts(["echo: before the restart", "echo: after"])
    await settled(slack)
    assert len(slack.model.calls) == 2


async def test_a_mention_arrives_twice_and_gets_one_reply_in_a_thread(slack) -> None:
    await slack.start()
    said = await slack.user_says("how are sales?", chat=slack.group_chat, mention=True)
    assert sorted(e["type"] for e in said.ref.events) == ["app_mention", "message"]
    await slack.wait_texts(["echo: how are sales?"], chat=slack.group_chat)
    await settled(slack)
    [post] = slack.fake.posts(slack.group_chat)
    assert post.thread_ts == said.ref.ts
    assert [s.text for s in slack.shown(slack.group_chat)] == ["echo: how are sales?"]
    assert all(d.acked for d in said.ref.deliveries) and len(slack.model.calls) == 1
    [msg] = slack.received
    assert (msg.is_direct, msg.mentions_bot, msg.guild_id) == (False, True, "T0PLUTOTEAM")
    assert msg.thread_id == said.ref.ts and msg.text == "how are sales?"


async def test_the_bots_own_messages_are_ignored(slack) -> None:
    await slack.start()
    await slack.user_says("hi")
    await slack.wait_texts(["echo: hi"])
    await settled(slack)
    echoed = [d for d in slack.fake.deliveries if d.event.get("bot_id") == slack.fake.bot_id]
    assert echoed and all(d.acked for d in echoed)  # Slack sent the bot its own message
    assert len(slack.fake.posts()) == 1 and len(slack.model.calls) == 1


# ---------------------------------------------------------------- threads


async def test_threads_the_bot_is_in_are_followed_even_after_a_restart(slack) -> None:
    await slack.start()
    group = slack.group_chat
    mention = await slack.user_says("first", chat=group, mention=True)
    await slack.wait_texts(["echo: first"], chat=group)
    other = await slack.fake.user_message(group, "a thread without the bot")
    await slack.fake.user_message(group, "chat in it", thread_ts=other.ts)
    await slack.fake.wait_for_calls("conversations.replies", 1)  # is the bot in it? no
    await settled(slack)
    await slack.restart()
    slack.fake.rate_limit_next("conversations.replies", retry_after=1)  # waited out
    await slack.fake.user_message(group, "and then?", thread_ts=mention.ref.ts)
    await slack.wait_texts(["echo: first", "echo: and then?"], chat=group)
    await settled(slack)
    assert [p.thread_ts for p in slack.fake.posts(group)] == [mention.ref.ts] * 2
    assert [m.text for m in slack.received] == ["first", "and then?"]
    assert [c.status for c in slack.fake.calls_to("conversations.replies")] == [200, 429, 200]


async def test_every_channel_message_can_go_to_the_routing_table(
        config_dir: Path, data_dir: Path) -> None:
    h = SlackSocketHarness(config_dir=config_dir, data_dir=data_dir)
    h.provider_config = lambda: {  # type: ignore[method-assign]
        **SlackSocketHarness.provider_config(h), "channel_messages": "all",
        "reply_in_thread": False}
    await h.open()
    try:
        await h.start()
        await h.user_says("no mention here", chat=h.group_chat)
        await h.wait_texts(["echo: no mention here"], chat=h.group_chat)
        [post] = h.fake.posts(h.group_chat)
        assert post.thread_ts is None  # answered in the channel itself
        [msg] = h.received
        assert (msg.is_direct, msg.mentions_bot, msg.thread_id) == (False, False, None)
    finally:
        await h.close()


# ---------------------------------------------------------------- HTTP endpoint


async def test_forged_stale_and_malformed_posts_are_refused(http) -> None:
    url = http.fake.events_url
    assert url and await http.fake.verify_url()
    assert await http.fake.send_bad_signature(url) == 401
    assert await http.fake.send_stale(url) == 401
    event = {"type": "message", "channel": http.direct_chat, "user": http.fake.default_user,
             "text": "sneaky", "ts": http.fake.next_ts(), "channel_type": "im"}
    payload = json.dumps(http.fake.event_callback(event))
    assert (await http.fake.post_signed(url, payload, signature="v0=deadbeef"))[0] == 401
    assert (await http.fake.post_signed(url, payload, secret="not-the-secret"))[0] == 401
    status, _, text = await http.fake.post_signed(url, "{not json")
    assert status == 400 and "Traceback" not in text
    assert (await http.fake.post_signed(url, "[1, 2]"))[0] == 400
    assert (await http.fake.post_signed(url, "x" * (1024 * 1024 + 10)))[0] == 413
    await http.settled()  # whatever the posts could have caused has happened
    assert http.received == [] and http.model.calls == [] and http.fake.posts() == []


async def test_events_before_the_provider_runs_are_refused_for_slack_to_retry(
        config_dir: Path, data_dir: Path) -> None:
    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        await h.start()
        assert h.gateway is not None
        provider = h.gateway.providers["slack"]
        assert isinstance(provider, SlackProvider)
        provider._intake = None  # noqa: SLF001 - as while it (re)connects
        said = await h.fake.user_message(h.direct_chat, "too early")
        delivery = await said.deliveries[0].wait(10)
        assert delivery.gave_up and {a.status for a in delivery.attempts} == {503}
        assert await h.fake.verify_url()  # url_verification is answered all the same
    finally:
        await h.close()


# ---------------------------------------------------------------- Socket Mode


async def test_socket_mode_reconnects_when_slack_asks_and_keeps_working(
        config_dir: Path, data_dir: Path) -> None:
    h = SlackSocketHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        await h.start()
        first = h.fake.open_sockets[0]
        await h.user_says("before")
        await h.wait_texts(["echo: before"])
        assert await h.fake.socket_disconnect("refresh_requested") == 1
        await h.fake.wait_for_socket(2)
        await h.fake.wait_until(lambda: not first.is_open, 5, "the old connection to close")
        await h.user_says("after")
        await h.wait_texts(["echo: before", "echo: after"])
        assert len(h.fake.calls_to("apps.connections.open")) == 2
        assert await h.fake.socket_close() == 1  # dropped without a word: it comes back too
        await h.fake.wait_for_socket(3)
        await h.user_says("again")
        await h.wait_texts(["echo: before", "echo: after", "echo: again"])
    finally:
        await h.close()


# ---------------------------------------------------------------- files


async def test_a_file_too_large_is_refused_in_one_sentence(slack) -> None:
    await slack.start()
    big = slack.fake.add_file(b"x" * 2048, "big.csv")
    big["size"] = 80 * 1024 * 1024  # what Slack says it is
    await slack.fake.user_message(slack.direct_chat, "look", files=[big])
    shown = await slack.wait_shown(lambda s: len(s) >= 2, what="the refusal and the answer")
    assert shown[0].text == "The file big.csv is too large for me to read (the limit is 50 MB)."
    assert slack.received[0].attachments == ()


async def test_a_chart_goes_into_the_thread_it_answers(slack, tmp_path: Path) -> None:
    await slack.start()
    provider = slack.gateway.providers["slack"]  # type: ignore[union-attr]
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG fake")
    thread = slack.fake.next_ts()
    await provider.send(OutgoingMessage(chat_id=slack.group_chat, thread_id=thread,
                                        text="the *chart*", markup="slack_mrkdwn",
                                        attachments=(Attachment(filename="chart.png", path=chart,
                                                                kind="image"),)))
    [upload] = slack.fake.uploads
    assert (upload.channel, upload.thread_ts, upload.data) == (slack.group_chat, thread,
                                                              b"\x89PNG fake")
    assert upload.initial_comment == "the *chart*"


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("code", ["channel_not_found", "not_in_channel", "is_archived",
                                  "invalid_auth"])
async def test_permanent_errors(http, code: str) -> None:
    provider = http.gateway.providers["slack"]  # type: ignore[union-attr]
    http.fake.fail_next("chat.postMessage", code)
    with pytest.raises(ProviderError) as refused:
        await provider.send(OutgoingMessage(chat_id=http.direct_chat, text="x"))
    assert permanent(refused.value) and code in str(refused.value)
    assert "\n" not in str(refused.value)


async def test_a_rate_limit_carries_slacks_retry_after(http) -> None:
    provider = http.gateway.providers["slack"]  # type: ignore[union-attr]
    http.fake.rate_limit_next("chat.update", retry_after=7)
    with pytest.raises(ProviderError) as limited:
        await provider.edit(OutgoingMessage(chat_id=http.direct_chat, text="x", edit_of="1.2"))
    assert limited.value.retry_after == 7 and not permanent(limited.value)
    http.fake.fail_next("chat.postMessage", "internal_error")
    with pytest.raises(ProviderError) as transient:
        await provider.send(OutgoingMessage(chat_id=http.direct_chat, text="x"))
    assert not permanent(transient.value) and transient.value.retry_after is None


async def test_a_rejected_token_is_reported_without_secrets(config_dir, data_dir, caplog,
                                                            monkeypatch) -> None:
    caplog.set_level(logging.DEBUG)
    h = SlackSocketHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        monkeypatch.setenv(BOT_TOKEN_ENV, "xoxb-wrong-token-123456")
        ctx = provider_context(ProviderConfig(**h.provider_config()), data_dir, None)
        provider = SlackProvider.from_context(ctx)
        with pytest.raises(ProviderError) as refused:
            await asyncio.wait_for(provider.run(lambda m: asyncio.sleep(0)), 10)
        assert permanent(refused.value) and BOT_TOKEN_ENV in str(refused.value)
        await provider.close()
    finally:
        await h.close()
    assert "xoxb-wrong-token-123456" not in caplog.text


async def test_secrets_never_reach_the_logs(slack, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    await slack.start()
    csv = slack.fake.add_file(b"city,people\nOslo,700000\n", "cities.csv")
    await slack.fake.user_message(slack.direct_chat, "read this", files=[csv])
    await slack.user_says("hello", chat=slack.group_chat, mention=True)
    await slack.wait_shown(lambda s: len(s) == 1, chat=slack.group_chat, what="the answer")
    await slack.wait_shown(lambda s: any("read this" in m.text for m in s), what="the answer")
    await settled(slack)
    assert caplog.records
    for secret in slack.secrets().values():
        assert secret not in caplog.text


# ---------------------------------------------------------------- configuration and text


def test_configuration_mistakes_name_the_field(data_dir: Path, monkeypatch) -> None:
    def build(**cfg: object) -> None:
        SlackProvider.from_context(provider_context(ProviderConfig(enabled=True, **cfg),
                                                   data_dir, None))

    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="SLACK_BOT_TOKEN"):
        build(mode="socket")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.delenv("SLACK_APP_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="SLACK_APP_TOKEN"):
        build(mode="socket")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s3cret")
    with pytest.raises(ConfigError, match="HTTP server"):
        build(mode="http")
    with pytest.raises(ConfigError, match=r"providers\.slack\.mode"):
        build(mode="carrier-pigeon")
    with pytest.raises(ConfigError, match=r"providers\.slack\.api_base"):
        build(mode="socket", api_base="ftp://x")


def test_slack_text_reads_as_a_person_wrote_it() -> None:
    bot = "U0BOT"
    assert plain_text("<@U0BOT> what is 1 &lt; 2 &amp;&amp; 3 &gt; 2?", bot) == \
        "what is 1 < 2 && 3 > 2?"
    assert plain_text("<@U0BOT>: ask <@U123|bob> in <#C1|general>", bot) == \
        "ask @bob in #general"
    assert plain_text("see <https://x.io/a|the docs> or <https://y.io> <!here>", bot) == \
        "see the docs (https://x.io/a) or https://y.io @here"
    assert plain_text("mail <mailto:a@b.c|a@b.c>", bot) == "mail a@b.c"


async def test_the_event_is_acknowledged_before_the_work_is_done(
        config_dir: Path, data_dir: Path) -> None:
    release = asyncio.Event()

    class Waiting(ScriptedModel):
        async def stream(self, messages, tools, settings):  # type: ignore[no-untyped-def]
            await release.wait()
            async for part in super().stream(messages, tools, settings):
                yield part

    h = SlackHttpHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        await h.start(Waiting())
        said = await h.user_says("take your time")
        delivery = await said.ref.deliveries[0].wait(10)  # acknowledged, the model still busy
        assert delivery.acked and [a.retry_num for a in delivery.attempts] == [0]
        assert h.shown() == []
        release.set()
        await h.wait_texts(["echo: take your time"])
    finally:
        await h.close()


async def test_a_rejected_app_token_stops_socket_mode_in_one_sentence(
        config_dir: Path, data_dir: Path, caplog, monkeypatch) -> None:
    caplog.set_level(logging.DEBUG)
    h = SlackSocketHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        monkeypatch.setenv(APP_TOKEN_ENV, "xapp-wrong-token-123456")
        ctx = provider_context(ProviderConfig(**h.provider_config()), data_dir, None)
        provider = SlackProvider.from_context(ctx)
        with pytest.raises(ProviderError) as refused:
            await asyncio.wait_for(provider.run(lambda m: asyncio.sleep(0)), 10)
        assert permanent(refused.value) and APP_TOKEN_ENV in str(refused.value)
        await provider.close()
    finally:
        await h.close()
    assert "xapp-wrong-token-123456" not in caplog.text and "Traceback" not in caplog.text


def test_a_secret_logged_by_the_sdk_is_masked(data_dir: Path, monkeypatch, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-a-very-secret-token")
    monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-a-very-secret-token")
    config = ProviderConfig.model_validate({"enabled": True, "mode": "socket"})
    SlackProvider.from_context(provider_context(config, data_dir, None))
    for name in ("slack_sdk.web.async_base_client", "pluto.providers.slack.bolt",
                 "pluto.providers.slack.socket_mode.sdk"):
        logging.getLogger(name).debug("calling with %s and %s", "xoxb-a-very-secret-token",
                                      "xapp-a-very-secret-token")
    assert caplog.text.count("<secret>") == 6 and "very-secret" not in caplog.text
    assert "WARNING" not in caplog.text  # bolt's notice that it ignores SLACK_BOT_TOKEN
