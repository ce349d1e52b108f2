"""Voice notes users send (issue 32): decoded with ffmpeg, transcribed, and the words made the
message.

- :func:`transcribe_notes` (the gateway, before a run): each audio file a message came with is
  measured with ffprobe (a file over :attr:`VoiceLimits.max_seconds` or ``max_bytes`` is refused
  before anything is decoded), decoded by ffmpeg — a subprocess, within a timeout, never more
  than ``max_seconds`` of it (``-t``) — to 16 kHz mono 16-bit PCM, and transcribed: by an
  OpenAI-compatible ``/audio/transcriptions`` endpoint when one is configured, else offline by
  pocketsphinx (its English model ships in the wheel) in a worker thread, at most
  :data:`PARALLEL` at once per process. Each file that cannot be heard is one sentence.
- :class:`SpokenAnswer` (the gateway, for an agent whose answers are spoken): the run's final
  text, read aloud by espeak-ng and encoded by ffmpeg as OGG/Opus, kept as
  ``artifacts/<run>/voice-<id>.ogg`` and sent as a voice note after the text.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import multiprocessing
import re
import uuid
import wave
import weakref
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pluto.errors import PlutoError
from pluto.events import MessageFinal, RunEvent
from pluto.runtime.voice_worker import hear
from pluto.types import Attachment

log = logging.getLogger(__name__)

SUFFIXES = frozenset({".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac", ".wav", ".flac",
                      ".webm", ".amr", ".3gp", ".caf"})
RATE = 16_000  # samples a second, mono, s16le: what pocketsphinx's model was trained on
PARALLEL = 2  # offline transcriptions at once (per process)
FFMPEG = "ffmpeg"
FFPROBE = "ffprobe"
ESPEAK = "espeak-ng"
MAX_SPOKEN = 2000  # characters of an answer spoken (the rest is in the text)

_pool: ProcessPoolExecutor | None = None  # offline transcription, started at the first note
# notes measured and decoded at once (ffmpeg processes), per event loop
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
    weakref.WeakKeyDictionary()


class VoiceRefused(PlutoError):
    """An audio file that is not heard; the message is one sentence for the user."""


@dataclass(frozen=True, slots=True)
class VoiceLimits:
    """Caps and the transcription endpoint (``voice:`` in pluto.yaml)."""

    max_seconds: int = 300
    max_bytes: int = 20 * 2**20
    timeout: float = 120.0  # seconds for decoding, and again for transcribing, one note
    model: str | None = None  # an OpenAI-compatible transcription model; None: offline
    api_base: str | None = None
    api_key: str | None = None


def is_audio(attachment: Attachment) -> bool:
    """Whether a file sent with a message is meant as audio (its content decides later)."""
    return (attachment.mime_type.lower().startswith("audio/")
            or Path(attachment.filename).suffix.lower() in SUFFIXES)


def heard(transcript: str) -> str:
    """The notice that shows the user what was understood."""
    return f"heard: {transcript}"


async def transcribe_notes(attachments: Sequence[Attachment], limits: VoiceLimits,
                           sources: Sequence[Path | None]) -> tuple[list[str], list[str]]:
    """The transcript of each audio file (``sources``: where each is on disk, None when it
    was not received), and a sentence for each one that could not be heard."""
    words: list[str] = []
    problems: list[str] = []
    for attachment, source in zip(attachments, sources, strict=True):
        name = attachment.filename
        try:
            if source is None:
                raise VoiceRefused(f"I did not receive {name}; please send it again.")
            words.append(await transcribe(source, name, limits))
        except VoiceRefused as e:
            problems.append(str(e))
        except TimeoutError:
            problems.append(f"{name} took too long to listen to, so I skipped it.")
        except Exception:
            log.exception("transcribing %s failed", name)
            problems.append(f"Could not listen to {name}: something went wrong on our side; "
                            "the error has been logged.")
    return words, problems


async def transcribe(source: Path, name: str, limits: VoiceLimits) -> str:
    """The words of one audio file, or :class:`VoiceRefused`."""
    size = source.stat().st_size
    if size > limits.max_bytes:
        raise VoiceRefused(f"{name} is too large ({size / 2**20:.3g} MB; at most "
                           f"{limits.max_bytes / 2**20:.3g} MB).")
    async with _gate():
        seconds = await duration(source, name, limits.timeout)
        if seconds is not None and seconds > limits.max_seconds:
            raise VoiceRefused(f"{name} is too long ({_minutes(seconds)}; I listen to at most "
                               f"{_minutes(limits.max_seconds)}).")
        pcm = await decode(source, name, limits)
    if len(pcm) < RATE // 10 * 2:
        raise VoiceRefused(f"I could not make out any words in {name}.")
    if limits.model:
        text = await remote(pcm, name, limits)
    else:
        text = await _offline(pcm, limits.timeout)
    text = " ".join(text.split())
    if not text:
        raise VoiceRefused(f"I could not make out any words in {name}.")
    return text


def _gate() -> asyncio.Semaphore:
    """Taken while ffmpeg or espeak-ng run: at most :data:`PARALLEL` notes at once."""
    return _gates.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(PARALLEL))


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


# ffmpeg ----------------------------------------------------------------------------------------

async def _run(args: list[str], timeout: float,
               data: bytes | None = None) -> tuple[int, bytes, bytes]:
    """A subprocess's exit code, stdout and stderr (``data``: its stdin); killed when over
    ``timeout``."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL if data is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(data)
    except BaseException:  # (the timeout, or cancelled): nothing is left running
        if proc.returncode is None:
            proc.kill()
            await asyncio.shield(proc.wait())
        raise
    return proc.returncode or 0, out, err


def _head(source: Path) -> bytes:
    with source.open("rb") as f:
        return f.read(12)


def _looks_like_audio(head: bytes) -> bool:
    """Whether a file starts as an audio container does (so unreadable means damaged)."""
    return (head.startswith((b"OggS", b"ID3", b"RIFF", b"fLaC", b"\x1aE\xdf\xa3", b"#!AMR"))
            or head[4:8] == b"ftyp" or (len(head) > 1 and head[0] == 0xFF
                                        and head[1] & 0xE0 == 0xE0))


def _damaged(name: str) -> VoiceRefused:
    return VoiceRefused(f"{name} seems to be damaged (its audio is incomplete), so I could "
                        "not listen to it.")


def _not_audio(name: str) -> VoiceRefused:
    return VoiceRefused(f"{name} is not an audio file I can listen to (a voice note, OGG, "
                        "MP3, M4A, WAV or FLAC).")


async def duration(source: Path, name: str, timeout: float) -> float | None:
    """The length its container states (None when it states none); :class:`VoiceRefused`
    when it holds no audio."""
    code, out, _ = await _run([FFPROBE, "-v", "error", "-select_streams", "a",
                               "-show_entries", "stream=codec_type:format=duration",
                               "-of", "json", str(source)], timeout)
    try:
        info = json.loads(out) if code == 0 else {}
    except ValueError:
        info = {}
    if not info.get("streams"):
        head = await asyncio.to_thread(_head, source)
        raise _damaged(name) if code != 0 and _looks_like_audio(head) else _not_audio(name)
    try:
        return float(info.get("format", {}).get("duration"))
    except (TypeError, ValueError):
        return None


async def decode(source: Path, name: str, limits: VoiceLimits) -> bytes:
    """16 kHz mono s16le PCM of at most ``max_seconds`` (a longer stream is refused)."""
    code, pcm, err = await _run([FFMPEG, "-nostdin", "-v", "error", "-i", str(source),
                                 "-t", str(limits.max_seconds + 1), "-vn", "-ac", "1",
                                 "-ar", str(RATE), "-f", "s16le", "pipe:1"], limits.timeout)
    if code != 0:
        log.info("audio %s undecodable: %s", name, err[-300:].decode("utf-8", "replace"))
        raise _damaged(name)
    if len(pcm) > limits.max_seconds * RATE * 2:
        raise VoiceRefused(f"{name} is too long (I listen to at most "
                           f"{_minutes(limits.max_seconds)}).")
    return pcm


# transcribing ----------------------------------------------------------------------------------

async def _offline(pcm: bytes, timeout: float) -> str:
    """pocketsphinx in worker processes (:data:`PARALLEL`; runtime/voice_worker.py says why not
    threads), within ``timeout`` (a note still waiting then is dropped; one being heard finishes
    unawaited). A worker that died is replaced for the next note."""
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(PARALLEL, mp_context=multiprocessing.get_context("spawn"))
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            return await loop.run_in_executor(_pool, hear, pcm)
    except BrokenProcessPool:
        log.error("voice: a transcribing process died; a new one hears the next note")
        _pool = None
        raise


def wav(pcm: bytes) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)
    return out.getvalue()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible audio endpoint: its base URL (``…/v1``) and key."""

    api_base: str | None = None  # None: OpenAI's
    api_key: str | None = None
    timeout: float = 120.0

    async def post(self, path: str, limit: int, **body: Any) -> bytes:
        """The answer's body (at most ``limit`` bytes); :class:`OSError` when there is none."""
        import aiohttp

        base = (self.api_base or "https://api.openai.com/v1").rstrip("/")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as session, \
                    session.post(f"{base}{path}", headers=headers, **body) as resp:
                data = await resp.content.read(limit)
                if resp.status != 200:
                    raise OSError(f"{path} answered {resp.status}")
                return data
        except (aiohttp.ClientError, TimeoutError) as e:
            raise OSError(f"{path}: {type(e).__name__}") from None


async def remote(pcm: bytes, name: str, limits: VoiceLimits) -> str:
    """The words an OpenAI-compatible ``/audio/transcriptions`` endpoint hears (a WAV of the
    decoded audio is sent: every such server reads it, and it is within the caps)."""
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("model", str(limits.model))
    form.add_field("response_format", "json")
    form.add_field("file", await asyncio.to_thread(wav, pcm), filename="voice.wav",
                   content_type="audio/wav")
    try:
        body = await Endpoint(limits.api_base, limits.api_key, limits.timeout).post(
            "/audio/transcriptions", 1_000_000, data=form)
    except OSError as e:
        log.warning("transcribing %s: %s", name, e)
        raise VoiceRefused(f"Could not transcribe {name} right now (the speech service did "
                           "not answer); please try again later.") from None
    try:
        return str(json.loads(body)["text"])
    except (ValueError, KeyError, TypeError):
        raise VoiceRefused(f"Could not transcribe {name}: the speech service's answer was "
                           "not understood.") from None


# speaking (answers) ----------------------------------------------------------------------------

def speakable(markdown: str) -> str:
    """An answer's Markdown as words to read: no code blocks, links as their text, no marks."""
    text = re.sub(r"```.*?(```|$)", " ", markdown, flags=re.S)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_`#>|~]+", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= MAX_SPOKEN else text[:MAX_SPOKEN].rsplit(" ", 1)[0] + " …"


@dataclass(frozen=True, slots=True)
class Speech:
    """An OpenAI-compatible ``/audio/speech`` endpoint; without one, espeak-ng speaks."""

    model: str
    voice: str = "alloy"
    endpoint: Endpoint = Endpoint()


async def speak(text: str, timeout: float = 60.0, speech: Speech | None = None) -> bytes:
    """``text`` read aloud (espeak-ng, offline, or ``speech``), as OGG/Opus made by ffmpeg."""
    async with _gate():
        if speech is None:
            code, audio, err = await _run([ESPEAK, "--stdin", "--stdout", "-v", "en-us"],
                                          timeout, text.encode("utf-8"))
            if code != 0 or not audio:
                raise VoiceRefused(f"espeak-ng failed: {err[-200:].decode('utf-8', 'replace')}")
        else:
            audio = await speech.endpoint.post("/audio/speech", 50 * 2**20, json={
                "model": speech.model, "input": text, "voice": speech.voice,
                "response_format": "opus"})
        return await _opus(audio, timeout)


async def _opus(audio: bytes, timeout: float) -> bytes:
    """Any audio as mono OGG/Opus, the format of a voice note."""
    code, ogg, err = await _run([FFMPEG, "-nostdin", "-v", "error", "-i", "pipe:0", "-vn",
                                 "-c:a", "libopus", "-b:a", "32k", "-ar", "48000", "-ac", "1",
                                 "-application", "voip", "-f", "ogg", "pipe:1"], timeout, audio)
    if code != 0 or not ogg:
        raise VoiceRefused(f"ffmpeg failed: {err[-200:].decode('utf-8', 'replace')}")
    return ogg


class SpokenAnswer:
    """A run's answer, heard on its way to the chat and then spoken as a voice note."""

    def __init__(self, data_dir: Path, run_id: str, timeout: float = 60.0,
                 speech: Speech | None = None):
        self.data_dir = data_dir
        self.run_id = run_id
        self.timeout = timeout
        self.speech = speech
        self.text = ""

    async def listen(self, events: AsyncIterator[RunEvent]) -> AsyncIterator[RunEvent]:
        async for event in events:
            if isinstance(event, MessageFinal):
                self.text = event.text
            yield event

    async def note(self) -> Attachment | None:
        """The answer as an OGG/Opus voice note kept with the run; None when there was no
        answer, or it could not be spoken (logged: the text was sent all the same)."""
        words = speakable(self.text)
        if not words:
            return None
        try:
            ogg = await speak(words, self.timeout, self.speech)
        except (VoiceRefused, TimeoutError, OSError) as e:
            log.warning("speaking the answer of run %s failed: %s", self.run_id, e)
            return None
        folder = re.sub(r"[^A-Za-z0-9_-]", "_", self.run_id)[:64] or "run"
        path = self.data_dir / "artifacts" / folder / f"voice-{uuid.uuid4().hex[:8]}.ogg"
        await asyncio.to_thread(_write, path, ogg)
        return Attachment(filename="answer.ogg", mime_type="audio/ogg", size=len(ogg),
                          path=path, kind="file")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
