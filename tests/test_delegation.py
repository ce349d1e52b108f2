"""Agents as tools (``ask_<name>``) and handoffs (``handoff_to``): runtime/delegation.py, with
an in-process scripted model; the handoff through the gateway's pipeline."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from pluto.agents.spec import AgentSpec, Budget, DelegationLimits, HistoryWindow, load_agent
from pluto.errors import ConfigError, UnknownAgent
from pluto.events import MessageFinal, RunEnd, RunEvent, ToolEnd, ToolProgress, ToolStart
from pluto.gateway.app import Gateway
from pluto.runtime.delegation import Delegation
from pluto.runtime.model import ToolCall
from pluto.runtime.runner import Runner, RunRequest
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.usage import Attribution, UsageMeter
from pluto.settings import PlutoConfig
from pluto.storage.sqlite import SqliteStore
from tests.helpers.gateway import RecordingProvider
from tests.helpers.inspect_store import runs
from tests.helpers.served import wait_for


def spec(name: str, tmp: Path, *, agents: tuple[str, ...] = (), max_tokens: int = 100_000,
         limits: DelegationLimits = DelegationLimits(), handoff: tuple[str, ...] = ()
         ) -> AgentSpec:
    return AgentSpec(name=name, description=f"the {name}", model="scripted", api_base=None,
                     api_key_env=None, temperature=None, instructions=f"You are {name}.",
                     tools=(), datasets=(), budget=Budget(max_tokens=max_tokens),
                     history=HistoryWindow(), source=tmp, agents=agents, delegation=limits,
                     handoff=handoff)


def ask(name: str, question: str, id: str = "c1") -> ToolCall:
    return ToolCall(id, f"ask_{name}", json.dumps({"question": question}))


class Setup:
    def __init__(self, store: SqliteStore, model: ScriptedModel, *agents: AgentSpec):
        self.store = store
        self.agents = {a.name: a for a in agents}
        self.delegation = Delegation(self.load)
        self.runner = Runner(store.conversations, models={}, tools={}, data_dir=Path("."),
                             model_factory=model, usage=UsageMeter(store.usage),
                             services={"delegation": self.delegation})

    async def load(self, name: str) -> AgentSpec:
        if name not in self.agents:
            raise UnknownAgent(name)
        return self.agents[name]

    async def request(self, agent: str, text: str = "hi") -> RunRequest:
        session = await self.store.conversations.session("chat", agent)
        return RunRequest(uuid.uuid4().hex, session, self.agents[agent], text,
                          who=Attribution("test", "u1", "c1", "default"))

    async def run(self, agent: str, text: str = "hi") -> tuple[RunRequest, list[RunEvent]]:
        req = await self.request(agent, text)
        return req, [e async for e in self.runner.run(req)]


@pytest.fixture
async def store(tmp_path: Path):
    async with SqliteStore(tmp_path / "p.db") as s:
        yield s


def tool_ends(events: list[RunEvent]) -> list[ToolEnd]:
    return [e for e in events if isinstance(e, ToolEnd)]


async def test_a_parent_asks_a_child_and_answers_with_its_answer(store, tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[ask("analyst", "What were sales in May?")],
                 usage={"prompt_tokens": 30, "completion_tokens": 5}),
        Scripted(text="Sales in May were 42.", usage={"prompt_tokens": 20, "completion_tokens": 7}),
        Scripted(text="The analyst says: 42.", usage={"prompt_tokens": 50, "completion_tokens": 6}))
    s = Setup(store, model, spec("lead", tmp_path, agents=("analyst",)), spec("analyst", tmp_path))
    req, events = await s.run("lead", "How did May go?")
    assert isinstance(events[-2], MessageFinal) and events[-2].text == "The analyst says: 42."
    [end] = tool_ends(events)
    assert (end.name, end.content, end.is_error) == ("ask_analyst", "Sales in May were 42.", False)
    child = end.details["run_id"]
    # the call's start named the child's run already (a watcher nests its events there)
    [start] = [e for e in events if isinstance(e, ToolStart)]
    assert start.child_run_id == child
    # the child ran with its own instructions, on the question alone
    assert [m["content"] for m in model.calls[1]] == ["You are analyst.",
                                                      "What were sales in May?"]
    assert "ask_analyst" in str(model.calls[2])  # the parent read the answer as a tool result
    # its own run, its events readable by its id; the parent's progress names it
    row = await store.conversations.run(child)
    assert row is not None and (row.agent, row.status) == ("analyst", "ok")
    kinds = [e.type for e in await store.conversations.events(child)]
    assert kinds[0] == "run.start" and kinds[-2:] == ["message.final", "run.end"]
    progress = [e for e in events if isinstance(e, ToolProgress)]
    assert progress == [] or child in (progress[0].message or "")
    stored = [e for e in await store.conversations.events(req.run_id)
              if isinstance(e, ToolProgress)]
    assert stored and stored[0].message == f"asking analyst (run {child})"
    # its usage is the parent's: in the parent's ledger (purpose ask_analyst) and its totals
    calls = await store.usage.calls(run_id=req.run_id)
    assert [(c.agent, c.purpose, c.input_tokens) for c in calls] == [
        ("lead", "answer", 30), ("lead", "ask_analyst", 20), ("lead", "tool_loop", 50)]
    assert isinstance(events[-1], RunEnd) and events[-1].usage["total_tokens"] == 118


async def test_a_child_that_runs_out_of_the_parents_budget_gives_it_an_error(store, tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[ask("analyst", "Dig deep.")],
                 usage={"prompt_tokens": 300, "completion_tokens": 50}),
        # the child spends past what the parent had left (1,000 - 350) on its first turn
        Scripted(tool_calls=[ToolCall("k1", "current_time", "{}")],
                 usage={"prompt_tokens": 600, "completion_tokens": 100}),
        Scripted(text="Sorry, the analyst could not finish; here is what I know."))
    s = Setup(store, model, spec("lead", tmp_path, agents=("analyst",), max_tokens=1000),
              spec("analyst", tmp_path))
    req, events = await s.run("lead")
    [end] = tool_ends(events)
    assert end.is_error and end.content.startswith("Error: analyst could not answer: ")
    assert "650-token limit" in end.content  # the parent's tokens left were its limit
    assert end.details["outcome"] == "budget"
    assert isinstance(events[-2], MessageFinal) and events[-2].text.startswith("Sorry")
    assert isinstance(events[-1], RunEnd) and events[-1].outcome == "ok"
    assert events[-1].usage["prompt_tokens"] >= 900  # the child's tokens counted
    row = await store.conversations.run(end.details["run_id"])
    assert row is not None and row.status == "budget"
    calls = await store.usage.calls(run_id=req.run_id)
    assert [c.purpose for c in calls] == ["answer", "ask_analyst", "tool_loop"]


@pytest.mark.slow
async def test_a_child_gets_part_of_the_parents_time_and_the_parent_still_answers(store, tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[ask("analyst", "Take your time.")]),
        Scripted(text="x" * 400, chunk=1, delay=0.01),  # slower than the parent's time allows
        Scripted(text="The analyst ran out of time; in short: unknown."))
    lead = spec("lead", tmp_path, agents=("analyst",))
    lead = dataclasses.replace(lead, budget=Budget(max_seconds=1.6))
    s = Setup(store, model, lead, spec("analyst", tmp_path))
    req, events = await s.run("lead")
    [end] = tool_ends(events)
    assert end.is_error and "second limit" in end.content and end.details["outcome"] == "budget"
    assert isinstance(events[-2], MessageFinal) and events[-2].text.startswith("The analyst ran")
    assert isinstance(events[-1], RunEnd) and events[-1].outcome == "ok"


async def test_a_usage_budget_covers_the_child_as_the_parents(store, tmp_path):
    from pluto.settings import Budget as UsageBudget
    model = ScriptedModel(
        Scripted(tool_calls=[ask("analyst", "q")],
                 usage={"prompt_tokens": 100, "completion_tokens": 10}),
        Scripted(text="a", usage={"prompt_tokens": 100, "completion_tokens": 10}),
        Scripted(text="done", usage={"prompt_tokens": 100, "completion_tokens": 10}))
    s = Setup(store, model, spec("lead", tmp_path, agents=("analyst",)),
              spec("analyst", tmp_path))
    s.runner.usage = UsageMeter(store.usage, budgets=lambda: [
        UsageBudget(per="agent", period="month", tokens=100_000)])
    await s.run("lead")
    status = await s.runner.usage.status()
    spent = {e["key"]: e["total_tokens"] for e in status[0]["spent"]}
    assert spent == {"lead": 330}  # the analyst's call is counted as the lead's


async def test_depth_and_fan_out_are_limited(store, tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[ask("analyst", "one", "c1"), ask("analyst", "two", "c2")]),
        Scripted(tool_calls=[ask("writer", "deeper")]),  # the analyst (depth 1) asks on
        Scripted(text="analyst's answer"),
        Scripted(text="lead's answer"))
    one = DelegationLimits(max_depth=1, max_children=1)
    s = Setup(store, model, spec("lead", tmp_path, agents=("analyst",), limits=one),
              spec("analyst", tmp_path, agents=("writer",)), spec("writer", tmp_path))
    req, events = await s.run("lead")
    first, second = tool_ends(events)
    assert (first.is_error, first.content) == (False, "analyst's answer")
    assert second.is_error and "already asked 1 agent(s), the most allowed (1)" in second.content
    child_events = await store.conversations.events(first.details["run_id"])
    [refused] = [e for e in child_events if isinstance(e, ToolEnd)]
    assert refused.is_error and "only 1 level(s) deep" in refused.content
    assert events[-2].text == "lead's answer"  # type: ignore[union-attr]
    assert len(model.calls) == 4  # the writer was never asked


async def test_cancelling_the_parent_during_a_child_records_both_cancelled(store, tmp_path):
    model = ScriptedModel(Scripted(tool_calls=[ask("analyst", "slow one")]),
                          Scripted(text="x" * 400, chunk=1, delay=0.01))
    s = Setup(store, model, spec("lead", tmp_path, agents=("analyst",)),
              spec("analyst", tmp_path))
    req = await s.request("lead")
    seen: list[RunEvent] = []
    task = asyncio.create_task(_consume(s.runner, req, seen))
    await wait_for(lambda: len(model.calls) == 2 and bool(s.delegation.lineage))
    [child] = list(s.delegation.lineage)
    task.cancel()  # what /stop does to the session's task
    with pytest.raises(asyncio.CancelledError):
        await task
    for run_id in (req.run_id, child):
        row = await store.conversations.run(run_id)
        assert row is not None and row.status == "cancelled", run_id
    assert not s.delegation.lineage


async def _consume(runner: Runner, req: RunRequest, seen: list[RunEvent]) -> None:
    async for event in runner.run(req):
        seen.append(event)


async def test_a_handoff_is_found_again_after_a_restart(store, tmp_path):
    model = ScriptedModel(Scripted(tool_calls=[ToolCall("h1", "handoff_to", '{"name": "writer"}')]),
                          Scripted(text="The writer takes over."))
    s = Setup(store, model, spec("lead", tmp_path, handoff=("writer",)), spec("writer", tmp_path))
    req, events = await s.run("lead")
    [end] = tool_ends(events)
    assert end.details == {"text": "Handing over to writer.", "handoff": "writer"}
    session = req.session.id
    assert (await s.delegation.agent_for(session, "lead", store.conversations)).name == "writer"
    again = Delegation(s.load)  # a new process: it reads the session's handoff back
    assert (await again.agent_for(session, "lead", store.conversations)).name == "writer"
    other = await store.conversations.session("another chat", "lead")
    assert (await again.agent_for(other.id, "lead", store.conversations)).name == "lead"
    del s.agents["writer"]  # an agent handed to that is gone: the route's answers
    assert (await again.agent_for(session, "lead", store.conversations)).name == "lead"


@pytest.mark.postgres
async def test_a_handoff_made_on_one_instance_holds_on_another_that_saw_the_session(tmp_path):
    from pluto.storage.postgres import PostgresStore
    from tests.helpers.pg import fresh_schema

    with fresh_schema() as url:
        async with PostgresStore(url) as a, PostgresStore(url) as b:
            model = ScriptedModel(
                Scripted(tool_calls=[ToolCall("h1", "handoff_to", '{"name": "writer"}')]),
                Scripted(text="The writer takes over."))
            agents = (spec("lead", tmp_path, handoff=("writer",)), spec("writer", tmp_path))
            on_b = Setup(b, ScriptedModel(), *agents)
            session = (await b.conversations.session("chat", "lead")).id
            # B answered the chat before: the route's agent
            assert (await on_b.delegation.agent_for(session, "lead", b.conversations)).name \
                == "lead"
            await Setup(a, model, *agents).run("lead")  # A's run hands the session over
            # ... and B, which saw the session before, follows the handoff at its next message
            assert (await on_b.delegation.agent_for(session, "lead", b.conversations)).name \
                == "writer"


# agent.yaml ---------------------------------------------------------------------------------

def write_agent(root: Path, name: str, yaml: str) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "agent.yaml").write_text(yaml)
    return root / name


@pytest.mark.parametrize("yaml, line, problem", [
    ("model: m\nagents:\n  - analyst\n  - nobody\n", 4, "no agent is named 'nobody'"),
    ("model: m\nhandoff: [lead]\n", 2, "an agent cannot list itself ('lead')"),
    ("model: m\nagents: [analyst, analyst]\n", 2, "'analyst' is listed twice"),
])
def test_agent_yaml_errors_name_the_file_and_line(tmp_path, yaml, line, problem):
    write_agent(tmp_path, "analyst", "model: m\n")
    lead = write_agent(tmp_path, "lead", yaml)
    with pytest.raises(ConfigError) as e:
        load_agent(lead, is_agent=lambda n: (tmp_path / n / "agent.yaml").is_file())
    [(file, at, _field, message)] = e.value.problems
    assert (file.endswith("lead/agent.yaml"), at, message) == (True, line, problem)


def test_a_cycle_loads_and_limits_are_read(tmp_path):
    write_agent(tmp_path, "a", "model: m\nagents: [b]\ndelegation: {max_depth: 3}\n")
    write_agent(tmp_path, "b", "model: m\nagents: [a]\nhandoff: [a]\n")
    known = lambda n: n in ("a", "b")  # noqa: E731
    a, b = load_agent(tmp_path / "a", is_agent=known), load_agent(tmp_path / "b", is_agent=known)
    assert (a.agents, a.delegation.max_depth, a.delegation.max_children) == (("b",), 3, 5)
    assert (b.agents, b.handoff) == (("a",), ("a",))


# through the gateway: a handoff, /stop ------------------------------------------------------

def gateway_config(tmp_path: Path, default: str) -> Path:
    """A config whose every chat goes to ``default``'s agent.yaml; a writer and an analyst."""
    config = tmp_path / "config"
    for name, extra in (("default", default), ("writer", ""), ("analyst", "")):
        write_agent(config / "agents", name, f"model: scripted\ninstructions: i.md\n{extra}")
        (config / "agents" / name / "i.md").write_text(f"You are the {name}.")
    (config / "routes.yaml").write_text("routes: []\ndefault: default\n")
    return config


async def start(gw: Gateway) -> RecordingProvider:
    p = RecordingProvider()
    gw.add_provider(p)
    await p.running.wait()
    return p


async def test_a_handoff_moves_the_next_messages_to_the_other_agent_until_new(tmp_path):
    model = ScriptedModel(
        Scripted(tool_calls=[ToolCall("h1", "handoff_to", '{"name": "writer"}')]),
        Scripted(text="The writer will take it from here."),
        fallback=lambda m: Scripted(text=f"[{m[0]['content']}] {m[-1]['content']}"))
    async with Gateway(gateway_config(tmp_path, "handoff: [writer]\n"),
                       config=PlutoConfig(data_dir=tmp_path / "data"), model_factory=model) as gw:
        p = await start(gw)
        await p.say("I need a poem")
        assert (await p.wait_finals(1)) == ["The writer will take it from here."]
        assert "Handing over to writer." in [m.text for m in p.sent]
        await p.say("about the sea")
        assert (await p.wait_finals(2))[1] == "[You are the writer.] about the sea"
        await p.say("/help")
        await wait_for(lambda: any(f.startswith("You are talking to **writer**")
                                   for f in p.finals()))
        await p.say("/new")
        await wait_for(lambda: any("new conversation" in f for f in p.finals()))
        await p.say("hello again")
        await wait_for(lambda: "[You are the default.] hello again" in p.finals())
        await p.say("/help")
        await wait_for(lambda: any(f.startswith("You are talking to **default**")
                                   for f in p.finals()))


async def test_stop_during_a_child_stops_both(tmp_path):
    model = ScriptedModel(Scripted(tool_calls=[ask("analyst", "count everything")]),
                          Scripted(text="x" * 400, chunk=1, delay=0.01))
    async with Gateway(gateway_config(tmp_path, "agents: [analyst]\n"),
                       config=PlutoConfig(data_dir=tmp_path / "data"), model_factory=model) as gw:
        p = await start(gw)
        await p.say("how many?")
        await wait_for(lambda: len(model.calls) == 2)  # the analyst is answering
        [child] = gw.pipeline.delegation.lineage
        assert child in gw.pipeline.live  # held here: the recovery sweep leaves it alone
        await p.say("/stop")
        assert (await p.wait_finals(1)) == ["Stopped."]
        await gw.settled()
        assert sorted((r["agent"], r["status"]) for r in await runs(gw.store)) == [
            ("analyst", "cancelled"), ("default", "cancelled")]
