"""Several instances on one PostgreSQL: tokens that only grow, every write of a run fenced by
its chat's claim in the same statement, an outage every instance saw handing nothing around,
and one clock (the database's) for every decision between instances.

PostgreSQL: ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py); without it the tests fail.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

import pluto.gateway.cluster as cluster_module
from pluto.errors import RunTakenOver
from pluto.events import MessageDelta, MessageFinal, RunEnd, RunStart, ToolEnd
from pluto.gateway.cluster import Cluster
from pluto.gateway.delivery.outbox import Outbox
from pluto.storage.postgres import PostgresStore
from pluto.types import OutgoingMessage
from tests.helpers.gateway import RecordingProvider
from tests.helpers.pg import fresh_schema


@pytest.fixture
async def two() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two instances' stores on one database (schema)."""
    with fresh_schema() as url:
        async with PostgresStore(url) as a, PostgresStore(url) as b:
            a.conversations.owner, b.conversations.owner = "a", "b"
            yield a, b


async def expire(store: PostgresStore, name: str) -> None:
    """``name`` ran out (its holder stopped renewing it): on the database's clock."""
    await store.engine.write(("UPDATE leases SET until = 0 WHERE name = ?", (name,)))


async def test_a_token_only_grows_even_across_releases(two) -> None:
    a, b = two
    first = await a.leases.acquire("chat:t:1", "a", 30)
    assert first is not None
    assert await a.leases.release("chat:t:1", "a", first)
    again = await b.leases.acquire("chat:t:1", "b", 30)  # free: taken anew
    assert again is not None and again > first
    assert await b.leases.take("chat:t:1", "b", 30) == (again, False)  # its own: same token
    await expire(b, "chat:t:1")
    took = await a.leases.take("chat:t:1", "a", 30)
    assert took is not None and took[0] > again and took[1]  # taken from b


async def test_a_lease_that_ran_out_is_taken_over_only_when_the_taker_says_so(two) -> None:
    a, b = two
    token = await a.leases.acquire("chat:t:2", "a", 30)
    await expire(a, "chat:t:2")
    assert await b.leases.acquire("chat:t:2", "b", 30, takeover=False) is None
    assert await a.leases.renew_all("a", {"chat:t:2": token}, 30) == set()  # a still has it
    assert (await b.leases.holder("chat:t:2")).owner == "a"
    assert await b.leases.acquire("chat:t:3", "b", 30, takeover=False) is not None  # free


async def run_under_claim(store: PostgresStore, run_id: str, msg_id: str, claim):  # type: ignore[no-untyped-def]
    conv = store.conversations
    await store.inbound.accept("telegram", msg_id, {"chat_id": "1", "text": "hi",
                                                    "message_id": msg_id})
    conv.claim(("telegram", msg_id), claim)
    session = await conv.session("agent/telegram/1", "agent")
    await conv.start_run(run_id, session.id, "agent", "hi",
                         RunStart(run_id=run_id, session_id=session.id, agent="agent"),
                         source=("telegram", msg_id))
    return session


@pytest.mark.parametrize("by_a", ["hand back", "stop"])
async def test_a_run_ended_by_two_instances_at_once_is_ended_once(two, by_a: str) -> None:
    """A hands its stranded run back (its outage is over) — or a user stops it there — while B
    takes the chat over: both look the run up, both would write its end (a hand-back with the
    same seq). The second waits for the first and finds the run ended: one end, no duplicate
    key, no traceback (a fault scenario's log had one)."""
    a, b = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    await run_under_claim(a, "r1", "m1", (lease, token))
    await a.conversations.append_event(MessageDelta(run_id="r1", text="half an answer"))
    gate = threading.Event()
    locked = threading.Event()

    def hold(conn):  # type: ignore[no-untyped-def]
        # (a third connection) nobody writes events until the gate opens: both takers get
        # as far as they can before their write
        conn.execute("LOCK TABLE run_events IN EXCLUSIVE MODE")
        locked.set()
        gate.wait(30)

    async with PostgresStore(a.engine.url) as c:
        holding = asyncio.ensure_future(c.engine.transact(hold))
        await asyncio.to_thread(locked.wait, 30)
        session = await a.conversations.session("agent/telegram/1", "agent")
        handing_back = asyncio.ensure_future(
            a.conversations.recover_runs(["r1"]) if by_a == "hand back" else
            a.conversations.cancel_run("r1", session.id, "agent", "hi",
                                       RunEnd(run_id="r1", outcome="cancelled"),
                                       error="stopped by the user", source=("telegram", "m1")))
        taking = asyncio.ensure_future(b.conversations.take_over_chat("telegram", "1"))

        async def waiting() -> int:
            row = await c.engine.fetchone(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()")
            return int(row[0])

        deadline = time.monotonic() + 30
        while await waiting() < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # both takers blocked: one on the table, one before
        assert await waiting() >= 2
        gate.set()
        await holding
        results = await asyncio.gather(handing_back, taking, return_exceptions=True)
    assert not any(isinstance(r, BaseException) for r in results), results
    ended = [e for r in results for e in ([] if r is None else r if isinstance(r, list)
                                          else [r])]
    ends = [e for e in await b.conversations.events("r1") if e.type == "run.end"]
    assert len(ended) == 1 and ends == ended, (ended, ends)


async def test_a_taken_over_runs_writes_are_refused_and_leave_no_history(two) -> None:
    a, b = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    session = await run_under_claim(a, "r1", "m1", (lease, token))
    # a tool call and its result, written while a holds the chat
    await a.conversations.add_message(session.id, "assistant", None, run_id="r1",
                                      tool_calls=[{"id": "c1", "type": "function", "function":
                                                   {"name": "sql", "arguments": "{}"}}])
    await a.conversations.append_event(MessageDelta(run_id="r1", text="thinking"))
    # a stops renewing (paused); b takes the chat over and the run with it
    await expire(b, lease)
    took = await b.leases.take(lease, "b", 30)
    assert took is not None and took[1]
    taken = await b.conversations.take_over_chat("telegram", "1")
    assert [e.run_id for e in taken] == ["r1"]
    # a resumes: every write of its run is refused, in the statement that makes it
    with pytest.raises(RunTakenOver):
        await a.conversations.add_message(session.id, "tool", "42", run_id="r1",
                                          tool_call_id="c1", name="sql",
                                          event=ToolEnd(run_id="r1", call_id="c1", name="sql",
                                                        content="42"))
    with pytest.raises(RunTakenOver):
        await a.conversations.append_event(MessageDelta(run_id="r1", text="late"))
    with pytest.raises(RunTakenOver):
        await a.conversations.complete_run("r1", session.id, MessageFinal(run_id="r1",
                                                                          text="stale"),
                                           RunEnd(run_id="r1", outcome="ok"), usage={})
    # the history the re-run reads holds nothing of the taken-over run
    assert await b.conversations.messages(session.id) == []
    events = await b.conversations.events("r1")
    assert [e.type for e in events][-1] == "run.end"
    assert not any(getattr(e, "text", None) in ("late", "stale") for e in events)
    assert await b.inbound.unhandled_in_chat("telegram", "1") != []  # answered again, by b


async def test_a_run_that_finds_its_message_answered_elsewhere_ends_on_the_record(two) -> None:
    """A took a message up and was paused before its run began; B took the chat over and
    answered the message with a run of its own. A resumes and begins its run: refused — and
    ended on the record, with its end event, which the error carries for A's watchers. Before,
    its row said interrupted with no end event: a widget tab shown the run from A (accepted
    there) followed it for ever, and was never shown B's answer
    (tests/test_cluster_chaos_web.py, seed 2: an answer missing from the tabs that stayed)."""
    a, b = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    await a.inbound.accept("telegram", "m1", {"chat_id": "1", "text": "hi", "message_id": "m1"})
    a.conversations.claim(("telegram", "m1"), (lease, token))
    await expire(b, lease)
    took = await b.leases.take(lease, "b", 30)
    assert took is not None
    await run_under_claim(b, "r2", "m1", (lease, took[0]))
    session = await a.conversations.session("agent/telegram/1", "agent")
    with pytest.raises(RunTakenOver) as refused:
        await a.conversations.start_run("r1", session.id, "agent", "hi",
                                        RunStart(run_id="r1", session_id=session.id,
                                                 agent="agent"), source=("telegram", "m1"))
    end = refused.value.end
    assert isinstance(end, RunEnd) and end.outcome == "interrupted"
    assert await b.conversations.events("r1") == [end]  # what a follower anywhere reads
    run = await b.conversations.run("r1")
    assert run is not None and run.status == "interrupted"
    assert await b.inbound.unhandled_in_chat("telegram", "1") == []  # B's run has it


async def test_a_run_handed_back_does_not_put_back_a_message_another_run_answers(two) -> None:
    """A's run could not even be ended (storage failed as it found its message answered
    elsewhere): A hands it back once storage works — it is ended, and its message, which B's
    run answers, stays B's: put back in the inbox it would be answered twice."""
    a, b = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    await run_under_claim(a, "r1", "m1", (lease, token))
    await expire(b, lease)
    took = await b.leases.take(lease, "b", 30)
    assert took is not None
    # B answers the message (as if it had taken the chat over while A's row said queued)
    await b.engine.write(("UPDATE inbound_seen SET outcome = ? WHERE message_id = 'm1'",
                          (json.dumps({"type": "accepted", "run_id": "r2"}),)))
    ended = await a.conversations.recover_runs(["r1"])
    assert [e.run_id for e in ended] == ["r1"]
    assert await b.inbound.unhandled_in_chat("telegram", "1") == []
    # a run whose message is still its own is answered again, as before
    await run_under_claim(a, "r3", "m3", (lease, took[0]))
    await a.conversations.recover_runs(["r3"])
    assert [m["message_id"] for m in await b.inbound.unhandled_in_chat("telegram", "1")] == ["m3"]


async def test_a_history_copy_read_before_a_take_over_is_not_used_after_it(two) -> None:
    """The messages of a taken-over run are deleted before it is answered again: an instance
    that read them with the session earlier reads the session's history whole again."""
    a, b = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    session = await run_under_claim(a, "r1", "m1", (lease, token))
    await a.conversations.session("agent/telegram/1", "agent")  # (its copy holds "hi")
    assert [m["content"] for m in await a.conversations.history(session.id, 10, 10_000)] == \
        ["hi"]
    await expire(b, lease)
    assert await b.leases.take(lease, "b", 30) is not None
    assert [e.run_id for e in await b.conversations.take_over_chat("telegram", "1")] == ["r1"]
    await a.conversations.session("agent/telegram/1", "agent")
    assert await a.conversations.history(session.id, 10, 10_000) == []


async def test_a_run_whose_claim_still_holds_writes_and_completes(two) -> None:
    a, _ = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    session = await run_under_claim(a, "r2", "m2", (lease, token))
    await a.leases.renew_all("a", {lease: token}, 30)
    await a.conversations.append_event(MessageDelta(run_id="r2", text="he"))
    final, end = await a.conversations.complete_run(
        "r2", session.id, MessageFinal(run_id="r2", text="hello"),
        RunEnd(run_id="r2", outcome="ok"), usage={})
    assert (await a.conversations.run("r2")).status == "ok"
    assert [m.role for m in await a.conversations.messages(session.id)] == ["user",
                                                                            "assistant"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_after_an_outage_of_its_own_an_instance_takes_nothing_over_for_a_lease(
        two, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every instance saw the outage: leases ran out on the database meanwhile, but the
    holders renew them once back; the first one back takes none of them."""
    a, b = two
    clock = Clock()
    monkeypatch.setattr(cluster_module.time, "monotonic", clock)
    holder = Cluster(a.leases, "a", ttl=10.0)
    other = Cluster(b.leases, "b", ttl=10.0)
    await holder.acquire("chat:telegram:9")
    await expire(a, "chat:telegram:9")  # the outage outlasted the lease
    other._cut_off = True  # its heartbeat failed during the outage ...
    await other.leases.renew_all("b", {}, 10.0)
    other._cut_off, other._settle_until = False, clock.now + other.ttl  # ... and came back
    assert other.settling()
    assert await other.acquire("chat:telegram:9") is None  # not taken: a renews it
    assert await holder.leases.renew_all("a", dict(holder._held), 10.0) == set()
    clock.now += other.ttl
    assert not other.settling()
    assert await other.acquire("chat:telegram:9") is None  # renewed: still a's
    await expire(a, "chat:telegram:9")  # a really stopped
    assert await other.acquire("chat:telegram:9") is not None


# one clock: the database's ---------------------------------------------------------------

class Skew:
    """This process's wall clock moved ``seconds`` ahead while inside (one instance's clock
    wrong: what it does meanwhile is what that instance would do)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds: float):
        self.monkeypatch, self.seconds = monkeypatch, seconds

    def __enter__(self) -> None:
        real = time.time
        self.monkeypatch.setattr(time, "time", lambda: real() + self.seconds)

    def __exit__(self, *exc: object) -> None:
        self.monkeypatch.undo()


async def test_a_clock_400_s_ahead_changes_nothing_between_instances(
        two, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    for store, name in ((a, "a"), (b, "b")):  # both alive
        await store.leases.acquire(f"instance:{name}", name, 30)
    ahead = Skew(monkeypatch, 400)
    # an outbox claim of a's is not taken by b, whose clock is ahead
    assert await a.outbox.claim("reply-1", "a", 30)
    with ahead:
        assert not await b.outbox.claim("reply-1", "b", 30)
    # ... nor does a claim b made while ahead last 400 s longer than asked
    with ahead:
        assert await b.outbox.claim("reply-2", "b", 0.5)
    await b.engine.write(("DELETE FROM leases WHERE name = 'instance:b'", ()))  # b died
    assert await a.outbox.claim("reply-2", "a", 30)
    # a message that just arrived has not waited, whoever's clock asks
    await a.inbound.accept("telegram", "m-1", {"chat_id": "7", "text": "x"})
    with ahead:
        assert await b.inbound.waiting_chats("telegram", 2.0) == []
        await b.inbound.accept("telegram", "m-2", {"chat_id": "8", "text": "y"})
    assert await a.inbound.waiting_chats("telegram", 2.0) == []
    assert "8" in await a.inbound.waiting_chats("telegram", -60.0)  # (it is there)
    # a flood hold made by the instance ahead lasts what the platform asked, for everyone
    with ahead:
        await b.flood.hold("telegram", "7", time.time() + 5.0)
    holds = await a.flood.holds(time.time())
    assert len(holds) == 1 and 4.0 < holds[0][2] - time.time() <= 5.0
    with ahead:  # and the instance ahead reads it in its own clock, just as long
        held = await b.flood.holds(time.time())
        assert 4.0 < held[0][2] - time.time() <= 5.0


async def outboxes(two: tuple[PostgresStore, PostgresStore], p: RecordingProvider,
                   a_may_send: Callable[[], bool]) -> tuple[Outbox, Outbox]:
    """Instance a's outbox (sending while ``a_may_send``) and b's, both instances alive."""
    boxes = (Outbox(two[0].outbox, {"test": p}, sweep_seconds=0, owner="a",
                    may_send=a_may_send),
             Outbox(two[1].outbox, {"test": p}, sweep_seconds=0, owner="b"))
    boxes[1].ahead_wait = 0.01
    for store, box in zip(two, boxes):
        await box.open()
        await store.leases.acquire(f"instance:{box.owner}", box.owner, 60)
    return boxes


async def test_a_taken_over_chat_waits_for_the_older_reply_its_live_owner_still_holds(
        two) -> None:
    """a recorded a reply and could not send it (cut off past its lease, taken for dead, the
    chat taken over by b); a came back (alive, its claim on the reply valid again). b queues
    a's reply ahead of its own and waits for it: nothing newer reaches the chat before a sends
    it. Had b skipped it (the claim is someone else's), b's answer would come first."""
    a, b = two
    p = RecordingProvider()
    silent = [True]
    box_a, box_b = await outboxes(two, p, lambda: not silent[0])
    first = await box_a.deliver(p, "r1", [OutgoingMessage(chat_id="c1", text="first")])
    assert await first is False and p.sent == []  # a is silent: kept, claimed, unsent
    looks = [0]
    claim = b.outbox.claim

    async def counted(*args: object, **kwargs: object) -> bool:
        looks[0] += 1
        return await claim(*args, **kwargs)  # type: ignore[arg-type]

    b.outbox.claim = counted  # type: ignore[method-assign]
    assert await box_b.flush_chat(p, "c1") == 1  # the taker: a's reply first
    second = await box_b.deliver(p, "r2", [OutgoingMessage(chat_id="c1", text="second")])
    async with asyncio.timeout(10):
        while looks[0] < 5:  # b has looked at a's claim again and again
            await asyncio.sleep(0.01)
    assert p.sent == [] and not second.done()  # nothing newer went first
    silent[0] = False  # a sends what it kept
    await box_a.flush(p)
    await box_a.idle()
    assert await second is True
    await box_b.idle()
    assert [m.text for m in p.sent] == ["first", "second"]
    assert not await b.outbox.pending("test")
    await box_a.close()
    await box_b.close()


async def test_a_chat_whose_reply_could_not_go_is_not_idle_until_it_is_out(two) -> None:
    """a was silenced (cut off from the database) as it sent a reply: the reply rests,
    recorded, for the sweep. The chat is not idle meanwhile — its worker holds it; let go, its
    next message is answered by b, whose answer reached the chat above a's (seen in CI:
    tests/test_cluster_faults.py[outage], m6's answer above m5's). Once a's sweep sent it,
    it is."""
    p = RecordingProvider()
    silent = [True]
    box_a, box_b = await outboxes(two, p, lambda: not silent[0])
    first = await box_a.deliver(p, "r1", [OutgoingMessage(chat_id="c1", text="first")])
    assert await first is False and p.sent == []  # silenced: the chat rests
    assert not await box_a.chat_idle("test", "c1", 0.3)
    assert await box_a.chat_idle("test", "c2", 0.3)  # (another chat of a's: nothing waits)
    silent[0] = False
    assert await box_a.flush(p) == 1  # the sweep
    assert await box_a.chat_idle("test", "c1", 10)
    assert [m.text for m in p.sent] == ["first"]
    await box_a.close()
    await box_b.close()


async def test_a_taken_over_chat_sends_the_older_reply_itself_once_its_owner_is_gone(
        two) -> None:
    """The same, but a stops for good while b waits: once a's heartbeat has run out, b claims
    a's reply and sends it, then its own."""
    a, b = two
    p = RecordingProvider()
    box_a, box_b = await outboxes(two, p, lambda: False)
    assert await (await box_a.deliver(p, "r1", [OutgoingMessage(chat_id="c1",
                                                                 text="first")])) is False
    await box_b.flush_chat(p, "c1")
    second = await box_b.deliver(p, "r2", [OutgoingMessage(chat_id="c1", text="second")])
    await expire(a, "instance:a")  # a is gone
    assert await second is True
    await box_b.idle()
    assert [m.text for m in p.sent] == ["first", "second"]
    await box_b.close()


class GatedProvider(RecordingProvider):
    """Its send of ``text`` waits for ``gate`` (a slow platform call in flight)."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.gate, self.held = text, asyncio.Event(), asyncio.Event()

    async def send(self, message: OutgoingMessage) -> str | None:
        if message.text == self.text and not self.gate.is_set():
            self.held.set()
            await self.gate.wait()
        return await super().send(message)


async def test_two_instances_taking_up_a_dead_ones_replies_send_them_in_order(two) -> None:
    """a recorded three replies in a chat and died before sending any; b's and c's sweeps both
    take them up. b claims the first and its send is slow: c, finding the first b's, leaves
    the chat's later replies to b. Had c gone on to the second (its claim was free), the second
    and third would have reached the chat before the first."""
    a, b = two
    p = GatedProvider("first")
    box_a = Outbox(a.outbox, {"test": p}, sweep_seconds=0, owner="a", may_send=lambda: False)
    await a.leases.acquire("instance:a", "a", 60)
    for reply_id, text in (("r1", "first"), ("r2", "second"), ("r3", "third")):
        done = await box_a.deliver(p, reply_id, [OutgoingMessage(chat_id="c1", text=text)])
        assert await done is False  # a is silent: recorded, claimed, unsent
    await expire(a, "instance:a")  # a is gone
    box_b, box_c = (Outbox(b.outbox, {"test": p}, sweep_seconds=0, owner=o) for o in "bc")
    for box in (box_b, box_c):
        await b.leases.acquire(f"instance:{box.owner}", box.owner, 60)
    assert await box_b.flush(p) == 3
    await asyncio.wait_for(p.held.wait(), 10)  # b sends the first: in flight
    assert await box_c.flush(p) == 3
    await asyncio.wait_for(box_c.idle(), 10)
    assert p.sent == []  # c sent nothing beside b
    p.gate.set()
    await asyncio.wait_for(box_b.idle(), 10)
    assert [m.text for m in p.sent] == ["first", "second", "third"]
    assert not await b.outbox.pending("test")
    for box in (box_a, box_b, box_c):
        await box.close()
