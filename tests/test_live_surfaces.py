"""The web widget and the HTTP API take a run's answer from the run feed: its committed events
are the durable record (no outbox row, no second commit), a reconnecting tab finds each answer
exactly once, and one given while the tab was closed is there when it comes back. The gateway's
answers without a run (a command's reply) still go through the outbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.events import MessageFinal, RunEnd, RunStart
from pluto.gateway.app import Gateway
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig, StorageConfig
from pluto.storage.postgres import PostgresStore
from pluto.storage.sqlite import SqliteStore
from tests.helpers.inspect_store import outbox_claims, outbox_rows
from tests.helpers.pg import fresh_schema
from tests.helpers.served import API_KEY, Tab, served, url, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SLOW = "one two three four five six seven eight nine ten eleven twelve"


@pytest.fixture(autouse=True)
def keys(monkeypatch) -> None:
    monkeypatch.setenv("PLUTO_WEB_SECRET", "s" * 40)
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def _outbox(gw: Any, provider: str) -> list[tuple[Any, ...]]:
    return await outbox_rows(gw.store, provider)


async def _settled(gw: Any) -> None:
    """Every run's delivery has returned (whatever it records, it has recorded)."""
    await wait_for(lambda: not gw.pipeline.live)


async def _post(http: aiohttp.ClientSession, gw: Any, text: str) -> dict[str, Any]:
    async with http.post(url(gw, "/api/v1/agent/tasks?wait=10"), json={"input": text},
                         headers=AUTH) as resp:
        assert resp.status == 201, await resp.text()
        return (await resp.json())["last_step"]


async def test_widget_and_api_runs_leave_no_outbox_row_and_commands_still_do(
        config_dir, data_dir, http):
    model = ScriptedModel(fallback=lambda m: Scripted(text=f"You said: {m[-1]['content']}",
                                                      chunk=4))
    async with served(config_dir, data_dir, model) as gw:
        tab = await Tab.open(http, gw)
        final = await tab.ask("hello there")
        assert final["text"] == "You said: hello there" and final["run_id"]
        assert (await tab.until("run.end"))["run_id"] == final["run_id"]
        step = await _post(http, gw, "a question")
        assert step["output"] == "You said: a question" and step["outcome"] == "ok"
        await _settled(gw)
        assert await _outbox(gw, "web") == [] and await _outbox(gw, "api") == []
        assert await outbox_claims(gw.store) == []
        # an answer without a run has no run events to replay: it is recorded in the outbox
        helped = await tab.ask("/help")
        assert helped["run_id"] is None and "/new" in helped["text"]
        command = await _post(http, gw, "/help")
        assert command["run_id"] is None and "/new" in command["output"]
        assert [(r[0], r[1]) for r in await _outbox(gw, "web")] == [(None, "reply")]
        assert [(r[0], r[1]) for r in await _outbox(gw, "api")] == [(None, "reply")]


def _run_frames(tab: Tab, run_id: str) -> list[dict[str, Any]]:
    return [f for f in tab.frames if f.get("run_id") == run_id]


async def test_a_tab_that_reconnects_mid_answer_or_after_it_sees_the_answer_once(
        config_dir, data_dir, http):
    slow = ScriptedModel(Scripted(text=SLOW, chunk=3, delay=0.05))
    async with served(config_dir, data_dir, slow) as gw:
        tab = await Tab.open(http, gw)
        await tab.send(type="message", id="m1", text="count slowly")
        delta = await tab.until("message.delta")
        run_id = delta["run_id"]
        await tab.ws.close()
        back = await Tab.open(http, gw, token=tab.ready["token"])  # mid-answer
        end = await back.until("run.end")
        assert end["outcome"] == "ok"
        assert [m["role"] for m in back.history] == ["user"]  # the answer comes as frames
        frames = _run_frames(back, run_id)
        assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))  # from the start
        finals = [f for f in frames if f["type"] == "message.final"]
        assert [f["text"] for f in finals] == [SLOW]
        assert "".join(f["text"] for f in frames if f["type"] == "message.delta") == SLOW
        await _settled(gw)
        after = await Tab.open(http, gw, token=tab.ready["token"])  # after the end
        assert [(m["role"], m["text"]) for m in after.history] == [("user", "count slowly"),
                                                                   ("assistant", SLOW)]
        # the next answer's frames are the first after the history: nothing of the old run
        fresh = await after.ask("and again?")
        assert fresh["run_id"] != run_id and not _run_frames(after, run_id)
        await after.until("run.end")
        # and the tab that came back mid-answer got nothing more of it (no second reply)
        await back.until("run.end", lambda f: f["run_id"] == fresh["run_id"])
        assert [f["type"] for f in _run_frames(back, run_id)].count("message.final") == 1
        assert await _outbox(gw, "web") == []


async def test_an_answer_given_while_the_tab_was_closed_is_shown_on_reconnect(
        config_dir, data_dir, http):
    slow = ScriptedModel(Scripted(text=SLOW, chunk=3, delay=0.03))
    async with served(config_dir, data_dir, slow) as gw:
        tab = await Tab.open(http, gw)
        await tab.send(type="message", id="m1", text="answer while I am away")
        await tab.until("ack")
        await tab.ws.close()  # nobody is watching when the answer comes
        runs = await wait_for(lambda: gw.store.conversations.recent_runs(status="ok"))
        run_id = runs[0]["id"]
        await _settled(gw)
        await wait_for(lambda: not gw.providers["web"].following())
        back = await Tab.open(http, gw, token=tab.ready["token"])
        assert [(m["role"], m["text"], m["run_id"]) for m in back.history] == [
            ("user", "answer while I am away", run_id), ("assistant", SLOW, run_id)]
        fresh = await back.ask("thanks")
        await back.until("run.end", lambda f: f["run_id"] == fresh["run_id"])
        assert not _run_frames(back, run_id)  # shown once: in the history, not as frames too
        assert await _outbox(gw, "web") == []


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_dead_instances_feed_answers_are_not_taken_for_undelivered(engine, tmp_path):
    """Several instances: an answered run with no outbox row is one whose instance died before
    its reply was recorded — except where answers come from the feed (never in the outbox)."""
    async def answered(store: Any, provider: str, chat: str, run_id: str) -> None:
        assert await store.inbound.accept(provider, f"m-{run_id}", {"chat_id": chat})
        session = await store.conversations.session(f"k-{run_id}", "agent")
        await store.conversations.start_run(
            run_id, session.id, "agent", "hi", RunStart(run_id=run_id, session_id=session.id,
                                                        agent="agent"),
            source=(provider, f"m-{run_id}"))
        await store.conversations.complete_run(run_id, session.id,
                                               MessageFinal(run_id=run_id, text="hello"),
                                               RunEnd(run_id=run_id, outcome="ok"), usage={})

    async def check(store: Any) -> None:
        store.conversations.owner = "dead"
        await answered(store, "telegram", "t1", "r1")
        await answered(store, "web", "w1", "r2")
        await answered(store, "api", "a1", "r3")
        found = await store.conversations.orphaned_chats(alive={"me"})
        assert sorted(found) == [("api", "a1"), ("telegram", "t1"), ("web", "w1")]
        assert await store.conversations.orphaned_chats(
            alive={"me"}, answered_in_feed=("web", "api")) == [("telegram", "t1")]

    if engine == "sqlite":
        async with SqliteStore(tmp_path / "pluto.db") as store:
            await check(store)
    else:
        with fresh_schema() as pg:
            async with PostgresStore(pg) as store:
                await check(store)


@asynccontextmanager
async def _two_instances(config_dir: Path, tmp_path: Path, model: ScriptedModel,
                         lease_seconds: float | None = None) -> AsyncIterator[list[Gateway]]:
    """Two ``pluto serve`` on one PostgreSQL database, each with its web chat (one signing
    key: a visitor's token is good on both, as behind a load balancer)."""
    with fresh_schema() as pg:
        async with AsyncExitStack() as stack:
            gateways = []
            for i in range(2):
                storage = {} if lease_seconds is None else {
                    "storage": StorageConfig(lease_seconds=lease_seconds)}
                cfg = PlutoConfig(data_dir=tmp_path / f"data{i}",
                                  providers={"web": {"enabled": True}}, **storage)
                gw = Gateway(config_dir, config=cfg, model_factory=model, serve=True,
                             http_bind=("127.0.0.1", 0), store=PostgresStore(pg))
                await stack.enter_async_context(gw)
                await wait_for(lambda g=gw: g.health["web"].state == "running")
                gateways.append(gw)
            yield gateways


async def test_a_tab_that_reconnects_to_another_instance_mid_answer_sees_it_once(
        config_dir, tmp_path, http):
    slow = ScriptedModel(Scripted(text=SLOW, chunk=3, delay=0.08))
    async with _two_instances(config_dir, tmp_path, slow) as (a, b):
        tab = await Tab.open(http, a)
        await tab.send(type="message", id="m1", text="count slowly")
        delta = await tab.until("message.delta")
        run_id = delta["run_id"]
        await tab.ws.close()  # the load balancer sends the reconnect to the other instance
        back = await Tab.open(http, b, token=tab.ready["token"])
        assert [m["role"] for m in back.history] == ["user"]
        end = await back.until("run.end", lambda f: f["run_id"] == run_id)
        assert end["outcome"] == "ok"
        frames = _run_frames(back, run_id)  # from storage, from its start, then live
        assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
        assert [f["text"] for f in frames if f["type"] == "message.final"] == [SLOW]
        assert "".join(f["text"] for f in frames if f["type"] == "message.delta") == SLOW
        later = await Tab.open(http, b, token=tab.ready["token"])  # and once it is over
        assert [(m["role"], m["text"]) for m in later.history] == [("user", "count slowly"),
                                                                   ("assistant", SLOW)]
        fresh = await later.ask("and again?")
        await later.until("run.end", lambda f: f["run_id"] == fresh["run_id"])
        assert not _run_frames(later, run_id)


@asynccontextmanager
async def _running_on_b(config_dir: Path, tmp_path: Path, http: aiohttp.ClientSession
                        ) -> AsyncIterator[tuple[Gateway, Tab, str]]:
    """Two instances; a slow answer under way on B for a tab there: (A, that tab, the run)."""
    slow = ScriptedModel(Scripted(text=SLOW, chunk=3, delay=0.08))
    async with _two_instances(config_dir, tmp_path, slow) as (a, b):
        on_b = await Tab.open(http, b)
        await on_b.send(type="message", id="m1", text="count slowly")
        yield a, on_b, (await on_b.until("message.delta"))["run_id"]


@pytest.mark.postgres  # (through _running_on_b)
async def test_a_tab_joining_as_a_run_elsewhere_ends_gets_its_answer(
        config_dir, tmp_path, http, monkeypatch):
    """A tab joins on A while the chat's run goes on on B, and the run ends between A's read
    of the history and its look at the run: the history has the message without its answer,
    and the run, ended, was taken for one whose answer the history holds — the tab never
    showed it (tests/test_cluster_chaos_web.py, seed 9: a tab that came back showed m4 with no
    answer). It is followed from storage now, its answer shown once."""
    async with _running_on_b(config_dir, tmp_path, http) as (a, on_b, run_id):
        chats = a.providers["web"].chats
        transcript = chats.transcript

        async def read_before_the_end(probe: Any, limit: int = 200) -> Any:
            items = await transcript(probe, limit)
            async def ended() -> bool:
                run = await a.store.conversations.run(run_id)
                return run is not None and run.status == "ok"
            await wait_for(ended, timeout=20)  # (the run ends as the history is made)
            return items

        monkeypatch.setattr(chats, "transcript", read_before_the_end)
        on_a = await Tab.open(http, a, token=on_b.ready["token"])
        assert [m["role"] for m in on_a.history] == ["user"]
        end = await on_a.until("run.end", lambda f: f["run_id"] == run_id)
        assert end["outcome"] == "ok"
        frames = _run_frames(on_a, run_id)
        assert [f["text"] for f in frames if f["type"] == "message.final"] == [SLOW]


@pytest.mark.postgres  # (through _running_on_b)
async def test_a_tab_joining_as_a_run_is_taken_over_shows_its_message_waiting(
        config_dir, tmp_path, http, monkeypatch):
    """A tab joins on A while the chat's run goes on on B, and the run is taken over between
    A's read of the waiting messages and its read of the transcript: the message was in
    neither (not waiting at the first read; at the second, back in the inbox and its run's
    messages deleted) — the tab lost it, and drew its answer, when it came, at the end
    (tests/test_cluster_chaos_web.py, seed 4, with tabs dropping silent sockets). The reads are
    done again when a take-over deleted messages of the session meanwhile."""
    async with _running_on_b(config_dir, tmp_path, http) as (a, on_b, run_id):
        chats = a.providers["web"].chats
        transcript = chats.transcript
        taken: list[str] = []

        async def taken_over_first(probe: Any, limit: int = 200) -> Any:
            if not taken:  # (once: B's instance was declared gone as the history is read)
                taken.extend(e.run_id for e in await a.store.conversations.recover_runs(
                    [run_id]))
            return await transcript(probe, limit)

        monkeypatch.setattr(chats, "transcript", taken_over_first)
        on_a = await Tab.open(http, a, token=on_b.ready["token"])
        assert taken == [run_id]
        assert [(m["role"], m["text"], m.get("id")) for m in on_a.history] == [
            ("user", "count slowly", "m1")]


async def test_a_tab_shown_a_run_another_instance_answered_instead_gets_that_answer(
        config_dir, tmp_path, http, monkeypatch):
    """A took the tab's message up and was held before its run began (paused, say); its
    chat's lease moved on. A then begins its run: refused, and ended on the record — so the
    tab on A, which was following A's run, is shown the run that answers the message (B's,
    or A's own once it holds the chat again). Before, A's run ended with no end event: the tab
    followed it for ever and never showed the answer (tests/test_cluster_chaos_web.py, seed
    2: instance 0 answered the message while instance 2 was stopped)."""
    model = ScriptedModel(fallback=lambda m: Scripted(text=f"You said: {m[-1]['content']}"))
    async with _two_instances(config_dir, tmp_path, model, lease_seconds=2) as (a, b):
        held, gate = asyncio.Event(), asyncio.Event()
        start = a.store.conversations.start_run

        async def paused(*args: Any, **kwargs: Any) -> Any:
            held.set()
            await gate.wait()
            return await start(*args, **kwargs)

        monkeypatch.setattr(a.store.conversations, "start_run", paused)
        tab = await Tab.open(http, a)
        await tab.send(type="message", id="m1", text="hello")
        await tab.until("ack")
        await asyncio.wait_for(held.wait(), 10)
        # A's lease moved on (as in a pause) before its next renewal says so; A goes on: its
        # run is refused — and the chat found lost at once, not begun again and again, each
        # time asking the model, until the renewal tells
        await a.store.engine.write(("DELETE FROM leases WHERE name LIKE 'chat:web:%'", ()))
        gate.set()

        async def answered() -> bool:
            row = await b.store.engine.fetchone("SELECT count(*) FROM runs WHERE status = 'ok'")
            return bool(row[0])

        await wait_for(answered, timeout=30)  # the chat's next holder finds it waiting
        final = await tab.until("message.final", timeout=20)
        assert final["text"] == "You said: hello"
        await wait_for(lambda: not a.pipeline.live)
        # A asked the model as its run began (before its start was recorded): once, and the
        # run that answered once more
        assert len(model.calls) == 2
        assert len(tab.of("message.final")) == 1
        again = await Tab.open(http, a, token=tab.ready["token"])
        assert [(m["role"], m["text"]) for m in again.history] == [
            ("user", "hello"), ("assistant", "You said: hello")]


async def test_a_run_reply_handed_to_the_web_provider_anyway_is_shown_once_with_its_seq(tmp_path):
    """An outbox row recorded before run replies were taken from the feed (an upgrade with
    replies unsent) still reaches the chat, as the frame the feed would have given."""
    from pluto.types import OutgoingMessage
    from tests.test_web import _listening_provider, _Stored
    provider, _, tab = _listening_provider(tmp_path, _Stored())
    await provider.send(OutgoingMessage(chat_id="c", text="Hello", run_id="r", seq=3))
    await provider.send(OutgoingMessage(chat_id="c", text="It failed.", run_id="r2", seq=2,
                                        kind="error"))
    await provider.send(OutgoingMessage(chat_id="c", text="Commands: /new", answers="c:m9"))
    assert tab.frames == [
        {"type": "message.final", "id": "r:3", "run_id": "r", "seq": 3, "text": "Hello"},
        {"type": "error", "id": "r2:2", "run_id": "r2", "seq": 2, "code": "run_error",
         "message": "It failed.", "reply_to": None},
        {"type": "message.final", "id": tab.frames[2]["id"], "run_id": None,
         "text": "Commands: /new", "reply_to": "m9"}]
