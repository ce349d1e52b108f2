"""The Runner's loop, budgets, errors and cancellation, with an in-process scripted model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from pluto.agents.spec import AgentSpec, Budget, HistoryWindow
from pluto.runtime.errors import ModelError
from pluto.events import MessageDelta, MessageFinal, RunEnd, RunError, RunStart, ToolEnd, ToolStart
from pluto.runtime.batching import batched
from pluto.runtime.model import ModelTurn, ToolCall
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import BUILTIN_TOOLS, ToolContext, ToolError, tool
from pluto.storage.ports import ConversationStore
from pluto.storage.sqlite import SqliteStore


@tool
async def boom(ctx: ToolContext) -> str:
    """Always fails."""
    raise RuntimeError("kaput")


@tool
async def refuse(ctx: ToolContext, why: str) -> str:
    """Raises a ToolError.

    Args:
        why: the reason
    """
    raise ToolError(why)


@tool
async def slow(ctx: ToolContext, seconds: float) -> str:
    """Sleeps."""
    await asyncio.sleep(seconds)  # (a slow tool: the scenario, not a wait)
    return "done"


TOOLS = {**BUILTIN_TOOLS, "boom": boom, "refuse": refuse, "slow": slow}


def agent(tmp: Path, **budget: float) -> AgentSpec:
    return AgentSpec(name="a", description="", model="scripted", api_base=None, api_key_env=None,
                     temperature=None, instructions="Be brief.",
                     tools=("current_time", "boom", "refuse", "slow"), datasets=(),
                     budget=Budget(**budget), history=HistoryWindow(), source=tmp)


@pytest.fixture
async def store(tmp_path: Path):
    async with SqliteStore(tmp_path / "p.db") as s:
        yield s.conversations


async def run(store: ConversationStore, model: ScriptedModel, spec: AgentSpec, text: str = "hi",
              key: str = "k") -> list:
    runner = Runner(store, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model,
                    retry_base_delay=0.01)
    session = await store.session(key, spec.name)
    req = RunRequest(uuid.uuid4().hex, session, spec, text)
    return [e async for e in runner.run(req)]


def call(name: str, args: object, id: str = "c1") -> ToolCall:
    return ToolCall(id, name, args if isinstance(args, str) else json.dumps(args))


async def test_plain_answer_is_persisted_and_one_written_at_once_comes_whole(store, tmp_path):
    model = ScriptedModel(Scripted(text="Hello there, friend.", chunk=5))
    events = await run(store, model, agent(tmp_path))
    # written at once: complete before a first batch could go, it comes as the answer alone
    # (no preview to show and then replace)
    assert [type(e) for e in events] == [RunStart, MessageFinal, RunEnd]
    assert isinstance(events[-2], MessageFinal) and events[-2].text == "Hello there, friend."
    assert isinstance(events[-1], RunEnd) and events[-1].outcome == "ok"
    stored = await store.events(events[0].run_id)
    assert stored == events  # every event committed, numbered, in order
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    run_row = await store.run(events[0].run_id)
    assert run_row.status == "ok" and run_row.usage["total_tokens"] > 0


async def test_tool_loop_feeds_results_back(store, tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[call("current_time", {"timezone": "UTC"})]),
        Scripted(text="It is now."))
    events = await run(store, model, agent(tmp_path))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["run.start", "tool.start", "tool.end"]
    end = next(e for e in events if isinstance(e, ToolEnd))
    assert not end.is_error and end.content.endswith("+00:00")
    second_call = model.calls[1]
    assert second_call[-2]["tool_calls"][0]["function"]["name"] == "current_time"
    assert second_call[-1] == {"role": "tool", "tool_call_id": "c1", "name": "current_time",
                               "content": end.content}


@pytest.mark.parametrize("bad_call, expected", [
    (call("current_time", '{"timezone": "UTC"'), "not valid JSON"),
    (call("current_time", "[1, 2]"), "must be a JSON object"),
    (call("no_such_tool", {}), "There is no tool named 'no_such_tool'"),
    (call("current_time", {"tz": "UTC"}), "unknown argument(s): tz"),
    (call("current_time", {"timezone": 5}), "timezone must be of type string"),
    (call("current_time", {"timezone": "Mars/Base"}), "unknown time zone"),
    (call("refuse", {"why": "no way"}), "Error: no way"),
    (call("boom", {}), "The tool failed: RuntimeError: kaput"),
])
async def test_bad_tool_calls_go_back_to_the_model(store, tmp_path, bad_call, expected):
    model = ScriptedModel(Scripted(tool_calls=[bad_call]), Scripted(text="Sorry, fixed."))
    events = await run(store, model, agent(tmp_path))
    end = next(e for e in events if isinstance(e, ToolEnd))
    assert end.is_error and expected in end.content
    assert model.calls[1][-1]["content"] == end.content  # the model sees the error and recovers
    assert events[-1].outcome == "ok" and events[-2].text == "Sorry, fixed."


async def test_tool_call_budget(store, tmp_path):
    looping = ScriptedModel(fallback=lambda m: Scripted(
        tool_calls=[call("current_time", {}, id=f"c{len(m)}")]))
    events = await run(store, looping, agent(tmp_path, max_tool_calls=3))
    assert sum(isinstance(e, ToolEnd) for e in events) == 3
    err = next(e for e in events if isinstance(e, RunError))
    assert err.kind == "budget" and "3 tool calls" in err.message
    assert events[-1].outcome == "budget"


async def test_token_budget(store, tmp_path):
    model = ScriptedModel(fallback=lambda m: Scripted(
        tool_calls=[call("current_time", {}, id=f"c{len(m)}")],
        usage={"prompt_tokens": 600, "completion_tokens": 100}))
    events = await run(store, model, agent(tmp_path, max_tokens=2000))
    err = next(e for e in events if isinstance(e, RunError))
    assert "2,000-token limit" in err.message and events[-1].outcome == "budget"


async def test_wall_time_budget_during_model_and_tool(store, tmp_path):
    slow_model = ScriptedModel(Scripted(text="a" * 50, chunk=1, delay=0.05))
    events = await run(store, slow_model, agent(tmp_path, max_seconds=0.3))
    assert events[-1].outcome == "budget"
    assert "0.3-second limit" in next(e for e in events if isinstance(e, RunError)).message
    slow_tool = ScriptedModel(Scripted(tool_calls=[call("slow", {"seconds": 5})]))
    events = await run(store, slow_tool, agent(tmp_path, max_seconds=0.3), key="k2")
    assert events[-1].outcome == "budget"


async def test_retryable_model_error_is_retried(store, tmp_path):
    model = ScriptedModel(
        Scripted(error=ModelError("The model is rate limited", retryable=True)),
        Scripted(error=ModelError("The model service had an error.", retryable=True)),
        Scripted(text="third time lucky"))
    events = await run(store, model, agent(tmp_path))
    assert events[-2].text == "third time lucky" and len(model.calls) == 3


async def test_permanent_model_error_is_one_plain_sentence(store, tmp_path):
    model = ScriptedModel(Scripted(error=ModelError("The model service rejected the API key.")))
    events = await run(store, model, agent(tmp_path))
    err = next(e for e in events if isinstance(e, RunError))
    assert err.message == "The model service rejected the API key."
    assert events[-1].outcome == "error" and len(model.calls) == 1


async def test_cancellation_is_recorded_and_keeps_what_was_shown(store, tmp_path):
    model = ScriptedModel(Scripted(text="partial answer that goes on", chunk=4, delay=0.05))
    spec = agent(tmp_path)
    runner = Runner(store, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model)
    session = await store.session("k", "a")
    seen: list = []

    async def consume() -> None:
        async for e in runner.run(RunRequest("r1", session, spec, "hi")):
            seen.append(e)

    task = asyncio.create_task(consume())
    while sum(isinstance(e, MessageDelta) for e in seen) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await store.run("r1")).status == "cancelled"
    last = (await store.events("r1"))[-1]
    assert isinstance(last, RunEnd) and last.outcome == "cancelled"
    history = await store.history(session.id, 10, 1000)
    assert history[-1]["role"] == "assistant" and history[-1]["content"].startswith("part")


async def test_history_window_and_continuity(store, tmp_path):
    model = ScriptedModel()
    spec = agent(tmp_path)
    for i in range(3):
        await run(store, model, spec, text=f"message {i}")
    last_prompt = model.calls[-1]
    assert [m["content"] for m in last_prompt if m["role"] == "user"] == [
        "message 0", "message 1", "message 2"]
    narrow = dataclasses.replace(spec, history=HistoryWindow(max_messages=2))
    await run(store, model, narrow, text="message 3")
    assert [m["role"] for m in model.calls[-1]] == ["system", "user", "assistant", "user"]


@pytest.mark.parametrize(("interval", "delay"), [(0, 0.03), (0.04, 0.03)])
async def test_streaming_past_the_time_budget_ends_as_budget_not_cancelled(
        store, tmp_path, caplog, interval, delay):
    """The deadline passes while the consumer (storing, sending) is busy as well as the model:
    the run still ends with the budget sentence, its partial text kept, outcome ``budget``
    (the deadline used to cancel the consumer, which recorded a "user's stop")."""
    model = ScriptedModel(Scripted(text="word " * 200, chunk=10, delay=delay))
    spec = agent(tmp_path, max_seconds=2)
    runner = Runner(store, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model,
                    delta_interval=interval)
    session = await store.session("slow-reader", "a")
    events = []
    async for event in runner.run(RunRequest("r-budget", session, spec, "hi")):
        events.append(event)
        if isinstance(event, MessageDelta):
            await asyncio.sleep(0.1)  # a slow consumer: 100 deltas take 10 s
    err = next(e for e in events if isinstance(e, RunError))
    assert err.message == "I stopped: this answer took longer than the 2-second limit."
    assert err.kind == "budget" and events[-1].outcome == "budget"
    row = await store.run("r-budget")
    assert row.status == "budget" and "2-second limit" in row.error
    shown = "".join(e.text for e in events if isinstance(e, MessageDelta))
    history = await store.history(session.id, 10, 10_000)
    assert shown and history[-1] == {"role": "assistant", "content": shown}
    assert any("stopped at its seconds budget" in r.getMessage() for r in caplog.records)


async def test_deltas_are_committed_in_batches_the_first_at_once(store, tmp_path):
    model = ScriptedModel(Scripted(text="Hello there, friend.", chunk=1, delay=0.02))
    runner = Runner(store, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model,
                    delta_interval=3600)  # no batch is due before the turn ends
    session = await store.session("batched", "a")
    events = [e async for e in runner.run(RunRequest("r-batch", session, agent(tmp_path), "hi"))]
    deltas = [e.text for e in events if isinstance(e, MessageDelta)]
    assert deltas == ["H", "ello there, friend."]  # the first token is never held back
    assert await store.events("r-batch") == events
    assert events[-2].text == "Hello there, friend." and events[-1].outcome == "ok"


async def test_many_answers_streaming_at_once_get_their_previews_in_wider_batches(store, tmp_path):
    """Past STREAMS_AT_FULL_RATE turns streaming at once, each preview batch waits longer (in
    proportion, up to MAX_DELTA_INTERVAL): a thousand answers at once cost the loop a fifth of
    the commits and frames, and the questions still arriving get their turn."""
    from pluto.runtime import runner as runner_module

    runner = Runner(store, models={}, tools=TOOLS, data_dir=Path("."),
                    model_factory=ScriptedModel(), delta_interval=0.04)
    full = runner_module.STREAMS_AT_FULL_RATE
    assert runner.streaming == 0 and runner._batch_gap() == 0.04
    runner.streaming = full
    assert runner._batch_gap() == 0.04
    runner.streaming = 4 * full
    assert runner._batch_gap() == pytest.approx(0.16)
    runner.streaming = 1000 * full
    assert runner._batch_gap() == runner_module.MAX_DELTA_INTERVAL
    runner.streaming = 0

    # a turn counts while it streams, and no longer once it ended (or failed)
    seen: list[int] = []
    model = ScriptedModel(Scripted(text="one two three", chunk=4, delay=0.01),
                          Scripted(error=ModelError("The model service had an error.")))
    session = await store.session("gap", "a")
    async for event in runner.run(RunRequest("r-gap", session, agent(tmp_path), "hi")):
        seen.append(runner.streaming)
    assert seen[0] == 1 and runner.streaming == 0
    runner.model_factory = model
    for run_id, outcome in (("r-gap-2", "ok"), ("r-gap-3", "error")):
        events = [e async for e in runner.run(RunRequest(run_id, session, agent(tmp_path), "x"))]
        assert events[-1].outcome == outcome and runner.streaming == 0


async def test_a_batch_gap_given_as_a_function_is_asked_before_each_batch():
    gaps = iter([3600.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # the first gap holds; then none

    asked: list[float] = []

    def gap() -> float:
        asked.append(value := next(gaps, 0.0))
        return value

    out = [item async for item in batched(_source(["a", "b", "c"], delay=0.05), interval=gap)]
    assert "".join(i for i in out if isinstance(i, str)) == "abc"
    assert asked and asked[0] == 3600.0  # (after the first piece, which goes at once)
    assert isinstance(out[-1], ModelTurn)


async def _source(pieces: list[str], *, delay: float = 0.01, error: Exception | None = None,
                  closed: list[bool] | None = None):
    try:
        for piece in pieces:
            await asyncio.sleep(delay)  # (a model streaming slowly: the scenario)
            yield piece
        if error is not None:
            raise error
        yield ModelTurn("".join(pieces))
    finally:
        if closed is not None:
            closed.append(True)


async def test_a_batch_goes_once_it_holds_max_chars():
    out = [item async for item in batched(_source(["abcd"] * 7), interval=3600, max_chars=10)]
    assert out[:-1] == ["abcd", "abcdabcdabcd", "abcdabcdabcd"] and isinstance(out[-1], ModelTurn)


async def test_text_an_answer_carries_itself_is_not_a_batch_of_its_own():
    def final(item) -> bool:
        return isinstance(item, ModelTurn) and not item.tool_calls

    async def at_once(turn: ModelTurn):
        yield "Hel"
        yield "lo"
        yield turn

    answer = [item async for item in batched(at_once(ModelTurn("Hello")), covers=final)]
    assert answer == [ModelTurn("Hello")]  # the answer says it all
    call = ModelTurn("Let me look.", tool_calls=[ToolCall("c1", "now", "{}")])
    with_tools = [item async for item in batched(at_once(call), covers=final)]
    assert with_tools == ["Hello", call]  # a turn that calls tools: its text is shown
    streamed = [item async for item in batched(_source(["ab", "cd", "ef"], delay=0.02),
                                               interval=3600, covers=final)]
    # the first piece at once, as ever; once one went out, the batches add up to the text
    assert streamed == ["ab", "cdef", ModelTurn("abcdef")]


async def test_an_answer_whose_end_is_right_behind_its_first_piece_shows_no_preview():
    def final(item) -> bool:
        return isinstance(item, ModelTurn) and not item.tool_calls

    async def next_read(turn: ModelTurn):  # the end in the next read from the socket
        yield "Hello"
        for _ in range(3):
            await asyncio.sleep(0)
        yield turn

    answer = [item async for item in batched(next_read(ModelTurn("Hello")), covers=final)]
    assert answer == [ModelTurn("Hello")]  # shown by the answer alone: no preview, no frame
    slow = [item async for item in batched(_source(["Hel", "lo"], delay=0.05), interval=3600,
                                           covers=final)]
    assert slow == ["Hel", "lo", ModelTurn("Hello")]  # a model that takes its time streams


async def test_an_error_comes_after_the_text_read_before_it():
    got: list = []
    with pytest.raises(ModelError, match="cut"):
        async for item in batched(_source(["ab", "cd"], error=ModelError("cut")),
                                  interval=3600):
            got.append(item)
    assert "".join(got) == "abcd"


async def test_closing_the_batches_closes_the_model_stream():
    closed: list[bool] = []
    stream = batched(_source(["x"] * 1000, delay=0.005, closed=closed), interval=0.01)
    assert await anext(stream) == "x"
    await stream.aclose()
    assert closed == [True]


async def test_previews_are_committed_behind_and_never_after_the_answer(store, tmp_path):
    session = await store.session("behind", "a")
    start = await store.start_run("r-behind", session.id, "a", "hi",
                                  RunStart(run_id="r-behind", session_id=session.id, agent="a"))
    first = await store.append_event(MessageDelta(run_id="r-behind", text="Hel"), durable=False)
    second = await store.append_event(MessageDelta(run_id="r-behind", text="lo"), durable=False)
    assert (start.seq, first.seq, second.seq) == (1, 2, 3)  # numbered at once
    final, end = await store.complete_run(
        "r-behind", session.id, MessageFinal(run_id="r-behind", text="Hello"),
        RunEnd(run_id="r-behind", outcome="ok"), usage={})
    stored = await store.events("r-behind")  # the answer's commit took the previews along
    assert [(e.seq, e.type) for e in stored] == [
        (1, "run.start"), (2, "message.delta"), (3, "message.delta"), (4, "message.final"),
        (5, "run.end")]
    assert [e.text for e in stored if isinstance(e, MessageDelta)] == ["Hel", "lo"]


async def test_previews_alone_are_committed_soon(store, tmp_path):
    session = await store.session("alone", "a")
    await store.start_run("r-alone", session.id, "a", "hi",
                          RunStart(run_id="r-alone", session_id=session.id, agent="a"))
    await store.append_event(MessageDelta(run_id="r-alone", text="partial"), durable=False)
    async with asyncio.timeout(5):
        while len(await store.events("r-alone")) < 2:
            await asyncio.sleep(0.01)
    assert (await store.events("r-alone"))[-1].text == "partial"


class _ReadToTheEnd(ScriptedModel):
    """A scripted model that says when its answer was read to the end."""

    read = False

    async def stream(self, messages, tools, settings):  # type: ignore[no-untyped-def]
        async for item in super().stream(messages, tools, settings):
            yield item
        self.read = True


class _SlowStart:
    """The store, with each run's start held until ``go`` is set (or failing with ``error``)."""

    def __init__(self, store: ConversationStore, error: Exception | None = None):
        self.store, self.error, self.go = store, error, asyncio.Event()

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    async def start_run(self, *args, **kwargs):
        await self.go.wait()
        if self.error is not None:
            raise self.error
        return await self.store.start_run(*args, **kwargs)


async def test_the_model_is_called_while_the_start_is_committed_and_nothing_shows_before_it(
        store, tmp_path):
    slow = _SlowStart(store)
    model = _ReadToTheEnd(Scripted(text="Hello there.", chunk=4))
    runner = Runner(slow, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model)
    session = await store.session("overlap", "a")
    observed: list = []
    events = runner.run(RunRequest("r-ov", session, agent(tmp_path), "hi"), observed.append)
    first = asyncio.ensure_future(events.__anext__())
    async with asyncio.timeout(5):
        while not model.read:  # the model is asked, its whole answer read, before the start
            await asyncio.sleep(0.005)  # is on disk ...
    assert not first.done() and observed == []  # ... and nothing is shown or observed
    slow.go.set()
    rest = [await first] + [e async for e in events]
    assert isinstance(rest[0], RunStart) and rest[0].seq == 1
    assert [type(e) for e in observed] == [type(e) for e in rest]  # same events, same order
    assert [e.text for e in rest if isinstance(e, MessageFinal)] == ["Hello there."]
    assert [e.seq for e in rest] == sorted(e.seq for e in rest)
    assert (await store.run("r-ov")).status == "ok"


async def test_a_start_that_fails_stops_the_model_call_and_shows_nothing(store, tmp_path):
    from pluto.errors import StorageError
    slow = _SlowStart(store, StorageError("disk full"))
    model = ScriptedModel(Scripted(text="never shown " * 20, chunk=3, delay=0.01))
    runner = Runner(slow, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model)
    session = await store.session("failstart", "a")
    observed: list = []
    events = runner.run(RunRequest("r-fs", session, agent(tmp_path), "hi"), observed.append)
    first = asyncio.ensure_future(events.__anext__())
    async with asyncio.timeout(5):
        while not model.calls:
            await asyncio.sleep(0.005)
    slow.go.set()
    with pytest.raises(StorageError):  # as before: the caller ends it and says so
        await first
    assert observed == [] and await store.run("r-fs") is None
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "model-turn"]  # call stopped


async def test_a_run_stopped_before_its_start_is_committed_ends_cancelled(store, tmp_path):
    slow = _SlowStart(store)
    model = ScriptedModel(Scripted(text="slow words " * 20, chunk=3, delay=0.02))
    runner = Runner(slow, models={}, tools=TOOLS, data_dir=Path("."), model_factory=model)
    session = await store.session("stopearly", "a")
    observed: list = []

    async def consume() -> None:
        async for _ in runner.run(RunRequest("r-se", session, agent(tmp_path), "hi"),
                                  observed.append):
            pass

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        while not model.calls:
            await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.sleep(0.02)
    slow.go.set()  # the start lands after the stop: the run is still ended, as cancelled
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await store.run("r-se")).status == "cancelled"
    assert [type(e) for e in observed] == [RunStart, RunEnd]
    assert observed[-1].outcome == "cancelled"
