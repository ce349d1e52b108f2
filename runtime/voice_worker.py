"""The offline transcriber's worker, run in processes of its own (runtime/voice.py): pocketsphinx
keeps the GIL for the whole search that ends an utterance (~0.2 s for a few seconds of speech),
which in a thread of the gateway's process would stall its event loop — every chat, every
``/healthz`` — for as long. This module imports nothing of Pluto's: a worker starts light."""

from __future__ import annotations

from typing import Any

RATE = 16_000  # samples a second, mono, s16le: what pocketsphinx's model was trained on
_decoder: Any = None  # one per worker process, kept (loading the model takes ~0.3 s)


def hear(pcm: bytes) -> str:
    """The words pocketsphinx (its default en-us model) hears in ``pcm``."""
    global _decoder
    if _decoder is None:
        from pocketsphinx import Decoder  # type: ignore[import-untyped]

        _decoder = Decoder(samprate=RATE, loglevel="ERROR")
    _decoder.start_utt()
    _decoder.process_raw(pcm, full_utt=True)
    _decoder.end_utt()
    hyp = _decoder.hyp()
    return str(hyp.hypstr) if hyp is not None else ""
