"""A schedule into an HTTP API task: its firing is a step of the task, so a client reading the
task finds the scheduled answer among its steps, as it finds its own."""

from __future__ import annotations

import aiohttp
import pytest

from pluto.gateway.schedules.recurrence import When
from pluto.gateway.schedules.scheduler import add_schedule
from tests.helpers.served import API_KEY, served, url, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUTO_WEB_SECRET", "s" * 40)
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)


async def test_a_firing_into_an_api_task_is_a_step_of_it(config_dir, data_dir) -> None:
    async with served(config_dir, data_dir) as gw, aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(url(gw, "/api/v1/agent/tasks"), json={"input": "hello"}) as r:
            assert r.status == 201, await r.text()
            task = (await r.json())["task_id"]
        store = gw.store.schedules
        now = await store.now()
        await add_schedule(store, source="admin", owner=None, provider="api", chat_id=task,
                           agent="default", prompt="the weekly numbers",
                           when=When("at", str(now + 1.0)), created_by="test")
        gw.scheduler.wake()

        async def steps() -> list[dict]:
            async with http.get(url(gw, f"/api/v1/agent/tasks/{task}/steps")) as r:
                assert r.status == 200
                return (await r.json())["steps"]

        async def answered() -> list[dict] | None:
            found = await steps()
            return found if len(found) == 2 and found[1].get("output") else None

        first, fired = await wait_for(answered, timeout=30)
        assert fired["input"] == "the weekly numbers"
        assert fired["output"] == "echo: the weekly numbers"
        assert fired["additional_input"] == {"schedule": fired["additional_input"]["schedule"]}
        # a schedule into a task that does not exist: failed in its history, nothing else
        ghost = await add_schedule(store, source="admin", owner=None, provider="api",
                                   chat_id="no-such-task", agent="default", prompt="x",
                                   when=When("at", str(await store.now() + 0.5)),
                                   created_by="test")
        gw.scheduler.wake()

        async def failed() -> bool:
            history = await store.history(ghost.id)
            return bool(history) and history[0].outcome == "failed"

        await wait_for(failed, timeout=30)
        assert len(await steps()) == 2
