"""A full disk during traffic loses nothing and says so: the data dir on a small tmpfs, a few
hundred messages over many Telegram chats (the real provider against the fake Bot API, a
streaming model whose answers name their messages), the disk filled by a ballast file for
~25 s while messages keep coming, then freed. Every message is answered, once; /readyz is 503
while the disk is full; everything resumes by itself, with no restart.

Needs root (``mount -t tmpfs``); under CI=true a refused mount fails the test.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.providers.telegram import TelegramProvider
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig, ProviderConfig
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.gateway import provider_context

pytestmark = pytest.mark.slow

TOKEN_ENV = "PLUTO_FULL_DISK_TELEGRAM_TOKEN"
FIRST_CHAT = 7000
CHATS = 25
OUTAGE_SECONDS = 25.0  # how long the disk stays full (the scenario, not a wait for the code)
WORDS = "and the rest of the answer, a few words at a time"


def answer(text: str) -> str:
    return f"answer to {text}: {WORDS}"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = f"mount -t tmpfs was refused: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; this test needs root (CI runs it)")
        pytest.skip(why)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


class Ballast:
    """A file that takes every free byte of the disk, until it is removed."""

    def __init__(self, disk: Path):
        self.path = disk / "ballast"

    def fill(self) -> int:
        written = 0
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for size in (1 << 20, 1 << 12, 1 << 9):  # large steps, then to the last page
                block = b"\0" * size
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


def _listing(disk: Path) -> str:
    """What takes the disk's space (said when the disk is still full at the end)."""
    st = os.statvfs(disk)
    files = sorted((p.stat().st_size, str(p.relative_to(disk))) for p in disk.rglob("*")
                   if p.is_file())
    return (f"{st.f_bavail * st.f_frsize / 1e6:.1f} MB free; "
            + ", ".join(f"{name} {size / 1e6:.1f} MB" for size, name in reversed(files)))


@dataclass
class Traffic:
    fake: FakeTelegram
    gw: Gateway
    chats: list[int]
    asked: dict[int, list[str]] = field(default_factory=dict)

    def ask(self, per_chat: int) -> int:
        for _ in range(per_chat):
            for chat in self.chats:
                text = f"c{chat}m{len(self.asked.setdefault(chat, []))}"
                self.asked[chat].append(text)
                self.fake.inject_message(chat, text)
        return per_chat * len(self.chats)

    def shown(self, chat: int) -> list[str]:
        out = []
        for sent in self.fake.messages(chat):
            now = self.fake.message(chat, sent.message_id)
            out.append(str((now or {}).get("text", "")))
        return out

    def answered(self) -> int:
        return sum(len(self.shown(c)) for c in self.chats)

    def complete(self) -> bool:
        return all(self.shown(c) == [answer(t) for t in self.asked[c]] for c in self.chats)

    def tally(self) -> dict[str, list[str]]:
        """Lost, twice and stray answers over every chat (the chat shows them as they are)."""
        lost, twice, stray = [], [], []
        for chat in self.chats:
            shown, expected = self.shown(chat), [answer(t) for t in self.asked[chat]]
            lost += [t for t in expected if t not in shown]
            twice += sorted({t for t in shown if shown.count(t) > 1})
            stray += [t for t in shown if t not in expected]
        return {"lost": lost, "twice": twice, "stray": stray}

    async def readyz(self) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.gw.http.url}/readyz") as r:  # type: ignore[union-attr]
                return r.status, await r.json()


@pytest.fixture
async def traffic(config_dir: Path, small_disk: Path) -> AsyncIterator[Traffic]:
    fake = FakeTelegram()
    await fake.start()
    os.environ[TOKEN_ENV] = fake.token
    chats = [FIRST_CHAT + i for i in range(CHATS)]
    for chat in chats:
        fake.add_chat(chat, first_name=f"user{chat}")
    model = ScriptedModel(fallback=lambda msgs: Scripted(
        text=answer(msgs[-1]["content"]), chunk=12, delay=0.01))
    config = PlutoConfig(data_dir=small_disk / "data",
                         gateway={"stream_edit_interval_seconds": 0.2,
                                  "reload_interval_seconds": 0})
    gw = Gateway(config_dir, config=config, model_factory=model, serve=True,
                 http_bind=("127.0.0.1", 0))
    await gw.start()
    try:
        ctx = provider_context(ProviderConfig(enabled=True, token_env=TOKEN_ENV,
                                              base_url=fake.url, poll_timeout=1),
                               small_disk / "data", None, name="telegram")
        gw.add_provider(TelegramProvider.from_context(ctx))
        yield Traffic(fake, gw, chats)
    finally:
        await gw.stop()
        await fake.stop()
        os.environ.pop(TOKEN_ENV, None)


@pytest.mark.timeout(300)
async def test_a_full_disk_for_25_seconds_loses_nothing_and_recovers_by_itself(
        traffic: Traffic, small_disk: Path) -> None:
    gw, fake = traffic.gw, traffic.fake
    ballast = Ballast(small_disk)
    asked = traffic.ask(4)  # 100 messages: answers are being written when the disk fills
    await fake.wait_until(lambda: traffic.answered() >= 10, timeout=60, what="first answers")
    try:
        await asyncio.to_thread(ballast.fill)
        full_at = time.monotonic()
        asked += traffic.ask(4)  # 100 more while the disk is full
        # the gateway notices: the disk check at once, then commits that fail
        await fake.wait_until(lambda: gw.store.engine.health.problem is not None, timeout=30,
                              what="commits to fail on the full disk")
        samples: list[tuple[int, dict]] = []
        while time.monotonic() - full_at < OUTAGE_SECONDS:  # the outage lasts its 25 s
            samples.append(await traffic.readyz())
            await asyncio.sleep(0.5)  # a sample every 0.5 s through the 25 s the fault lasts
        answered_while_full = traffic.answered()
    finally:
        ballast.free()
    asked += traffic.ask(2)  # 50 more once there is space again
    await fake.wait_until(traffic.complete, timeout=150, what="every message answered")
    await asyncio.wait_for(gw.settled(), 60)

    assert traffic.tally() == {"lost": [], "twice": [], "stray": []}
    assert traffic.answered() == asked == 250
    assert samples and all(status == 503 for status, _ in samples)
    assert all(set(body["problems"]) & {"disk", "storage"} for _, body in samples)
    assert any(body["problems"].get("storage") == {"state": "failing"} for _, body in samples)
    assert answered_while_full < asked  # the outage really held answers back
    for _ in range(100):  # ready again by itself (the disk's figure is cached a few seconds)
        status, body = await traffic.readyz()
        if status == 200:
            break
        await asyncio.sleep(0.2)
    assert (status, body["problems"]) == (200, {}), _listing(small_disk)
    assert gw.store.engine.health.problem is None
