"""The admin API's schedules: add (each bad field one sentence), list with the next firing,
run now (answered in the chat), history, remove; the admin key is required."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.test_admin import KEY, Admin, make_admin
from tests.test_schedules_gateway import until_async


@pytest.fixture
async def admin(config_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PLUTO_ADMIN_KEY", KEY)
    gw, p = await make_admin(config_dir, data_dir)
    async with aiohttp.ClientSession() as http:
        yield Admin(gw, http, p)
    await gw.stop()


async def test_add_list_run_history_remove(admin: Admin) -> None:
    status, body = await admin.call("GET", "/admin/schedules", headers={})
    assert status == 401
    status, body = await admin.call("POST", "/admin/schedules", json={
        "agent": "default", "to": "test:ops", "cron": "0 9 * * 1-5", "tz": "Europe/Berlin",
        "prompt": "standup notes"})
    assert status == 201, body
    made = body["schedule"]
    assert (made["provider"], made["chat_id"], made["source"], made["describe"]) == (
        "test", "ops", "admin", "cron '0 9 * * 1-5' (Europe/Berlin)")
    status, body = await admin.call("GET", "/admin/schedules")
    assert status == 200 and [s["id"] for s in body["schedules"]] == [made["id"]]
    status, body = await admin.call("POST", f"/admin/schedules/{made['id']}/run")
    assert status == 200 and body == {"due_now": made["id"]}
    await admin.p.wait_finals(1, chat="ops")

    async def ran() -> list:
        status, body = await admin.call("GET", f"/admin/schedules/{made['id']}/history")
        return body["firings"] if body["firings"][0]["outcome"] == "ran" else []
    [firing] = await until_async(ran)
    assert firing["run_id"] and firing["due"] <= firing["fired_at"]
    await admin.gw.settled()  # the answer, in chunks of the provider's length
    assert "".join(admin.p.finals("ops")).endswith(": standup notes")
    status, body = await admin.call("DELETE", f"/admin/schedules/{made['id']}")
    assert status == 200 and body == {"removed": made["id"]}
    status, body = await admin.call("DELETE", f"/admin/schedules/{made['id']}")
    assert status == 404 and body["error"] == f"there is no schedule '{made['id']}'"


@pytest.mark.parametrize(("body", "says"), [
    ({"agent": "nobody", "to": "test:c", "every": "1h", "prompt": "p"},
     "'agent': unknown agent 'nobody'"),
    ({"agent": "default", "to": "c", "every": "1h", "prompt": "p"}, "'to' must be PROVIDER:CHAT"),
    ({"agent": "default", "to": "test:c", "prompt": "p"}, "give exactly one of"),
    ({"agent": "default", "to": "test:c", "cron": "0 25 * * *", "prompt": "p"},
     "'cron': '0 25 * * *' is not a cron expression I can use (bad hour)"),
    ({"agent": "default", "to": "test:c", "at": "2001-01-01 00:00", "prompt": "p"},
     "'at': That time has already passed"),
    ({"agent": "default", "to": "test:c", "every": "1h", "tz": "Mars/Base", "prompt": "p"},
     "'tz': 'Mars/Base' is not a time zone"),
    ({"agent": "default", "to": "test:c", "every": "1h", "prompt": "p", "colour": "red"},
     "unknown field 'colour'"),
])
async def test_bad_requests_are_one_sentence(admin: Admin, body: dict, says: str) -> None:
    status, answer = await admin.call("POST", "/admin/schedules", json=body)
    assert status == 400 and answer["error"].startswith(says), answer
    assert "\n" not in answer["error"]
