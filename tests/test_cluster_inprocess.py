"""Several gateway instances on one PostgreSQL database, in one test process: each with its own
store (its own connection pool), cluster id, intake and lanes, as separate processes would be.

What the real three-process test (tests/test_cluster.py) cannot look at closely: the live
event feed across instances, a chat's order when its messages reach different instances, and
one run at a time per session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.events import MessageDelta, RunEnd
from pluto.gateway.app import Gateway
from pluto.runtime.images import text_of
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig, StorageConfig
from pluto.storage.postgres import PostgresStore
from pluto.types import Accepted
from tests.helpers.gateway import RecordingProvider
from tests.helpers.pg import fresh_schema
from tests.helpers.served import Tab, wait_for


def slow_echo(messages: list[dict]) -> Scripted:
    return Scripted(text=f"echo: {messages[-1]['content']}", chunk=4, delay=0.02)


@pytest.fixture
async def instances(config_dir: Path, tmp_path: Path) -> AsyncIterator[list[tuple[Gateway, RecordingProvider]]]:
    with fresh_schema() as url:
        started: list[tuple[Gateway, RecordingProvider]] = []
        try:
            for i in range(3):
                cfg = PlutoConfig(data_dir=tmp_path / f"data{i}",
                                  storage=StorageConfig(lease_seconds=5))
                gw = Gateway(config_dir, config=cfg, model_factory=ScriptedModel(
                    fallback=slow_echo), store=PostgresStore(url))
                await gw.start()
                provider = RecordingProvider()
                gw.add_provider(provider)
                await provider.running.wait()
                started.append((gw, provider))
            yield started
        finally:
            for gw, _ in started:
                await gw.stop()


async def test_a_run_on_one_instance_is_followed_live_on_another_and_after_a_reconnect(
        instances) -> None:
    (a, _), (b, pb), (c, _) = instances
    outcome = await pb.say("hello there, a long enough message to stream")
    assert isinstance(outcome, Accepted)
    seen = []
    async for event in a.feed.follow(outcome.run_id):  # a watcher on A; the run is on B
        seen.append(event)
        if len(seen) == 3:
            break  # the widget's socket drops here; it reconnects to C with what it has
    async for event in c.feed.follow(outcome.run_id, after=seen[-1].seq):
        seen.append(event)
    stored = [e.seq for e in await b.store.conversations.events(outcome.run_id)]
    # no gap, no duplicate
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1)), ([e.seq for e in seen], stored)
    assert isinstance(seen[-1], RunEnd) and seen[-1].outcome == "ok"
    assert any(isinstance(e, MessageDelta) for e in seen)
    assert [e.seq for e in seen] == stored


async def test_a_chat_whose_messages_reach_different_instances_is_answered_in_order(
        instances) -> None:
    providers = [p for _, p in instances]
    texts = [f"message {i}" for i in range(9)]
    tickets = []
    for i, text in enumerate(texts):  # round robin, as a load balancer would
        intake = providers[i % 3].intake
        assert intake is not None
        tickets.append(await intake.submit(providers[i % 3].msg(text, chat="shared-chat")))
    outcomes = [await t.outcome() for t in tickets]
    assert all(isinstance(o, Accepted) for o in outcomes), outcomes
    store = instances[0][0].store
    for o in outcomes:  # every run ends (the instance that received it learned its run id)
        for _ in range(200):
            run = await store.conversations.run(o.run_id)
            if run is not None and run.status == "ok":
                break
            await asyncio.sleep(0.05)
    runs = [await store.conversations.run(o.run_id) for o in outcomes]
    assert [r.status for r in runs] == ["ok"] * len(texts)
    by_start = sorted(runs, key=lambda r: r.started_at)
    assert [r.input for r in by_start] == texts  # in the order the messages were sent
    spans = [(r.started_at, r.ended_at) for r in by_start]
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans  # one at a time
    answers = [m.text for _, p in instances for m in p.sent if m.text.startswith("echo:")]
    assert sorted(answers) == sorted(f"echo: {t}" for t in texts)  # each once


async def test_a_rate_limit_holds_across_instances(config_dir: Path, tmp_path: Path) -> None:
    routes = config_dir / "routes.yaml"
    routes.write_text("defaults: {rate_limit: {user: 2/minute}}\n" + routes.read_text())
    with fresh_schema() as url:
        gateways = []
        try:
            for i in range(2):
                gw = Gateway(config_dir, config=PlutoConfig(data_dir=tmp_path / f"d{i}"),
                             model_factory=ScriptedModel(), store=PostgresStore(url))
                await gw.start()
                gateways.append(gw)
                provider = RecordingProvider()
                gw.add_provider(provider)
                await provider.running.wait()
            a, b = (gw.providers["test"] for gw in gateways)
            outcomes = [await p.say(f"hi {i}", chat=f"c{i}")  # one user, two chats
                        for i, p in enumerate([a, b, a, b])]
            kinds = [o.type for o in outcomes]
            assert kinds == ["accepted", "accepted", "refused", "refused"], outcomes
            assert outcomes[2].notice and "2 per minute" in outcomes[2].notice
            assert outcomes[3].notice is None  # one notice per streak, whichever instance
        finally:
            for gw in gateways:
                await gw.stop()


async def test_each_instance_says_who_it_is_and_what_it_holds(instances) -> None:
    (a, _), (b, _), _ = instances
    assert a.instance != b.instance
    report = a.health_reports["cluster"]()
    assert report["shared"] is True and f"instance:{a.instance}" in report["leases"]
    assert "PostgreSQL" in report["database"]
    a.metrics.cluster(a.instance, a.shared, a.cluster.held())
    text = a.metrics.render()[0].decode()
    assert f'pluto_instance{{instance="{a.instance}",shared="true"}} 1.0' in text
    assert 'pluto_cluster_leases{kind="instance"} 1.0' in text
    assert set(await a.cluster.alive()) >= {a.instance, b.instance}


@contextlib.asynccontextmanager
async def gateways_on(config_dir: Path, tmp_path: Path, urls: list[str],
                      model: ScriptedModel) -> AsyncIterator[list[Gateway]]:
    """A started gateway per database URL, each with a recording provider; stopped after."""
    gateways: list[Gateway] = []
    try:
        for i, url in enumerate(urls):
            gw = Gateway(config_dir, config=PlutoConfig(data_dir=tmp_path / f"d{i}"),
                         model_factory=model, store=PostgresStore(url))
            await gw.start()
            gateways.append(gw)
            provider = RecordingProvider()
            gw.add_provider(provider)
            await provider.running.wait()
        yield gateways
    finally:
        for gw in gateways:
            await gw.stop()


async def until_running(store, run_id: str):  # type: ignore[no-untyped-def]
    """The run's row once it is running (after 5 s at most: then as it is)."""
    for _ in range(100):
        run = await store.run(run_id)
        if run is not None and run.status == "running":
            break
        await asyncio.sleep(0.05)
    return run


async def test_stop_sent_to_another_instance_stops_the_run(config_dir, tmp_path) -> None:
    slow = ScriptedModel(fallback=lambda msgs: Scripted(text="word " * 400, chunk=5,
                                                        delay=0.02))
    with fresh_schema() as url:
        async with gateways_on(config_dir, tmp_path, [url, url], slow) as gateways:
            a, b = (gw.providers["test"] for gw in gateways)
            started = await b.say("tell me a long story", chat="c1")
            assert isinstance(started, Accepted)
            store = gateways[0].store.conversations
            await until_running(store, started.run_id)  # (on b)
            stopped = await a.say("/stop", chat="c1")  # the same chat, the other instance
            assert stopped.type == "answered" and stopped.text.startswith("Stopped"), stopped
            for _ in range(100):
                run = await store.run(started.run_id)
                if run.status != "running":
                    break
                await asyncio.sleep(0.05)
            assert run.status == "cancelled"


class Gated(ScriptedModel):
    """Echoes; the answer to a text :meth:`hold` names waits until its gate is opened."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}

    def hold(self, text: str) -> tuple[asyncio.Event, asyncio.Event]:
        """(reached, gate): set when the answer to ``text`` starts; set it to go on."""
        return self.gates.setdefault(text, (asyncio.Event(), asyncio.Event()))

    async def stream(self, messages, tools, settings):  # type: ignore[no-untyped-def]
        if (held := self.gates.get(text_of(messages[-1]["content"]))) is not None:
            held[0].set()
            await held[1].wait()
        async for part in super().stream(messages, tools, settings):
            yield part


@pytest.mark.parametrize("gap", ["missed", "deaf"])
async def test_notes_missed_make_every_held_chat_read_its_inbox_not_only_the_next_one_read(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: str) -> None:
    """The note of a message B recorded in a chat A holds is lost on A. ``missed``: A's
    listener is back and says notes may have been missed; A then reads another chat's inbox —
    which says nothing of the first chat's. ``deaf``: A's listener is still away (no note can
    be trusted). Either way the next message A itself receives in the first chat is answered
    after B's, not taken from memory ahead of it. (Found by tests/test_cluster_chaos.py: one
    chat's read used to clear the "missed" mark of all, and a listener's loss was told only
    once it was back.)"""
    model = Gated()
    reached, gate = model.hold("x1")
    with fresh_schema() as url:
        async with gateways_on(config_dir, tmp_path, [url, url], model) as gateways:
            pa, pb = (gw.providers["test"] for gw in gateways)
            intake = gateways[0].intakes["test"]
            assert pa.intake is not None and pb.intake is not None
            first = await pa.intake.submit(pa.msg("x1", chat="X"))
            await asyncio.wait_for(reached.wait(), 10)  # A holds chat X, answering x1
            heard, lost = intake.note, asyncio.Event()

            def deaf_to_x(payload: str | None) -> None:
                if payload is not None and payload.startswith("new|test|X|"):
                    lost.set()
                else:
                    heard(payload)

            monkeypatch.setattr(intake, "note", deaf_to_x)
            second = await pb.intake.submit(pb.msg("x2", chat="X"))  # its note is lost on A
            await asyncio.wait_for(lost.wait(), 10)
            monkeypatch.setattr(intake, "note", heard)
            if gap == "missed":
                intake.note(None)  # the listener back after its gap
            else:
                monkeypatch.setattr(gateways[0].store.bus, "_hearing", False)  # still away
            other = await pa.intake.submit(pa.msg("y1", chat="Y"))  # chat Y read on A
            assert isinstance(await asyncio.wait_for(other.outcome(), 10), Accepted)
            third = await pa.intake.submit(pa.msg("x3", chat="X"))
            gate.set()
            outcomes = [await asyncio.wait_for(t.outcome(), 30) for t in (first, second, third)]
            assert all(isinstance(o, Accepted) for o in outcomes), outcomes
            store = gateways[0].store.conversations
            for o in outcomes:
                for _ in range(200):
                    run = await store.run(o.run_id)
                    if run is not None and run.status == "ok":
                        break
                    await asyncio.sleep(0.05)
            runs = [await store.run(o.run_id) for o in outcomes]  # type: ignore[union-attr]
            assert [r.status for r in runs] == ["ok"] * 3
            assert [r.input for r in sorted(runs, key=lambda r: r.started_at)] == \
                ["x1", "x2", "x3"]


async def test_deployments_in_other_schemas_of_the_database_never_hear_each_other(
        config_dir, tmp_path) -> None:
    """Notifications are database-wide; two deployments sharing the database in schemas of
    their own (the same chat, the same session key) must not stop each other's runs."""
    slow = ScriptedModel(fallback=lambda msgs: Scripted(text="word " * 100, chunk=5,
                                                        delay=0.02))
    with fresh_schema() as url_a, fresh_schema() as url_b:
        async with gateways_on(config_dir, tmp_path, [url_a, url_b], slow) as gateways:
            a, b = (gw.providers["test"] for gw in gateways)
            started = await b.say("tell me a long story", chat="c1")
            assert isinstance(started, Accepted)
            store_b = gateways[1].store.conversations
            await until_running(store_b, started.run_id)  # (in deployment b)
            stopped = await a.say("/stop", chat="c1")  # deployment a: nothing of its own runs
            assert stopped.type == "answered" and not stopped.text.startswith("Stopped"), stopped
            await b.wait_finals(1)
            assert (await store_b.run(started.run_id)).status == "ok"
            assert b.finals()[0].startswith("word word")



@contextlib.asynccontextmanager
async def one_instance(config_dir: Path, tmp_path: Path, model: ScriptedModel
                       ) -> AsyncIterator[tuple[Gateway, RecordingProvider]]:
    """One gateway on a schema of its own (leases of 2 s) with a recording provider running."""
    with fresh_schema() as url:
        cfg = PlutoConfig(data_dir=tmp_path / "data", storage=StorageConfig(lease_seconds=2))
        gw = Gateway(config_dir, config=cfg, model_factory=model, store=PostgresStore(url))
        await gw.start()
        try:
            provider = RecordingProvider()
            gw.add_provider(provider)
            await provider.running.wait()
            assert provider.intake is not None
            yield gw, provider
        finally:
            await gw.stop()


def fail_while(away: list[bool], monkeypatch: pytest.MonkeyPatch,
               *methods: tuple[object, str]) -> None:
    """Each (store part, method name) raises StorageUnavailable while ``away[0]``: storage is
    away for those calls alone (a partial outage: asyncpg back, psycopg's pool not yet)."""
    from pluto.errors import StorageUnavailable

    for part, name in methods:
        original = getattr(part, name)

        async def call(*args: object, _original: Any = original, **kwargs: object) -> object:
            if away[0]:
                raise StorageUnavailable("the database cannot be reached")
            return await _original(*args, **kwargs)

        monkeypatch.setattr(part, name, call)

async def test_a_chat_whose_run_an_outage_cut_short_answers_that_run_first(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outage cuts a run short (its answer cannot be saved: it is handed back once storage
    works) and the chat's worker's look at the inbox fails meanwhile. The worker holds the
    chat until the run is handed back (a failed look used to make it let go: the chat was then
    taken again by the statement recording its next message, which worked while the hand-back
    did not yet, and answered that message first — or, in a race met about once in 35 runs,
    handed the run back just after the new holder had read the inbox). The message of the run
    cut short is answered again before the next one."""
    asked: list[str] = []

    def answer(messages: list[dict]) -> Scripted:
        said = messages[-1]["content"]
        asked.append(said)
        return Scripted(text=f"echo: {said}", chunk=1, delay=0.15 if said == "one" else 0.0)

    model = ScriptedModel(fallback=answer)
    async with one_instance(config_dir, tmp_path, model) as (gw, provider):
        intake = gw.intakes["test"]
        away = [False]  # storage "away" for what the test names
        conversations = gw.store.conversations
        fail_while(away, monkeypatch, (conversations, "complete_run"),
                   (conversations, "recover_runs"), (intake.inbox, "unhandled_in_chat"))
        await provider.intake.submit(provider.msg("one"))
        async with asyncio.timeout(10):
            while not asked:  # the model answers "one", slowly
                await asyncio.sleep(0.01)
        away[0] = True
        intake.note(None)  # a note may have been missed: the worker looks...
        # ...at the inbox, and cannot (it used to let go of the chat then)
        intake._wake.setdefault("c1", asyncio.Event()).set()
        async with asyncio.timeout(10):
            while not gw._stranded:  # the answer could not be saved: handed back later
                await asyncio.sleep(0.01)
        await provider.intake.submit(provider.msg("two"))  # recorded: behind "one"
        await asyncio.sleep(1.0)  # (the old way: "two" was answered in this second)
        assert provider.finals() == []
        assert gw.cluster.holds("chat:test:c1")  # (held through the outage)
        away[0] = False  # storage works again
        intake.note(None)  # (as the listener, back after an outage, wakes every chat)
        assert await provider.wait_finals(2, timeout=20) == ["echo: one", "echo: two"]
        await gw.settled()
        assert provider.finals() == ["echo: one", "echo: two"]


async def test_a_preview_of_a_run_cut_short_is_withdrawn_by_its_instance_when_handed_back(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage goes away while a run streams its live preview: the preview's id cannot be kept
    and the answer cannot be saved (the run is handed back once storage works). Its message may
    then be answered by any instance, which cannot know of that preview: the instance that
    showed it deletes it as it hands the run back, and the answer is a message of its own (the
    outage scenario left such a preview, full text and all, beside the answer given elsewhere)."""
    from pluto.types import Capabilities
    text = "echo: one and a few more words to stream"

    def answer(messages: list[dict]) -> Scripted:
        return Scripted(text=text, chunk=2, delay=0.05)

    with fresh_schema() as url:
        cfg = PlutoConfig(data_dir=tmp_path / "data", storage=StorageConfig(lease_seconds=2),
                          gateway={"stream_edit_interval_seconds": 0.1})
        gw = Gateway(config_dir, config=cfg, model_factory=ScriptedModel(fallback=answer),
                     store=PostgresStore(url))
        await gw.start()
        try:
            provider = RecordingProvider(capabilities=Capabilities(max_message_length=200,
                                                                   can_edit=True))
            gw.add_provider(provider)
            await provider.running.wait()
            assert provider.intake is not None
            away = [True]  # storage "away" for what the test names
            conversations = gw.store.conversations
            fail_while(away, monkeypatch, (conversations, "complete_run"),
                       (conversations, "recover_runs"), (gw.store.inbound, "keep_preview"))
            await provider.intake.submit(provider.msg("one"))
            async with asyncio.timeout(10):
                while not gw._stranded:  # shown, and its answer could not be saved
                    await asyncio.sleep(0.01)
            assert [m.edit_of for m in provider.sent] == [None]  # the preview, message 1
            away[0] = False  # storage works again: handed back, answered again

            def answer_in(message: str) -> bool:
                return any(m.edit_of == message and m.text == text for m in provider.edits)

            async with asyncio.timeout(20):
                while not answer_in("2"):  # the answer: in a message of its own
                    await asyncio.sleep(0.02)
            await gw.settled()
            assert provider.deleted == ["1"]  # the preview went
            assert len(provider.sent) == 2 and not gw._stranded
        finally:
            await gw.stop()


async def test_a_look_at_the_inbox_failing_while_a_run_goes_on_keeps_the_chat(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the chat's run goes on its worker looks at the inbox for a ``/stop`` whenever a
    note may have been missed. Storage away, that look failed — and the worker let go of the
    chat with the run still going: another instance took the chat, found free, and answered
    the next message before it (tests/test_cluster_faults.py[outage] under load: five chats
    out of order, runs refused at their end). The look waits for the next note now; the chat
    stays held until the run has ended."""
    model = Gated()
    reached, gate = model.hold("one")
    async with one_instance(config_dir, tmp_path, model) as (gw, provider):
        intake = gw.intakes["test"]
        lease = "chat:test:c1"
        released: list[str] = []
        release = gw.cluster.release

        async def noted(name: str) -> None:
            released.append(name)
            await release(name)

        monkeypatch.setattr(gw.cluster, "release", noted)
        looks = [0]
        from pluto.errors import StorageUnavailable
        unhandled = intake.inbox.unhandled_in_chat

        async def away(*args: Any, **kwargs: Any) -> Any:
            if reached.is_set() and not gate.is_set():
                looks[0] += 1
                raise StorageUnavailable("the database cannot be reached")
            return await unhandled(*args, **kwargs)

        monkeypatch.setattr(intake.inbox, "unhandled_in_chat", away)
        await provider.intake.submit(provider.msg("one"))
        await asyncio.wait_for(reached.wait(), 10)
        for _ in range(3):  # notes may have been missed: the worker looks, and cannot
            before = looks[0]
            intake.note(None)
            await wait_for(lambda before=before: looks[0] > before)
        assert gw.cluster.holds(lease) and lease not in released
        gate.set()
        assert await provider.wait_finals(1, timeout=20) == ["echo: one"]
        await gw.settled()
        run = (await gw.store.conversations.recent_runs(limit=1))[0]
        assert run["status"] == "ok", run


async def test_a_reply_recorded_though_storage_said_it_failed_goes_before_the_next(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The connection breaks as the reply is recorded: the server committed it, the
    instance heard an error and handed the run back once storage worked — found ended, its
    reply in the outbox, claimed here, nothing to answer again. That reply was left to the
    outbox's sweep, and the chat's next message, answered meanwhile, came first
    (tests/test_cluster_faults.py[outage] under load: "handed back: it had ended", m5's
    answer above m4's). It is queued at once now, ahead of anything newer — and, its one
    counted call being the record's, never made, without a warning that it may have been
    delivered before (no crash happened; nothing was sent twice)."""
    from pluto.errors import StorageUnavailable
    caplog.set_level(logging.INFO, logger="pluto")
    model = ScriptedModel(fallback=slow_echo)
    async with one_instance(config_dir, tmp_path, model) as (gw, provider):
        record = gw.store.outbox.record_claimed
        broke: list[str] = []

        async def committed_then_broken(rows: Any, *args: Any, **kwargs: Any) -> Any:
            done = await record(rows, *args, **kwargs)
            if not broke and rows[0].text == "echo: one":
                broke.append(rows[0].reply_id)
                raise StorageUnavailable("the database cannot be reached")
            return done

        monkeypatch.setattr(gw.store.outbox, "record_claimed", committed_then_broken)
        await provider.intake.submit(provider.msg("one"))
        await provider.intake.submit(provider.msg("two"))
        assert await provider.wait_finals(2, timeout=20) == ["echo: one", "echo: two"]
        await gw.settled()
        assert broke and provider.finals() == ["echo: one", "echo: two"]
        assert "handed back: it had ended answered" in caplog.text
        assert "may have been delivered" not in caplog.text


async def test_a_message_recorded_while_the_chat_is_taken_goes_before_the_next(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chat's worker takes the chat — one statement: its lease, then its waiting
    messages — and a message of the chat is recorded and queued here while that statement is
    under way, too late for its read. It was counted among the messages queued at the read,
    so taken for one another instance had handled; the next one, taken from memory, was
    answered before it (tests/test_cluster_chaos_web.py, seed 2: a tab's m15 answered after
    its m16–m19, all on one instance that had just been resumed)."""
    model = ScriptedModel(fallback=slow_echo)
    async with one_instance(config_dir, tmp_path, model) as (gw, provider):
        lease = "chat:test:c1"
        other = await gw.store.leases.acquire(lease, "another-instance", 30)
        assert other is not None  # the chat's worker here waits for it
        await provider.intake.submit(provider.msg("one"))
        await provider.intake.submit(provider.msg("two"))
        reading, go = asyncio.Event(), asyncio.Event()
        take = gw.cluster.take_chat

        async def slow_take(*args: Any, **kwargs: Any) -> Any:
            took = await take(*args, **kwargs)
            if not reading.is_set():  # (the statement has read the inbox; its answer is late)
                reading.set()
                await go.wait()
            return took

        monkeypatch.setattr(gw.cluster, "take_chat", slow_take)
        await gw.store.leases.release(lease, "another-instance", other)
        await asyncio.wait_for(reading.wait(), 30)
        await provider.intake.submit(provider.msg("three"))  # queued; not in the read
        go.set()
        await provider.intake.submit(provider.msg("four"))
        assert await provider.wait_finals(4, timeout=30) == [
            "echo: one", "echo: two", "echo: three", "echo: four"]


async def test_a_run_whose_chat_was_lost_and_found_free_is_answered_again(
        config_dir: Path, tmp_path: Path) -> None:
    """An outage cut the chat's lease: its release failed on the wire after the server had
    let it go (the row gone), so the chat is found free as the database comes back, not taken
    from a dead instance — nobody takes the run over. Its answer, written under the old lease,
    is refused ("taken over"). Its message was counted handled: unless the run is handed back
    it is answered by nobody, the run stays "running" for good (seen in
    tests/test_cluster_faults.py[outage]: two runs unfinished after every message had its
    answer — each from the streamed preview alone). Handed back: answered again, once."""
    model = Gated()
    reached, gate = model.hold("one")
    async with one_instance(config_dir, tmp_path, model) as (gw, provider):
        first = await provider.intake.submit(provider.msg("one"))
        run_id = (await first.outcome()).run_id  # type: ignore[union-attr]
        await asyncio.wait_for(reached.wait(), 10)
        lease = "chat:test:c1"
        assert gw.cluster.holds(lease)
        await gw.store.engine.write(("DELETE FROM leases WHERE name = ?", (lease,)))
        await wait_for(lambda: not gw.cluster.holds(lease))  # (the next renewal tells)
        gate.set()  # the run ends: its answer refused
        assert await provider.wait_finals(1, timeout=20) == ["echo: one"]
        await gw.settled()
        run = await gw.store.conversations.run(run_id)
        assert run is not None and run.status == "interrupted", run
        assert not await gw.store.conversations.unfinished_runs(time.time() + 3600)
        assert provider.finals() == ["echo: one"]


class HeldPlatform(RecordingProvider):
    """A platform that holds this instance's sends while ``gate`` is closed (a flood hold
    longer than a lease); every send of every instance lands in ``platform``, in the order the
    chat's members see them."""

    def __init__(self, platform: list[str], gate: asyncio.Event | None = None):
        super().__init__()
        self.platform, self.gate = platform, gate

    async def send(self, message: Any) -> str | None:
        if self.gate is not None:
            await self.gate.wait()
        self.platform.append(message.text)
        return await super().send(message)


async def test_a_chat_stays_with_the_instance_whose_answer_the_platform_holds_past_a_lease(
        config_dir: Path, tmp_path: Path) -> None:
    """A's answer to "one" is recorded but the platform holds it longer than a lease (a long
    flood hold); "two" reaches B after that. The chat is not let go while A's answer waits (it
    was, after a lease's length: B took it and answered "two" first, shown above "one"); "two"
    is answered meanwhile under A's hold, its answer sent after "one"."""
    platform: list[str] = []
    gate = asyncio.Event()
    lease = 2.0

    def echo(messages: list[dict]) -> Scripted:
        return Scripted(text=f"echo: {messages[-1]['content']}")

    with fresh_schema() as url:
        gateways: list[Gateway] = []
        try:
            for i, provider in enumerate([HeldPlatform(platform, gate), HeldPlatform(platform)]):
                cfg = PlutoConfig(data_dir=tmp_path / f"d{i}",
                                  storage=StorageConfig(lease_seconds=lease))
                gw = Gateway(config_dir, config=cfg, model_factory=ScriptedModel(fallback=echo),
                             store=PostgresStore(url))
                await gw.start()
                gateways.append(gw)
                gw.add_provider(provider)
                await provider.running.wait()
            a, b = (gw.providers["test"] for gw in gateways)
            assert isinstance(a, HeldPlatform) and isinstance(b, HeldPlatform)
            first = await a.say("one")
            assert isinstance(first, Accepted)
            store = gateways[0].store.conversations
            async with asyncio.timeout(10):
                while (run := await store.run(first.run_id)) is None or run.status != "ok":
                    await asyncio.sleep(0.02)  # answered and recorded; the platform holds it
            await asyncio.sleep(lease + 1.0)  # (the old way: the chat was let go by now)
            assert b.intake is not None
            second = await b.intake.submit(b.msg("two"))
            # answered meanwhile, under A's hold: its answer waits behind "one" (the old way: B
            # took the chat and its answer was shown first)
            answered = await asyncio.wait_for(second.outcome(), 10)
            assert isinstance(answered, Accepted)
            async with asyncio.timeout(10):
                while (run := await store.run(answered.run_id)) is None or run.status != "ok":
                    await asyncio.sleep(0.02)
            assert platform == []
            gate.set()
            async with asyncio.timeout(10):
                while len(platform) < 2:
                    await asyncio.sleep(0.02)
            for gw in gateways:
                await gw.settled()
            assert platform == ["echo: one", "echo: two"]
        finally:
            for gw in gateways:
                await gw.stop()


@pytest.mark.parametrize("where", ["same instance", "other instance"])
async def test_a_tab_that_joins_sees_the_messages_waiting_and_their_answers_as_they_come(
        config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A visitor's tab sent three messages on A; the first is being answered, the others wait
    their turn. A tab of the same visitor opens (the first one's socket dropped: a reload, a
    reconnect through the balancer to B): its history shows the two waiting — with the ids
    the tab gave them, so a tab that had not seen their acknowledgement draws them once — and
    each answer reaches it when its run begins, although on B no ticket of theirs tells (found
    by tests/test_cluster_chaos_web.py: the answers of messages queued on an instance that died
    reached no tab until a reload, and the messages vanished from the tab meanwhile)."""
    monkeypatch.setenv("PLUTO_WEB_SECRET", "w" * 40)
    model = Gated()
    reached, gate = model.hold("message 0")
    with fresh_schema() as url:
        gateways: list[Gateway] = []
        try:
            for i in range(2):
                gw = Gateway(config_dir, config=PlutoConfig(
                    data_dir=tmp_path / f"w{i}", providers={"web": {"enabled": True}}),
                    model_factory=model, store=PostgresStore(url), serve=True,
                    http_bind=("127.0.0.1", 0))
                await gw.start()
                gateways.append(gw)
                await wait_for(lambda g=gw: g.health["web"].state == "running")
            a, b = gateways if where == "other instance" else (gateways[0], gateways[0])
            async with aiohttp.ClientSession() as http:
                first = await Tab.open(http, a)
                for i in range(3):
                    await first.send(type="message", id=f"m{i}", text=f"message {i}")
                for i in range(3):
                    await first.until("ack", lambda f, i=i: f["reply_to"] == f"m{i}")
                await asyncio.wait_for(reached.wait(), 10)  # message 0 answered, 1 and 2 wait
                await first.ws.close()
                tab = await Tab.open(http, b, token=first.ready["token"])
                waiting = [(m.get("id"), m["text"]) for m in tab.history if m["role"] == "user"]
                assert waiting == [("m0", "message 0"), ("m1", "message 1"),
                                   ("m2", "message 2")], tab.history
                gate.set()
                finals = [await tab.until("message.final", timeout=30) for _ in range(3)]
                assert sorted(f["text"] for f in finals) == [f"echo: message {i}"
                                                             for i in range(3)]
                # each answer's start names the message it answers: the widget draws it in
                # that message's place (one found late may come after a later one's frames)
                starts = {f["run_id"]: f.get("message_id") for f in tab.of("run.start")}
                answered = {starts[f["run_id"]]: f["text"] for f in finals}
                assert {k: answered.get(k) for k in ("m1", "m2")} == {
                    "m1": "echo: message 1", "m2": "echo: message 2"}, (starts, finals)
        finally:
            for gw in gateways:
                await gw.stop()
