"""Files on every instance (issue 30, item 7): charts, results and datasets one instance made
are read on another through the shared file store (PostgreSQL), within size caps; hostile
names are refused; with SQLite nothing changes (the data dir is the only copy).

The PostgreSQL tests use a fresh schema each (tests/helpers/pg.py) and fail, never skip,
without a server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path

import aiohttp
import pytest

from pluto.errors import StorageUnavailable
from pluto.runtime.data import DataService
from pluto.runtime.files import SharedFiles
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.storage.blobs import BlobNameRefused, BlobTooLarge, LocalBlobs, check_key
from pluto.storage.postgres import PostgresStore
from pluto.storage.sqlite import SqliteStore
from pluto.gateway.pipeline.shared_uploads import UploadsFirst
from pluto.types import Attachment, IncomingMessage, Route
from tests.helpers.gateway import write_agent
from tests.helpers.pg import fresh_schema
from tests.helpers.served import Tab, served, url, wait_for

SECRET = "w" * 40
SALES_SQL = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 1"
HOSTILE = ["../pluto.db", "artifacts/../pluto.db", "artifacts/run/../../pluto.db",
           "/etc/passwd", "/artifacts/run/x.png", "artifacts\\run\\x.png", "C:/x/artifacts/a",
           "artifacts/.hidden", "artifacts//x.png", "artifacts/./x.png", "pluto.db",
           "web-session.key", "memory/u.md", "artifacts/run/x\x00.png", "artifacts",
           "", "artifacts/" + "a" * 600]


@pytest.fixture
async def pg_store():
    with fresh_schema() as pg_url:
        async with PostgresStore(pg_url) as store:
            yield store


# ---- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", HOSTILE)
def test_hostile_names_are_refused_with_the_reason(key):
    with pytest.raises(BlobNameRefused) as refused:
        check_key(key)
    assert str(refused.value)  # says what is wrong with the name


def test_shareable_names_and_the_keys_of_paths(tmp_path):
    for key in ("artifacts/run1/chart-0a1b.png", "uploads/telegram/42/Sales 2024.csv",
                "datasets/orders.duckdb"):
        assert check_key(key) == key
    files = SharedFiles(tmp_path / "a")
    assert files.key(tmp_path / "a" / "artifacts" / "r" / "c.png") == "artifacts/r/c.png"
    assert files.key("artifacts/r/c.png") == "artifacts/r/c.png"
    # another instance's data dir: from its shared folder on
    assert files.key("/srv/b/data/artifacts/r/c.png") == "artifacts/r/c.png"
    for bad in ("/etc/passwd", tmp_path / "a" / "pluto.db", "../x/artifacts/r/c.png",
                "artifacts/../../etc/passwd", tmp_path / "a" / "artifacts" / ".." / "pluto.db"):
        assert files.key(bad) is None, bad


# ---- SQLite: unchanged -----------------------------------------------------------------------


async def test_with_sqlite_files_stay_in_the_data_dir_only(tmp_path):
    async with SqliteStore(tmp_path / "pluto.db") as store:
        assert isinstance(store.blobs, LocalBlobs) and not store.blobs.shared
        files = SharedFiles(tmp_path, store.blobs)
        chart = tmp_path / "artifacts" / "r" / "c.png"
        chart.parent.mkdir(parents=True)
        chart.write_bytes(b"png")
        assert await files.publish(chart) == ""  # nothing copied
        assert await files.local("artifacts/r/c.png") == chart.resolve()
        assert await files.local("artifacts/r/missing.png") is None  # nothing fetched
        assert not files.shared
    service = DataService(tmp_path / "svc", files=SharedFiles(tmp_path / "svc", _Forbidden()))
    warehouse = await service.synced()  # no listing is asked for
    assert [d.name for d in warehouse.list()] == ["sales"] and not warehouse.list()[0].blob


class _Forbidden(LocalBlobs):
    async def listing(self, prefix: str) -> list[tuple[str, int, str, str]]:
        raise RuntimeError("SQLite mode must not look for shared files")


# ---- the PostgreSQL store --------------------------------------------------------------------


async def test_a_large_file_goes_in_chunks_and_comes_back_whole(pg_store, tmp_path):
    blob = bytes(range(256)) * (10 * 4096 + 17)  # 10 MiB and a bit: 11 chunks
    src = tmp_path / "a" / "artifacts" / "r" / "big.bin"
    src.parent.mkdir(parents=True)
    src.write_bytes(blob)
    a = SharedFiles(tmp_path / "a", pg_store.blobs)
    b = SharedFiles(tmp_path / "b", pg_store.blobs)
    sha = await a.publish(src)
    assert sha == hashlib.sha256(blob).hexdigest()
    got = await asyncio.gather(*(b.local(str(src)) for _ in range(3)))  # one fetch for all
    assert got[0] == got[1] == got[2] == (tmp_path / "b" / "artifacts" / "r" / "big.bin")
    assert got[0].read_bytes() == blob
    assert not [p for p in got[0].parent.iterdir() if p.name.startswith(".")]  # no leftovers
    assert await b.local("artifacts/r/none.bin") is None
    assert await pg_store.blobs.listing("artifacts/") == [
        ("artifacts/r/big.bin", len(blob), sha, "")]


async def test_caps_are_refused_with_a_clear_message(pg_store, tmp_path):
    files = SharedFiles(tmp_path, pg_store.blobs, max_bytes=1000, max_total=1500)
    folder = tmp_path / "artifacts" / "r"
    folder.mkdir(parents=True)
    (folder / "big.csv").write_bytes(b"x" * 1001)
    (folder / "a.csv").write_bytes(b"x" * 900)
    (folder / "b.csv").write_bytes(b"x" * 900)
    with pytest.raises(BlobTooLarge, match=r"big\.csv is 1 KB; files shared between instances "
                                           r"may be at most 1 KB"):
        await files.publish(folder / "big.csv")
    await files.publish(folder / "a.csv")
    with pytest.raises(BlobTooLarge, match=r"b\.csv \(1 KB\) does not fit in the shared file "
                                           r"store: 1 KB of 1 KB are in use"):
        await files.publish(folder / "b.csv")
    await files.publish(folder / "a.csv")  # replacing a file counts it once
    assert [k for k, *_ in await pg_store.blobs.listing("")] == ["artifacts/r/a.csv"]


async def test_hostile_names_are_refused_by_the_store(pg_store, tmp_path):
    (tmp_path / "x").write_text("secret")
    for key in HOSTILE:
        with pytest.raises(BlobNameRefused):
            await pg_store.blobs.put(key, tmp_path / "x", max_bytes=100, max_total=100)
        with pytest.raises(BlobNameRefused):
            await pg_store.blobs.fetch(key, tmp_path / "y")
    files = SharedFiles(tmp_path / "d", pg_store.blobs)
    with pytest.raises(BlobNameRefused):
        await files.publish(tmp_path / "x")  # outside the data dir
    assert await files.local("../x") is None and await files.local("/etc/passwd") is None
    assert await pg_store.blobs.listing("") == []


async def test_old_shared_files_are_pruned_datasets_are_not(pg_store, tmp_path):
    files = SharedFiles(tmp_path, pg_store.blobs)
    for key in ("artifacts/r/a.png", "uploads/t/1/a.csv", "datasets/a.duckdb"):
        path = tmp_path / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"1234")
        await files.publish(path)
    assert await pg_store.blobs.prune(("artifacts/", "uploads/"), 0.0, 10**9) == 0
    assert await pg_store.blobs.prune(("artifacts/", "uploads/"), 4e9, 10**9) == 2
    assert [k for k, *_ in await pg_store.blobs.listing("")] == ["datasets/a.duckdb"]


# ---- two gateways, separate data dirs, one PostgreSQL schema ---------------------------------


@pytest.fixture
async def two(config_dir, tmp_path, monkeypatch):
    """Instances A and B as docker-compose.yml runs them: one database, a data dir each,
    one web signing key."""
    monkeypatch.setenv("PLUTO_WEB_SECRET", SECRET)
    write_agent(config_dir, "charts", "tools: [make_chart, run_sql]\ndatasets: '*'\n")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - match: {provider: web, guild: charts}\n    agent: charts\n"
        "default: default\n")
    model = ScriptedModel(
        Scripted(tool_calls=[ToolCall("c1", "make_chart", json.dumps(
            {"sql": SALES_SQL, "kind": "bar", "x": "region", "y": ["total"]}))]),
        Scripted(text="Here is the chart."),
        fallback=lambda m: Scripted(text="ok"))
    with fresh_schema() as pg_url:
        monkeypatch.setenv("DATABASE_URL", pg_url)
        async with served(config_dir, tmp_path / "a", model) as a, \
                served(config_dir, tmp_path / "b", model) as b:
            assert a.store.shared and b.store.shared
            yield a, b


async def test_a_chart_made_on_a_downloads_through_b(two, tmp_path):
    a, b = two
    async with aiohttp.ClientSession() as http:
        tab = await Tab.open(http, a, agent="charts")
        await _ask(tab, "chart the sales by region")
        [end] = tab.of("tool.end")
        link = end["details"]["image"]
        assert link.startswith("/web/file/") and "/artifacts/" in link
        made = next((tmp_path / "a" / "artifacts").rglob("chart-*.png")).read_bytes()
        rel = link.split("/", 4)[4]
        assert not (tmp_path / "b" / rel).exists()
        async with http.get(url(b, link)) as resp:  # the URL the user was given, on B
            assert resp.status == 200 and resp.content_type == "image/png"
            assert await resp.read() == made
        assert (tmp_path / "b" / rel).read_bytes() == made  # B's cache
        # B shows A's run from storage, with a link B serves too
        on_b = await Tab.open(http, b, token=tab.ready["token"], agent="charts")
        [shown] = [m for m in on_b.history if m["role"] == "tool"]
        assert shown["details"]["image"] == link
        # the database cannot be read: a clear 503 to retry, no stack trace, nothing cached
        (tmp_path / "b" / rel).unlink()

        async def unreachable(key: str, dest: Path) -> bool:
            raise StorageUnavailable("the database cannot be reached")

        b.files.blobs.fetch = unreachable  # type: ignore[method-assign]
        async with http.get(url(b, link)) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "5"
            assert await resp.json() == {"error": "The file cannot be read right now; try "
                                                  "again shortly."}
        assert not (tmp_path / "b" / rel).exists()
        forged = link.replace(link.split("/")[3], "A" * 32)
        for bad in (forged, link.rsplit("/", 1)[0] + "/../../pluto.db",
                    link.replace("/artifacts/", "/datasets/")):
            async with http.get(url(b, bad)) as resp:
                assert resp.status == 404, bad


async def test_a_csv_sent_on_a_is_queryable_on_b(two, tmp_path):
    a, b = two
    async with aiohttp.ClientSession() as http:
        tab_b = await Tab.open(http, b)
        visitor = tab_b.ready["token"].split(".")[1]
        probe = IncomingMessage(provider="web", chat_id=visitor, user_id=visitor, text="",
                                is_direct=True)
        route = b.providers["web"].route(probe)
        # the file a platform delivered to A (as Telegram's provider saves it)
        sent = tmp_path / "a" / "uploads" / "web" / visitor / "orders.csv"
        sent.parent.mkdir(parents=True)
        sent.write_text("id,amount\n1,10.5\n2,20\n3,30\n")
        notes: list[tuple[str, str]] = []

        async def notify(text: str, kind: str) -> None:
            notes.append((text, kind))

        session = await a.store.conversations.session(route.session_key, route.agent)
        msg = IncomingMessage(provider="web", chat_id=visitor, user_id=visitor, text="",
                              attachments=(_attachment(sent),))
        assert await a.data.take_uploads(msg, route, session.id, notify) is None
        assert notes == [("Added dataset `orders`: 3 rows × 2 columns. Ask me about it, or try "
                          "`/describe orders`.", "notice")]
        answer = await _ask(tab_b, "/sql SELECT count(*) AS n, sum(amount) AS total FROM orders")
        assert answer["text"] == "|   n | total |\n| --: | ----: |\n|   3 |  60.5 |\n\n(1 row)"
        assert (tmp_path / "b" / "datasets" / "orders.duckdb").is_file()
        listed = await _ask(tab_b, "/datasets")
        assert "`orders` — 3 rows × 2 columns (sent in this chat)" in listed["text"]
        # removed on A: gone on B at its next look
        scope = a.data.service.scope(route.session_key, ())
        await a.data.service.remove("orders", scope)
        await tab_b.send(type="message", text="/sql SELECT * FROM orders")
        gone = await tab_b.until("error", timeout=60)
        assert "orders" in gone["message"] and not (tmp_path / "b" / "datasets" /
                                                 "orders.duckdb").exists()


async def test_a_file_a_platform_delivered_to_a_becomes_a_dataset_on_b(two, tmp_path):
    """A's provider saved the file and recorded the message; B claimed and answers it."""
    a, b = two
    sent = tmp_path / "a" / "uploads" / "telegram" / "42" / "Q3 Sales.csv"
    sent.parent.mkdir(parents=True)
    sent.write_text("region,amount\nnorth,5\nsouth,7\n")
    photo = sent.with_name("photo.jpg")
    photo.write_bytes(b"\xff\xd8 a photo")
    msg = IncomingMessage(provider="telegram", chat_id="42", user_id="7", text="",
                          attachments=(_attachment(sent), Attachment(
                              filename="photo.jpg", mime_type="image/jpeg", path=photo)))
    handed = UploadsFirst(_Recording(), a.files)
    await handed.submit(msg)
    assert handed.intake.got == [msg]  # type: ignore[attr-defined]
    # what an answer reads is kept for every instance: the data file, and the picture (its
    # model sees it, or is told of it)
    assert sorted(k for k, *_ in await a.store.blobs.listing("uploads/")) == [
        "uploads/telegram/42/Q3 Sales.csv", "uploads/telegram/42/photo.jpg"]
    text = sent.read_text()
    sent.unlink()  # B runs elsewhere: A's disk is not B's
    notes: list[tuple[str, str]] = []

    async def notify(text: str, kind: str) -> None:
        notes.append((text, kind))

    route = Route(agent="default", session_key="telegram:42", rule="test")
    session = await b.store.conversations.session(route.session_key, route.agent)
    assert await b.data.take_uploads(msg, route, session.id, notify) is None
    assert notes == [("Added dataset `q3_sales`: 2 rows × 2 columns. Ask me about it, or try "
                      "`/describe q3_sales`.", "notice")]
    assert (tmp_path / "b" / "uploads" / "telegram" / "42" / "Q3 Sales.csv").read_text() == text
    # a file that never reached the store: the user is asked to send it again
    lost = sent.with_name("lost.csv")  # on A's disk only, never kept in the store
    notes.clear()
    lost_msg = IncomingMessage(provider="telegram", chat_id="42", user_id="7", text="",
                               attachments=(Attachment(filename="lost.csv", path=lost),))
    assert await b.data.take_uploads(lost_msg, route, session.id, notify) is None
    assert notes == [("I did not receive lost.csv; please send it again.", "error")]


async def test_b_fetches_only_the_datasets_its_chats_see_and_keeps_other_names_free(two,
                                                                                  tmp_path):
    a, b = two
    sa, sb = a.data.service, b.data.service
    for chat in ("x", "y"):
        sent = tmp_path / "a" / "uploads" / "t" / chat / "orders.csv"
        sent.parent.mkdir(parents=True)
        sent.write_text(f"chat\n{chat}\n")
        await sa.add_upload(sent, "orders.csv", "text/csv", f"t:{chat}")
    assert {d.name: d.owner for d in await sa.visible(None)}["orders_2"] == "t:y"
    seen = await sb.visible(sb.scope("t:y", ()))
    assert [(d.name, d.owner) for d in seen] == [("orders_2", "t:y")]
    assert not (tmp_path / "b" / "datasets" / "orders.duckdb").exists()  # chat x's: not here
    # a third chat sends orders.csv to B: the name chat x holds on A stays x's
    sent = tmp_path / "b" / "uploads" / "t" / "z" / "orders.csv"
    sent.parent.mkdir(parents=True)
    sent.write_text("chat\nz\n")
    mine = await sb.add_upload(sent, "orders.csv", "text/csv", "t:z")
    assert mine.name == "orders_3"
    result = await sa.query("SELECT chat FROM orders_3", sa.scope("t:z", ()))
    assert list(result.rows) == [("z",)]


class _Recording:
    def __init__(self) -> None:
        self.got: list[IncomingMessage] = []

    async def submit(self, msg: IncomingMessage) -> None:
        self.got.append(msg)


async def test_an_upload_over_the_cap_is_refused_on_every_instance(two, tmp_path):
    a, b = two
    a.files.max_bytes = 2000  # the .duckdb file of any upload is larger
    owner = "web:someone"
    sent = tmp_path / "a" / "uploads" / "x" / "big.csv"
    sent.parent.mkdir(parents=True)
    sent.write_text("id\n" + "".join(f"{i}\n" for i in range(100)))
    from pluto.runtime.data import DatasetError

    with pytest.raises(DatasetError, match=r"big\.csv could not be kept for every instance: "
                                           r"big\.duckdb is \d+ KB; files shared between "
                                           r"instances may be at most 2 KB\."):
        await a.data.service.add_upload(sent, "big.csv", "text/csv", owner)
    scope = a.data.service.scope(owner, ())
    assert await a.data.service.visible(scope) == []  # not kept here either
    assert await b.data.service.visible(b.data.service.scope(owner, ())) == []


async def _ask(tab: Tab, text: str) -> dict:
    """A message's answer (slow under load: a chart imports matplotlib on first use)."""
    await tab.send(type="message", text=text)
    return await tab.until("message.final", timeout=60)


def _attachment(path: Path) -> Attachment:
    return Attachment(filename=path.name, mime_type="text/csv", size=path.stat().st_size,
                      path=path)


async def test_the_shared_catalog_is_not_read_without_postgresql(config_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    async with served(config_dir, tmp_path / "d") as gw:
        assert not gw.files.shared and isinstance(gw.store.blobs, LocalBlobs)
        async with aiohttp.ClientSession() as http:
            tab = await Tab.open(http, gw)
            answer = await _ask(tab, "/sql SELECT count(*) FROM sales")
            assert "2,000" in answer["text"] or "2000" in answer["text"]
    assert "shared file store" not in caplog.text


async def test_the_outbox_of_b_sends_a_chart_a_drew(pg_store, tmp_path):
    """A reply recorded on A and sent from B (A died, B's sweep took it): the chart's file is
    fetched into B's data dir before the platform call."""
    from pluto.gateway.delivery.outbox import Outbox
    from pluto.types import OutgoingMessage

    chart = tmp_path / "a" / "artifacts" / "run9" / "chart-1.png"
    chart.parent.mkdir(parents=True)
    chart.write_bytes(b"\x89PNG chart")
    await SharedFiles(tmp_path / "a", pg_store.blobs).publish(chart)
    chart.unlink()  # A's disk is not B's
    outbox = Outbox(pg_store.outbox, {})
    outbox.files = SharedFiles(tmp_path / "b", pg_store.blobs)
    message = OutgoingMessage(chat_id="1", text="", attachments=(
        Attachment(filename="chart-1.png", mime_type="image/png", path=chart, kind="image"),))
    sent = await outbox._files_here(message)
    assert sent.attachments[0].path == tmp_path / "b" / "artifacts" / "run9" / "chart-1.png"
    assert sent.attachments[0].path.read_bytes() == b"\x89PNG chart"
