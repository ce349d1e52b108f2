"""Schedules: how late a firing is after its due time — claimed (the row taken) and sent (the
answer handed to the platform) — over 100 one-offs due 50 ms apart, one gateway on SQLite with
a scripted model. Baseline: how late the event loop's own timers are (``call_later``), in the
same run."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import Figure, Report

ROOT = Path(__file__).resolve().parent.parent


def _q(values: list[float], k: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(k * len(ordered)))]


async def _timers(n: int, gap: float) -> list[float]:
    loop = asyncio.get_running_loop()
    late: list[float] = []
    done = asyncio.Event()
    start = loop.time() + 0.5
    for i in range(n):
        due = start + i * gap
        loop.call_at(due, lambda d=due: (late.append(loop.time() - d),
                                         len(late) == n and done.set()))
    await done.wait()
    return late


async def _firings(n: int, gap: float) -> tuple[list[float], list[float]]:
    from pluto.gateway.app import Gateway
    from pluto.gateway.schedules.recurrence import When
    from pluto.gateway.schedules.scheduler import add_schedule
    from pluto.runtime.testing import ScriptedModel
    from pluto.settings import PlutoConfig
    from pluto.types import OutgoingMessage
    from tests.helpers.gateway import RecordingProvider

    class Timed(RecordingProvider):
        def __init__(self) -> None:
            super().__init__("bench")
            self.at: dict[str, float] = {}

        async def send(self, message: OutgoingMessage) -> str | None:
            self.at.setdefault(message.chat_id, time.time())
            return await super().send(message)

    tmp = Path(tempfile.mkdtemp(prefix="pluto-bench-schedules-"))
    try:
        shutil.copytree(ROOT / "config", tmp / "config")
        async with Gateway(tmp / "config", config=PlutoConfig(data_dir=tmp / "data"),
                           model_factory=ScriptedModel()) as gw:
            provider = Timed()
            gw.add_provider(provider)
            await provider.running.wait()
            now = await gw.store.schedules.now()
            dues = {}
            for i in range(n):
                due = now + 1.0 + i * gap
                made = await add_schedule(
                    gw.store.schedules, source="admin", owner=None, provider="bench",
                    chat_id=f"c{i}", agent="default", prompt="ping",
                    when=When("at", str(due)), created_by="bench")
                dues[f"c{i}"] = (made.id, due)
            gw.scheduler.wake()
            while len(provider.at) < n:
                await asyncio.sleep(0.05)
            await gw.settled()
            claimed, sent = [], []
            for chat, (sid, due) in dues.items():
                [firing] = await gw.store.schedules.history(sid)
                claimed.append(firing.fired_at - due)
                sent.append(provider.at[chat] - due)
            return claimed, sent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(report: Report, quick: bool = False) -> None:
    n, gap = (20, 0.05) if quick else (100, 0.05)
    timers = asyncio.run(_timers(n, gap))
    claimed, sent = asyncio.run(_firings(n, gap))
    for k, label in ((0.5, "p50"), (0.99, "p99")):
        report.add(Figure("schedules", f"firing claimed after its due time, {label}",
                          _q(claimed, k) * 1000, "ms", f"event-loop timer lateness {label}",
                          _q(timers, k) * 1000, note=f"{n} one-offs {gap * 1000:.0f} ms apart"))
        met = _q(sent, k) < 0.25 if k == 0.99 else None
        report.add(Figure("schedules", f"firing's answer sent after its due time, {label}",
                          _q(sent, k) * 1000, "ms", f"event-loop timer lateness {label}",
                          _q(timers, k) * 1000, target="p99 < 250 ms" if k == 0.99 else None,
                          met=met))
