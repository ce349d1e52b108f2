"""Voice notes (issue 32): how long the offline default (ffmpeg, then pocketsphinx) takes per
second of audio, beside decoding alone (ffmpeg to PCM, the thinnest part of the same hop); and
how an event loop serving ``/healthz`` answers while ten voice notes are heard at once through
the gateway's own voice path (runtime/voice.py: a bounded pool off the loop), beside the same
loop with nothing to hear. The notes are espeak-ng speaking, encoded as OGG/Opus by ffmpeg."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import Figure, Report, percentile

SPEECH = ("what is six times seven. how many orders came from the north region last week. "
          "draw the sales of every month as a chart.")


def _note(folder: Path, text: str) -> tuple[Path, float]:
    """``text`` spoken as an OGG/Opus voice note, and its length in seconds."""
    speech = subprocess.run(["espeak-ng", "--stdout", text], check=True,
                            capture_output=True).stdout
    path = folder / "note.ogg"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", "pipe:0", "-c:a", "libopus", "-b:a",
                    "24k", "-ar", "48000", "-ac", "1", str(path)], input=speech, check=True)
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration",
                            "-of", "csv=p=0", str(path)], check=True, capture_output=True,
                           text=True)
    return path, float(probe.stdout.strip())


def run(report: Report, quick: bool = False) -> None:
    from pluto.runtime.voice import VoiceLimits

    rounds = 2 if quick else 4
    with tempfile.TemporaryDirectory(prefix="pluto-bench-voice-") as tmp:
        note, seconds = _note(Path(tmp), SPEECH)
        limits = VoiceLimits()
        heard, decoded = asyncio.run(_per_second(note, limits, rounds))
        report.add(Figure("voice", "offline transcription time per audio second", heard / seconds,
                          "s", "decoding alone (ffmpeg to 16 kHz PCM)", decoded / seconds,
                          note=f"best of {rounds}; a {seconds:.1f} s espeak-ng note"))
        busy, idle = asyncio.run(_healthz(note, limits, 10))
        report.add(Figure("voice", "/healthz p99 while 10 voice notes are heard at once",
                          percentile(busy, 99), "s", "the same loop, nothing to hear",
                          percentile(idle, 99), target="< 100 ms",
                          met=percentile(busy, 99) < 0.1,
                          note=f"worst {max(busy) * 1000:.0f} ms, median "
                               f"{statistics.median(busy) * 1000:.1f} ms over {len(busy)} "
                               "requests (the gateway's voice path on the loop that answers)"))


async def _per_second(note: Path, limits: object, rounds: int) -> tuple[float, float]:
    from pluto.runtime.voice import VoiceLimits, decode, transcribe

    assert isinstance(limits, VoiceLimits)
    heard = decoded = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        await decode(note, note.name, limits)
        decoded = min(decoded, time.perf_counter() - t0)
        t0 = time.perf_counter()
        await transcribe(note, note.name, limits)
        heard = min(heard, time.perf_counter() - t0)
    return heard, decoded


async def _healthz(note: Path, limits: object, notes: int) -> tuple[list[float], list[float]]:
    """/healthz latencies while ``notes`` are heard at once, then with nothing to hear."""
    import aiohttp
    from aiohttp import web

    from pluto.runtime.voice import transcribe

    app = web.Application()
    app.router.add_get("/healthz", lambda request: web.json_response({"ok": True}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        async with aiohttp.ClientSession() as session:
            async def poll(until: asyncio.Future[object] | None, count: int) -> list[float]:
                got: list[float] = []
                while (until is not None and not until.done()) or (until is None
                                                                   and len(got) < count):
                    t0 = time.perf_counter()
                    async with session.get(url) as response:
                        await response.read()
                    got.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.01)
                return got

            hearing = asyncio.ensure_future(asyncio.gather(
                *(transcribe(note, note.name, limits) for _ in range(notes))))  # type: ignore[arg-type]
            busy = await poll(hearing, 0)
            await hearing
            idle = await poll(None, max(20, len(busy)))
    finally:
        await runner.cleanup()
    return busy, idle
