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


def _messages_read(store: PostgresStore) -> list[int]:
    """From now on, how many messages each of ``store``'s row reads returned (one entry a
    read: a session's lookup with its history counts the history's rows)."""
    read: list[int] = []
    fetchall = store.engine.fetchall

    async def counted(sql, params=(), **kw):  # type: ignore[no-untyped-def]
        rows = await fetchall(sql, params, **kw)
        read.append(sum(1 for r in rows if r[4] is not None))
        return rows
    store.engine.fetchall = counted  # type: ignore[method-assign]
    return read


async def test_a_sessions_history_is_read_once_then_only_what_is_newer(pg_url):
    """The copy of a session's newest messages kept by an instance: a lookup reads only the
    messages written since (by any instance), and the run's history is the whole window."""
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        s = await a.conversations.session("k", "agent")
        for i in range(3):
            await a.conversations.add_message(s.id, "user", f"m{i}")
        read = _messages_read(a)
        assert (await a.conversations.session("k", "agent")).id == s.id
        assert read == [3]  # (its first lookup here since they were written: all of them)
        for i in range(3, 5):  # written by another instance (which took the chat meanwhile)
            await b.conversations.add_message(s.id, "user", f"m{i}")
        await a.conversations.session("k", "agent")
        assert read == [3, 2]  # just the two newer ones
        history = await a.conversations.history(s.id, 10, 10_000)
        assert [m["content"] for m in history] == [f"m{i}" for i in range(5)]
        # two lookups at once read the same newer message: the copy holds it once
        await b.conversations.add_message(s.id, "user", "m5")
        await asyncio.gather(a.conversations.session("k", "agent"),
                             a.conversations.session("k", "agent"))
        await a.conversations.session("k", "agent")
        assert read[-1] == 0
        history = await a.conversations.history(s.id, 10, 10_000)
        assert [m["content"] for m in history] == [f"m{i}" for i in range(6)]
        # a window of 50: the newest 50 after many more were written elsewhere
        for i in range(6, 70):
            await b.conversations.add_message(s.id, "user", f"m{i}")
        await a.conversations.session("k", "agent")
        assert read[-1] == 50
        history = await a.conversations.history(s.id, 40, 1_000_000)
        assert [m["content"] for m in history] == [f"m{i}" for i in range(30, 70)]


async def test_a_new_session_for_the_key_is_read_whole(pg_url):
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        s = await a.conversations.session("k", "agent")
        await a.conversations.add_message(s.id, "user", "before the reset")
        await a.conversations.session("k", "agent")
        assert await b.conversations.reset_session("k")  # (/new, on another instance)
        fresh = await b.conversations.session("k", "agent")
        await b.conversations.add_message(fresh.id, "user", "after")
        assert (await a.conversations.session("k", "agent")).id == fresh.id
        history = await a.conversations.history(fresh.id, 10, 10_000)
        assert [m["content"] for m in history] == ["after"]


async def test_a_sessions_history_is_read_whole_again_after_a_while(pg_url, monkeypatch):
    """However well the copy is kept, it is read whole again at least every
    ``WINDOW_WHOLE_EVERY`` seconds (a message committed out of id order is missed no longer)."""
    from pluto.storage.sql import conversations

    async with PostgresStore(pg_url) as a:
        s = await a.conversations.session("k", "agent")
        for i in range(3):
            await a.conversations.add_message(s.id, "user", f"m{i}")
        read = _messages_read(a)
        await a.conversations.session("k", "agent")
        await a.conversations.session("k", "agent")
        assert read == [3, 0]
        monkeypatch.setattr(conversations, "WINDOW_WHOLE_EVERY", 0.0)
        await a.conversations.session("k", "agent")
        assert read == [3, 0, 3]
        history = await a.conversations.history(s.id, 10, 10_000)
        assert [m["content"] for m in history] == ["m0", "m1", "m2"]
