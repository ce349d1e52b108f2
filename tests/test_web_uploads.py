"""Files sent from the chat widget (over its socket, to the gateway's usual path for files
users send), each refusal one sentence; the history a reconnecting tab gets keeps how answers
ended (stopped, failed); a message the gateway recorded but will not answer (over a rate limit
of routes.yaml) is said to be so, for the tab to show it as not sent."""

from __future__ import annotations

import aiohttp
import pytest

from pluto.runtime.errors import ModelError
from pluto.runtime.testing import Scripted, ScriptedModel
from tests.helpers.served import Tab, disk_full_once, served, wait_for

CSV = b"region,sales\nnorth,120\nsouth,80\neast,95\n"


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def _upload(tab: Tab, file_id: str, name: str, data: bytes, *, size: int | None = None,
                  mime: str | None = "text/csv", chunk: int = 16) -> dict:
    """Announce a file, send its bytes in a few binary frames; its ``file.received``."""
    await tab.send(type="file", id=file_id, name=name, mime=mime,
                   size=len(data) if size is None else size)
    await tab.until("file.accept", lambda f: f["reply_to"] == file_id)
    for i in range(0, len(data), chunk):
        await tab.ws.send_bytes(data[i:i + chunk])
    return await tab.until("file.received", lambda f: f["reply_to"] == file_id)


def _one_sentence(text: str) -> bool:
    return text.endswith(".") and "\n" not in text and "Traceback" not in text


async def test_a_data_file_sent_from_the_widget_becomes_a_dataset(config_dir, data_dir, http):
    model = ScriptedModel()
    async with served(config_dir, data_dir, model) as gw:
        tab = await Tab.open(http, gw)
        other = await Tab.open(http, gw, token=tab.ready["token"])  # the same chat, elsewhere
        received = await _upload(tab, "f1", "Sales 2026.csv", CSV)
        assert received["size"] == len(CSV) and received["name"] == "Sales 2026.csv"
        saved = list((data_dir / "uploads" / "web").rglob("*.csv"))
        assert [p.read_bytes() for p in saved] == [CSV]
        await tab.send(type="message", id="m1", text="which region sells most?", files=["f1"])
        await tab.until("ack", lambda f: f["reply_to"] == "m1")
        notice = await tab.until("notice")
        assert notice["text"].startswith("Added dataset `sales_2026`: 3 rows")
        final = await tab.until("message.final")
        assert "which region sells most?" in final["text"]
        shown = await other.until("message.user")
        assert shown["text"] == "which region sells most?" and shown["files"] == ["Sales 2026.csv"]
        assert "[The user sent the file Sales 2026.csv" in model.calls[-1][-1]["content"]
        await tab.ws.close()
        again = await Tab.open(http, gw, token=tab.ready["token"])
        assert saved[0].exists()  # the gateway's now: kept after the socket closed
        assert again.history[0] == again.history[0] | {  # the names, not the agent's notes
            "role": "user", "text": "which region sells most?", "files": ["Sales 2026.csv"]}
        await _upload(again, "f2", "only.csv", CSV)  # a file alone: no run, a note only
        await again.send(type="message", id="m2", files=["f2"])
        await again.until("notice")
        third = await Tab.open(http, gw, token=tab.ready["token"])
        assert third.history[-1] == third.history[-1] | {"role": "user", "text": "",
                                                          "files": ["only.csv"]}


async def test_files_the_chat_cannot_take_are_refused_in_one_sentence(config_dir, data_dir,
                                                                      http):
    async with served(config_dir, data_dir, web={"max_upload_mb": 0.001}) as gw:  # 1,048 B
        tab = await Tab.open(http, gw)
        refusals = {}
        for file_id, name, mime, size in (
                ("big", "big.csv", "text/csv", 5000), ("pdf", "report.pdf", "application/pdf", 10),
                ("pic", "drawing.svg", "image/svg+xml", 10), ("empty", "none.csv", "text/csv", 0)):
            await tab.send(type="file", id=file_id, name=name, mime=mime, size=size)
            error = await tab.until("error", lambda f, i=file_id: f["reply_to"] == i)
            assert error["code"] == "file_refused" and _one_sentence(error["message"]), error
            refusals[file_id] = error["message"]
        assert refusals["big"] == ("big.csv is too large to send here (4.88 kB; the limit is "
                                   "1.02 kB).")
        assert "report.pdf" in refusals["pdf"] and "CSV" in refusals["pdf"]
        assert refusals["pic"].startswith("Pictures")
        # longer than announced: refused, nothing kept
        await tab.send(type="file", id="liar", name="a.csv", size=4)
        await tab.until("file.accept")
        await tab.ws.send_bytes(b"a,b\n1,2\n")
        error = await tab.until("error", lambda f: f["reply_to"] == "liar")
        assert "longer than announced" in error["message"]
        # a message naming a file that never came
        await tab.send(type="message", id="m1", text="look", files=["liar"])
        error = await tab.until("error", lambda f: f["reply_to"] == "m1")
        assert error["code"] == "file_missing" and _one_sentence(error["message"])
        # bytes nobody announced, bad file frames
        await tab.ws.send_bytes(b"stray")
        assert (await tab.until("error"))["code"] == "bad_frame"
        for bad in ({"type": "file", "name": "x.csv", "size": 1},
                    {"type": "file", "id": "f", "name": "x.csv", "size": -1},
                    {"type": "file", "id": "f", "name": "", "size": 1},
                    {"type": "message", "text": "hi", "files": "f"}):
            await tab.ws.send_json(bad)
            error = await tab.until("error")
            assert error["code"] == "bad_frame" and _one_sentence(error["message"]), bad
        assert list((data_dir / "uploads").rglob("*.*")) == []
        assert (await tab.ask("still here?"))["text"] == "echo: still here?"


async def test_a_file_never_sent_with_a_message_is_deleted_when_the_tab_goes(config_dir,
                                                                             data_dir, http):
    async with served(config_dir, data_dir) as gw:
        tab = await Tab.open(http, gw)
        await _upload(tab, "f1", "kept.csv", CSV)
        await tab.send(type="file", id="f2", name="half.csv", size=len(CSV))
        await tab.until("file.accept")
        await tab.ws.send_bytes(CSV[:10])  # ... and the tab goes away mid-file
        await wait_for(lambda: len(list((data_dir / "uploads").rglob("*.csv"))) == 2)
        await tab.ws.close()
        await wait_for(lambda: not list((data_dir / "uploads").rglob("*.csv")))
        assert gw.health["web"].state == "running"


async def test_the_history_keeps_failed_and_stopped_answers(config_dir, data_dir, http):
    model = ScriptedModel(
        Scripted(error=ModelError("The model service rejected the API key.")),
        Scripted(text="y" * 400, chunk=2, delay=0.02))
    async with served(config_dir, data_dir, model) as gw:
        tab = await Tab.open(http, gw)
        await tab.send(type="message", id="m1", text="first")
        failed = await tab.until("error", lambda f: f.get("run_id") is not None)
        await tab.until("run.end", lambda f: f["run_id"] == failed["run_id"])
        await tab.send(type="message", id="m2", text="second")
        await tab.until("message.delta")
        await tab.send(type="stop")
        stopped = await tab.until("run.end", lambda f: f["outcome"] == "cancelled")
        await tab.ws.close()
        again = await Tab.open(http, gw, token=tab.ready["token"])
        ends = [m for m in again.history if m["role"] == "run.end"]
        assert [(e["run_id"], e["outcome"]) for e in ends] == [
            (failed["run_id"], "error"), (stopped["run_id"], "cancelled")]
        assert ends[0]["error"] == failed["message"] and ends[1]["error"] is None
        roles = [m["role"] for m in again.history]
        assert roles.index("run.end") == 1  # right after the message it answered
        assert roles[-2:] == ["assistant", "run.end"]  # the part shown, then the stop


async def test_a_message_over_the_routes_rate_limit_is_reported_refused(config_dir, data_dir,
                                                                        http):
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - name: web\n    match: {provider: web}\n    agent: default\n"
        "    rate_limit: {user: 1/minute}\ndefault: default\n")
    async with served(config_dir, data_dir) as gw:
        tab = await Tab.open(http, gw)
        assert (await tab.ask("first", "m1"))["text"] == "echo: first"
        await tab.send(type="message", id="m2", text="second")
        await tab.until("ack", lambda f: f["reply_to"] == "m2")  # recorded...
        refused = await tab.until("refused")  # ... and not answered
        assert refused["reply_to"] == "m2"
        notice = tab.of("notice") or [await tab.until("notice")]  # (in either order)
        assert "faster than I can answer" in notice[0]["text"]
        assert not tab.of("error") and len(tab.of("message.final")) == 1


async def test_a_message_with_a_file_not_recorded_is_sent_again_with_it(config_dir, data_dir,
                                                                         http):
    async with served(config_dir, data_dir) as gw:
        tab = await Tab.open(http, gw)
        await _upload(tab, "f1", "kept.csv", CSV)
        disk_full_once(gw)
        await tab.send(type="message", id="m1", text="rows?", files=["f1"])
        assert (await tab.until("error"))["code"] == "not_received"
        await tab.send(type="message", id="m1", text="rows?", files=["f1"])  # as the widget does
        await tab.until("ack", lambda f: f["reply_to"] == "m1")
        assert (await tab.until("notice"))["text"].startswith("Added dataset `kept`")
