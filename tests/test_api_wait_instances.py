"""Two instances on one PostgreSQL database: a step posted with ``?wait=`` to the instance that
does not run it (its chat is busy on the other) is answered from storage — the same answer a
later read of the step gives on either instance (providers/api/steps.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from pluto.storage.postgres import PostgresStore
from tests.helpers.pg import fresh_schema
from tests.helpers.served import API_KEY, url, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def slow_first(messages: list[dict[str, Any]]) -> Scripted:
    text = messages[-1]["content"]
    if text == "first":  # long enough for the next step to arrive while it runs
        return Scripted(text="a slow first answer " * 10, chunk=4, delay=0.02)
    return Scripted(text=f"echo: {text}")


@asynccontextmanager
async def two(config_dir: Path, tmp_path: Path) -> AsyncIterator[list[Gateway]]:
    with fresh_schema() as database:
        async with AsyncExitStack() as stack:
            gateways = []
            for i in range(2):
                cfg = PlutoConfig(data_dir=tmp_path / f"data{i}", providers={
                    "api": {"enabled": True, "keys_env": "PLUTO_TEST_API_KEYS"}})
                gw = Gateway(config_dir, config=cfg,
                             model_factory=ScriptedModel(fallback=slow_first), serve=True,
                             http_bind=("127.0.0.1", 0), store=PostgresStore(database))
                await stack.enter_async_context(gw)
                await wait_for(lambda g=gw: g.health["api"].state == "running")
                gateways.append(gw)
            yield gateways


@pytest.mark.slow
async def test_a_step_run_on_another_instance_is_answered_from_storage(
        config_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    async with two(config_dir, tmp_path) as (a, b), aiohttp.ClientSession() as http:
        async with http.post(url(a, "/api/v1/agent/tasks"), json={"input": "first"},
                             headers=AUTH) as resp:
            assert resp.status == 201
            task = await resp.json()
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        async with http.post(url(b, path + "?wait=30"), json={"input": "second"},
                             headers=AUTH) as resp:
            assert resp.status == 201
            answered = await resp.json()
        assert answered["status"] == "completed" and answered["output"] == "echo: second"
        row = await a.store.engine.fetchone("SELECT owner FROM runs WHERE id = ?",
                                            (answered["run_id"],))
        assert row["owner"] == a.instance  # it ran where its chat was busy, not on B
        for gw in (a, b):
            async with http.get(url(gw, f"{path}/{answered['step_id']}"),
                                headers=AUTH) as resp:
                assert await resp.json() == answered
        async with http.get(url(b, path), headers=AUTH) as resp:
            listed = await resp.json()
        assert [s["input"] for s in listed["steps"]] == ["first", "second"]
