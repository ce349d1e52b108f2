"""A message whose run was cut off by a crash is answered after the restart (``pluto serve``),
once; a one-shot terminal command does not answer the last one's leftovers."""

from __future__ import annotations

from pathlib import Path

from pluto.events import MessageFinal, RunEnd, RunStart
from pluto.gateway.app import Gateway
from pluto.gateway.pipeline.intake import message_to_dict
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig
from pluto.storage.sqlite import SqliteStore
from pluto.types import MARKDOWN, Capabilities, IncomingMessage
from tests.helpers.gateway import RecordingProvider
from tests.helpers.served import wait_for


async def crashed_mid_run(data_dir: Path, provider: RecordingProvider) -> IncomingMessage:
    """What a process killed during a run leaves: the message taken, its run running."""
    msg = provider.msg("what was I asking?", chat="c9")
    async with SqliteStore(data_dir / "pluto.db") as store:
        assert await store.inbound.accept(msg.provider, msg.message_id, message_to_dict(msg))
        session = await store.conversations.session("default/test/c9", "default")
        await store.conversations.start_run(
            "dead-run", session.id, "default", msg.text,
            RunStart(run_id="dead-run", session_id=session.id, agent="default"),
            source=(msg.provider, msg.message_id))
    return msg


async def test_serve_answers_a_message_its_crash_left_unanswered(config_dir, data_dir):
    provider = RecordingProvider()
    await crashed_mid_run(data_dir, provider)
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=ScriptedModel(),
                 serve=True, http_bind=("127.0.0.1", 0))
    await gw.start()
    try:
        gw.add_provider(provider)
        await provider.running.wait()
        # replayed at the provider's start, answered behind it
        await wait_for(lambda: provider.sent)
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
        # a barrier: a new message in the chat is answered after anything queued there before
        await provider.say("and now?", chat="c9")
        assert await provider.wait_finals(1) == ["echo: and now?"]
        assert [m.text for m in provider.sent] == ["echo: and now?"]  # the leftover: no answer
        assert (await gw.store.conversations.run("dead-run")).status == "interrupted"


async def test_the_new_answer_replaces_the_preview_the_cut_off_run_had_shown(config_dir,
                                                                             data_dir):
    provider = RecordingProvider(capabilities=Capabilities(
        max_message_length=200, can_edit=True, markup=MARKDOWN))
    msg = await crashed_mid_run(data_dir, provider)
    async with SqliteStore(data_dir / "pluto.db") as store:  # it had shown "Let me th"
        await store.inbound.keep_preview(msg.provider, msg.message_id, "41")
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=ScriptedModel(),
                 serve=True, http_bind=("127.0.0.1", 0))
    await gw.start()
    try:
        gw.add_provider(provider)
        await provider.running.wait()
        await wait_for(lambda: any(e.text == "echo: what was I asking?" for e in provider.edits))
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
        await wait_for(lambda: provider.edits)
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
        # a barrier: a new message in the chat is answered after anything queued there before
        await again.say("and now?", chat="c9")
        # the answer: sent as it is (one that comes at once) or over its preview
        final = await wait_for(lambda: [m for m in again.sent + again.edits
                                        if m.kind == "reply"])
        assert [m.text for m in final] == ["echo: and now?"]
        assert [m.kind for m in again.sent] in (["reply"], ["delta"])
        assert all(m.answers != msg.message_id and m.edit_of != "41"  # nothing of the old one
                   for m in again.sent + again.edits)
    finally:
        await gw.stop()
