"""A message whose run was cut off by a crash is answered after the restart (``pluto serve``),
once; a one-shot terminal command does not answer the last one's leftovers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pluto.events import MessageFinal, RunEnd, RunStart
from pluto.gateway.app import Gateway
from pluto.gateway.pipeline.intake import message_to_dict
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig
from pluto.storage.sqlite import SqliteStore
from pluto.types import MARKDOWN, Capabilities
from tests.helpers.gateway import RecordingProvider


async def crashed_mid_run(data_dir: Path, provider: RecordingProvider) -> None:
    """What a process killed during a run leaves: the message taken, its run running."""
    msg = provider.msg("what was I asking?", chat="c9")
    async with SqliteStore(data_dir / "pluto.db") as store:
        assert await store.inbound.accept(msg.provider, msg.message_id, message_to_dict(msg))
        session = await store.conversations.session("default/test/c9", "default")
        await store.conversations.start_run(
            "dead-run", session.id, "default", msg.text,
            RunStart(run_id="dead-run", session_id=session.id, agent="default"),
            source=(msg.provider, msg.message_id))


async def test_serve_answers_a_message_its_crash_left_unanswered(config_dir, data_dir):
    provider = RecordingProvider()
    await crashed_mid_run(data_dir, provider)
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=ScriptedModel(),
                 serve=True, http_bind=("127.0.0.1", 0))
    await gw.start()
    try:
        gw.add_provider(provider)
        await provider.running.wait()
        for _ in range(200):  # replayed at the provider's start, answered behind it
            if provider.sent:
                break
            await asyncio.sleep(0.05)
        assert [m.text for m in provider.sent] == ["echo: what was I asking?"]
        assert (await gw.store.conversations.run("dead-run")).status == "interrupted"
    finally:
        await gw.stop()


async def test_a_terminal_command_does_not_answer_the_last_ones_leftovers(config_dir, data_dir):
    provider = RecordingProvider()
    await crashed_mid_run(data_dir, provider)
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=ScriptedModel()) as gw:
        gw.add_provider(provider)
        await provider.running.wait()
        await asyncio.sleep(0.3)  # time enough to answer, were it going to
        assert provider.sent == []
        assert (await gw.store.conversations.run("dead-run")).status == "interrupted"


async def test_the_new_answer_replaces_the_preview_the_cut_off_run_had_shown(config_dir,
                                                                             data_dir):
    provider = RecordingProvider(capabilities=Capabilities(
        max_message_length=200, can_edit=True, markup=MARKDOWN))
    await crashed_mid_run(data_dir, provider)
    async with SqliteStore(data_dir / "pluto.db") as store:  # it had shown "Let me th"
        await store.engine.write(("UPDATE inbound_seen SET preview = '41'", ()))
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=ScriptedModel(),
                 serve=True, http_bind=("127.0.0.1", 0))
    await gw.start()
    try:
        gw.add_provider(provider)
        await provider.running.wait()
        for _ in range(200):
            if any(e.text == "echo: what was I asking?" for e in provider.edits):
                break
            await asyncio.sleep(0.05)
        assert provider.sent == []  # nothing new: the old preview became the answer
        assert provider.edits[-1].edit_of == "41"
        assert provider.edits[-1].text == "echo: what was I asking?"
    finally:
        await gw.stop()


async def test_an_answer_saved_but_not_yet_handed_to_the_outbox_is_sent_after_a_restart(
        config_dir, data_dir):
    """Killed between saving the answer and recording its reply: the next serve sends it once,
    replacing the preview the run had shown — the message is not answered again."""
    provider = RecordingProvider(capabilities=Capabilities(
        max_message_length=200, can_edit=True, markup=MARKDOWN))
    msg = provider.msg("what was I asking?", chat="c9")
    async with SqliteStore(data_dir / "pluto.db") as store:
        assert await store.inbound.accept(msg.provider, msg.message_id, message_to_dict(msg))
        await store.inbound.keep_preview(msg.provider, msg.message_id, "41")  # "Let me th"
        session = await store.conversations.session("default/test/c9", "default")
        await store.conversations.start_run(
            "done-run", session.id, "default", msg.text,
            RunStart(run_id="done-run", session_id=session.id, agent="default"),
            source=(msg.provider, msg.message_id))
        await store.conversations.complete_run(
            "done-run", session.id, MessageFinal(run_id="done-run", text="Let me think: 42."),
            RunEnd(run_id="done-run", outcome="ok"), usage={})
    model = ScriptedModel()
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=model,
                 serve=True, http_bind=("127.0.0.1", 0))
    await gw.start()
    try:
        gw.add_provider(provider)
        await provider.running.wait()
        for _ in range(200):
            if provider.edits:
                break
            await asyncio.sleep(0.05)
        await gw.outbox.idle()
        assert [(e.edit_of, e.text) for e in provider.edits] == [("41", "Let me think: 42.")]
        assert provider.sent == [] and model.calls == []  # not answered again
    finally:
        await gw.stop()
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=model,
                 serve=True, http_bind=("127.0.0.1", 0))
    await gw.start()
    try:  # and never again
        again = RecordingProvider(capabilities=provider.capabilities)
        gw.add_provider(again)
        await again.running.wait()
        await asyncio.sleep(0.3)  # time enough to send it, were it going to
        assert again.edits == [] and again.sent == []
    finally:
        await gw.stop()
