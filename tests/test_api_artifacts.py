"""The HTTP API's artifacts: the chart and the query result a step's run made are listed on
the step and the task with URLs, served to the key that made the task (or an admin key) and
to no other, never as server paths — in the step views and in the event stream alike."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.served import API_KEY, served, url

AUTH = {"Authorization": f"Bearer {API_KEY}"}
OTHER = {"Authorization": "Bearer other-key-abcdefghijklmnop"}
ADMIN = {"Authorization": "Bearer ops-key-abcdefghijklmnopq"}
SQL = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 1"


@pytest.fixture
async def gw(config_dir, data_dir, monkeypatch):
    monkeypatch.setenv("PLUTO_TEST_API_KEYS",
                       f"other-key-abcdefghijklmnop, {API_KEY}, ops:ops-key-abcdefghijklmnopq")
    model = ScriptedModel(
        Scripted(tool_calls=[ToolCall("c1", "make_chart", json.dumps({"sql": SQL,
                                                                      "kind": "bar"})),
                             ToolCall("c2", "run_sql", json.dumps({"sql": SQL}))]),
        Scripted(text="Here is the chart."))
    async with served(config_dir, data_dir, model, api={"admin_keys": ["ops"]}) as gateway:
        yield gateway


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def get(http: aiohttp.ClientSession, gw: Any, path: str,
              headers: dict[str, str] = AUTH) -> tuple[int, str, bytes]:
    async with http.get(url(gw, path), headers=headers) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_a_chart_and_a_result_are_fetched_through_the_api(gw, http, data_dir) -> None:
    async with http.post(url(gw, "/api/v1/agent/tasks?wait=30"), headers=AUTH,
                         data=json.dumps({"input": "chart the sales by region"})) as resp:
        assert resp.status == 201, await resp.text()
        task = await resp.json()
    step = task["last_step"]
    assert step["output"] == "Here is the chart." and step["outcome"] == "ok"
    assert [a["file_name"].rsplit("-", 1)[0] for a in step["artifacts"]] == ["chart", "result"]
    chart, result = step["artifacts"]
    assert chart["media_type"] == "image/png" and result["media_type"] == "text/csv"
    assert chart["url"] == f"/api/v1/agent/tasks/{task['task_id']}/artifacts/" \
                           f"{chart['artifact_id']}"
    assert task["artifacts"] == step["artifacts"]
    assert str(data_dir) not in json.dumps(task)

    status, ctype, png = await get(http, gw, chart["url"])
    assert (status, ctype, png[:8]) == (200, "image/png", b"\x89PNG\r\n\x1a\n")
    status, ctype, csv = await get(http, gw, result["url"])
    assert status == 200 and ctype.startswith("text/csv")
    assert csv.decode().splitlines()[0] == "region,total"

    listed = json.loads((await get(http, gw, f"/api/v1/agent/tasks/{task['task_id']}/"
                                             "artifacts?page_size=1"))[2])
    assert listed["artifacts"] == [chart]
    assert listed["pagination"]["total_items"] == 2

    # another key: the same 404 as a task that does not exist; an admin key may fetch it
    status, _, body = await get(http, gw, chart["url"], OTHER)
    assert status == 404 and json.loads(body)["code"] == "not_found"
    assert (await get(http, gw, chart["url"], {}))[0] == 401
    assert (await get(http, gw, chart["url"], ADMIN))[0] == 200
    unknown = chart["url"].rsplit("/", 1)[0] + "/" + "0" * 32
    assert (await get(http, gw, unknown))[0] == 404

    # the event stream names the artifacts' URLs, never a server path
    async with http.get(url(gw, step["events_url"]), headers=AUTH) as resp:
        stream = (await resp.read()).decode()
    ends = [json.loads(line[6:]) for line in stream.splitlines()
            if line.startswith("data: ") and '"tool.end"' in line]
    assert [e["details"].get("image") for e in ends] == [chart["url"], None]
    assert ends[1]["details"]["csv"] == result["url"]
    assert str(data_dir) not in stream


async def test_a_file_gone_from_the_data_dir_is_410(gw, http, data_dir) -> None:
    async with http.post(url(gw, "/api/v1/agent/tasks?wait=30"), headers=AUTH,
                         data=json.dumps({"input": "chart it"})) as resp:
        task = await resp.json()
    chart = task["last_step"]["artifacts"][0]
    for png in (data_dir / "artifacts").rglob(chart["file_name"]):
        png.unlink()
    status, _, body = await get(http, gw, chart["url"])
    assert status == 410 and "no longer kept" in json.loads(body)["error"]
