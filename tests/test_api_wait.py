"""A step's ``?wait=`` answered from its run as heard on this instance (providers/api/steps.py):
a run that ends well is answered from the events the feed handed over — no read of the step,
the run or its events — and anything else (a run that went on elsewhere, ended otherwise, or
outlasts the wait) from storage, as a later GET of the step would be."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from pluto.events import MessageDelta, MessageFinal, RunEnd, RunError, RunEvent, RunStart
from pluto.gateway.feed import WAKE, LocalRunFeed
from pluto.providers.api import views
from pluto.providers.api.steps import Steps
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.storage.rows import RunRow, StepRow
from pluto.types import Accepted, IncomingMessage, Outcome
from tests.helpers.served import API_KEY, served, url

RUN = "r" * 32
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Runs:
    """Storage's runs: what it holds, and every read made of it."""

    def __init__(self, events: list[RunEvent], row: RunRow | None = None):
        self.stored, self.row = events, row
        self.reads: list[str] = []

    async def run(self, run_id: str) -> RunRow | None:
        self.reads.append("run")
        return self.row

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        self.reads.append(f"events>{after}")
        return [e for e in self.stored if e.seq > after]


class Tasks:
    def __init__(self) -> None:
        self.begun: list[tuple[str, str]] = []
        self.reads = 0

    async def started(self, step_id: str, run_id: str) -> None:
        self.begun.append((step_id, run_id))

    async def step(self, task_id: str, step_id: str) -> StepRow | None:
        self.reads += 1
        return None


class Ticket:
    def __init__(self, outcome: Outcome):
        self._outcome = outcome

    async def outcome(self) -> Outcome:
        return self._outcome


class Intake:
    async def submit(self, msg: IncomingMessage) -> Ticket:
        return Ticket(Accepted(RUN))


class Elsewhere(LocalRunFeed):
    """The feed of an instance the run does not execute on."""

    def here(self, run_id: str) -> bool:
        return False


def events() -> list[RunEvent]:
    return [RunStart(run_id=RUN, seq=1, session_id="s", agent="default"),
            MessageDelta(run_id=RUN, seq=2, text="hel"),
            MessageFinal(run_id=RUN, seq=3, text="hello"),
            RunEnd(run_id=RUN, seq=4, outcome="ok", usage={"total_tokens": 7})]


STEP = StepRow("s1", "t1", 1, "hi", None, "created", None, None, 1.0, None)
MSG = IncomingMessage(provider="api", chat_id="t1", user_id="u", text="hi", message_id="s1")


async def _entered(feed: LocalRunFeed, tasks: Tasks, listen: bool = True) -> tuple[Steps, Any]:
    steps = Steps(tasks, feed)  # type: ignore[arg-type]
    return steps, await steps.enter(Intake(), MSG, STEP, listen=listen)  # type: ignore[arg-type]


async def test_a_run_that_ends_well_here_is_answered_from_what_was_heard():
    runs, tasks = Runs([]), Tasks()
    feed = LocalRunFeed(runs)
    steps, entered = await _entered(feed, tasks)
    assert tasks.begun == [("s1", RUN)] and entered.step.run_id == RUN
    waiting = asyncio.create_task(steps.seen(entered, 30))
    made = events()
    for event in made:
        feed.publish(event)
    seen = await waiting
    assert seen.run is not None and seen.run.status == "ok" and seen.events == made
    view = await views.step_view(runs, seen.step, run=seen.run, events=seen.events)
    assert view["status"] == "completed" and view["outcome"] == "ok" and view["is_last"]
    assert view["output"] == "hello" and view["additional_output"] == {"usage":
                                                                       {"total_tokens": 7}}
    assert view["run_id"] == RUN and view["ended_at"] == made[-1].ts
    assert runs.reads == [] and tasks.reads == 0  # nothing read back
    assert not feed.watched(RUN)  # the listener is gone


async def test_a_run_on_another_instance_is_answered_from_storage():
    stored = events()
    runs, tasks = Runs(stored, RunRow(RUN, "s", "default", "ok", "hi", None,
                                      {"total_tokens": 7}, 1.0, 2.0)), Tasks()
    steps, entered = await _entered(Elsewhere(runs), tasks)
    assert entered.heard is None  # not promised here: followed
    seen = await steps.seen(entered, 30)
    assert runs.reads == ["events>0"] and seen.events == stored and seen.run is None
    view = await views.step_view(runs, seen.step, run=seen.run, events=seen.events)
    assert runs.reads == ["events>0", "run"]  # the row as stored: its end, to the moment
    assert view["status"] == "completed" and view["output"] == "hello"
    assert view["ended_at"] == 2.0


async def test_a_run_that_went_on_elsewhere_midway_is_read_on_from_where_it_was_heard():
    stored = events()
    runs, tasks = Runs(stored), Tasks()
    feed = LocalRunFeed(runs)
    steps, entered = await _entered(feed, tasks)
    feed.publish(stored[0])
    entered.heard(WAKE)  # (as SharedRunFeed tells a listener: committed by another instance)
    seen = await steps.seen(entered, 30)
    assert runs.reads == ["events>1"] and seen.events == stored
    assert seen.run is None  # (its row as stored, read for the view)


async def test_a_run_that_ends_otherwise_takes_its_row_from_storage():
    failed = [RunStart(run_id=RUN, seq=1, session_id="s", agent="default"),
              RunError(run_id=RUN, seq=2, message="The model is unavailable."),
              RunEnd(run_id=RUN, seq=3, outcome="error")]
    runs = Runs([], RunRow(RUN, "s", "default", "error", "hi", "model down", {}, 1.0, 2.0))
    tasks = Tasks()
    feed = LocalRunFeed(runs)
    steps, entered = await _entered(feed, tasks)
    waiting = asyncio.create_task(steps.seen(entered, 30))
    for event in failed:
        feed.publish(event)
    seen = await waiting
    assert seen.run is None and seen.events == failed
    view = await views.step_view(runs, seen.step, run=seen.run, events=seen.events)
    assert runs.reads == ["run"]  # the row only: its events were heard
    assert view["outcome"] == "error" and view["error"] == "model down"


async def test_a_wait_that_runs_out_is_answered_from_storage():
    runs, tasks = Runs([]), Tasks()
    feed = LocalRunFeed(runs)
    steps, entered = await _entered(feed, tasks)
    feed.publish(events()[0])
    seen = await steps.seen(entered, 0)
    assert seen.run is None and seen.events is None and seen.step.run_id == RUN
    assert not feed.watched(RUN)


async def test_a_step_waited_for_shows_what_a_later_read_of_it_shows(config_dir, data_dir,
                                                                     monkeypatch):
    """Through a real gateway: the answer built from the run heard here is the stored one."""
    model = ScriptedModel(fallback=lambda m: Scripted(text=f"answer to: {m[-1]['content']}"))
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        async with http.post(url(gw, "/api/v1/agent/tasks"), json={"input": "one"},
                             headers=AUTH) as resp:
            task = await resp.json()
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        async with http.post(url(gw, path + "?wait=30"), json={"input": "two"},
                             headers=AUTH) as resp:
            assert resp.status == 201
            answered = await resp.json()
        async with http.get(url(gw, f"{path}/{answered['step_id']}"),
                            headers=AUTH) as resp:
            stored = await resp.json()
    assert answered["status"] == "completed" and answered["output"] == "answer to: two"
    assert answered["additional_output"]["usage"]["total_tokens"] > 0
    # (its end as heard: the run.end's time, a moment before the commit that stored the run's)
    assert answered.pop("ended_at") <= stored.pop("ended_at")
    assert answered == stored
