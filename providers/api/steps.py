"""How an API step enters the pipeline and learns what became of it.

A step's message goes to ``Gateway.handle`` like any chat message. Then one of these happens:
the gateway answers at once (a command, a refusal, a full queue: ``send`` while it enters), a
run starts (the gateway's run listener gives its id), an answer comes later without a run (the
agent is unavailable), the message is dropped silently (over a rate limit; dropped by ``/stop``).
Each of those settles the step, so no step waits forever.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from pluto.types import IncomingMessage, OutgoingMessage
from pluto.gateway.transcript import follow_run
from pluto.storage.tasks import StepRow, TaskStore

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

NOT_ACCEPTED = "The gateway did not take this message (a rate limit or an access rule)."
DROPPED = "This message was dropped before it ran (a /stop dropped the waiting messages)."


class StepIntake:
    def __init__(self, backend: Gateway, tasks: TaskStore):
        self.backend = backend
        self.tasks = tasks
        # one message of a task enters at a time: replies sent while it does answer its step
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary())
        self._answers: dict[str, list[OutgoingMessage]] = {}  # task → replies while it enters
        self._waiting: dict[str, deque[str]] = defaultdict(deque)  # task → steps without a run
        self._messages: dict[str, IncomingMessage] = {}  # step without a run → its message
        self._changed: dict[str, asyncio.Event] = {}  # step → set when it starts or is answered

    async def enter(self, inbox: Callable[[IncomingMessage], Awaitable[None]], msg: IncomingMessage,
                    step: StepRow) -> None:
        """Hand a step's message (``msg``, whose id is the step's) to the gateway."""
        task_id = msg.chat_id
        lock = self._locks.get(task_id) or self._locks.setdefault(task_id, asyncio.Lock())
        async with lock:
            replies: list[OutgoingMessage] = []
            self._answers[task_id] = replies
            self._waiting[task_id].append(step.id)
            self._messages[step.id] = msg
            try:
                await inbox(msg)
            finally:
                del self._answers[task_id]
        if replies:
            await self._answer(step.id, replies)
            self._settle(task_id, step.id)
        elif not self._queued(msg):  # dropped without a word (e.g. over a rate limit)
            await self.tasks.answered(step.id, error=NOT_ACCEPTED)
            self._settle(task_id, step.id)

    async def on_run(self, msg: IncomingMessage, run_id: str) -> None:
        if msg.message_id:
            await self.tasks.started(msg.message_id, run_id)
            self._settle(msg.chat_id, msg.message_id)

    async def send(self, message: OutgoingMessage) -> str | None:
        if message.run_id is not None and await self.backend.store.run(message.run_id):
            return message.run_id  # a run's answer is read from the run itself
        answers = self._answers.get(message.chat_id)
        if answers is not None:  # the reply to the message entering right now
            answers.append(message)
            return uuid.uuid4().hex
        waiting = self._waiting.get(message.chat_id)
        if waiting:  # e.g. "the agent is not available", sent when its turn came
            step_id = waiting[0]
            await self._answer(step_id, [message])
            self._settle(message.chat_id, step_id)
        return uuid.uuid4().hex

    def _settle(self, task_id: str, step_id: str) -> None:
        self._messages.pop(step_id, None)
        waiting = self._waiting.get(task_id)
        if waiting is not None:
            if step_id in waiting:
                waiting.remove(step_id)
            if not waiting:
                del self._waiting[task_id]
        if (event := self._changed.get(step_id)) is not None:
            event.set()

    async def _answer(self, step_id: str, replies: list[OutgoingMessage]) -> None:
        text = "\n\n".join(m.text for m in replies if m.text)
        if all(m.kind == "reply" for m in replies):
            await self.tasks.answered(step_id, output=text)
        else:
            await self.tasks.answered(step_id, error=text or NOT_ACCEPTED)

    def _queued(self, msg: IncomingMessage) -> bool:
        """Whether ``msg`` waits in (or runs from) its session's lane, right after handling."""
        route = self.backend.routes.route(msg)
        return route is not None and self.backend.lanes.busy(route.session_key)

    async def reap(self, task_id: str) -> None:
        """Steps still waiting for a run whose session has no work left were dropped (by
        ``/stop``): say so instead of showing them as waiting forever."""
        for step_id in list(self._waiting.get(task_id, ())):
            msg = self._messages.get(step_id)
            if msg is not None and not self._queued(msg):
                await self.tasks.answered(step_id, error=DROPPED)
                self._settle(task_id, step_id)

    async def wait(self, step: StepRow, seconds: float) -> StepRow:
        """The step once it is done, or as it is after ``seconds``."""
        changed = self._changed.setdefault(step.id, asyncio.Event())
        try:
            async with asyncio.timeout(seconds):
                current = await self.tasks.step(step.task_id, step.id) or step
                while current.run_id is None and current.status == "created":
                    await changed.wait()
                    changed.clear()
                    current = await self.tasks.step(step.task_id, step.id) or current
                if current.run_id is not None:
                    async with aclosing(follow_run(self.backend.store, self.backend.hub,
                                                   current.run_id)) as events:
                        async for _ in events:
                            pass
        except TimeoutError:
            pass
        finally:
            self._changed.pop(step.id, None)
        await self.reap(step.task_id)
        return await self.tasks.step(step.task_id, step.id) or step
