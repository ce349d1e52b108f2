"""Voice from the chat widget (issue 32): a voice note (OGG/Opus, as espeak-ng and ffmpeg make
it) sent over the widget's socket as an upload is heard — the tab is shown "heard: …" and the
agent gets the words — and a recording named as browsers name theirs (``audio/webm;codecs=opus``)
is taken too. Real ffmpeg, espeak-ng and pocketsphinx."""

from __future__ import annotations

import aiohttp
import pytest

from pluto.providers.web.uploads import kind_refusal
from pluto.runtime.testing import ScriptedModel
from tests.helpers.served import Tab, served, url
from tests.test_voice import answer, spoken
from tests.test_web_uploads import _upload


def test_audio_is_a_kind_the_widget_takes():
    for name, mime in (("voice.ogg", "audio/ogg"), ("voice.webm", "audio/webm"),
                       ("memo.mp3", "audio/mpeg"), ("memo.m4a", "audio/mp4"),
                       ("take.wav", "audio/x-wav"), ("voice.webm", "video/webm")):
        assert kind_refusal(name, mime) is None, name
    refusal = kind_refusal("report.pdf", "application/pdf")
    assert refusal is not None and "audio" in refusal


@pytest.mark.slow
async def test_a_voice_note_sent_from_the_widget_is_heard_and_answered(config_dir, data_dir):
    model = ScriptedModel(fallback=answer)
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        tab = await Tab.open(http, gw)
        note = spoken()
        received = await _upload(tab, "v1", "voice.ogg", note, mime="audio/ogg;codecs=opus",
                                 chunk=4096)
        assert received["size"] == len(note)
        await tab.send(type="message", id="m1", files=["v1"])
        await tab.until("ack", lambda f: f["reply_to"] == "m1")
        notice = await tab.until("notice", lambda f: f["text"].startswith("heard: "), 60)
        final = await tab.until("message.final", timeout=60)
        said = str(model.calls[-1][-1]["content"])
        assert said.startswith("what is") and notice["text"] == f"heard: {said}"
        assert final["text"] == "42"


@pytest.mark.slow
async def test_a_spoken_answer_is_a_clip_the_tab_plays_after_its_text(config_dir, data_dir):
    from pluto.runtime.testing import Scripted
    from pluto.settings import VoiceConfig

    model = ScriptedModel(Scripted(text="The answer is **42**."))
    async with served(config_dir, data_dir, model,
                      voice=VoiceConfig(speak_agents=["default"])) as gw, \
            aiohttp.ClientSession() as http:
        tab = await Tab.open(http, gw)
        await tab.ask("what is six times seven?", msg_id="m1")
        voice = await tab.until("voice", timeout=60)
        assert voice["url"].startswith("/web/file/") and voice["reply_to"] == "m1"
        async with http.get(url(gw, voice["url"])) as got:
            assert got.status == 200 and got.content_type == "audio/ogg"
            assert (await got.read()).startswith(b"OggS")
        async with http.get(url(gw, voice["url"].replace("/web/file/", "/web/file/x"))) as bad:
            assert bad.status == 404  # a forged signature plays nothing
