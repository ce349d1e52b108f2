"""The widget's microphone in Debian's Chromium (issue 32): Chromium's fake microphone plays a
WAV espeak-ng made ("what is six times seven"); the visitor presses the microphone (from the
keyboard), waits while the recording runs, presses it again, and the recording goes up as a
voice note that the gateway hears ("heard: …" shown, the words the agent gets) and the agent
answers. A browser without
MediaRecorder shows no microphone; a refused permission is one line in the widget."""

from __future__ import annotations

import subprocess
from pathlib import Path

import playwright.async_api as playwright_api
import pytest

from pluto.runtime.testing import Scripted, ScriptedModel
from tests.browser.test_widget_features import chromium
from tests.helpers.served import served, url
from tests.test_voice import QUESTION

expect = playwright_api.expect
REFUSE = """() => {
  navigator.mediaDevices.getUserMedia = () =>
    Promise.reject(new DOMException("Permission denied", "NotAllowedError"));
}"""


def spoken_wav(folder: Path) -> Path:
    """The question as a WAV Chromium's fake microphone can play: a second of silence
    first, then espeak-ng's voice, then silence (48 kHz mono 16-bit)."""
    speech = subprocess.run(["espeak-ng", "--stdout", QUESTION], capture_output=True,
                            check=True, timeout=60).stdout
    path = folder / "question.wav"
    subprocess.run(["ffmpeg", "-v", "error", "-i", "pipe:0", "-af",
                    "adelay=1000:all=1,apad=pad_dur=3", "-ar", "48000", "-ac", "1",
                    "-c:a", "pcm_s16le", str(path)], input=speech, check=True, timeout=60)
    return path


@pytest.mark.slow
async def test_a_question_asked_into_the_microphone_is_heard_and_answered(config_dir, data_dir,
                                                                         tmp_path):
    from tests.browser.test_widget_browser import ARGS

    fake_mic = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={spoken_wav(tmp_path)}%noloop"]
    model = ScriptedModel(fallback=lambda messages: Scripted(text="42"))
    async with served(config_dir, data_dir, model) as gw, \
            chromium(args=ARGS + fake_mic) as browser:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        mic = page.locator(".pluto-mic")
        await expect(mic).to_have_attribute("aria-label", "Record a voice message")
        await mic.focus()
        await page.keyboard.press("Enter")
        await expect(mic).to_have_attribute("aria-pressed", "true")
        await expect(mic).to_have_attribute("aria-label", "Stop recording and send")
        await expect(page.locator(".pluto-rec-time")).to_have_text("0:05", timeout=15_000)
        await mic.click()
        await expect(mic).to_have_attribute("aria-pressed", "false")
        heard = page.locator(".pluto-system").filter(has_text="heard: ")
        await expect(heard).to_have_count(1, timeout=60_000)
        await expect(page.locator(".pluto-user .pluto-attached")).to_have_count(1)
        answered = page.locator(".pluto-bot .pluto-bubble")
        await expect(answered).to_have_count(1, timeout=60_000)
        said = str(model.calls[-1][-1]["content"])
        assert (await heard.text_content() or "").strip() == f"heard: {said}"
        assert said  # (words: through Chromium's capture and WebM/Opus, pocketsphinx hears
        # the question roughly — "not to six and one" — so the words are not held to it)
        await expect(answered).to_have_text("42")
        assert errors == []


@pytest.mark.slow
async def test_no_microphone_without_mediarecorder_and_a_refusal_is_one_line(config_dir,
                                                                            data_dir):
    async with served(config_dir, data_dir) as gw, chromium() as browser:
        bare = await browser.new_page()
        await bare.add_init_script("delete window.MediaRecorder;")
        await bare.goto(url(gw, "/"))
        await expect(bare.locator(".pluto-status")).to_have_text("Online")
        await expect(bare.locator(".pluto-attach")).to_have_count(1)
        await expect(bare.locator(".pluto-mic")).to_have_count(0)
        page = await browser.new_page()
        await page.goto(url(gw, "/"))
        await expect(page.locator(".pluto-status")).to_have_text("Online")
        await page.evaluate(REFUSE)
        await page.locator(".pluto-mic").click()
        refusal = page.locator(".pluto-system.pluto-error")
        await expect(refusal).to_have_text("The microphone is blocked for this page; allow it "
                                           "in your browser to send a voice message.")
        await expect(page.locator(".pluto-mic")).to_have_attribute("aria-pressed", "false")
