"""/remind from the web widget: the visitor's schedule fires into their chat, and the answer is
kept there: the history of the next visit shows it. (A tab open at the time streams it live:
tests/test_web_live_runs.py.)"""

from __future__ import annotations

import aiohttp
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.served import Tab, served, wait_for

SECRET = "a-widget-secret-for-schedules-0123456789"


async def test_a_widget_reminder_is_answered_in_the_visitors_chat(config_dir, data_dir,
                                                                  monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    model = ScriptedModel(fallback=lambda m: Scripted(text=f"Reminder: {m[-1]['content']}"))
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        clock = [await gw.store.schedules.now()]
        gw.store.schedules.clock = lambda: clock[0]
        tab = await Tab.open(http, gw)
        said = await tab.ask("/remind in 2h check the oven")
        assert said["text"].startswith("Scheduled `"), said
        sid = said["text"].split("`")[1]
        clock[0] += 2 * 3600 + 1
        gw.scheduler.wake()

        async def ran() -> bool:
            found = await gw.store.schedules.history(sid)
            return bool(found) and found[0].outcome == "ran"
        await wait_for(ran)
        again = await Tab.open(http, gw, token=tab.ready["token"])  # the next visit
        assert ("assistant", "Reminder: check the oven") in [
            (m["role"], m["text"]) for m in again.history]
