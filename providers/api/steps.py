"""How an API step enters the pipeline and learns what became of it.

A step's message goes to intake like any chat message (its id is the step's id). Intake's
typed outcome says at once what happens: a run starts (the step points at it from then on, and
its output is read from the run), or the gateway answers without a run — a command's answer or
a notice reaches the step through delivery (:meth:`Steps.answered_by`), and a refusal without a
word is recorded from the outcome itself. No step waits forever.

A request that waits for its step's answer (``?wait=``) hears the run on this instance: the
run feed hands it each event of a run accepted here as it is published (from the first, see
:meth:`RunFeed.listen`), so a run that ends well is answered from those events — its output,
usage and end — without reading back the step, the run or its events (its ``ended_at`` is its
``run.end``'s time, a moment before the commit that stored the run's). A run that goes on
elsewhere (another instance: its events followed from storage), ends otherwise (an error, a
stop, a person's approval: its row read) or outlasts the wait is answered from storage, as a
later ``GET`` of the step would be.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from pluto.events import RunEnd, RunEvent, RunStart
from pluto.gateway.ports import Intake, RunFeed
from pluto.storage.ports import TaskStore
from pluto.storage.rows import RunRow, StepRow
from pluto.types import (Accepted, Answered, Dropped, Duplicate, IncomingMessage, Outcome,
                         OutgoingMessage, Refused)

ANSWER_WAIT = 10.0  # seconds a step answered without a run waits for its answer's delivery


class Heard:
    """A run's events as the feed publishes them on this instance, from its first: complete
    until a gap (an event whose ``seq`` is not the next, e.g. the feed's wake-up for a run
    that went on elsewhere) says storage must tell the rest."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self.ended = asyncio.Event()  # its run.end heard, or a gap
        self.broken = False
        self.stop: Callable[[], None] | None = None

    def __call__(self, event: RunEvent) -> None:  # (in the call that publishes the event)
        if self.ended.is_set():
            return
        last = self.events[-1].seq if self.events else 0
        if event.seq != last + 1:
            self.broken = True
            self.ended.set()
            return
        self.events.append(event)
        if isinstance(event, RunEnd):
            self.ended.set()

    def close(self) -> None:
        if self.stop is not None:
            self.stop()
            self.stop = None


@dataclass(eq=False)
class Entered:
    """A step handed to intake: ``step`` as it stands (pointing at its run when one started),
    what intake decided, and the run heard from its start (when asked for and possible)."""

    step: StepRow
    outcome: Outcome
    heard: Heard | None = None

    def close(self) -> None:
        if self.heard is not None:
            self.heard.close()


@dataclass(frozen=True)
class Seen:
    """A step once waited for: with its run and events when they are known here (None: read
    them from storage)."""

    step: StepRow
    run: RunRow | None = None
    events: list[RunEvent] | None = field(default=None)


def ended_well(step: StepRow, events: list[RunEvent], end: RunEnd) -> RunRow:
    """The run row a run that ended ``ok`` left (status, usage, end), from its events: what
    the runner committed with its ``run.end`` (``ended_at``: the end's time, within the
    moment of the commit)."""
    start = next((e for e in events if isinstance(e, RunStart)), None)
    assert step.run_id is not None
    return RunRow(step.run_id, start.session_id if start else "", start.agent if start else "",
                  "ok", step.input, None, dict(end.usage),
                  start.ts if start else step.created_at, end.ts)


class Steps:
    def __init__(self, tasks: TaskStore, feed: RunFeed):
        self.tasks = tasks
        self.feed = feed
        self._settled: dict[str, asyncio.Event] = {}  # step → set when it is answered

    async def enter(self, intake: Intake, msg: IncomingMessage, step: StepRow, *,
                    listen: bool = False) -> Entered:
        """Hand a step's message (``msg``, whose id is the step's) to intake and record what
        the pipeline decided; an answer without a run is waited for (briefly). ``listen``: a
        run it starts is heard from its first event (close the result when done with it)."""
        settled = self._settled.setdefault(step.id, asyncio.Event())
        try:
            outcome = await (await intake.submit(msg)).outcome()
            match outcome:
                case Accepted(run_id=run_id):
                    heard = Heard() if listen else None
                    if heard is not None:  # before anything is awaited: from its first event
                        heard.stop = self.feed.listen(run_id, heard)
                        heard = heard if heard.stop is not None else None
                    try:
                        await self.tasks.started(step.id, run_id)
                    except BaseException:
                        if heard is not None:
                            heard.close()
                        raise
                    return Entered(dataclasses.replace(step, run_id=run_id, status="running"),
                                   outcome, heard)
                case Refused(notice=None, reason=reason) | Dropped(notice=None, reason=reason):
                    await self.tasks.answered(step.id, error=f"The gateway did not take this "
                                              f"message: {reason}.")
                case Duplicate():
                    await self.tasks.answered(step.id, error="This message was sent before.")
                case Answered() | Refused() | Dropped():  # the answer comes through delivery
                    try:
                        await asyncio.wait_for(settled.wait(), ANSWER_WAIT)
                    except TimeoutError:
                        pass
            return Entered(step, outcome)
        finally:
            self._settled.pop(step.id, None)

    async def answered_by(self, message: OutgoingMessage) -> None:
        """Delivery hands over an answer given without a run (``answers``: the step id)."""
        if not message.answers:
            return
        if message.kind == "reply":
            await self.tasks.answered(message.answers, output=message.text)
        else:
            await self.tasks.answered(message.answers, error=message.text)
        if (event := self._settled.get(message.answers)) is not None:
            event.set()

    async def now(self, entered: Entered) -> Seen:
        """The step as it is, without waiting: one answered without a run is read back (its
        answer was recorded meanwhile); one with a run is read from the run."""
        entered.close()
        if entered.step.run_id is not None:
            return Seen(entered.step)
        step = entered.step
        return Seen(await self.tasks.step(step.task_id, step.id) or step)

    async def seen(self, entered: Entered, seconds: float) -> Seen:
        """The step once its run ended (its events as heard or followed here), or as storage
        has it after ``seconds``."""
        step = entered.step
        if step.run_id is None:
            return await self.now(entered)
        heard = entered.heard
        events: list[RunEvent] = []
        try:
            async with asyncio.timeout(seconds):
                if heard is not None:
                    await heard.ended.wait()
                    events = list(heard.events)
                if not events or not isinstance(events[-1], RunEnd):
                    # not heard here from its start, or went on elsewhere: the feed (storage)
                    after = events[-1].seq if events else 0
                    async with aclosing(self.feed.follow(step.run_id, after,
                                                         fresh=True)) as feed:
                        async for event in feed:
                            events.append(event)
        except TimeoutError:
            return Seen(step)
        finally:
            entered.close()
        end = events[-1] if events and isinstance(events[-1], RunEnd) else None
        if end is None:
            return Seen(step)
        # heard here from its start to a good end: its row is what that end committed; else
        # (read from storage, or another end) the row is read as stored
        whole = heard is not None and not heard.broken
        run = ended_well(step, events, end) if whole and end.outcome == "ok" else None
        return Seen(step, run, events)

    async def wait(self, step: StepRow, seconds: float) -> StepRow:
        """The step once it is done (its run ended), or as it is after ``seconds``."""
        current = await self.tasks.step(step.task_id, step.id) or step
        if current.run_id is not None:
            try:
                async with asyncio.timeout(seconds):
                    async with aclosing(self.feed.follow(current.run_id)) as events:
                        async for _ in events:
                            pass
            except TimeoutError:
                pass
        return await self.tasks.step(step.task_id, step.id) or current
