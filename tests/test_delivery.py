"""Delivery: from a run's events to what a provider sends, by its declared capabilities —
rendering and splitting, streaming by edits (throttled), typing, images, the live path."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

import pluto.gateway.delivery.delivery as delivery_module
import pluto.gateway.delivery.streaming as streaming_module
from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.gateway.delivery.delivery import Delivery
from pluto.gateway.delivery.outbox import Outbox
from pluto.gateway.ports import Provider
from pluto.errors import DeliveryRefused, RateLimited, ProviderError
from pluto.gateway.delivery.render import render_chunks
from pluto.gateway.delivery.streaming import EditThrottle, LivePreview
from pluto.providers.telegram.markup import TELEGRAM_HTML
from pluto.types import (PLAIN, Capabilities, Dialect, IncomingMessage, MessageDelta,
                         OutgoingMessage,
                         MessageFinal, RunEnd, RunError, RunEvent, RunStart, ToolEnd, ToolStart)
from pluto.runtime.testing import ScriptedModel
from pluto.storage.sqlite import SqliteStore
from tests.helpers.gateway import RecordingProvider

RUN = "run1"
HTML = Capabilities(max_message_length=60, markup=TELEGRAM_HTML)
EDITS = Capabilities(max_message_length=60, markup=TELEGRAM_HTML, can_edit=True,
                     has_typing=True, can_send_images=True)


class Delivered(Delivery):
    """Delivery whose ``run`` returns once what it recorded is sent (the outbox sends behind
    it), with the provider registered as running."""

    providers: dict[str, Provider]

    async def run(self, provider: Provider, msg: IncomingMessage,  # type: ignore[override]
                  events: AsyncIterator[RunEvent]) -> RunEvent | None:
        self.providers[provider.name] = provider
        last = await super().run(provider, msg, events)
        await self.outbox.idle()
        return last


@pytest.fixture
async def delivery(data_dir: Path) -> AsyncIterator[Delivery]:
    async with SqliteStore(data_dir / "pluto.db") as store:
        providers: dict[str, Provider] = {}
        throttle = EditThrottle(0)
        outbox = Outbox(store.outbox, providers, throttle=throttle, sweep_seconds=0)
        await outbox.open()
        d = Delivered(outbox, data_dir=data_dir.resolve(), throttle=throttle,
                      typing_interval=0.01)
        d.providers = providers
        yield d


def message(*, direct: bool = True) -> IncomingMessage:
    return IncomingMessage(provider="test", chat_id="c1", user_id="u1", text="hi",
                           message_id="c1:7", is_direct=direct)


Step = RunEvent | Callable[[], Awaitable[object]]


async def events(*steps: Step, run: str = RUN) -> AsyncIterator[RunEvent]:
    """A run's events; a callable step is awaited in between (to wait for the platform)."""
    yield RunStart(run_id=run, session_id="s", agent="default")
    for step in steps:
        if callable(step):
            await step()
        else:
            yield step
    yield RunEnd(run_id=run, outcome="ok")


def delta(text: str, run: str = RUN) -> MessageDelta:
    return MessageDelta(run_id=run, text=text)


def final(text: str, run: str = RUN) -> MessageFinal:
    return MessageFinal(run_id=run, text=text)


def until(predicate: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    async def wait() -> None:
        async with asyncio.timeout(5):
            while not predicate():
                await asyncio.sleep(0.005)
    return wait


async def test_the_final_reply_is_rendered_split_and_recorded(delivery, data_dir):
    p = RecordingProvider(capabilities=HTML)
    text = "**Bold** <b>not a tag</b> & more. " * 5
    await delivery.run(p, message(), events(delta("**Bo"), final(text)))
    expected = render_chunks(text, TELEGRAM_HTML, 60)
    assert len(expected) > 1 and [m.text for m in p.sent] == expected
    assert {m.markup for m in p.sent} == {TELEGRAM_HTML.name} and "&lt;b&gt;" in p.sent[0].text
    rows = await delivery.outbox.rows.reply(RUN)
    assert [(r.status, r.platform_id) for r in rows] == [("sent", str(i + 1))
                                                          for i in range(len(expected))]


async def test_a_rendering_failure_falls_back_to_plain_text(delivery, monkeypatch):
    real = delivery_module.render_chunks

    def broken(markdown: str, dialect: Dialect, limit: int) -> list[str]:
        if dialect != PLAIN:
            raise RuntimeError("renderer bug")
        return real(markdown, dialect, limit)

    monkeypatch.setattr(delivery_module, "render_chunks", broken)
    p = RecordingProvider(capabilities=HTML)
    await delivery.run(p, message(), events(final("**still** readable")))
    assert [m.text for m in p.sent] == ["still readable"]


async def test_a_reply_streams_by_edits_and_ends_with_the_exact_text(delivery):
    p = RecordingProvider(capabilities=EDITS)
    await delivery.run(p, message(), events(
        delta("Hello"), until(lambda: p.sent),
        delta(" **brave"), until(lambda: p.edits),
        delta(" new** world"), final("Hello **brave new** world")))
    assert [(m.kind, m.text) for m in p.sent] == [("delta", "Hello")]  # one message only
    assert p.edits[0].text == "Hello <b>brave</b>"  # the preview closes open markup
    assert p.edits[-1].text == "Hello <b>brave new</b> world"
    assert p.edits[-1].kind == "reply" and p.edits[-1].edit_of == "1"


async def test_the_preview_becomes_the_first_chunk_and_the_rest_follow(delivery):
    p = RecordingProvider(capabilities=EDITS)
    text = " ".join(f"word{i}" for i in range(30))
    await delivery.run(p, message(direct=False), events(
        delta("word0"), until(lambda: p.sent), final(text)))
    expected = render_chunks(text, TELEGRAM_HTML, 60)
    assert [m.text for m in p.edits][-1] == expected[0]
    assert [m.text for m in p.sent[1:]] == expected[1:]
    assert p.sent[0].reply_to == "c1:7"  # in a group the reply quotes the question, once
    assert all(m.reply_to is None for m in p.sent[1:])


async def test_edits_are_throttled_per_chat(monkeypatch):
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(streaming_module.asyncio, "sleep", fake_sleep)
    throttle = EditThrottle(1.0)
    for _ in range(3):
        await throttle.turn(("p", "a"))
    await throttle.turn(("p", "b"))  # another chat has its own pace
    assert waits == [pytest.approx(1.0, abs=0.2), pytest.approx(2.0, abs=0.2)]
    throttle.hold(("p", "b"), 30)  # the platform asked to wait
    await throttle.turn(("p", "b"))
    assert waits[-1] == pytest.approx(30, abs=0.2)


async def test_the_preview_honours_retry_after_and_stops_on_permanent_errors(delivery):
    p = RecordingProvider(capabilities=EDITS)
    p.fail_next(RateLimited("slow down", retry_after=0.01))
    await delivery.run(p, message(), events(
        delta("one"), until(lambda: p.sent), final("one two")))
    assert [m.text for m in p.sent] == ["one"] and p.edits[-1].text == "one two"

    q = RecordingProvider(capabilities=EDITS)
    q.fail_next(DeliveryRefused("no rights to send"))
    await delivery.run(q, message(), events(
        delta("one", "run2"), until(lambda: not q.failures), delta(" two", "run2"),
        final("one two", "run2"), run="run2"))
    assert [(m.kind, m.text) for m in q.sent] == [("reply", "one two")] and q.edits == []


async def test_typing_is_repeated_while_the_run_works(delivery):
    p = RecordingProvider(capabilities=EDITS)
    await delivery.run(p, message(), events(until(lambda: len(p.typing_calls) >= 3),
                                            final("done")))
    typed = len(p.typing_calls)
    # five typing intervals (0.01 s) pass: the clock passing is what is checked — a running
    # indicator would have ticked meanwhile — not a wait for something to happen
    await asyncio.sleep(0.05)
    assert typed >= 3 and len(p.typing_calls) == typed  # stopped with the final reply


async def test_an_error_after_a_preview_is_a_new_message(delivery):
    p = RecordingProvider(capabilities=EDITS)
    await delivery.run(p, message(), events(
        delta("partial"), until(lambda: p.sent),
        RunError(run_id=RUN, message="The model service is unavailable.")))
    assert [(m.kind, m.text) for m in p.sent] == [
        ("delta", "partial"), ("error", "The model service is unavailable.")]


async def test_images_made_by_tools_follow_the_text(delivery, data_dir, tmp_path, caplog):
    chart = data_dir / "artifacts" / "chart.png"
    chart.parent.mkdir(parents=True)
    chart.write_bytes(b"\x89PNG fake")
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"x")

    def steps(run: str) -> AsyncIterator[RunEvent]:
        def tool_end(details: object) -> ToolEnd:
            return ToolEnd(run_id=run, call_id="c", name="chart", content="ok", details=details)
        return events(ToolStart(run_id=run, call_id="c", name="chart", arguments={}),
                      tool_end({"image": str(chart)}), tool_end({"image": str(outside)}),
                      tool_end({"image": "artifacts/missing.png"}), tool_end(["a", "list"]),
                      final("Here it is.", run), run=run)

    p = RecordingProvider(capabilities=EDITS)
    await delivery.run(p, message(), steps("run1"))
    assert [m.text for m in p.sent] == ["Here it is.", ""]
    [image] = p.sent[1].attachments
    assert (image.kind, image.path, image.mime_type) == ("image", chart.resolve(), "image/png")
    assert "outside the data dir or missing" in caplog.text

    text_only = RecordingProvider(capabilities=HTML)
    await delivery.run(text_only, message(), steps("run2"))
    assert [m.text for m in text_only.sent] == ["Here it is.", "(image: chart.png)"]


async def test_providers_that_stream_get_only_the_final_reply_with_its_seq(delivery):
    p = RecordingProvider(streams=True)  # it shows the progress itself, from the run feed
    the_final = dataclasses.replace(final("It is **now**"), seq=4)
    await delivery.run(p, message(), events(
        delta("It is "), ToolStart(run_id=RUN, call_id="c", name="current_time", arguments={}),
        delta("**now**"), the_final))
    assert [(m.kind, m.text, m.run_id, m.seq, m.answers) for m in p.sent] == [
        ("reply", "It is **now**", RUN, 4, "c1:7")]  # the model's text, as it streamed
    assert [r.status for r in await delivery.outbox.rows.reply(RUN)] == ["sent"]  # recorded


async def test_a_redelivered_message_starts_one_run(config_dir, data_dir):
    model = ScriptedModel()
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=model) as gw:
        p = RecordingProvider()
        gw.add_provider(p)
        await p.running.wait()
        msg = p.msg("hello")
        assert p.intake is not None
        await p.intake.submit(msg)
        await p.wait_finals(1)
        await p.intake.submit(msg)  # the platform delivers it again
        await p.intake.submit(p.msg("/help"))
        await p.wait_finals(3)  # /help's answer is two chunks here
    assert p.finals()[0] == "echo: hello" and len(model.calls) == 1
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=model) as gw:  # and again after a restart
        q = RecordingProvider()
        gw.add_provider(q)
        await q.running.wait()
        assert q.intake is not None
        await q.intake.submit(msg)
        await q.intake.submit(q.msg("/help"))
        await q.wait_finals(2)
    assert len(model.calls) == 1 and "/new" in q.finals()[1]


async def test_a_run_that_recorded_no_reply_leaves_its_preview_to_the_messages_next_run(
        delivery):
    """Storage failed before the reply was recorded (the run is handed back): the message's
    next run edits the preview the first one showed, even though its id was never kept."""
    p = RecordingProvider(capabilities=EDITS)

    async def cut_short() -> AsyncIterator[RunEvent]:
        yield RunStart(run_id="r1", session_id="s", agent="default")
        yield delta("Half an")
        async with asyncio.timeout(5):
            while not p.sent:
                await asyncio.sleep(0.005)
        raise RuntimeError("storage is away")  # no final: nothing recorded

    with pytest.raises(RuntimeError):
        await delivery.run(p, message(), cut_short())
    await delivery.run(p, message(), events(delta("Whole"), final("Whole answer."), run="r2"))
    assert [m.text for m in p.sent] == ["Half an"]  # one message in the chat
    assert p.edits[-1].edit_of == "1" and p.edits[-1].text == "Whole answer."


@pytest.mark.parametrize("answered", [False, True])
async def test_with_several_instances_a_preview_another_run_left_is_deleted_not_edited(
        delivery, answered):
    """The preview kept with the message may be a stopped instance's, with an edit under way
    that lands when it resumes: the new answer is a message of its own, and the old preview is
    removed first (a late edit then changes nothing, or a message already gone)."""
    delivery.replace_left = True
    p = RecordingProvider(capabilities=EDITS)
    msg = dataclasses.replace(message(), shown="41")
    if answered:  # its answer was committed, never handed to the outbox
        delivery.providers[p.name] = p
        await delivery.resend_final(p, msg, final("Whole answer.", run="r1"))
        await delivery.outbox.idle()
    else:
        await delivery.run(p, msg, events(delta("Whole"), until(lambda: p.sent),
                                          final("Whole answer.")))
    assert p.deleted == ["41"]
    assert all(e.edit_of != "41" for e in p.edits)
    assert (p.edits[-1].text if p.edits else p.sent[-1].text) == "Whole answer."


async def test_one_instance_edits_the_preview_a_crash_left(delivery):
    p = RecordingProvider(capabilities=EDITS)
    await delivery.run(p, dataclasses.replace(message(), shown="41"),
                       events(final("Whole answer.")))
    assert p.deleted == [] and p.sent == []
    assert (p.edits[-1].edit_of, p.edits[-1].text) == ("41", "Whole answer.")


async def test_a_preview_that_went_out_after_its_run_was_taken_over_is_deleted(delivery):
    """Paused with the preview's first send in flight: the platform made the message, and the
    instance learns so only after its run was taken over — nobody else knows of the message,
    so the instance deletes it itself rather than leave half an answer in the chat."""
    fresh = [True]

    class Paused(RecordingProvider):
        async def send(self, message):
            sent = await super().send(message)
            fresh[0] = False  # (the fence lapsed while the call was out)
            return sent

    p = Paused(capabilities=EDITS)
    delivery.providers[p.name] = p
    preview = LivePreview(p, OutgoingMessage(chat_id="c1", text=""), EditThrottle(0),
                          post=delivery.outbox.post, may_send=lambda: fresh[0])
    preview.add("Half an")
    await until(lambda: p.deleted)()
    assert p.deleted == ["1"] and [m.text for m in p.sent] == ["Half an"]
    assert await preview.finish() is None  # nothing of it is left to edit
