"""The API harness: the real HTTP API provider (``/api/v1/``, Agent Protocol tasks and steps) on
the gateway's HTTP server, and a client in the test that uses it as an integrator would.

The gateway runs as ``pluto serve`` runs it, in-process (:class:`ServedHarness`): the API enabled
in ``pluto.yaml``'s ``providers``, its bearer key in the environment variable ``keys_env``
names. A chat is a task: the first message of a chat creates it (``POST /agent/tasks``), every
later one is a step (``POST /agent/tasks/{id}/steps``). The chat ids scenarios use are labels
(``direct_chat = "direct"``); the provider's own chat id is the task id (``tasks``).

What the client is shown for a chat is its task's steps as ``GET /agent/tasks/{id}/steps``
returns them: each step's ``output`` (its run's final text, or what it had written so far), or
its ``error``; a step with neither shows nothing yet. A step waiting for a person's decision
(status ``awaiting_approval``) shows its ``approval``: the tool, its arguments, and the
commands that decide it (the API has no buttons: a client POSTs ``approve_url`` /
``deny_url``, or sends a command as its next step, which these scenarios do). The client reads them continuously in the
background, and follows each step's run over SSE (``GET /agent/{run_id}/events``, resuming with
``Last-Event-ID`` after a restart), checking as it reads: every event's ``id`` is its ``seq``,
the seqs only grow, the stream ends with ``run.end``, and a finished step's output is the text
of its run's ``message.final``. A breach fails the scenario at its next look at what is shown,
or when the harness closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pluto.providers.api import ApiProvider
from tests.conformance.harness import Shown, UserMessage
from tests.conformance.web_harness import ServedHarness, code_of

KEYS_ENV = "PLUTO_CONFORMANCE_API_KEYS"
API_KEY = "conformance-api-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
POLL_SECONDS = 0.02
RETRY_SECONDS = 0.2  # an integrator's pause before it posts a message answered 503 again


@dataclass
class Posted:
    """A message the integrator sends: each POST's status; its step once one was made."""

    chat: str
    text: str
    statuses: list[int] = field(default_factory=list)
    step_id: str | None = None


@dataclass
class ApiHarness(ServedHarness):
    name: str = "api"
    caps: Any = ApiProvider.capabilities
    # no "redelivery": every POST of a step is a new step with its own id (the message id the
    # gateway dedupes by), so the API never hands the gateway the same message twice; no
    # groups, files or flood control on an HTTP API; no "serve": a run's answer is read from
    # the run itself, not sent in chunks (see docs/api.md)
    features: frozenset[str] = frozenset()
    direct_chat: str = "direct"  # a label: the chat's task is made by its first message
    tasks: dict[str, str] = field(default_factory=dict)  # chat label → task id
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # task id → steps
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run id → SSE
    _followers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _poller: asyncio.Task[None] | None = None
    _backlog: list[Posted] = field(default_factory=list)  # answered 503: posted again, in order
    _retrier: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _passes: int = 0  # the poller's full passes over every chat's steps

    def providers_config(self) -> dict[str, Any]:
        return {"api": {"enabled": True, "keys_env": KEYS_ENV}}

    def environment(self) -> dict[str, str]:
        return {KEYS_ENV: API_KEY}

    async def connected(self, timeout: float = 10) -> None:
        await self.provider_running("api", timeout)
        status, body = await self.call("GET", "/api/v1/agents")
        assert status == 200, f"api: GET /agents answered {status}: {body}"
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll(), name="api-harness:poll")

    async def close(self) -> None:
        for steps in self.steps.values():
            for step in steps:
                self._check(step)
        tasks = [t for t in (self._poller, self._retrier, *self._followers.values())
                 if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().close()

    # the client -----------------------------------------------------------------------------

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.http is not None
        data = json.dumps(body) if body is not None else None
        async with self.http.request(method, self.base_url + path, data=data,
                                     headers=AUTH) as resp:
            return resp.status, await resp.json()

    async def user_says(self, text: str, *, chat: str | None = None, mention: bool = False,
                        reply_to: Shown | None = None,
                        document: tuple[str, bytes] | None = None) -> UserMessage:
        """POST the message (a task, or a step of the chat's task). A 503 is retried after a
        pause, as an integrator would, in the background and in order: the chat's later
        messages wait behind it (they need its task)."""
        assert document is None, "the API takes text only"
        posted = Posted(chat or self.direct_chat, text)
        if self._backlog:
            self._backlog.append(posted)
        elif not await self._post(posted):
            self._backlog.append(posted)
            self._retrier = asyncio.create_task(self._retry(), name="api-harness:retry")
        return UserMessage(posted.chat, posted)

    async def _post(self, posted: Posted) -> bool:
        """One POST of a message; False when the gateway answered 503 (try again)."""
        task = self.tasks.get(posted.chat)
        if task is None:
            status, body = await self.call("POST", "/api/v1/agent/tasks", {"input": posted.text})
        else:
            status, body = await self.call("POST", f"/api/v1/agent/tasks/{task}/steps",
                                           {"input": posted.text})
        posted.statuses.append(status)
        if status == 503:
            assert set(body) == {"error", "code"} and "Traceback" not in body["error"], body
            return False
        assert status == 201, f"api: posting a message answered {status}: {body}"
        if task is None:
            self.tasks[posted.chat] = body["task_id"]
            body = body["last_step"]
        posted.step_id = body["step_id"]
        return True

    async def _retry(self) -> None:
        while self._backlog:
            await asyncio.sleep(RETRY_SECONDS)
            if await self._post(self._backlog[0]):
                self._backlog.pop(0)

    def confirmed(self, message: UserMessage) -> bool | None:
        """Confirmed: a POST of the message was answered 201 (503s before it)."""
        return message.ref.step_id is not None

    async def _read_steps(self, task: str) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = []
        page = 1
        while True:
            status, body = await self.call(
                "GET", f"/api/v1/agent/tasks/{task}/steps?page={page}&page_size=100")
            assert status == 200, f"api: listing the steps answered {status}: {body}"
            steps += body["steps"]
            if page >= body["pagination"]["total_pages"]:
                return steps
            page += 1

    async def _poll(self) -> None:
        """Read every chat's steps, again and again; follow each new run's events."""
        while True:
            if self.gateway is not None and self.gateway.http is not None:
                for task in list(self.tasks.values()):
                    try:
                        steps = await self._read_steps(task)
                    except (aiohttp.ClientError, AssertionError) as e:
                        if self.gateway is not None and self.gateway.ready:
                            self.violations.append(f"reading the steps failed: {e!r}")
                        continue
                    for step in steps:
                        run = step.get("run_id")
                        if run and run not in self._followers:
                            self._followers[run] = asyncio.create_task(
                                self._follow(run), name=f"api-harness:sse:{run}")
                    if steps != self.steps.get(task):
                        self.steps[task] = steps
                        self._changed.set()
                self._passes += 1
            await asyncio.sleep(POLL_SECONDS)

    async def _follow(self, run: str) -> None:
        """A run's events over SSE until its ``run.end``; a dropped stream (a restart) is
        resumed after the last event it gave."""
        got = self.events.setdefault(run, [])
        while not got or got[-1]["event"] != "run.end":
            if self.gateway is None or self.gateway.http is None:
                await asyncio.sleep(POLL_SECONDS)
                continue
            assert self.http is not None
            last = {"Last-Event-ID": got[-1]["id"]} if got else {}
            try:
                async with self.http.get(f"{self.base_url}/api/v1/agent/{run}/events",
                                         headers={**AUTH, **last}) as resp:
                    if resp.status != 200 or resp.content_type != "text/event-stream":
                        raise AssertionError(f"{resp.status} {await resp.text()}")
                    await self._read_events(run, resp, got)
            except (aiohttp.ClientError, ConnectionError):
                await asyncio.sleep(POLL_SECONDS)
            except AssertionError as e:
                self.violations.append(f"the events of run {run}: {e}")
                return

    async def _read_events(self, run: str, resp: aiohttp.ClientResponse,
                           got: list[dict[str, Any]]) -> None:
        current: dict[str, Any] = {}
        async for line in resp.content:
            text = line.decode().rstrip("\r\n")
            if text.startswith(":"):
                continue  # a keep-alive
            if text:
                key, _, value = text.partition(": ")
                current[key] = json.loads(value) if key == "data" else value
                continue
            if not current:
                continue
            event, current = current, {}
            seq = event["data"].get("seq")
            if event.get("id") != str(seq) or event.get("event") != event["data"].get("type"):
                raise AssertionError(f"an event whose id or name is not its seq or type: {event}")
            if got and seq <= int(got[-1]["id"]):
                raise AssertionError(f"seq {seq} came after seq {got[-1]['id']}")
            if got and got[-1]["event"] == "run.end":
                raise AssertionError(f"an event after run.end: {event}")
            got.append(event)
            self._changed.set()

    # what the client is shown ---------------------------------------------------------------

    def _check(self, step: dict[str, Any]) -> None:
        events = self.events.get(step.get("run_id") or "", [])
        if step["status"] != "completed" or not events or events[-1]["event"] != "run.end":
            return
        finals = [e["data"]["text"] for e in events if e["event"] == "message.final"]
        if finals and [step["output"]] != finals:
            problem = (f"step {step['step_id']} shows {step['output']!r}, its run's "
                       f"message.final said {finals}")
            if problem not in self.violations:
                self.violations.append(problem)

    def shown(self, chat: str | None = None) -> list[Shown]:
        chat = chat or self.direct_chat
        task = self.tasks.get(chat, chat)
        out = []
        for step in self.steps.get(task, []):
            self._check(step)
            text = step["output"] if step["output"] is not None else step["error"]
            if step["status"] == "awaiting_approval":
                text = self._approval_text(step)
            if text is not None:
                out.append(Shown(id=step["step_id"], text=text, raw=text, code=code_of(text)))
        assert not self.violations, f"api: the HTTP API broke its contract: {self.violations}"
        return out

    @staticmethod
    def _approval_text(step: dict[str, Any]) -> str:
        approval = step["approval"]
        assert approval is not None, f"a step awaiting approval without it: {step}"
        base = f"/api/v1/agent/tasks/{step['task_id']}/steps/{step['step_id']}"
        assert approval["approve_url"] == f"{base}/approve", approval
        assert approval["deny_url"] == f"{base}/deny", approval
        approve, deny = approval["commands"]
        return (f"The agent wants to run {approval['tool']} with:\n{approval['arguments']}\n"
                f"Reply `{approve}` or `{deny}`.")

    async def caught_up(self) -> None:
        """A pass of the poller that began after now has read every chat's steps, and every
        run it follows has given its events up to its ``run.end``."""
        after = self._passes + 1  # (a pass under way may have read a chat before now)
        while self._passes <= after or any(
                not got or got[-1]["event"] != "run.end" for got in
                (self.events.get(run) for run in self._followers)):
            await asyncio.sleep(POLL_SECONDS)

    async def changed(self) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), 0.5)
