"""The API's event stream resumed from any ``Last-Event-ID``: before, at or past the end of an
ended run, the stream holds what is after it and ends with ``run.end`` at once; a value that is
no seq is refused with 400 (issue 29, item 9)."""

from __future__ import annotations

import aiohttp

from tests.helpers.served import url
from tests.test_api import AUTH, call, gw, http, keys, model, sse  # noqa: F401 - fixtures


async def _ended_run(http, gw) -> str:  # noqa: F811
    status, task = await call(http, gw, "POST", "/api/v1/agent/tasks?wait=30", {"input": "hi"})
    assert status == 201 and task["last_step"]["status"] == "completed"
    return task["last_step"]["run_id"]


async def test_resuming_an_ended_run_from_anywhere_ends_with_run_end(gw, http):  # noqa: F811
    run_id = await _ended_run(http, gw)
    everything = await sse(http, gw, run_id)
    assert everything[-1]["event"] == "run.end"
    end = int(everything[-1]["id"])
    for last in ["0", "1", str(end - 1), str(end), str(end + 1), "999999999999999999",
                 " 3 ", ""]:
        got = await sse(http, gw, run_id, headers={"Last-Event-ID": last})
        after = int(last or 0)
        want = [e for e in everything if int(e["id"]) > after] or everything[-1:]
        assert got == want, last
    # Last-Event-ID wins over ?after= (an EventSource reconnecting keeps its URL)
    assert await sse(http, gw, run_id, headers={"Last-Event-ID": str(end)},
                     query="?after=0") == everything[-1:]
    assert await sse(http, gw, run_id, query=f"?after={end + 100}") == everything[-1:]


async def test_a_last_event_id_that_is_no_seq_gets_400(gw, http):  # noqa: F811
    run_id = await _ended_run(http, gw)
    for bad in ["abc", "-1", "1.5", "12345678901234567890", "²", "0x10"]:
        async with http.get(url(gw, f"/api/v1/agent/{run_id}/events"),
                            headers={**AUTH, "Last-Event-ID": bad}) as resp:
            body = await resp.json()
        assert resp.status == 400 and body["code"] == "bad_request", bad
        assert "Last-Event-ID" in body["error"]
    async with aiohttp.ClientSession() as fresh:  # (a fresh client: nothing left open)
        assert (await sse(fresh, gw, run_id))[-1]["event"] == "run.end"
