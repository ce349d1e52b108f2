"""Access: refusals, mentions, DM pairing (codes, expiry, approval, persistence), rate limits."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.gateway.pipeline.ratelimit import OncePer, Rate, RateLimiter, parse_rate
from pluto.runtime.testing import ScriptedModel
from pluto.storage.rows import PairingError, format_code, normalize_code
from pluto.storage.sqlite import SqliteStore
from pluto.types import IncomingMessage, Route
from tests.helpers.gateway import RecordingProvider

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


async def until(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    async def poll() -> Any:
        while not (value := cond()):
            await asyncio.sleep(0.01)
        return value
    return await asyncio.wait_for(poll(), timeout)


def texts(p: RecordingProvider, kind: str | None = None) -> list[str]:
    return [m.text for m in p.sent if kind is None or m.kind == kind]


async def settle(gw: Gateway) -> None:
    """Wait until every queued message has been answered."""
    await gw.settled()


@pytest.fixture
async def make_gw(config_dir: Path, data_dir: Path):
    made: list[Gateway] = []

    async def make(routes: str, **access: Any) -> tuple[Gateway, RecordingProvider]:
        (config_dir / "routes.yaml").write_text(routes)
        cfg = PlutoConfig(data_dir=data_dir, access=access)
        gw = Gateway(config_dir, config=cfg, model_factory=ScriptedModel())
        await gw.start()
        made.append(gw)
        p = RecordingProvider("telegram")
        gw.add_provider(p)
        await p.running.wait()
        return gw, p

    yield make
    for gw in made:
        await gw.stop()


async def test_not_admitted_gets_nothing_or_one_refusal_in_direct_messages(make_gw) -> None:
    gw, p = await make_gw("routes:\n  - {match: {user: '13'}, deny: true}\ndefault: null\n",
                          refusal="Sorry, this bot is private.")
    for _ in range(3):
        await p.say("hello", user="13")  # denied, direct
    await p.say("hello", user="14", chat="g", is_direct=False)  # unmatched, group
    await p.say("hello", user="15")  # unmatched, direct
    await settle(gw)
    assert texts(p) == ["Sorry, this bot is private."] * 2  # once per user, not per message
    assert [m.chat_id for m in p.sent] == ["c1", "c1"]


async def test_no_refusal_configured_means_silence(make_gw) -> None:
    gw, p = await make_gw("default: null\n")
    await p.say("hello")
    await settle(gw)
    assert p.sent == []


async def test_require_mention_in_groups(make_gw) -> None:
    gw, p = await make_gw("routes:\n  - {match: {provider: telegram}, agent: default,"
                          " require_mention: true}\n")
    await p.say("just chatting", chat="g", is_direct=False)
    await p.say("@bot hello", chat="g", is_direct=False, mentions_bot=True)
    await p.say("direct hello", chat="d")
    assert await p.wait_finals(2) == ["echo: @bot hello", "echo: direct hello"]


PAIRING = "routes:\n  - {match: {provider: telegram}, agent: default, access: pairing}\n"


async def test_pairing_code_approval_and_persistence(make_gw, config_dir, data_dir) -> None:
    gw, p = await make_gw(PAIRING, pairing_ttl_seconds=600)
    await p.say("hi", user="42", user_name="Ada")
    await p.say("hi again", user="42")  # the same code, not repeated within a minute
    await p.say("in a group", user="42", chat="g", is_direct=False)  # never a code in a group
    await settle(gw)
    [notice] = texts(p, "notice")
    pending = await gw.access.pairing.pending()
    assert [(r.user_id, r.user_name) for r in pending] == [("42", "Ada")]
    code = pending[0].code
    assert format_code(code) in notice and "valid for 10 minutes" in notice
    approval = await gw.access.pairing.approve(format_code(code).lower(), by="test")
    assert (approval.provider, approval.user_id) == ("telegram", "42")
    await p.say("now?", user="42")
    assert await p.wait_finals(1) == ["echo: now?"]
    await p.say("group now", user="42", chat="g", is_direct=False)
    assert await p.wait_finals(2) == ["echo: now?", "echo: group now"]
    await gw.stop()
    # a restart keeps the approval
    gw2, p2 = await make_gw(PAIRING)
    await p2.say("after restart", user="42")
    assert await p2.wait_finals(1) == ["echo: after restart"]
    with pytest.raises(PairingError):
        await gw2.access.pairing.approve(code, by="test")  # a code is used once


async def test_pairing_codes_expire(make_gw) -> None:
    gw, p = await make_gw(PAIRING, pairing_ttl_seconds=60)
    clock = Clock()
    gw.access.pairing.clock = clock
    await p.say("hi", user="7")
    await settle(gw)
    first = (await gw.access.pairing.pending())[0].code
    clock.now += 61
    assert await gw.access.pairing.pending() == []
    with pytest.raises(PairingError, match="codes expire"):
        await gw.access.pairing.approve(first, by="test")
    await p.say("hi?", user="7")
    await settle(gw)
    second = (await gw.access.pairing.pending())[0].code
    assert second != first and len(texts(p, "notice")) == 2  # a new code is sent at once
    assert format_code(second) in texts(p, "notice")[1]


async def test_pairing_store_details(data_dir: Path) -> None:
    async with SqliteStore(data_dir / "pluto.db") as store:
        pairing = store.pairing
        await pairing.migrate()  # idempotent
        a, b = await asyncio.gather(pairing.request("t", "1", "1", None, 60),
                                    pairing.request("t", "1", "1", None, 60))
        assert a.code == b.code and [a.new, b.new].count(True) == 1
        assert normalize_code(f" {format_code(a.code).lower()} ") == a.code
        with pytest.raises(PairingError):
            await pairing.approve("NOPE-NOPE", by="x")
        await pairing.approve(a.code, by="x")
        assert await pairing.is_approved("t", "1") and not await pairing.is_approved("u", "1")
        assert await pairing.revoke("t", "1") and not await pairing.revoke("t", "1")
        assert not await pairing.is_approved("t", "1")


def test_pairing_cli_approves_and_lists(config_dir: Path, data_dir: Path) -> None:
    async def ask() -> str:
        async with SqliteStore(data_dir / "pluto.db") as store:
            pairing = store.pairing
            return (await pairing.request("telegram", "42", "42", "Ada", 600)).code

    code = asyncio.run(ask())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}

    def pluto(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pluto.gateway.cli", "pairing", *args,
                               "--config", str(config_dir), "--data-dir", str(data_dir)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)

    listed = pluto("list")
    assert listed.returncode == 0 and format_code(code) in listed.stdout and "Ada" in listed.stdout
    wrong = pluto("approve", "ZZZZ-ZZZZ")
    assert wrong.returncode == 1 and "no pending pairing request" in wrong.stderr
    ok = pluto("approve", format_code(code))
    assert ok.returncode == 0 and "approved telegram user 42 (Ada)" in ok.stdout
    assert "telegram\tuser 42\tAda" in pluto("list").stdout
    assert pluto("revoke", "--provider", "telegram", "--user", "42").returncode == 0
    assert pluto("revoke", "--provider", "telegram", "--user", "42").returncode == 1


LIMITED = """
routes:
  - name: limited
    match: {provider: telegram}
    agent: default
    session: user
    rate_limit: {user: 2/minute, chat: 3/minute}
"""


async def test_rate_limit_answers_with_one_notice_per_streak(make_gw) -> None:
    gw, p = await make_gw(LIMITED)
    clock = Clock()
    gw.access.limiter.clock = clock
    for i in range(5):
        await p.say(f"m{i}", user="1")
    await settle(gw)
    assert texts(p, "reply") == ["echo: m0", "echo: m1"]
    [notice] = texts(p, "notice")
    assert "You are sending messages faster" in notice and "2 per minute" in notice
    await p.say("/help", user="1")  # commands are not counted, and are answered
    await settle(gw)
    assert "show what I can do" in "".join(texts(p, "reply"))
    clock.now += 30  # one message refilled
    await p.say("m5", user="1")
    await p.say("m6", user="1")  # a new streak: one new notice
    await p.say("m7", user="1")
    await settle(gw)
    assert texts(p, "reply")[-1] == "echo: m5" and len(texts(p, "notice")) == 2


async def test_chat_limit_is_shared_by_everyone_in_the_chat(make_gw) -> None:
    gw, p = await make_gw(LIMITED)
    gw.access.limiter.clock = Clock()
    for user in ("1", "2", "3", "4", "5"):
        await p.say(f"from {user}", user=user, chat="group", is_direct=False)
    await p.say("elsewhere", user="5", chat="other")
    await settle(gw)
    assert sorted(texts(p, "reply")) == ["echo: elsewhere", "echo: from 1", "echo: from 2",
                                         "echo: from 3"]
    [notice] = texts(p, "notice")
    assert notice.startswith("This chat is sending messages faster")


@pytest.mark.parametrize("text, count, seconds", [
    ("5/minute", 5, 60), ("5 per minute", 5, 60), ("100/hours", 100, 3600), ("3/10s", 3, 10),
    ("1/day", 1, 86400), ("2/0.5s", 2, 0.5), ("7/min", 7, 60),
])
def test_parse_rate(text: str, count: int, seconds: float) -> None:
    assert parse_rate(text) == Rate(count, seconds)


@pytest.mark.parametrize("bad", ["", "5", "five/minute", "5/fortnight", "0/minute", "-1/s",
                                 "5/0s", None, 3.5, ["5/m"]])
def test_parse_rate_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a rate|at least 1"):
        parse_rate(bad)


def test_limiter_refills_forgets_and_caps_memory() -> None:
    clock = Clock()
    limiter = RateLimiter(clock=clock, max_keys=10)
    rate = Rate(1, 10)
    assert limiter.acquire([("a", rate)]) is None
    first = limiter.acquire([("a", rate)])
    assert first is not None and first.notify and first.retry_after == pytest.approx(10)
    again = limiter.acquire([("a", rate)])
    assert again is not None and not again.notify
    clock.now += 10
    assert limiter.acquire([("a", rate)]) is None
    # both buckets or none: a user within limits is not charged when the chat is over
    assert limiter.acquire([("u", Rate(5, 10)), ("a", rate)]) is not None
    for _ in range(5):  # the user's bucket is still full: five go, the sixth is refused
        assert limiter.acquire([("u", Rate(5, 10))]) is None
    assert limiter.acquire([("u", Rate(5, 10))]) is not None
    for i in range(2000):
        limiter.acquire([(i, rate)])
    assert len(limiter) <= 10


def test_once_per() -> None:
    clock = Clock()
    once = OncePer(60, clock=clock, max_keys=3)
    assert once.due("a") and not once.due("a")
    clock.now += 61
    assert once.due("a")
    for k in "bcdef":
        once.due(k)
    assert len(once) <= 3


async def test_only_a_providers_own_route_skips_the_access_rules(make_gw) -> None:
    """The widget looks routes up for its tabs (``route``): its messages still go through the
    routing table's access rules; only ``own_route`` (the console's test chat) names a route."""
    gw, _ = await make_gw("routes:\n  - {match: {user: '13'}, deny: true}\n")

    class LooksRoutesUp(RecordingProvider):
        def route(self, probe: IncomingMessage) -> Route | None:
            return Route(agent="default", session_key="anything")

    p = LooksRoutesUp("web")
    gw.add_provider(p)
    await p.running.wait()
    await p.say("let me in", user="13")
    await p.say("hello", user="14")
    await settle(gw)
    assert texts(p) == ["echo: hello"]
