"""The HTTP API under ``/api/v1/`` (Agent Protocol tasks and steps, live run events as SSE).

The API is a provider of its own (``api``): a task is a chat, each step a message that goes
through the same intake and pipeline as any other (routing, access, per-session lanes, storage;
see :mod:`.steps`). A step's run id is known as soon as the step is created, its output is read
from its run, and its events stream from the run feed.
Every route but the OpenAPI document needs ``Authorization: Bearer <key>``, with keys taken
from the environment variable(s) named by ``providers.api.keys_env``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pluto.errors import ConfigError, StorageError
from pluto.events import RunEvent
from pluto.gateway.ports import (ChatDirectory, HttpMount, Intake, Provider, ProviderContext,
                                 RunFeed, SharedFileReader)
from pluto.providers.api import artifacts, views
from pluto.providers.api.a2a import A2A
from pluto.providers.api.auth import (CALLER, IS_ADMIN, ApiKey, ApiSettings, Guard, load_keys,
                                      load_settings)
from pluto.providers.api.idempotency import Idempotency, Made
from pluto.providers.api.openapi import openapi_document
from pluto.providers.api.sse import EventStreams
from pluto.providers.api.steps import Entered, Seen, Steps
from pluto.providers.api.views import ApiError
from pluto.providers.handover import HandOver, NotRecorded
from pluto.providers.kit.bounded import remember
from pluto.storage.ports import IdempotencyStore, RunReader, TaskStore
from pluto.storage.rows import RunRow, StepRow, TaskRow
from pluto.types import (MARKDOWN, Accepted, Answered, Capabilities, Duplicate,
                         IncomingMessage, OutgoingMessage, Refused)

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
MAX_WAIT_SECONDS = 60
PAUSED_KEPT = 10_000
TASKS_KEPT = 10_000  # tasks known here (a task's row never changes once made)


class ApiProvider(Provider):
    name = "api"
    # clients watch a run's progress over SSE (the run feed); a step's output is read from its
    # run's events (no outbox row for it); only answers without a run come through send()
    capabilities = Capabilities(max_message_length=1_000_000, markup=MARKDOWN,
                                streams_deltas=True, answers_from_feed=True)

    def __init__(self, settings: ApiSettings, keys: list[ApiKey], *, chats: ChatDirectory,
                 runs: RunReader, tasks: TaskStore, feed: RunFeed,
                 idempotency: IdempotencyStore | None = None,
                 files: SharedFileReader | None = None):
        self.settings = settings
        self.files = files  # the charts and results runs made: the tasks' artifacts
        self.a2a = A2A(self)  # A2A's JSON-RPC at the URL of each agent's card
        self.chats = chats
        self.runs = runs
        self.tasks = tasks
        self.feed = feed
        self.streams = EventStreams(feed)
        self.steps = Steps(tasks, feed)
        self.idempotency = Idempotency(idempotency)  # retried POSTs make their step once
        self._intake: Intake | None = None
        self.handover = HandOver(self.name)
        self._ready = asyncio.Event()
        self._guard = Guard(keys, self._ready, settings.admin_keys)
        # the paused runs that decisions here continued → their task: the step now points at
        # the run that resumed it; the paused run's stream stays readable by the task's key
        # (in this process: storage keeps one run per step)
        self._paused: OrderedDict[str, str] = OrderedDict()
        self._pointing: set[asyncio.Task[None]] = set()  # steps moving to a resumed run
        # the tasks made or read here, most recent: a task's row is written once and never
        # changed or deleted, so a step of a known task needs no read of it
        self._known: OrderedDict[str, TaskRow] = OrderedDict()

    @classmethod
    def from_context(cls, ctx: ProviderContext) -> ApiProvider:
        settings = load_settings(ctx.config.model_dump())
        if ctx.http is None or ctx.chats is None or ctx.runs is None or ctx.tasks is None:
            raise ConfigError([("pluto.yaml", None, "providers.api",
                                "the HTTP API needs the HTTP server: run 'pluto serve'")])
        keys = load_keys(settings)
        if not keys:
            log.warning("api: no keys in $%s; every API call will get 401", settings.keys_env)
        provider = cls(settings, keys, chats=ctx.chats, runs=ctx.runs, tasks=ctx.tasks,
                       feed=ctx.feed, idempotency=ctx.idempotency, files=ctx.files)
        provider.mount(ctx.http)
        return provider

    def mount(self, http: HttpMount) -> None:
        r = http.router
        r.add_get(f"{PREFIX}/openapi.json", self._openapi)
        page, wait = ("page", "page_size"), ("wait",)
        r.add_get(f"{PREFIX}/agents", self._guard(self._agents))
        r.add_post(f"{PREFIX}/agent/tasks", self._guard(self._create_task, wait))
        r.add_get(f"{PREFIX}/agent/tasks", self._guard(self._list_tasks, page))
        r.add_get(f"{PREFIX}/agent/tasks/{{task_id}}", self._guard(self._get_task))
        r.add_post(f"{PREFIX}/agent/tasks/{{task_id}}/steps",
                   self._guard(self._create_step, wait))
        r.add_get(f"{PREFIX}/agent/tasks/{{task_id}}/steps", self._guard(self._list_steps, page))
        r.add_get(f"{PREFIX}/agent/tasks/{{task_id}}/steps/{{step_id}}",
                  self._guard(self._get_step))
        for verb in ("approve", "deny"):  # a step whose run waits for a person's decision
            r.add_post(f"{PREFIX}/agent/tasks/{{task_id}}/steps/{{step_id}}/{verb}",
                       self._guard(self._decide))
        r.add_get(f"{PREFIX}/agent/tasks/{{task_id}}/artifacts",
                  self._guard(self._list_artifacts, page))
        r.add_get(f"{PREFIX}/agent/tasks/{{task_id}}/artifacts/{{artifact_id}}",
                  self._guard(self._get_artifact))
        r.add_get(f"{PREFIX}/agent/{{run_id}}/events", self._guard(self._events, ("after",)))
        r.add_post("/agents/{name}", self._guard(self.a2a.handle))  # each agent card's URL
        http.on_shutdown.append(self.streams.close_all)

    # the gateway side ---------------------------------------------------------------------

    async def run(self, intake: Intake) -> None:
        self._intake = intake
        self._ready.set()
        try:
            await self.idempotency.keep_pruned()  # messages arrive through HTTP requests
        finally:
            self._ready.clear()

    async def send(self, message: OutgoingMessage) -> str | None:
        if message.run_id is not None:
            return message.run_id  # a run's answer is read from the run itself
        await self.steps.answered_by(message)  # a command's answer, a notice
        return message.answers

    def run_started(self, msg: IncomingMessage, run_id: str) -> None:
        """The gateway resumed, on this instance, a run of a task's chat paused for a person
        (``msg.approval``: nobody decided in time): the step waiting on it points at the run
        that resumes it at once (its ``run_id`` and ``events_url``). A schedule's firing into
        a task's chat answers no step. A run resumed on another instance is found by
        :meth:`_continued` when the step is read."""
        if msg.approval is None:
            return
        task = asyncio.create_task(self._point(msg.chat_id, msg.approval, run_id),
                                   name=f"api:resumed:{run_id}")
        self._pointing.add(task)
        task.add_done_callback(self._pointing.discard)

    async def _point(self, task_id: str, approval_id: str, run_id: str) -> None:
        try:
            step = await self.tasks.last_step(task_id)
            if step is None or step.run_id is None or step.run_id == run_id:
                return
            run = await self.runs.run(step.run_id)
            if run is None or run.status != "awaiting_approval":
                return
            waiting = views.pending_approval(await self.runs.events(step.run_id))
            if waiting is None or waiting.approval_id != approval_id:
                return
            remember(self._paused, step.run_id, task_id, PAUSED_KEPT)
            await self.tasks.started(step.id, run_id)
        except Exception as e:  # noqa: BLE001 - reading the step finds it (_continued)
            log.warning("api: pointing task %s's step at resumed run %s failed: %s",
                        task_id, run_id, e)

    async def close(self) -> None:
        for task in list(self._pointing):
            task.cancel()
        await asyncio.gather(*self._pointing, return_exceptions=True)

    async def _enter(self, request: web.Request, task_id: str, agent: str | None,
                     step: StepRow, *, listen: bool = False) -> Entered:
        """The step handed to intake (``listen``: its run heard from its start, for a request
        that waits for it; close the result)."""
        assert self._intake is not None
        caller = request[CALLER] or "api"  # per key: rate limits count per client
        try:
            return await self.steps.enter(self.handover.guard(self._intake), IncomingMessage(
                provider=self.name, chat_id=task_id, user_id=caller, user_name=caller,
                text=step.input, message_id=step.id, guild_id=agent, is_direct=True), step,
                listen=listen)
        except NotRecorded:  # storage failed (logged once per outage): the client retries
            with contextlib.suppress(Exception):  # (storage may refuse this too)
                await self.tasks.answered(step.id, error="This message could not be recorded "
                                          "and was not handled; it was answered 503.")
            raise ApiError(503, "not_recorded", "The message could not be recorded just now "
                           "(a problem on our side); send it again in a moment.") from None

    # HTTP ---------------------------------------------------------------------------------

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(self.settings.max_input_chars))

    async def _agents(self, request: web.Request) -> web.Response:
        out = []
        for agent in await self.chats.agents():
            route = self.chats.route(self._probe(agent.name))
            out.append({"name": agent.name, "description": agent.description,
                        "available": agent.available,
                        "reachable": route is not None and route.agent == agent.name})
        return web.json_response({"agents": out})

    def _probe(self, agent: str | None, text: str = "") -> IncomingMessage:
        return IncomingMessage(provider=self.name, chat_id="probe", user_id="api", text=text,
                               guild_id=agent, is_direct=True)

    async def _check_route(self, agent: str | None, text: str) -> str:
        if agent is not None:
            names = [a.name for a in await self.chats.agents()]
            if agent not in names:
                known = ", ".join(names) or "none"
                raise ApiError(404, "unknown_agent",
                               f"There is no agent '{agent}' (known: {known}).")
        route = self.chats.route(self._probe(agent, text))
        if route is None:
            raise ApiError(403, "not_routed", "routes.yaml gives messages from the API no agent.")
        if agent is not None and route.agent != agent:
            raise ApiError(403, "not_routed", f"routes.yaml sends these messages to "
                           f"'{route.agent}', not '{agent}'; add a rule matching "
                           f"{{provider: api, guild: {agent}}}.")
        return route.agent

    def _wait_seconds(self, request: web.Request) -> int:
        return views.int_query(request, "wait", 0, 0, MAX_WAIT_SECONDS)

    async def _create_task(self, request: web.Request) -> web.Response:
        wait = self._wait_seconds(request)
        data = await views.json_body(request, ("input", "agent", "additional_input"),
                                     self._max_body())
        text = views.text_input(data, self.settings.max_input_chars)
        extra = views.additional_input(data)
        requested = views.agent_name(data)
        agent = await self._check_route(requested, text)

        async def make(made: Made) -> web.Response:
            task = await self.tasks.create_task(agent, text, extra, requested,
                                                owner=request[CALLER])
            remember(self._known, task.id, task, TASKS_KEPT)
            step = await self.tasks.add_step(task.id, text, extra)
            seen = await self._answer(request, task, step, made, wait)
            return web.json_response(await self._task_view(task, seen.step, seen.run,
                                                           seen.events), status=201)

        return await self.idempotency.once(request, data, make, self._made_task)

    async def _made_task(self, resource: str) -> web.Response:
        """The answer for a task made by an attempt that died before it answered."""
        task_id, _, step_id = resource.partition("/")
        task, step = await self.tasks.task(task_id), await self.tasks.step(task_id, step_id)
        if task is None:
            raise ApiError(404, "not_found", "There is no task with that id.")
        return web.json_response(await self._task_view(task, step), status=201)

    async def _create_step(self, request: web.Request) -> web.Response:
        wait = self._wait_seconds(request)
        task = await self._task(request)
        data = await views.json_body(request, ("input", "additional_input"), self._max_body())
        text = views.text_input(data, self.settings.max_input_chars)
        extra = views.additional_input(data)
        await self._check_route(task.requested_agent, text)

        async def make(made: Made) -> web.Response:
            step = await self.tasks.add_step(task.id, text, extra)
            seen = await self._answer(request, task, step, made, wait)
            return web.json_response(await views.step_view(
                self.runs, seen.step, self.files, run=seen.run, events=seen.events), status=201)

        return await self.idempotency.once(request, data, make, self._made_step)

    async def _answer(self, request: web.Request, task: TaskRow, step: StepRow, made: Made,
                      wait: int) -> Seen:
        """A new step handed to intake, and what became of it after ``wait`` seconds at most:
        a run that ends well on this instance is answered from its events as they were heard
        (no read of the step, the run or its events); anything else from storage."""
        entered = await self._enter(request, task.id, task.requested_agent, step,
                                    listen=wait > 0)
        try:
            await made(f"{task.id}/{step.id}")
            return await (self.steps.seen(entered, wait) if wait else self.steps.now(entered))
        finally:
            entered.close()

    async def _made_step(self, resource: str) -> web.Response:
        """The answer for a step made by an attempt that died before it answered."""
        task_id, _, step_id = resource.partition("/")
        step = await self.tasks.step(task_id, step_id)
        if step is None:
            raise ApiError(404, "not_found", "That task has no step with that id.")
        return web.json_response(await views.step_view(self.runs, step, self.files), status=201)

    async def _task(self, request: web.Request) -> TaskRow:
        """The task, when the caller's key made it (or is an admin key): another key's task is
        answered exactly like one that does not exist."""
        task_id = request.match_info["task_id"]
        task = self._known.get(task_id)
        if task is None and (task := await self.tasks.task(task_id)) is not None:
            remember(self._known, task_id, task, TASKS_KEPT)
        if task is None or not self._may_see(request, task):
            raise ApiError(404, "not_found", "There is no task with that id.")
        return task

    @staticmethod
    def _may_see(request: web.Request, task: TaskRow | None) -> bool:
        if request[IS_ADMIN]:
            return True
        return task is not None and task.owner is not None and task.owner == request[CALLER]

    async def _get_task(self, request: web.Request) -> web.Response:
        task = await self._task(request)
        last = await self.tasks.last_step(task.id)
        return web.json_response(await self._task_view(task, last))

    async def _list_tasks(self, request: web.Request) -> web.Response:
        number, size = views.page(request)
        owner = None if request[IS_ADMIN] else request[CALLER]  # None: every key's tasks
        rows, total = await self.tasks.tasks((number - 1) * size, size, owner=owner)
        items = [await self._task_view(t, await self.tasks.last_step(t.id))
                 for t in rows]
        return web.json_response({"tasks": items,
                                  "pagination": views.pagination(total, number, size)})

    async def _list_steps(self, request: web.Request) -> web.Response:
        task = await self._task(request)
        number, size = views.page(request)
        rows, total = await self.tasks.steps(task.id, (number - 1) * size, size)
        items = [await views.step_view(self.runs, await self._continued(task, s) or s,
                                       self.files) for s in rows]
        return web.json_response({"steps": items,
                                  "pagination": views.pagination(total, number, size)})

    async def _get_step(self, request: web.Request) -> web.Response:
        task = await self._task(request)
        step = await self._continued(task, await self.tasks.step(task.id,
                                                                 request.match_info["step_id"]))
        if step is None:
            raise ApiError(404, "not_found", "That task has no step with that id.")
        return web.json_response(await views.step_view(self.runs, step, self.files))

    # approvals: a step whose run waits for a person (docs/approvals.md) ------------------

    async def _decide(self, request: web.Request) -> web.Response:
        """``POST …/steps/{id}/approve`` or ``/deny`` (body optional: ``{"reason": …}``): the
        command sent as the task's user, in the task's chat. Decided: the step continues with
        the run that resumes it (its ``run_id`` and ``events_url`` are that run's)."""
        task = await self._task(request)
        step = await self.tasks.step(task.id, request.match_info["step_id"])
        if step is None:
            raise ApiError(404, "not_found", "That task has no step with that id.")
        verb = request.path.rsplit("/", 1)[-1]
        reason = await self._reason(request)
        reason = reason if verb == "deny" else ""
        if step.run_id is None:
            raise ApiError(409, "not_waiting", "This step waits for no approval.")
        run = await self.runs.run(step.run_id)
        waiting = views.pending_approval(await self.runs.events(step.run_id)) \
            if run is not None and run.status == "awaiting_approval" else None
        if waiting is None:
            raise ApiError(409, "not_waiting", "This step waits for no approval.")
        assert self._intake is not None
        command = f"/{verb} {waiting.approval_id}" + (f" {reason}" if reason else "")
        caller = request[CALLER] or "api"
        msg = IncomingMessage(provider=self.name, chat_id=task.id, user_id=caller,
                              user_name=caller, text=command,
                              message_id=f"{step.id}:{verb}:{waiting.approval_id}",
                              guild_id=task.requested_agent, is_direct=True)
        try:
            outcome = await (await self.handover.guard(self._intake).submit(msg)).outcome()
        except NotRecorded:
            raise ApiError(503, "not_recorded", "The decision could not be recorded just now; "
                           "send it again in a moment.") from None
        match outcome:
            case Accepted(run_id=run_id):
                remember(self._paused, step.run_id, task.id, PAUSED_KEPT)
                await self.tasks.started(step.id, run_id)
            case Duplicate():
                pass  # sent before: the step as it is now
            case Refused(reason="not an approver", notice=notice):
                raise ApiError(403, "not_an_approver", notice or "You may not decide this.")
            case Answered(text=text):
                raise ApiError(409, "not_waiting", text)
            case _:
                raise ApiError(409, "not_waiting", "The decision was not taken.")
        step = await self.tasks.step(task.id, step.id) or step
        return web.json_response(await views.step_view(self.runs, step, self.files))

    async def _continued(self, task: TaskRow, step: StepRow | None) -> StepRow | None:
        """A step waiting for a decision nobody took in time: the gateway resumed its run
        itself (a message of its own, not this API's), so the step is pointed at that run once
        its answer is in the task's conversation."""
        if step is None or step.run_id is None:
            return step
        run = await self.runs.run(step.run_id)
        if run is None or run.status != "awaiting_approval":
            return step
        waiting = views.pending_approval(await self.runs.events(step.run_id))
        if waiting is None or waiting.expires_at > time.time():
            return step  # decided here (POST approve / deny) or still open
        probe = IncomingMessage(provider=self.name, chat_id=task.id, user_id="api", text="",
                                guild_id=task.requested_agent, is_direct=True)
        ended = run.ended_at or 0.0
        for item in await self.chats.transcript(probe, limit=50):
            if item.role == "assistant" and item.run_id and item.run_id != step.run_id and \
                    item.ts >= ended and not await self.tasks.has_run(item.run_id):
                remember(self._paused, step.run_id, task.id, PAUSED_KEPT)
                await self.tasks.started(step.id, item.run_id)
                return await self.tasks.step(task.id, step.id) or step
        return step

    @staticmethod
    async def _reason(request: web.Request) -> str:
        """The optional body's ``reason`` (a denial's, shown to the model), one line."""
        if request.body_exists and (request.content_length or 1) > 0:
            data = await views.json_body(request, ("reason",), 4096)
        else:
            data = {}
        reason = data.get("reason")
        if reason is None:
            return ""
        if not isinstance(reason, str) or not views.is_text(reason) or len(reason) > 300:
            raise views.bad("'reason' must be a string of at most 300 characters.")
        return " ".join(reason.split())

    async def _events(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        after = views.int_query(request, "after", 0, 0, 10_000_000)
        after = views.last_event_id(request, after)
        task = await self.tasks.task_of_run(run_id)
        if task is None and (paused := self._paused.get(run_id)) is not None:
            task = await self.tasks.task(paused)  # a run a decision continued (see _decide)
        if request[IS_ADMIN]:
            known = await self.runs.run(run_id) is not None or await self.tasks.has_run(run_id)
        else:  # only the runs of the caller's own tasks
            known = self._may_see(request, task)
        if not known:
            raise ApiError(404, "not_found", "There is no run with that id.")
        return await self.streams.stream(request, run_id, after, self._linker(task))

    # artifacts: the files a task's runs made -----------------------------------------------

    def _linker(self, task: TaskRow | None) -> Callable[[str], str | None]:
        """A server path named in a run's events → its artifact's URL (None: not served)."""
        def link(path: str) -> str | None:
            if task is None or self.files is None:
                return None
            found = artifacts.artifact_at(path, self.files)
            return artifacts.url(task.id, found.id) if found is not None else None
        return link

    async def _artifacts(self, task: TaskRow) -> list[artifacts.Artifact]:
        """Every artifact of the task's steps, in order."""
        found: list[artifacts.Artifact] = []
        offset = 0
        while True:
            rows, total = await self.tasks.steps(task.id, offset, views.MAX_PAGE_SIZE)
            for step in rows:
                if step.run_id is not None:
                    found += artifacts.artifacts_of(await self.runs.events(step.run_id),
                                                    self.files)
            offset += len(rows)
            if not rows or offset >= total:
                return list({a.id: a for a in found}.values())

    async def _task_view(self, task: TaskRow, last: StepRow | None, run: RunRow | None = None,
                         events: list[RunEvent] | None = None) -> dict[str, Any]:
        """``run`` and ``events``: the last step's, when known here (a run that ended well
        was not paused: nothing to continue)."""
        made = await self._artifacts(task) if self.files is not None else []
        if run is None:
            continued = await self._continued(task, last)
            if continued is not last:
                events = None  # (it points at another run now)
            last = continued
        return await views.task_view(self.runs, task, last, self.files, made, run=run,
                                     events=events)

    async def _list_artifacts(self, request: web.Request) -> web.Response:
        task = await self._task(request)
        number, size = views.page(request)
        made = await self._artifacts(task)
        items = [a.view(task.id) for a in made[(number - 1) * size: number * size]]
        return web.json_response({"artifacts": items,
                                  "pagination": views.pagination(len(made), number, size)})

    async def _get_artifact(self, request: web.Request) -> web.StreamResponse:
        task = await self._task(request)
        wanted = request.match_info["artifact_id"]
        found = next((a for a in await self._artifacts(task) if a.id == wanted), None)
        if found is None or self.files is None:
            raise ApiError(404, "not_found", "That task has no artifact with that id.")
        try:  # made on another instance: fetched from the shared file store
            path = await self.files.local(found.key)
        except StorageError as e:
            log.warning("api: artifact %s of task %s could not be read: %s", found.name,
                        task.id, e)
            raise ApiError(503, "unavailable", "The file cannot be read right now; try again "
                           "shortly.") from None
        if path is None:
            raise ApiError(410, "gone", f"{found.name} is no longer kept (old files are "
                           "deleted after a while).")
        return web.FileResponse(path, headers={
            "Content-Type": found.media_type, "X-Content-Type-Options": "nosniff",
            "Content-Disposition": artifacts.content_disposition(found),
            "Content-Security-Policy": "default-src 'none'",
            "Cache-Control": "private, max-age=3600"})

    def _max_body(self) -> int:
        return self.settings.max_input_chars * 4 + views.MAX_ADDITIONAL_BYTES * 2 + 1024
