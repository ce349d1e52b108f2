"""PostgreSQL, several instances: what rides in one statement (issue 30, item 6) still says
what it said as separate statements — the run feed's notification comes with the commit of the
events, a chat taken comes with its waiting messages, a session comes with the history its run
reads (never stale after a write here).

The tests use the server named by ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py) and fail
when it is not reachable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from pluto.events import MessageFinal, RunEnd, RunStart
from pluto.storage.postgres import PostgresStore
from tests.helpers.pg import fresh_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    with fresh_schema() as url:
        yield url


async def _heard(url: str, channel: str, during) -> list[str]:  # type: ignore[no-untyped-def]
    """The notifications on ``channel`` while ``during()`` runs (and just after)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f"LISTEN {channel}")
        await during()
        got: list[str] = []

        async def drain() -> None:
            async for note in conn.notifies():
                got.append(note.payload)
        with pytest.raises(TimeoutError):  # (notifications come at commit: all there now)
            await asyncio.wait_for(drain(), 0.3)
        return got


async def test_each_write_of_events_of_a_run_followed_elsewhere_notifies_as_it_commits(
        pg_url):
    async with PostgresStore(pg_url) as store:
        conv = store.conversations
        conv.owner = "i1"
        conv.notify_channel = await store.bus.scoped("pluto_runs")
        session = await conv.session("k", "agent")

        async def a_run() -> None:
            await conv.start_run("r1", session.id, "agent", "hi",
                                 RunStart(run_id="r1", session_id=session.id, agent="agent"))
            await conv.complete_run("r1", session.id, MessageFinal(run_id="r1", text="hello"),
                                    RunEnd(run_id="r1", outcome="ok"), usage={})

        heard = await _heard(pg_url, conv.notify_channel, a_run)
        assert heard == []  # followed by no other instance: told nobody
        await conv.follow_elsewhere("r2")  # (as another instance's feed records it)
        other = PostgresStore(pg_url)
        async with other:
            other.conversations.owner = "i2"
            other.conversations.notify_channel = conv.notify_channel
            await other.conversations.follow_elsewhere("r2")

            async def a_followed_run() -> None:
                await conv.start_run("r2", session.id, "agent", "hi",
                                     RunStart(run_id="r2", session_id=session.id,
                                              agent="agent"))
                await conv.complete_run("r2", session.id,
                                        MessageFinal(run_id="r2", text="hello"),
                                        RunEnd(run_id="r2", outcome="ok"), usage={})

            # the start, then the answer with the end: once each, however many follow it
            assert await _heard(pg_url, conv.notify_channel, a_followed_run) == ["i1|r2",
                                                                                 "i1|r2"]
            await conv.follow_elsewhere("r2", False)
            await other.conversations.follow_elsewhere("r2", False)
        assert [e.type for e in await conv.events("r2")] == ["run.start", "message.final",
                                                              "run.end"]

        async def nothing_to_tell() -> None:  # no channel: no notification, same writes
            conv.notify_channel = None
            await conv.start_run("r3", session.id, "agent", "again",
                                 RunStart(run_id="r3", session_id=session.id, agent="agent"))

        assert await _heard(pg_url, "pluto_runs", nothing_to_tell) == []


async def test_a_chat_is_taken_with_its_waiting_messages_in_arrival_order(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    async with a, b:
        for i in range(3):
            await a.inbound.accept("telegram", f"m{i}", {"message_id": f"m{i}", "chat_id": "c"})
        took, found = await a.inbound.take_chat(a.leases, "chat:telegram:c", "A", 30,
                                                "telegram", "c")
        assert took is not None and not took[1]
        assert [m["message_id"] for m in found] == ["m0", "m1", "m2"]
        # held by A: B gets neither the chat nor its messages
        assert await b.inbound.take_chat(b.leases, "chat:telegram:c", "B", 30,
                                         "telegram", "c") == (None, [])
        # a chat with nothing waiting is taken all the same (nothing read)
        took, found = await b.inbound.take_chat(b.leases, "chat:telegram:d", "B", 30,
                                                "telegram", "d")
        assert took is not None and found == []


async def test_the_history_read_with_a_session_is_never_stale_after_a_write_here(pg_url):
    async with PostgresStore(pg_url) as store:
        conv = store.conversations
        s = await conv.session("k", "agent")
        for i in range(3):
            await conv.add_message(s.id, "user", f"m{i}")
        assert (await conv.session("k", "agent")).id == s.id  # (with its history)
        await conv.add_message(s.id, "user", "written after the lookup")
        history = await conv.history(s.id, 10, 10_000)
        assert [m["content"] for m in history] == ["m0", "m1", "m2",
                                                   "written after the lookup"]


async def test_a_history_longer_than_what_was_read_with_the_session_is_read_whole(pg_url):
    async with PostgresStore(pg_url) as store:
        conv = store.conversations
        s = await conv.session("k", "agent")
        for i in range(60):
            await conv.add_message(s.id, "user", f"m{i}")
        await conv.session("k", "agent")  # reads the newest 50 with it
        history = await conv.history(s.id, 55, 1_000_000)
        assert [m["content"] for m in history] == [f"m{i}" for i in range(5, 60)]
        await conv.session("k", "agent")
        short = await conv.history(s.id, 3, 1_000_000)  # served by what was read with it
        assert [m["content"] for m in short] == ["m57", "m58", "m59"]
