"""PostgreSQL, several instances: fewer statements per message, the same guarantees (issue 30).

- A run's ledger rows ride in the statement that ends the run, fenced by its chat's claim as
  that statement is: written with the answer; with a stale token the run's end is refused and
  the calls it paid for are counted in rows of their own; held rows that no run's end takes go
  alone.
- A message received by an instance that has no worker for its chat takes the chat in the
  statement that records it (noted to the others only when another holds the chat; a release
  notifies only when someone tried to take the lease meanwhile); messages received by the instance
  that holds their chat are answered from memory, in order, without reading its inbox again.

The tests use the server named by ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py) and fail
when it is not reachable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import pluto.storage.sql.usage as usage_module
from pluto.errors import RunTakenOver
from pluto.events import MessageFinal, RunEnd
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.storage.postgres import PostgresStore
from pluto.storage.sql.usage import UsageCall
from pluto.types import Accepted
from tests.test_cluster_inprocess import gateways_on, until_running
from tests.helpers.pg import fresh_schema
from tests.test_claims import run_under_claim, two  # noqa: F401 (two: a fixture)

pytestmark = pytest.mark.postgres

PERIODS = {"day": 86400.0 * 20000, "month": 86400.0 * 19990}


def call(session_id: str, run_id: str, tokens: int, cost: float | None) -> UsageCall:
    return UsageCall(run_id=run_id, session_id=session_id, agent="agent", model="m",
                     input_tokens=tokens, output_tokens=1, latency=0.1, outcome="ok",
                     provider="telegram", user_id="u", chat_id="1", cost=cost)


async def started(store: PostgresStore, run_id: str, msg_id: str, claim: tuple[str, int]
                  ) -> str:
    """A run of chat 1 started under ``claim``: its session's id."""
    return (await run_under_claim(store, run_id, msg_id, claim)).id  # type: ignore[no-any-return]


async def counters(store: PostgresStore) -> list[Any]:
    return await store.engine.fetchall(
        "SELECT scope, period, calls, input_tokens FROM usage_counters WHERE scope = 'agent'"
        " ORDER BY period")


async def complete(store: PostgresStore, run_id: str, session_id: str) -> None:
    await store.conversations.complete_run(run_id, session_id,
                                           MessageFinal(run_id=run_id, text="hello"),
                                           RunEnd(run_id=run_id, outcome="ok"), usage={})


async def test_a_runs_ledger_rows_are_written_by_the_statement_that_ends_it(
        two, monkeypatch) -> None:
    monkeypatch.setattr(usage_module, "RIDE_SECONDS", 3600.0)  # only the run's end writes them
    a, _ = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    session = await started(a, "r1", "m1", (lease, token))
    first = a.usage.record_soon(call(session, "r1", 100, None), PERIODS)  # a tool call's turn
    second = a.usage.record_soon(call(session, "r1", 200, 0.5), PERIODS)  # the answer's
    assert not first.done() and not second.done()
    assert await a.usage.calls(run_id="r1") == []  # held: nothing written on its own
    await complete(a, "r1", session)
    assert await first == 2 and await second == 2  # (the rows written with the run's end)
    rows = await a.usage.calls(run_id="r1")
    assert [(c.input_tokens, c.cost) for c in rows] == [(100, None), (200, 0.5)]  # in order
    # each counter once, with both calls (one statement changes a row once)
    assert [tuple(r) for r in await counters(a)] == [("agent", "day", 2, 300),
                                                     ("agent", "month", 2, 300)]


async def test_a_taken_over_runs_end_is_refused_and_its_paid_calls_still_counted(
        two, monkeypatch) -> None:
    monkeypatch.setattr(usage_module, "RIDE_SECONDS", 3600.0)
    a, b = two
    lease = "chat:telegram:1"
    token = await a.leases.acquire(lease, "a", 30)
    session = await started(a, "r2", "m2", (lease, token))
    held = a.usage.record_soon(call(session, "r2", 100, None), PERIODS)
    await b.engine.write(("UPDATE leases SET until = 0 WHERE name = ?", (lease,)))
    assert await b.leases.take(lease, "b", 30) is not None  # b takes the chat (a token more)
    with pytest.raises(RunTakenOver):
        await complete(a, "r2", session)
    # the answer and the run's end are refused; the model call made here was paid for: it
    # counts for the budgets, in rows of its own
    assert (await a.engine.fetchone("SELECT status FROM runs WHERE id = ?", ("r2",)))[0] != "ok"
    assert await held == 1
    assert [c.input_tokens for c in await a.usage.calls(run_id="r2")] == [100]
    assert [tuple(r)[2:] for r in await counters(a)] == [(1, 100), (1, 100)]


async def test_ledger_rows_no_runs_end_takes_go_alone(two, monkeypatch) -> None:
    monkeypatch.setattr(usage_module, "RIDE_SECONDS", 0.0)
    a, _ = two
    written = a.usage.record_soon(call("s-alone", "r3", 7, 0.1), PERIODS)
    assert await written == 1
    assert [c.input_tokens for c in await a.usage.calls(run_id="r3")] == [7]
    assert [tuple(r) for r in await counters(a)] == [("agent", "day", 1, 7),
                                                     ("agent", "month", 1, 7)]


def slow_echo(messages: list[dict]) -> Scripted:
    return Scripted(text=f"echo: {messages[-1]['content']}", chunk=4, delay=0.05)


async def test_messages_received_by_the_chats_holder_are_answered_without_reading_its_inbox(
        config_dir: Path, tmp_path: Path) -> None:
    with fresh_schema() as url:
        async with gateways_on(config_dir, tmp_path, [url],
                               ScriptedModel(fallback=slow_echo)) as (gw,):
            provider = gw.providers["test"]
            intake = provider.intake
            assert intake is not None
            inbox = intake.inbox
            reads: list[str] = []
            read = inbox.unhandled_in_chat

            async def counted(provider_name: str, chat_id: str, limit: int = 100
                              ) -> list[dict[str, Any]]:
                reads.append(chat_id)
                return await read(provider_name, chat_id, limit)

            inbox.unhandled_in_chat = counted  # type: ignore[method-assign]
            takes: list[str] = []
            take = gw.cluster.take_chat

            async def taken(name: str, *args: Any) -> Any:
                takes.append(name)
                return await take(name, *args)

            gw.cluster.take_chat = taken  # type: ignore[method-assign]
            first = await intake.submit(provider.msg("message 0", chat="held"))
            outcome = await first.outcome()
            assert isinstance(outcome, Accepted)
            await until_running(gw.store.conversations, outcome.run_id)  # the chat is held
            later = [await intake.submit(provider.msg(f"message {i}", chat="held"))
                     for i in (1, 2)]
            assert [type(await t.outcome()) for t in later] == [Accepted, Accepted]
            answers = await provider.wait_finals(3, chat="held")
            assert answers == ["echo: message 0", "echo: message 1", "echo: message 2"]
            assert reads == []  # (taken from the queue: the inbox read once, with the chat)
            assert takes == []  # (the chat taken by the statement that recorded message 0)


async def test_a_message_recorded_takes_its_chat_in_the_same_statement_noted_only_if_held(
        two) -> None:
    import asyncio

    import psycopg

    a, b = two
    a.inbound.notify = b.inbound.notify = "ride_notes"
    url = a.engine.url  # type: ignore[attr-defined]
    await a.inbound.accept("telegram", "m0", {"message_id": "m0", "chat_id": "c", "via": "A"})
    notes: list[str] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("LISTEN ride_notes")
        done = await a.inbound.accept_taking(a.leases, "chat:telegram:c", "A", 30, "telegram",
                                             "m1", {"message_id": "m1", "chat_id": "c",
                                                    "via": "A"})
        assert done is not None
        fresh, took, waiting = done
        assert fresh and took is not None and not took[1]
        # the messages waiting before it (the read does not see the row it records)
        assert [m["message_id"] for m in waiting] == ["m0"]
        # another instance's message for the chat A holds: recorded, the chat not taken
        assert await b.inbound.accept_taking(b.leases, "chat:telegram:c", "B", 30, "telegram",
                                             "m2", {"message_id": "m2", "chat_id": "c",
                                                    "via": "B"}) == (True, None, [])
        # a redelivery: not recorded again, and it takes nothing (as a recording alone)
        await a.engine.write(("UPDATE leases SET until = 0 WHERE name = ?",
                              ("chat:telegram:c",)))  # (A's lease ran out: takeable)
        assert await b.inbound.accept_taking(b.leases, "chat:telegram:c", "B", 30, "telegram",
                                             "m1", {"message_id": "m1", "chat_id": "c",
                                                    "via": "B"}) == (False, None, [])
        assert (await b.leases.holder("chat:telegram:c")) is None  # (ran out, not taken)
        took_b = await b.inbound.accept_taking(b.leases, "chat:telegram:c", "B", 30,
                                               "telegram", "m3", {"message_id": "m3",
                                                                  "chat_id": "c", "via": "B"})
        assert took_b is not None and took_b[1] is not None and took_b[1][1]  # taken over
        assert [m["message_id"] for m in took_b[2]] == ["m0", "m1", "m2"]

        async def drain() -> None:
            async for note in conn.notifies():
                notes.append(note.payload)
        with pytest.raises(TimeoutError):  # (notifications come at commit: all there now)
            await asyncio.wait_for(drain(), 0.3)
    # noted only the message whose chat another instance held (m2): the chat taken by the
    # statement (m1, m3) has no other holder to tell; a redelivery is not noted
    assert notes == ["new|telegram|c|B"]


async def test_a_release_notifies_only_those_who_tried_to_take_the_lease(two) -> None:
    """A chat let go that nobody else tried to take costs no notification to every instance;
    one that another tried to take while it was held (its take failed: the row is marked)
    is noted ``free``, and the mark goes with the next holder. A message recorded by itself
    (its receiver has a worker for the chat) is noted only while another instance holds the
    chat."""
    import asyncio

    import psycopg

    a, b = two
    for store in (a, b):
        store.inbound.notify = store.leases.notify = "free_notes"
    url = a.engine.url  # type: ignore[attr-defined]
    name = "chat:telegram:c"
    notes: list[str] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("LISTEN free_notes")
        token = await a.leases.acquire(name, "A", 30)
        assert token is not None
        # A's own message while A holds the chat: nobody else to tell
        assert await a.inbound.accept("telegram", "m1", {"message_id": "m1", "chat_id": "c",
                                                         "via": "A"})
        assert await a.leases.release(name, "A", token)  # nobody tried: no note
        token = await a.leases.acquire(name, "A", 30)
        assert token is not None
        # B's message while A holds it: noted (A's worker reads it); B's take fails, marking it
        assert await b.inbound.accept("telegram", "m2", {"message_id": "m2", "chat_id": "c",
                                                         "via": "B"})
        assert await b.leases.take(name, "B", 30) is None
        assert await a.leases.take(name, "A", 30) == (token, False)  # (A's own: kept, marked)
        assert await a.leases.release(name, "A", token)  # B tried: noted
        took = await b.leases.take(name, "B", 30)
        assert took is not None and took[0] > token
        assert await b.leases.release(name, "B", took[0])  # the mark went with A: no note
        # a message recorded while nobody holds the chat: its receiver takes it, no note
        assert await b.inbound.accept("telegram", "m3", {"message_id": "m3", "chat_id": "c",
                                                         "via": "B"})

        async def drain() -> None:
            async for note in conn.notifies():
                notes.append(note.payload)
        with pytest.raises(TimeoutError):  # (notifications come at commit: all there now)
            await asyncio.wait_for(drain(), 0.3)
    assert notes == ["new|telegram|c|B", f"free|{name}"]


async def test_a_chats_next_turn_soon_after_an_answer_is_taken_under_the_same_hold(
        config_dir: Path, tmp_path: Path) -> None:
    """The chat is kept for a moment after its last answer (``Shared.linger``): a next message
    that follows within it is answered without the chat being let go and taken again (two
    statements fewer); with nothing more, the chat is let go once the moment is over."""
    with fresh_schema() as url:
        async with gateways_on(config_dir, tmp_path, [url], ScriptedModel()) as (gw,):
            provider = gw.providers["test"]
            intake = provider.intake
            assert intake is not None and intake.shared is not None
            assert intake.shared.linger > 0
            calls: list[str] = []
            take, release = gw.cluster.take_chat, gw.cluster.release

            async def taken(name: str, *args: Any) -> Any:
                calls.append("take")
                return await take(name, *args)

            async def released(name: str) -> None:
                await release(name)
                calls.append("release")  # (once its statement is done: the lease is gone)

            gw.cluster.take_chat = taken  # type: ignore[method-assign]
            gw.cluster.release = released  # type: ignore[method-assign]
            for i in range(3):  # each sent once the one before is answered (a conversation)
                ticket = await intake.submit(provider.msg(f"turn {i}", chat="talk"))
                assert isinstance(await ticket.outcome(), Accepted)
                await provider.wait_finals(i + 1, chat="talk")
            lease = "chat:test:talk"
            assert calls == []  # (taken by the statement that recorded turn 0, kept since)
            for _ in range(200):  # let go once nothing more came
                if "release" in calls:
                    break
                await asyncio.sleep(0.01)
            assert calls == ["release"] and not gw.cluster.holds(lease)
            assert await gw.store.leases.holder(lease) is None
