"""How an API step enters the pipeline and learns what became of it.

A step's message goes to intake like any chat message (its id is the step's id). Intake's
typed outcome says at once what happens: a run starts (the step points at it from then on, and
its output is read from the run), or the gateway answers without a run — a command's answer or
a notice reaches the step through delivery (:meth:`Steps.answered_by`), and a refusal without a
word is recorded from the outcome itself. No step waits forever.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from pluto.gateway.ports import Intake, RunFeed
from pluto.storage.ports import TaskStore
from pluto.storage.rows import StepRow
from pluto.types import (Accepted, Answered, Dropped, Duplicate, IncomingMessage, Outcome,
                         OutgoingMessage, Refused)

ANSWER_WAIT = 10.0  # seconds a step answered without a run waits for its answer's delivery


class Steps:
    def __init__(self, tasks: TaskStore, feed: RunFeed):
        self.tasks = tasks
        self.feed = feed
        self._settled: dict[str, asyncio.Event] = {}  # step → set when it is answered

    async def enter(self, intake: Intake, msg: IncomingMessage, step: StepRow) -> Outcome:
        """Hand a step's message (``msg``, whose id is the step's) to intake and record what
        the pipeline decided; an answer without a run is waited for (briefly)."""
        settled = self._settled.setdefault(step.id, asyncio.Event())
        try:
            outcome = await (await intake.submit(msg)).outcome()
            match outcome:
                case Accepted(run_id=run_id):
                    await self.tasks.started(step.id, run_id)
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
            return outcome
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
