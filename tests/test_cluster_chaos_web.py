"""The chat widget on three ``pluto serve`` sharing one PostgreSQL, under the random faults of
tests/test_cluster_chaos.py: instances killed and restarted, stopped past their lease, every
database connection cut. What the widget's visitors must see through all of it, as a person
at the page would judge it: every message answered once, in order, no answer shown twice, none
left half-written, nothing lost — whether the tab's socket died with its instance, hung on a
stopped one, or the answer ran on an instance the tab never spoke to.

Each visitor is a :class:`Visitor`, which behaves as providers/web/static/widget.js does: it
keeps its session token, redraws the chat from the ``history`` frame after each (re)connect,
sends again (same ids) the messages not yet acknowledged, and opens a closed socket again — on
the next instance, as a round-robin balancer would (one that does not answer the handshake
within a few seconds, a stopped one, is passed over, as a balancer's health check would). A
socket that says nothing for ``ping_seconds`` after a frame that expects an answer (a message,
a ping after as long with nothing heard) is dropped for the next, as the widget drops one on a
stopped instance.

PostgreSQL: ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py); without it the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.pg import connect, fresh_schema
from tests.test_cluster import answer_to
from tests.test_cluster_chaos import SEEDS, Chaos
from tests.test_cluster_faults import Cluster

VISITORS = 12
ROUNDS = 20  # one round (a message from every visitor) every ROUND_SECONDS
ROUND_SECONDS = 1.25
HANDSHAKE_SECONDS = 3.0  # a balancer's patience with an instance that does not answer
PING_SECONDS = 2.0  # the instances' providers.web.ping_seconds


@dataclass
class Bubble:
    """One message the tab shows: the visitor's (``run_id`` None; ``id`` the tab's, ``run_of``
    the run it started, as the history says) or an answer."""
    text: str
    run_id: str | None = None
    final: bool = False
    error: str | None = None
    id: str | None = None
    run_of: str | None = None


@dataclass
class Visitor:
    """One widget tab (see the module's docstring)."""
    name: str
    ports: list[int]
    http: aiohttp.ClientSession
    turn: itertools.count[int]
    token: str | None = None
    pending: dict[str, str] = field(default_factory=dict)  # sent, not acknowledged: id -> text
    view: list[Bubble] = field(default_factory=list)
    ws: aiohttp.ClientWebSocketResponse | None = None
    ready: bool = False
    connects: int = 0
    silences: int = 0  # sockets dropped for saying nothing
    problems: list[str] = field(default_factory=list)
    ping_seconds: float = 15.0  # as ready says
    expect_by: float | None = None  # an answer expected by then (a frame sent, monotonic)

    async def say(self, mid: str, text: str) -> None:
        self.pending[mid] = text
        self.view.append(Bubble(text, id=mid))
        if self.ready:
            await self._send(mid, text)

    async def _send(self, mid: str, text: str) -> None:
        if self.ws is None:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):  # closing: sent after the next
            await self.ws.send_json({"type": "message", "id": mid, "text": text})  # history
            if self.expect_by is None:
                self.expect_by = time.monotonic() + self.ping_seconds

    def _bubble(self, run_id: str, message_id: str | None = None) -> Bubble:
        """The answer's bubble; a new one goes after the message it answers (and that
        message's answers drawn already), else at the end — as the widget draws it."""
        for b in self.view:
            if b.run_id == run_id:
                return b
        b = Bubble("", run_id)
        at = next((i for i, q in enumerate(self.view) if q.run_id is None and q.run_of == run_id),
                  None)
        if at is not None and self.view[at].id is None:
            self.view[at].id = message_id  # (learnt: a run answering it again goes here too)
        if at is None and message_id is not None:
            at = next((i for i, q in enumerate(self.view) if q.run_id is None and
                       q.id == message_id), None)
        if at is None:
            self.view.append(b)
            return b
        while at + 1 < len(self.view) and self.view[at + 1].run_id is not None:
            at += 1
        self.view.insert(at + 1, b)
        return b

    async def _frame(self, f: dict[str, Any]) -> None:
        kind = f.get("type")
        if kind == "ready":
            self.token = f["token"]
            self.ping_seconds = float(f.get("ping_seconds") or 15)
        elif kind == "history":
            self.view = []
            for m in f["messages"]:
                if m["role"] == "user":
                    self.view.append(Bubble(m["text"], id=m.get("id"), run_of=m.get("run_id")))
                elif m["role"] == "assistant":
                    b = self._bubble(m["run_id"])
                    b.text = f"{b.text}\n\n{m['text']}" if b.text else m["text"]
                    b.final = True
                elif m["role"] == "run.end" and m.get("error"):
                    self._bubble(m["run_id"]).error = m["error"]
            recorded = {m.get("id") for m in f["messages"] if m["role"] == "user"}
            self.pending = {k: t for k, t in self.pending.items() if k not in recorded}
            shown = {b.text for b in self.view if b.run_id is None}
            self.view += [Bubble(t, id=k) for k, t in self.pending.items() if t not in shown]
            self.ready = True
            for mid, text in list(self.pending.items()):
                await self._send(mid, text)
        elif kind == "ack":
            self.pending.pop(f["reply_to"], None)
        elif kind == "run.start":
            self._bubble(f["run_id"], f.get("message_id"))
        elif kind == "message.delta":
            b = self._bubble(f["run_id"])
            if not b.final:
                b.text += f["text"]
        elif kind == "message.final":
            b = self._bubble(f["run_id"])
            b.text, b.final = f["text"], True
        elif kind == "run.end" and f.get("outcome") == "interrupted":
            # cut off (its instance stopped): answered again by a run of its own
            self.view = [b for b in self.view if b.run_id != f["run_id"]]
        elif kind == "run.end":
            b = self._bubble(f["run_id"])
            b.final = True
            if not b.text and b.error is None:
                self.view.remove(b)  # (as the widget: an answer that said nothing is not drawn)
        elif kind == "error":
            if f.get("code") == "not_received":  # storage failed: sent again after the wait
                asyncio.get_running_loop().call_later(
                    float(f.get("retry_after") or 1), self._again, f.get("reply_to"))
            elif f.get("run_id"):
                b = self._bubble(f["run_id"])
                b.final, b.error = True, f["message"]
            else:
                self.problems.append(f"error frame {f}")
        elif kind == "notice":
            self.problems.append(f"notice {f.get('text')!r}")

    def _again(self, mid: str | None) -> None:
        if mid in self.pending and self.ready:
            asyncio.ensure_future(self._send(mid, self.pending[mid]))

    async def run(self) -> None:
        """Connected, reconnected, for ever (cancelled when the test is over)."""
        while True:
            port = self.ports[next(self.turn) % len(self.ports)]
            self.ready = False
            try:
                async with asyncio.timeout(HANDSHAKE_SECONDS):
                    ws = await self.http.ws_connect(f"http://127.0.0.1:{port}/ws")
            except (TimeoutError, aiohttp.ClientError, OSError):
                await asyncio.sleep(0.2)  # (the widget's back-off, shortened)
                continue
            self.ws = ws
            self.connects += 1
            try:
                await ws.send_json({"type": "hello", "token": self.token, "agent": None})
                async with asyncio.timeout(HANDSHAKE_SECONDS):
                    while not self.ready:  # ready, then the history
                        msg = await ws.receive()
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            raise ConnectionError(f"closed before the history: {msg.type}")
                        await self._frame(msg.json())
                await self._listen(ws)
            except (TimeoutError, ConnectionError, aiohttp.ClientError, OSError):
                pass  # (a stopped instance's handshake, a killed one's socket: the next one)
            finally:
                self.ready = False
                self.ws = None
                await ws.close()
            await asyncio.sleep(0.2)

    async def _listen(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Frames until the socket closes, or says nothing for ``ping_seconds`` after a frame
        that expects an answer (ConnectionError): a stopped instance keeps it open."""
        heard, self.expect_by = time.monotonic(), None
        while True:
            now = time.monotonic()
            if self.expect_by is not None and now >= self.expect_by:
                self.silences += 1
                raise ConnectionError("the socket said nothing")
            if self.expect_by is None and now - heard >= self.ping_seconds:
                await ws.send_json({"type": "ping"})
                self.expect_by = now + self.ping_seconds
            until = heard + self.ping_seconds if self.expect_by is None else self.expect_by
            try:
                msg = await ws.receive(timeout=max(0.05, until - now))
            except TimeoutError:
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                return
            heard, self.expect_by = time.monotonic(), None
            await self._frame(msg.json())

    def answers(self) -> list[Bubble]:
        return [b for b in self.view if b.run_id is not None]


async def history_of(http: aiohttp.ClientSession, port: int, token: str) -> list[dict[str, Any]]:
    """What a new tab of this visitor is shown."""
    async with http.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
        await ws.send_json({"type": "hello", "token": token, "agent": None})
        async with asyncio.timeout(30):
            async for msg in ws:
                frame = msg.json()
                if frame["type"] == "history":
                    return list(frame["messages"])
    raise AssertionError("no history")


def what_became_of(db_url: str, names: list[str]) -> str:
    """The inbox rows and runs of these visitors' messages (for a failure's report)."""
    out = []
    with connect(db_url) as conn:
        for name in names[:3]:
            rows = conn.execute(
                "SELECT i.message_id, i.handled, i.outcome, r.status, r.owner, r.id"
                " FROM inbound_seen i LEFT JOIN runs r ON r.source_provider = i.provider"
                " AND r.source_id = i.message_id WHERE i.provider = 'web' AND i.payload LIKE %s"
                " ORDER BY i.rowid, r.started_at", (f"%{name} m%",)).fetchall()
            out.append(f"{name}:\n    " + "\n    ".join(map(str, rows)))
    return "\n".join(out)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
async def test_widget_visitors_of_three_instances_under_random_faults_see_each_answer_once_in_order(
        tmp_path: Path, config_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, config_dir, "chaos-web", proxied=True)
    chaos = Chaos(cluster, rng, kinds=("kill", "pause", "pause", "cut"))
    texts = {v: [f"v{v} m{r}" for r in range(ROUNDS)] for v in range(VISITORS)}
    expected = {v: [answer_to(t) for t in texts[v]] for v in range(VISITORS)}
    tasks: list[asyncio.Task[None]] = []
    with fresh_schema() as db_url:
        async with aiohttp.ClientSession() as http:
            try:
                await cluster.start(db_url, chats=[], delay=0.15, mode="polling",
                                    web={"rate_messages": 1000, "rate_seconds": 60,
                                         "ping_seconds": PING_SECONDS})
                visitors = [Visitor(f"v{v}", cluster.ports, http, itertools.count(v))
                            for v in range(VISITORS)]
                tasks = [asyncio.create_task(v.run()) for v in visitors]

                async def traffic() -> None:
                    for r in range(ROUNDS):
                        for v, visitor in enumerate(visitors):
                            await visitor.say(f"m{r}", texts[v][r])
                        await asyncio.sleep(ROUND_SECONDS)  # the traffic's pace

                sending = asyncio.create_task(traffic())
                await cluster.model.wait_for_requests(VISITORS, timeout=60)  # under way
                chaos.t0 = time.monotonic()
                await chaos.run(time.monotonic() + (ROUNDS - 3) * ROUND_SECONDS)
                await sending

                def done(v: int) -> bool:
                    shown = visitors[v].answers()
                    return (not visitors[v].pending and all(b.final for b in shown)
                            and {b.text for b in shown} >= set(expected[v]))

                deadline = time.monotonic() + 300
                while time.monotonic() < deadline and not all(map(done, range(VISITORS))):
                    await asyncio.sleep(0.5)
                report = (f"chaos (seed {seed}): {VISITORS * ROUNDS} messages; faults:\n  "
                          + "\n  ".join(chaos.log))
                for v, visitor in enumerate(visitors):
                    if not done(v):
                        report += f"\n{visitor.name} ({visitor.connects} connects, pending " \
                                  f"{list(visitor.pending)}) shows:\n    " + "\n    ".join(
                                      f"{b.run_id} {b.final} {b.error} {b.text!r}"
                                      for b in visitor.view)
                if not all(map(done, range(VISITORS))):
                    print(report)
                    print(what_became_of(db_url, [visitors[v].name for v in range(VISITORS)
                                                  if not done(v)]))
                for v, visitor in enumerate(visitors):
                    shown = [(b.text, b.final, b.error) for b in visitor.answers()]
                    assert not visitor.pending, (visitor.name, visitor.pending, report)
                    # the tab, as the visitor sees it now: each answer once, complete, in order
                    if shown != [(a, True, None) for a in expected[v]]:
                        print(visitor.name, "shows:\n   ", "\n    ".join(
                            f"{b.id} {b.run_of} {b.run_id} {b.final} {b.text!r}"
                            for b in visitor.view))
                        print(what_became_of(db_url, [visitor.name]))
                    assert shown == [(a, True, None) for a in expected[v]], (
                        visitor.name, shown, report)
                    # and the visitor's own messages, each once, in order
                    said = [b.text for b in visitor.view if b.run_id is None]
                    assert said == texts[v], (visitor.name, said, report)
                    assert not visitor.problems, (visitor.name, visitor.problems, report)
                    assert visitor.token is not None
                    # and a new tab (a reload) on any instance: the same, with the messages
                    items = await history_of(http, cluster.ports[v % 3], visitor.token)
                    said = [m["text"] for m in items if m["role"] == "user"]
                    answered = [m["text"] for m in items if m["role"] == "assistant"]
                    if said != texts[v] or answered != expected[v]:
                        print(visitor.name, "history:\n   ", "\n    ".join(
                            f"{m['role']} {m.get('run_id')} {m.get('ts')} {m['text']!r}"
                            for m in items))
                        print(what_became_of(db_url, [visitor.name]))
                    assert said == texts[v], (visitor.name, items, report)
                    assert answered == expected[v], (visitor.name, items, report)
                    assert not [m for m in items if m["role"] == "run.end"], (items, report)
                reconnects = sum(v.connects - 1 for v in visitors)
                silences = sum(v.silences for v in visitors)
                print(f"{report}\n  -> every answer shown once, in order, in every tab; "
                      f"{reconnects} reconnects ({silences} of a socket that said nothing)")
                for serve in cluster.instances:
                    assert await serve.stop() == 0
                    log = serve.log.read_text(errors="replace")
                    assert "Traceback" not in log, log[-3000:]
            except BaseException:
                print("\n".join(chaos.log))
                for i, serve in enumerate(cluster.instances):
                    print(f"--- instance {i} ---\n{serve.tail()}")
                raise
            finally:
                for task in [*tasks, *chaos.tasks]:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for serve in cluster.instances:  # (a stopped one cannot die of SIGTERM)
                    if serve.proc is not None and serve.proc.returncode is None:
                        serve.proc.send_signal(signal.SIGCONT)
                await cluster.stop()
