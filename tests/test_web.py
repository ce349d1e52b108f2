"""The web chat over its WebSocket, against a real gateway on loopback: the protocol, sessions,
several tabs, bad input and floods, origins, disconnects, tool details and signed file links."""

from __future__ import annotations

import asyncio
import json
import stat
import struct
import time
import zlib
from pathlib import Path

import aiohttp
import pytest

from pluto.errors import ConfigError
from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.providers.web.protocol import (
    Hello,
    Message,
    Ping,
    ProtocolError,
    Stop,
    TokenBucket,
    display_details,
    encode,
    is_ping,
    parse_frame,
)
from pluto.providers.web.tokens import KEY_FILE, FileLinks, SessionSigner, load_key
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import BUILTIN_TOOLS, ToolContext, ToolResult, tool
from tests.helpers.gateway import write_agent
from tests.helpers.served import Tab, disk_full_once, served, url, wait_for

SECRET = "s" * 40


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel(fallback=lambda m: Scripted(text=f"You said: {m[-1]['content']}",
                                                     chunk=4))


@pytest.fixture
async def gw(config_dir, data_dir, model, monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    async with served(config_dir, data_dir, model, web={"rate_messages": 30}) as gateway:
        yield gateway


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def test_a_message_streams_its_answer_and_every_frame_has_ids(gw, http, model):
    # a model that takes its time (one that answers at once is shown by its final alone)
    model.fallback = lambda m: Scripted(text=f"You said: {m[-1]['content']}", chunk=4,
                                        delay=0.01)
    tab = await Tab.open(http, gw)
    assert tab.ready["token"].startswith("v1.") and tab.ready["agent"] == "default"
    assert tab.history == [] and tab.ready["reset"] is None
    final = await tab.ask("hello there", msg_id="m1")
    assert final["text"] == "You said: hello there"
    end = await tab.until("run.end")
    assert end["outcome"] == "ok"
    assert tab.of("ack")[0]["reply_to"] == "m1"
    start = tab.of("run.start")[0]
    assert start["message_id"] == "m1" and start["run_id"] == final["run_id"]
    deltas = tab.of("message.delta")
    assert deltas and "".join(d["text"] for d in deltas) == final["text"]  # in batches
    run_frames = [f for f in tab.frames if f.get("run_id")]
    assert [f["seq"] for f in run_frames] == list(range(1, len(run_frames) + 1))
    ids = [f["id"] for f in tab.frames]
    assert all(ids) and len(set(ids)) == len(ids)


async def test_messages_sent_after_one_not_received_wait_for_it_and_keep_their_order(gw, http):
    """Storage fails as m1 is recorded; the tab has sent m2 already (before m1's error came
    back). Had m2 been recorded, it would be answered before m1, sent again after the wait
    (seen in tests/test_cluster_chaos_web.py: a tab's m17 answered after its m19). m2 is not
    received either until m1 is; sent again in order, both are answered in order."""
    disk_full_once(gw)
    tab = await Tab.open(http, gw)
    await tab.send(type="message", id="m1", text="one")
    await tab.send(type="message", id="m2", text="two")
    refused = [await tab.until("error"), await tab.until("error")]
    assert [(f["code"], f["reply_to"]) for f in refused] == [("not_received", "m1"),
                                                            ("not_received", "m2")]
    assert all(f["retry_after"] >= 0.5 for f in refused)
    for mid, text in (("m1", "one"), ("m2", "two")):  # as the widget does: in order
        await tab.send(type="message", id=mid, text=text)
    finals = [await tab.until("message.final") for _ in range(2)]
    assert [f["text"] for f in finals] == ["You said: one", "You said: two"]
    assert [f["reply_to"] for f in tab.of("ack")] == ["m1", "m2"]


async def test_the_session_survives_a_reload_and_forged_or_expired_tokens_start_afresh(gw, http):
    first = await Tab.open(http, gw)
    await first.ask("remember the word kumquat")
    await first.until("run.end")
    token = first.ready["token"]
    await first.ws.close()

    again = await Tab.open(http, gw, token=token)
    assert [(m["role"], m["text"]) for m in again.history] == [
        ("user", "remember the word kumquat"), ("assistant", "You said: remember the word kumquat")]
    assert again.ready["token"] != "" and again.ready["reset"] is None

    forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    stranger = await Tab.open(http, gw, token=forged)
    assert stranger.history == [] and stranger.ready["reset"] == "invalid"
    old = SessionSigner(SECRET.encode(), max_age=1, clock=lambda: time.time() - 31 * 86400)
    visitor = token.split(".")[1]
    expired = await Tab.open(http, gw, token=old.issue(visitor))
    assert expired.history == [] and expired.ready["reset"] == "expired"
    for junk in ("not a token", "v1..1.x", "x" * 600):
        tab = await Tab.open(http, gw, token=junk)
        assert tab.history == [] and tab.ready["reset"] == "invalid"


async def test_a_visitor_only_ever_sees_their_own_session(gw, http):
    alice = await Tab.open(http, gw)
    await alice.ask("my secret is 4711")
    await alice.until("run.end")
    alice_visitor = alice.ready["token"].split(".")[1]
    # Bob tries to claim Alice's chat: extra fields are ignored, the chat comes from his token
    bob = await Tab.open(http, gw, hello=False)
    await bob.send(type="hello", token=None, chat_id=alice_visitor, user_id=alice_visitor)
    await bob.until("history")
    assert bob.history == [] and bob.ready["token"].split(".")[1] != alice_visitor
    # ... or Alice's visitor id with a signature of his own making
    bob_token = bob.ready["token"]
    claim = f"v1.{alice_visitor}.{int(time.time())}.{bob_token.rsplit('.', 1)[1]}"
    bob2 = await Tab.open(http, gw, token=claim)
    assert bob2.history == [] and bob2.ready["reset"] == "invalid"
    # ... and nothing of what Bob says reaches Alice's tab
    await bob.ask("hello from bob")
    await bob.until("run.end")
    # a barrier: Alice's socket is read through her next answer, which comes after anything
    # of Bob's the gateway could have pushed to her
    mine = await alice.ask("anything new?")
    await alice.until("run.end", lambda f: f["run_id"] == mine["run_id"])
    assert not any("bob" in str(f.get("text", "")) for f in alice.frames)


async def test_every_tab_of_a_session_gets_the_conversation(gw, http):
    one = await Tab.open(http, gw)
    two = await Tab.open(http, gw, token=one.ready["token"])
    other = await Tab.open(http, gw)
    await one.ask("from tab one", msg_id="t1")
    echoed = await two.until("message.user")
    assert echoed["text"] == "from tab one" and echoed["id"] == "t1"
    final = await two.until("message.final")
    assert final["text"] == "You said: from tab one"
    await one.until("run.end")
    await two.until("run.end")
    assert [f["id"] for f in one.frames if f.get("run_id")] == \
        [f["id"] for f in two.frames if f.get("run_id")]
    # a barrier: the other session's socket is read through its own answer, which comes after
    # anything of the first session's the gateway could have pushed to it
    mine = await other.ask("and here?")
    await other.until("run.end", lambda f: f["run_id"] == mine["run_id"])
    theirs = {f["run_id"] for f in one.frames if f.get("run_id")}
    assert [f["type"] for f in other.frames[:2]] == ["ready", "history"]
    assert not any(f.get("run_id") in theirs or "from tab one" in str(f.get("text", ""))
                   for f in other.frames)


async def test_commands_answer_at_once_without_a_run(gw, http, model):
    tab = await Tab.open(http, gw)
    reply = await tab.ask("/help")
    assert reply["run_id"] is None and "/stop" in reply["text"]
    assert model.calls == []


async def test_bad_frames_get_one_clear_error_each_and_the_chat_goes_on(gw, http):
    tab = await Tab.open(http, gw, hello=False)
    await tab.send(type="message", text="too early")
    assert (await tab.until("error"))["code"] == "hello_required"
    await tab.send(type="hello", token=None)
    await tab.until("history")
    cases = [
        ("{not json", "bad_json"), ("[1, 2]", "bad_frame"), ('"hello"', "bad_frame"),
        ('{"text": "no type"}', "bad_frame"), ('{"type": 42}', "bad_frame"),
        ('{"type": "message", "text": 42}', "bad_frame"),
        ('{"type": "message", "text": ["a"]}', "bad_frame"),
        ('{"type": "message"}', "bad_frame"),
        ('{"type": "message", "text": "   "}', "empty"),
        ('{"type": "message", "text": "\\ud800"}', "bad_frame"),
        ('{"type": "message", "text": "hi", "id": "has spaces"}', "bad_frame"),
        ('{"type": "hello"}', "bad_frame"),
        ('{"type": "shout", "text": "x"}', "unknown_type"),
        ('{"type": "message", "text": "' + "x" * 4001 + '"}', "too_long"),
    ]
    for raw, code in cases:
        await tab.ws.send_str(raw)
        error = await tab.until("error")
        assert error["code"] == code, raw
        assert error["message"].endswith((".", "-")) and "Traceback" not in error["message"]
    await tab.ws.send_bytes(b"\x00\x01")
    assert (await tab.until("error"))["code"] == "bad_frame"
    assert (await tab.ask("still here?"))["text"] == "You said: still here?"


async def test_a_frame_over_the_hard_cap_closes_the_socket(gw, http):
    tab = await Tab.open(http, gw)
    await tab.ws.send_str('{"type": "message", "text": "' + "x" * 100_000 + '"}')
    assert await tab.next(5) is None and tab.close_code == 1009
    assert (await (await Tab.open(http, gw)).ask("others are fine"))["text"]


async def test_a_flood_is_told_once_then_cut_off(config_dir, data_dir, model, http):
    async with served(config_dir, data_dir, model, web={"rate_messages": 5}) as gw:
        tab = await Tab.open(http, gw)
        for i in range(40):
            if tab.ws.closed:
                break
            await tab.ws.send_json({"type": "message", "text": f"spam {i}"})
        while await tab.next(5) is not None:
            pass
        limited = [f for f in tab.of("error") if f["code"] == "rate_limited"]
        assert len(limited) == 1 and limited[0]["retry_after"] > 0
        assert tab.close_code == 1008
        assert len(tab.of("ack")) == 4  # the hello took one of the five
        fresh = await Tab.open(http, gw)
        assert (await fresh.ask("I am not flooding"))["text"] == "You said: I am not flooding"


async def test_a_tab_pinging_is_answered_without_using_up_its_rate_limit(config_dir, data_dir,
                                                                          model, http):
    """A tab that hears nothing pings (the widget, after ``ready``'s ``ping_seconds``): each
    ping is answered ``pong``, before ``hello`` too, and a tab's pings do not use up the
    messages it may send; a flood of pings is a flood like any other."""
    async with served(config_dir, data_dir, model,
                      web={"rate_messages": 5, "ping_seconds": 2}) as gw:
        early = Tab(await http.ws_connect(url(gw, "/ws")))
        await early.send(type="ping")
        assert (await early.next(5) or {}).get("type") == "pong"
        await early.send(type="hello", token=None)
        await early.until("history")
        assert early.ready["ping_seconds"] == 2
        for _ in range(2):  # with the one before hello: three pings in ping_seconds, free
            await early.send(type="ping")
            await early.until("pong")
        for i in range(4):  # hello took one of five: four messages may still go
            assert (await early.ask(f"q{i}"))["text"] == f"You said: q{i}"
        assert not early.of("error")
        flood = await Tab.open(http, gw)
        for _ in range(40):
            if flood.ws.closed:
                break
            await flood.ws.send_str('{"type": "ping"}')
        while await flood.next(5) is not None:
            pass
        assert [f["code"] for f in flood.of("error")] == ["rate_limited"]
        assert flood.close_code == 1008
        assert 3 <= len(flood.of("pong")) <= 3 + 4 + 1  # the free ones, then the limit's


async def test_origins_are_checked_on_the_handshake(config_dir, data_dir, model, http):
    async with served(config_dir, data_dir, model,
                      web={"allowed_origins": ["https://shop.example.com"]}) as gw:
        for origin in ("https://evil.example", "null", "http://shop.example.com",
                       "https://shop.example.com.evil.io"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url(gw, "/ws"), headers={"Origin": origin})
            assert refused.value.status == 403, origin
        for origin in ("https://shop.example.com", "http://localhost:3000",
                       "http://127.0.0.1:9999", url(gw)):
            tab = await Tab.open(http, gw, origin=origin)
            assert tab.ready["token"], origin
            await tab.ws.close()


async def test_a_tab_closed_mid_answer_finds_the_whole_answer_after_reconnecting(
        config_dir, data_dir, http, monkeypatch):
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    slow = ScriptedModel(Scripted(text="a long and careful answer, " * 8, chunk=5, delay=0.02))
    async with served(config_dir, data_dir, slow) as gw:
        tab = await Tab.open(http, gw)
        await tab.send(type="message", text="tell me slowly")
        delta = await tab.until("message.delta")
        await tab.ws.close()
        run = await wait_for(lambda: _ended(gw, delta["run_id"]))
        assert run.status == "ok"
        # and delivered: a tab opened while its last frames go out gets them as frames (the
        # test above), not in the history
        await wait_for(lambda: run.id not in gw.providers["web"].following())
        back = await Tab.open(http, gw, token=tab.ready["token"])
        assert back.history[-1] == {"role": "assistant", "text": ("a long and careful answer, "
                                                                  * 8), "run_id": run.id,
                                    "ts": back.history[-1]["ts"]}


async def test_a_tab_that_joins_mid_answer_sees_it_from_the_start(config_dir, data_dir, http):
    slow = ScriptedModel(Scripted(text="one two three four five six seven", chunk=3,
                                  delay=0.03))
    async with served(config_dir, data_dir, slow) as gw:
        first = await Tab.open(http, gw)
        await first.send(type="message", text="count")
        await first.until("message.delta")
        late = await Tab.open(http, gw, token=first.ready["token"])
        final = await late.until("message.final")
        assert final["text"] == "one two three four five six seven"
        shown = "".join(f["text"] for f in late.of("message.delta"))
        assert shown == final["text"]  # from the first delta, none twice
        assert [m["role"] for m in late.history] == ["user"]


async def test_stop_ends_the_answer_in_progress(config_dir, data_dir, http):
    slow = ScriptedModel(Scripted(text="x" * 400, chunk=2, delay=0.02))
    async with served(config_dir, data_dir, slow) as gw:
        tab = await Tab.open(http, gw)
        await tab.send(type="message", text="go on forever")
        await tab.until("message.delta")
        await tab.send(type="stop")
        assert (await tab.until("message.final", lambda f: f["run_id"] is None))["text"] \
            == "Stopped."
        end = tab.of("run.end") or [await tab.until("run.end")]  # in either order
        assert end[0]["outcome"] == "cancelled"


def _png(path: Path) -> None:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2,
                                                                          0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


@tool
async def sales_chart(ctx: ToolContext) -> ToolResult:
    """Sales by region, as a table and a chart."""
    return ToolResult("north 10, south 20", details={
        "title": "Sales", "image": "artifacts/chart.png", "csv": "artifacts/sales.csv",
        "table": {"columns": ["region", "sales"], "rows": [["north", 10], {"region": "south",
                                                                           "sales": 20}]}})


async def test_tool_results_show_tables_and_charts_through_signed_links(
        config_dir, data_dir, http, monkeypatch):
    monkeypatch.setitem(BUILTIN_TOOLS, "sales_chart", sales_chart)  # a tool agents may name
    write_agent(config_dir, "charts", "tools: [sales_chart]\n")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - match: {provider: web, guild: charts}\n    agent: charts\ndefault: default\n")
    _png(data_dir / "artifacts" / "chart.png")
    (data_dir / "artifacts" / "sales.csv").write_text("region,sales\nnorth,10\nsouth,20\n")
    (data_dir / "secret.txt").write_text("not for visitors")
    model = ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "sales_chart", "{}")]),
                          Scripted(text="Here are the sales."))
    async with served(config_dir, data_dir, model) as gw:
        tab = await Tab.open(http, gw, agent="charts")
        assert tab.ready["agent"] == "charts"
        await tab.ask("show me sales")
        end = await tab.until("tool.end") if not tab.of("tool.end") else tab.of("tool.end")[0]
        details = end["details"]
        assert details["table"] == {"columns": ["region", "sales"], "truncated": False,
                                    "rows": [["north", 10], ["south", 20]], "total_rows": 2}
        link = details["image"]
        assert link.startswith("/web/file/") and link.endswith("/artifacts/chart.png")
        async with http.get(url(gw, link)) as resp:
            assert resp.status == 200 and resp.content_type == "image/png"
        async with http.get(url(gw, details["csv"])) as resp:
            assert resp.status == 200 and resp.content_type == "text/csv"
            assert resp.headers["Content-Disposition"] == 'attachment; filename="sales.csv"'
            assert await resp.text() == "region,sales\nnorth,10\nsouth,20\n"
        sig = link.split("/")[3]
        for bad in (link.replace(sig, "A" * len(sig)), f"/web/file/{sig}/secret.txt",
                    f"/web/file/{sig}/../pluto.db", "/web/file/x/%2e%2e/pluto.db"):
            async with http.get(url(gw, bad)) as resp:
                assert resp.status == 404, bad
        await tab.until("run.end")
        again = await Tab.open(http, gw, token=tab.ready["token"], agent="charts")
        assert [m["role"] for m in again.history] == ["user", "tool", "assistant"]
        assert again.history[1]["details"]["image"] == link
        default_chat = await Tab.open(http, gw, token=tab.ready["token"])
        assert default_chat.history == [] and default_chat.ready["agent"] == "default"


async def test_too_many_tabs_are_refused(config_dir, data_dir, model, http):
    async with served(config_dir, data_dir, model, web={"max_sockets_per_visitor": 2}) as gw:
        one = await Tab.open(http, gw)
        two = await Tab.open(http, gw, token=one.ready["token"])
        assert not two.ws.closed
        third = await Tab.open(http, gw, token=one.ready["token"], hello=False)
        await third.send(type="hello", token=one.ready["token"])
        assert (await third.until("error"))["code"] == "too_many_tabs"
        assert await third.next() is None and third.close_code == 1008


async def test_no_hello_in_time_closes_the_socket(config_dir, data_dir, model, http):
    async with served(config_dir, data_dir, model, web={"hello_timeout_seconds": 0.2}) as gw:
        tab = await Tab.open(http, gw, hello=False)
        assert await tab.next() is None and tab.close_code == 1008


async def test_shutdown_says_going_away(config_dir, data_dir, model, http):
    config = PlutoConfig(data_dir=data_dir, providers={"web": {"enabled": True}})
    gw = Gateway(config_dir, config=config, model_factory=model, serve=True,
                 http_bind=("127.0.0.1", 0))
    await gw.start()
    await wait_for(lambda: gw.health["web"].state == "running")
    tab = await Tab.open(http, gw)
    await gw.stop()
    assert await tab.next() is None and tab.close_code == 1001


async def test_the_demo_page_and_the_widget_are_served_with_safe_headers(gw, http):
    async with http.get(url(gw, "/")) as resp:
        page = await resp.text()
        assert resp.status == 200 and "default-src 'none'" in resp.headers[
            "Content-Security-Policy"]
        assert '<script src="/widget.' in page and "{{" not in page
    for path, kind in (("/widget.js", "application/javascript"), ("/widget.css", "text/css")):
        async with http.get(url(gw, path)) as resp:
            assert resp.status == 200 and resp.content_type == kind
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
    async with http.get(url(gw, "/widget.js")) as resp:
        assert "innerHTML" not in await resp.text()
    # behind a TLS proxy the embed snippet names https; a header that is no scheme is ignored
    host = url(gw, "").split("://", 1)[1].rstrip("/")
    for sent, scheme in (("https", "https"), ("javascript", "http")):
        async with http.get(url(gw, "/"), headers={"X-Forwarded-Proto": sent}) as resp:
            assert f"{scheme}://{host}" in await resp.text()


def test_the_signing_key_is_made_once_and_kept_private(tmp_path, monkeypatch):
    monkeypatch.delenv("PLUTO_WEB_SECRET", raising=False)
    key = load_key(tmp_path, "PLUTO_WEB_SECRET")
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 32
    path.chmod(0o644)
    assert load_key(tmp_path, "PLUTO_WEB_SECRET") == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setenv("PLUTO_WEB_SECRET", "short")
    with pytest.raises(ConfigError, match="at least 32 characters"):
        load_key(tmp_path, "PLUTO_WEB_SECRET")
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    assert load_key(tmp_path, "PLUTO_WEB_SECRET") == SECRET.encode()


async def test_bad_web_settings_are_reported_by_field(config_dir, data_dir):
    with pytest.raises(ConfigError, match=r"providers\.web\.allowed_origins"):
        async with served(config_dir, data_dir, web={"allowed_origins": ["not an origin"]}):
            pass
    with pytest.raises(ConfigError, match=r"providers\.web\.max_message_chars"):
        async with served(config_dir, data_dir, web={"max_message_chars": 0}):
            pass


async def _ended(gw: Gateway, run_id: str):
    run = await gw.store.conversations.run(run_id)
    return run if run is not None and run.status not in ("queued", "running") else None


# unit tests of the protocol's pieces -----------------------------------------------------------

def test_tool_details_are_checked_before_a_browser_sees_them(tmp_path):
    links = FileLinks(b"k" * 32, tmp_path)
    _png(tmp_path / "a.png")
    shown = display_details({
        "table": {"columns": ["a"] * 80, "rows": [[{"x": 1}] * 80] * 500, "total_rows": 9999},
        "image": "a.png", "text": "t" * 10_000, "title": 42, "html": "<b>no</b>"}, links.link)
    assert shown is not None
    assert len(shown["table"]["columns"]) == 50 and len(shown["table"]["rows"]) == 200
    assert shown["table"]["rows"][0][0] == "{'x': 1}" and shown["table"]["total_rows"] == 9999
    assert shown["table"]["truncated"] is True
    assert shown["image"].startswith("/web/file/") and len(shown["text"]) == 4000
    assert "title" not in shown and "html" not in shown
    for image in ("javascript:alert(1)", "data:text/html;base64,PGI+", "../../etc/passwd",
                  "/etc/passwd", "missing.png", "file:///etc/passwd", 7):
        assert display_details({"image": image}, links.link) is None, image
    assert display_details({"image": "https://example.com/c.png"}, links.link) == {
        "image": "https://example.com/c.png"}
    assert display_details("just text", links.link) is None
    assert display_details({"table": {"rows": [[1]]}}, links.link) is None


def test_client_frames_are_parsed_strictly():
    assert parse_frame('{"type": "hello", "agent": "sales", "token": null}', 10) == Hello(
        None, "sales")
    assert parse_frame('{"type": "message", "text": "hi", "id": "a:1"}', 10) == Message("a:1",
                                                                                        "hi")
    assert parse_frame('{"type": "stop", "extra": 1}', 10) == Stop()
    assert parse_frame('{"type": "ping"}', 10) == Ping() and is_ping('{"type":"ping"}')
    assert not is_ping('{"type": "message", "text": "ping"}') and not is_ping("ping")
    assert not is_ping('{"type": "ping", "pad": "' + "x" * 100 + '"}')  # (long: a frame)
    for raw in ('{"type": "hello", "agent": "../x"}', '{"type": "hello", "agent": 5}',
                '{"type": "hello", "token": {}}', '{"type": true}', "null", "1e999"):
        with pytest.raises(ProtocolError):
            parse_frame(raw, 10)


def test_server_frames_are_encoded_as_json_text_whatever_a_tool_put_in_them():
    frame = {"type": "tool.end", "id": "r:3", "seq": 3, "text": "naïve ✓ \u2028",
             "details": {"rows": [[1, 2.5, None, True]]}}
    assert json.loads(encode(frame)) == frame
    huge = {"type": "tool.start", "args": {"n": 2 ** 70}}  # past orjson's 64 bits: still sent
    assert json.loads(encode(huge)) == huge


def test_the_rate_limit_refills_evenly():
    now = [0.0]
    bucket = TokenBucket(2, 10, clock=lambda: now[0])
    assert bucket.take() == 0 and bucket.take() == 0
    assert bucket.take() == pytest.approx(5.0)
    now[0] = 5.0
    assert bucket.take() == 0 and bucket.take() > 0


async def test_a_run_that_fails_before_it_starts_is_reported_and_not_watched_forever(gw, http,
                                                                                      caplog):
    conversations = gw.store.conversations
    real = conversations.start_run

    async def broken(*args: object, **kwargs: object) -> None:
        conversations.start_run = real  # type: ignore[method-assign]
        raise OSError("disk full")

    conversations.start_run = broken  # type: ignore[method-assign]
    tab = await Tab.open(http, gw)
    await tab.send(type="message", text="hello?")
    error = await tab.until("error")
    assert error["code"] == "run_error" and "went wrong on our side" in error["message"]
    assert "disk full" not in str(tab.frames)  # the details stay in the log
    await wait_for(lambda: not gw.providers["web"].following())
    assert (await tab.ask("and now?"))["text"] == "You said: and now?"


# a run's frames reach the tabs in the feed's own call (no task per run) ------------------------

class _StubTab:
    """What the rooms need of a tab: its chat and where its frames go."""

    def __init__(self, chat_id: str):
        self.chat_id = chat_id
        self.frames: list[dict] = []

    def push(self, frame: dict) -> None:
        self.frames.append(frame)

    async def close(self) -> None:
        """Nothing to close: a stub has no socket."""


class _Stored:
    def __init__(self, events: list = ()):
        self.stored = list(events)
        self.reads = 0

    async def events(self, run_id: str, after: int = 0) -> list:
        self.reads += 1
        return [e for e in self.stored if e.run_id == run_id and e.seq > after]


def _listening_provider(tmp_path: Path, stored: _Stored):
    from pluto.gateway.feed import LocalRunFeed
    from pluto.providers.web.provider import WebProvider
    from pluto.providers.web.settings import WebSettings

    feed = LocalRunFeed(stored)
    provider = WebProvider(WebSettings(enabled=True), key=b"k" * 32, data_dir=tmp_path,
                           feed=feed, chats=None)  # type: ignore[arg-type]
    tab = _StubTab("c")
    provider.rooms.join(tab)  # type: ignore[arg-type]
    return provider, feed, tab


def _run_events(run_id: str = "r") -> list:
    from pluto.events import MessageDelta, MessageFinal, RunEnd, RunStart
    return [RunStart(run_id=run_id, session_id="s", agent="a", seq=1),
            MessageDelta(run_id=run_id, text="Hel", seq=2),
            MessageFinal(run_id=run_id, text="Hello", seq=3),
            RunEnd(run_id=run_id, outcome="ok", seq=4)]


async def test_a_run_followed_from_storage_reads_on_after_storage_fails(
        tmp_path, monkeypatch, caplog):
    """Following a run from storage (it runs on another instance) and storage fails for a
    moment — a cut, an outage: the showing reads on from where it stood once storage answers.
    Before, the failure ended it: the run counted as shown here, the tab never got the rest
    of it, and a tab that came back was not shown it either."""
    import pluto.providers.web.provider as web_provider
    from pluto.errors import StorageUnavailable

    class Failing(_Stored):
        async def events(self, run_id: str, after: int = 0) -> list:
            self.reads += 1
            if self.reads in (2, 3):
                raise StorageUnavailable("the database cannot be reached")
            return [e for e in self.stored if e.run_id == run_id and e.seq > after]

    monkeypatch.setattr(web_provider, "FOLLOW_RETRY", 0.01)
    start, delta, final, end = _run_events()
    stored = Failing([start, delta])
    provider, feed, tab = _listening_provider(tmp_path, stored)
    provider._follow("c", "r", "m1")  # (not accepted here: followed from storage)
    await wait_for(lambda: len(tab.frames) == 2)  # what storage had, then a wait
    stored.stored += [final, end]
    feed.publish(end)  # (a gap: storage is read — and fails twice)
    await wait_for(lambda: "run.end" in [f["type"] for f in tab.frames])
    assert [f["type"] for f in tab.frames] == ["run.start", "message.delta", "message.final",
                                                "run.end"]
    assert provider.following() == {}
    assert "Traceback" not in caplog.text and "reading it again" in caplog.text


async def test_a_fresh_run_is_shown_as_it_is_published_its_reply_too(tmp_path):
    stored = _Stored()
    provider, feed, tab = _listening_provider(tmp_path, stored)
    provider._follow("c", "r", "m1", fresh=True)
    assert provider.following() == {"r": False}  # listened to: no task of its own
    start, delta, final, end = _run_events()
    feed.publish(start)
    assert tab.frames[-1]["type"] == "run.start" and tab.frames[-1]["message_id"] == "m1"
    feed.publish(delta)
    assert tab.frames[-1] == {"type": "message.delta", "id": "r:2", "run_id": "r", "seq": 2,
                              "text": "Hel"}
    feed.publish(final)  # the reply comes from the feed like the rest (no outbox for it)
    assert tab.frames[-1] == {"type": "message.final", "id": "r:3", "run_id": "r", "seq": 3,
                              "text": "Hello"}
    feed.publish(end)
    assert [f["type"] for f in tab.frames] == ["run.start", "message.delta", "message.final",
                                               "run.end"]
    assert not provider.following() and not feed.watched("r") and stored.reads == 0


async def test_a_listened_run_that_missed_its_start_is_read_from_storage(tmp_path):
    evs = _run_events()
    stored = _Stored(evs)
    provider, feed, tab = _listening_provider(tmp_path, stored)
    provider._follow("c", "r", fresh=True)
    feed.publish(evs[1])  # seq 2 first: its start went by before it was listened to
    await wait_for(lambda: stored.reads == 1)
    await wait_for(lambda: not provider.following())  # storage had it to its end
    feed.publish(evs[2])  # (late live copies: not shown again)
    feed.publish(evs[3])
    assert [f["seq"] for f in tab.frames] == [1, 2, 3, 4]  # each once, in order
    assert [f["type"] for f in tab.frames] == ["run.start", "message.delta", "message.final",
                                               "run.end"]


async def test_a_listened_run_that_stays_silent_is_looked_up_in_storage(tmp_path, monkeypatch):
    from pluto.providers.web import provider as web_provider
    monkeypatch.setattr(web_provider, "SILENT_CHECK", 0.05)
    evs = _run_events()
    stored = _Stored(evs[:2])  # it ran (and was forgotten by the feed) before anyone listened
    provider, feed, tab = _listening_provider(tmp_path, stored)
    provider._follow("c", "r", fresh=True)
    await wait_for(lambda: [f["seq"] for f in tab.frames] == [1, 2])
    assert provider.following()["r"] and not feed._listeners
    await provider.close()


async def test_a_listened_run_whose_frame_fails_is_shown_from_storage(tmp_path, monkeypatch,
                                                                      caplog):
    from pluto.providers.web import protocol as web_protocol
    evs = _run_events()
    stored = _Stored(evs[:2])
    provider, feed, tab = _listening_provider(tmp_path, stored)
    provider._follow("c", "r", fresh=True)
    real = web_protocol.run_frame
    monkeypatch.setattr(web_protocol, "run_frame", lambda *a: 1 / 0)  # a bug, once
    feed.publish(evs[0])  # the run publishing it is never hurt ...
    monkeypatch.setattr(web_protocol, "run_frame", real)
    feed.publish(evs[1])
    # ... and the tabs get the run all the same, from storage
    await wait_for(lambda: [f["seq"] for f in tab.frames] == [1, 2])
    assert "showing run r failed" in caplog.text
    await provider.close()
