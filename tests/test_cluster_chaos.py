"""Three ``pluto serve`` on one PostgreSQL and the fake Telegram (long polling), under faults
drawn at random while the traffic flows — the way production breaks, several things at once:

- ``kill``: an instance is killed (SIGKILL) and started again 0.5-3 s later;
- ``pause``: an instance is stopped (SIGSTOP) for 1-20 s — often past its 5 s lease, so its
  chats are taken elsewhere meanwhile — then continued;
- ``cut``: every connection the instances hold to PostgreSQL is terminated at once;
- ``flood``: Telegram answers every send, edit and typing call with 429 for 1-4 s.

A fault every 0.5-2 s; at times all three instances are down at once. The schedule comes
from a seeded random generator: the seed is printed, and ``CHAOS_SEEDS=7,8`` replays (or
widens) the run. Every message's answer names it, and the chats must end as the scenario
tests of tests/test_cluster.py say: each message answered, once, each chat in order. Two things
the platform makes unknowable are told apart from faults, as there: a preview a killed instance had shown but never recorded (its
id died with it) stays behind as a leftover, and a reply a stopped instance had in flight when
it stopped may be sent again by the chat's new holder — only with a "may have been delivered"
line in its log (no bot API tells whether a send that got no answer went through).

PostgreSQL: ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py); without it the test fails.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.conformance.test_kill import Serve
from tests.helpers.inspect_store import opened, platform_messages, until_nothing_left_to_deliver
from tests.helpers.pg import fresh_schema
from tests.test_chat_order import WindowedTelegram
from tests.test_cluster import answer_to, wait_ready
from tests.test_cluster_faults import Cluster, terminate_backends

# (13: the schedule that found a chat answered out of order — tests/test_cluster_inprocess.py,
# "notes missed" — reproduced at each of its runs before the fix)
SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "1,13").split(",") if s.strip()]
CHATS = 12
ROUNDS = 24  # one round (a message to every chat) every ROUND_SECONDS
ROUND_SECONDS = 1.25
DOWN_AT_ONCE = 3  # instances killed or stopped at the same time, at most (all: an outage)


class Chaos:
    """The faults, drawn from ``rng`` and applied to ``cluster`` while the traffic flows;
    what happened is kept for the assertions (``log``) and the report."""

    def __init__(self, cluster: Cluster, rng: random.Random,
                 kinds: tuple[str, ...] = ("kill", "pause", "pause", "cut", "flood")):
        self.cluster, self.rng, self.kinds = cluster, rng, kinds
        self.down: set[int] = set()
        self.killed_at: dict[int, list[float]] = {}
        self.log: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.t0 = time.monotonic()

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.t0:5.1f}s {what}")

    async def kill(self, i: int) -> None:
        serve = self.cluster.instances[i]
        assert serve.proc is not None
        await serve.stop(signal.SIGKILL)
        self.killed_at.setdefault(i, []).append(time.monotonic())
        pause = self.rng.uniform(0.5, 3.0)
        self.note(f"kill {i}, back in {pause:.1f}s")
        await asyncio.sleep(pause)  # (the time it stays dead: the fault itself)
        await serve.start("--port", str(self.cluster.ports[i]))
        await wait_ready(self.cluster.ports[i])
        self.down.discard(i)

    async def pause(self, i: int) -> None:
        serve = self.cluster.instances[i]
        assert serve.proc is not None
        seconds = self.rng.uniform(1.0, 20.0)
        self.note(f"stop {i} for {seconds:.1f}s")
        serve.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)  # (the time it stays stopped: the fault itself)
        finally:
            serve.proc.send_signal(signal.SIGCONT)
        self.down.discard(i)

    def one(self) -> None:
        kind = self.rng.choice(self.kinds)
        if kind in ("kill", "pause"):
            up = [i for i in range(len(self.cluster.instances)) if i not in self.down]
            if len(self.down) >= DOWN_AT_ONCE or not up:
                kind = "cut"
            else:
                i = self.rng.choice(up)
                self.down.add(i)
                self.tasks.append(asyncio.create_task(
                    self.kill(i) if kind == "kill" else self.pause(i)))
                return
        if kind == "cut":
            assert self.cluster.proxy is not None
            self.note(f"cut {terminate_backends(self.cluster.proxy.upstream_ports())} "
                      "database connections")
        else:
            seconds = self.rng.uniform(1.0, 4.0)
            assert isinstance(self.cluster.telegram, WindowedTelegram)
            self.cluster.telegram.close_for(seconds)
            self.note(f"Telegram answers 429 for {seconds:.1f}s")

    async def run(self, until: float) -> None:
        await asyncio.sleep(self.rng.uniform(1.0, 3.0))
        while time.monotonic() < until:
            self.one()
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))  # (the schedule: faults' pace)
        await asyncio.gather(*self.tasks)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
async def test_three_instances_under_random_faults_answer_every_message_once_in_order(
        tmp_path: Path, config_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    chats = [8000 + i for i in range(CHATS)]
    expected = {c: [answer_to(f"tg{c} m{r}") for r in range(ROUNDS)] for c in chats}
    cluster = Cluster(tmp_path, config_dir, "chaos", proxied=True)
    cluster.telegram = WindowedTelegram()
    chaos = Chaos(cluster, rng)
    with fresh_schema() as db_url:
        try:
            await cluster.start(db_url, chats=chats, delay=0.15, mode="polling")

            async def traffic() -> None:
                for r in range(ROUNDS):
                    for c in chats:
                        cluster.telegram.inject_message(c, f"tg{c} m{r}")
                    await asyncio.sleep(ROUND_SECONDS)  # the traffic's pace

            sending = asyncio.create_task(traffic())
            await cluster.model.wait_for_requests(CHATS, timeout=60)  # answers under way
            chaos.t0 = time.monotonic()
            await chaos.run(time.monotonic() + (ROUNDS - 3) * ROUND_SECONDS)
            await sending
            orphans: set[tuple[int, str]] = set()

            shown = cluster.shown_with_ids

            def complete(c: int) -> list[str]:
                want = set(expected[c])
                return [t for t, mid in shown(c) if t in want and (c, mid) not in orphans]

            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not all(
                    len(set(complete(c))) >= ROUNDS for c in chats):
                await asyncio.sleep(0.5)
            async with opened(db_url) as store:  # nothing left that could be sent twice later
                await until_nothing_left_to_deliver(store)
                known = await platform_messages(store, "telegram")
            # a preview shown by an instance killed before it recorded the preview's id: nobody
            # knows it, and it has not changed since that instance died (as tests/test_cluster)
            last_kill = max((t for ts in chaos.killed_at.values() for t in ts), default=0.0)
            orphans = {(c, mid) for c in chats for _, mid in shown(c)
                       if (str(c), mid) not in known
                       and cluster.telegram.last_change(c, int(mid)) <= last_kill}
            missing = {c: ROUNDS - len(set(complete(c))) for c in chats
                       if len(set(complete(c))) < ROUNDS}
            report = (f"chaos (seed {seed}): {CHATS * ROUNDS} messages; faults:\n  "
                      + "\n  ".join(chaos.log))
            assert not missing, f"chats still missing answers: {missing}\n{report}"
            flagged = sum(serve.log.read_text(errors="replace").count("may have been delivered")
                          for serve in cluster.instances)
            resent = leftovers = 0
            for c in chats:
                once = list(dict.fromkeys(complete(c)))
                assert once == expected[c], (c, shown(c), report)  # in order
                resent += len(complete(c)) - len(once)
                for text, mid in shown(c):
                    if text not in expected[c]:  # a preview cut off, or a killed one's
                        assert any(a.startswith(text) for a in expected[c]), (c, text, report)
                        leftovers += 1
            assert resent <= flagged, (resent, flagged, report)
            print(f"{report}\n  -> every message answered in order; {resent} sent again after "
                  f"an unknown outcome ({flagged} flagged); {leftovers} partial preview(s) "
                  f"left, {len(orphans)} of them never recorded")
            for serve in cluster.instances:
                assert await serve.stop() == 0
                log = serve.log.read_text(errors="replace")
                assert "Traceback" not in log, log[-3000:]
                assert cluster.telegram.token not in log
        except BaseException:
            print("\n".join(chaos.log))
            for i, serve in enumerate(cluster.instances):
                print(f"--- instance {i} ---\n{serve.tail()}")
            raise
        finally:
            for task in chaos.tasks:
                task.cancel()
            for serve in cluster.instances:  # (a stopped one cannot die of SIGTERM)
                if serve.proc is not None and serve.proc.returncode is None:
                    serve.proc.send_signal(signal.SIGCONT)
            await cluster.stop()
