"""The data tools: a scripted agent conversation through litellm against the fake OpenAI
server (list, describe, a failing query the model corrects, a query, a chart delivered as an
image), then each tool on its own: results, caps, artifacts, errors and scope."""

from __future__ import annotations

import asyncio
import csv
import json
import struct
from pathlib import Path

import pytest

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.types import MARKDOWN, Capabilities, ToolEnd
from pluto.runtime.data import DataService
from pluto.runtime.data_tools import DATA_TOOLS
from pluto.runtime.tools import ToolContext, ToolResult
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.helpers.gateway import RecordingProvider, write_agent

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


# ---- a conversation through litellm ---------------------------------------------------


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key="sk-data") as server:
        yield server


@pytest.fixture
async def chat(fake: FakeOpenAI, config_dir: Path, data_dir: Path,
               monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PLUTO_API_KEY", "sk-data")
    cfg = PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": fake.base_url, "api_key_env": "PLUTO_API_KEY",
        "retries": 0, "timeout": 10}})
    async with Gateway(config_dir, config=cfg) as gw:
        provider = RecordingProvider(capabilities=Capabilities(
            max_message_length=4000, markup=MARKDOWN, can_send_images=True))
        gw.add_provider(provider)
        await provider.running.wait()
        yield gw, provider


async def sent_with_attachments(p: RecordingProvider) -> list:
    """The messages with files, once there are some (they follow the text)."""
    async def until() -> list:
        while not (found := [m for m in p.sent if m.attachments]):
            await asyncio.sleep(0.01)
        return found
    return await asyncio.wait_for(until(), 10)


def tool_reply(request: dict) -> str:
    """What the tool said, as the model reads it in its next request."""
    message = request["messages"][-1]
    assert message["role"] == "tool"
    return message["content"]


async def test_an_agent_lists_describes_queries_corrects_itself_and_charts(chat, fake,
                                                                          data_dir):
    gw, p = chat
    good = "SELECT region, sum(amount) AS total FROM sales GROUP BY region ORDER BY region"
    fake.script(
        Reply(tool_calls=[ToolCall("list_datasets", {})]),
        Reply(tool_calls=[ToolCall("describe_dataset", {"name": "sales"})]),
        Reply(tool_calls=[ToolCall("run_sql", {"sql": good.replace("region,", "regoin,", 1)})]),
        Reply(tool_calls=[ToolCall("run_sql", {"sql": good})]),
        Reply(tool_calls=[ToolCall("make_chart", {"sql": good, "kind": "bar", "x": "region",
                                                  "y": ["total"], "title": "Sales by region"})]),
        Reply(text="North sold the most: 137,164.29."),
    )
    await p.say("Which region sold the most?")
    assert await p.wait_finals(1, timeout=30) == ["North sold the most: 137,164.29."]
    requests = fake.requests
    assert len(requests) == 6
    assert {"list_datasets", "run_sql", "make_chart"} <= {
        t["function"]["name"] for t in requests[0]["tools"]}
    assert "sales: 2,000 rows; columns: date DATE, region VARCHAR" in tool_reply(requests[1])
    described = tool_reply(requests[2])
    assert "Dataset sales: 2,000 rows, 6 columns" in described
    assert "region | VARCHAR | East | West | 4" in described and "Sample rows:" in described
    failed = tool_reply(requests[3])
    assert failed.startswith("The query failed: Binder Error") and '"regoin"' in failed
    assert "Traceback" not in failed
    table = tool_reply(requests[4])
    assert table.splitlines()[:2] == ["region | total", "East | 131597.06"]
    assert table.endswith("(4 rows)")
    assert tool_reply(requests[5]).startswith("Drew a bar chart of total by region (4 bars).")

    [image] = await sent_with_attachments(p)
    attachment = image.attachments[0]
    assert attachment.kind == "image" and attachment.filename.endswith(".png")
    assert png_size(attachment.path) == (900, 500)
    assert attachment.path.stat().st_size > 5_000
    run_dir = attachment.path.parent
    assert run_dir.parent == data_dir / "artifacts"
    [result_csv] = run_dir.glob("result-*.csv")
    assert list(csv.reader(result_csv.open()))[:2] == [["region", "total"],
                                                       ["East", "131597.06"]]

    events = [e for e in await gw.store.conversations.events(run_dir.name)
              if isinstance(e, ToolEnd)]
    assert [(e.name, e.is_error) for e in events] == [
        ("list_datasets", False), ("describe_dataset", False), ("run_sql", True),
        ("run_sql", False), ("make_chart", False)]
    details = events[3].details
    assert details["table"] == {"columns": ["region", "total"], "truncated": False, "rows": [
        ["East", "131597.06"], ["North", "137164.29"], ["South", "133398.98"],
        ["West", "131444.50"]], "numeric": [False, True], "total_rows": 4}
    assert details["csv"] == str(result_csv)
    assert events[4].details == {"image": str(attachment.path), "title": "Sales by region"}


async def test_a_refused_query_goes_back_to_the_model_and_writes_nothing(chat, fake, data_dir):
    gw, p = chat
    fake.script(Reply(tool_calls=[ToolCall("run_sql", {"sql": "COPY sales TO '/tmp/x.csv'"})]),
                Reply(text="I may only read."))
    await p.say("export the sales")
    assert await p.wait_finals(1, timeout=30) == ["I may only read."]
    said = tool_reply(fake.requests[1])
    assert said == "The query was refused: Only a single read-only SELECT is allowed; got COPY."
    assert not (data_dir / "artifacts").exists() or not any((data_dir / "artifacts").iterdir())


# ---- each tool ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> DataService:
    service = DataService(tmp_path_factory.mktemp("data"))
    warehouse = service.warehouse()  # the demo dataset
    source = tmp_path_factory.mktemp("files") / "wide.csv"
    source.write_text("n,label\n" + "".join(f"{i},row {i} {'x' * 40}\n" for i in range(500)))
    warehouse.ingest(source, "wide")
    warehouse.ingest(source, "mine", owner="chat-a")
    return service


def context(service: DataService, datasets: tuple[str, ...] | str = "*",
            session_key: str = "chat-a") -> ToolContext:
    return ToolContext("run1", "s1", session_key, "default", service.data_dir,
                       {"data": service}, datasets)


async def call(tool: str, ctx: ToolContext, **arguments: object) -> ToolResult:
    return await DATA_TOOLS[tool](ctx, arguments)


async def test_list_datasets_shows_the_scope(service: DataService) -> None:
    everything = await call("list_datasets", context(service))
    assert [d["name"] for d in everything.details["datasets"]] == ["mine", "sales", "wide"]
    assert "- mine (sent in this chat): 500 rows" in everything.content
    narrow = await call("list_datasets", context(service, ("wide",), "chat-b"))
    assert [d["name"] for d in narrow.details["datasets"]] == ["wide"]
    nothing = await call("list_datasets", context(service, (), "chat-b"))
    assert nothing.content.startswith("No datasets are available.") and not nothing.is_error


async def test_describe_an_unknown_or_hidden_dataset_is_an_error(service: DataService) -> None:
    hidden = await call("describe_dataset", context(service, (), "chat-b"), name="sales")
    assert hidden.is_error and hidden.content == ("There is no dataset named 'sales'. "
                                                  "Available: none.")
    described = await call("describe_dataset", context(service), name=" wide ")
    assert not described.is_error and described.details["rows"] == 500
    assert described.details["table"]["rows"][0][:4] == ["n", "BIGINT", "0", "499"]


async def test_run_sql_caps_what_the_model_reads_and_keeps_the_rest(
        service: DataService) -> None:
    result = await call("run_sql", context(service), sql="SELECT * FROM wide ORDER BY n")
    assert not result.is_error and len(result.content.encode()) <= 4000
    assert result.content.endswith(" of 500 rows; aggregate or add LIMIT to see the rest)")
    table = result.details["table"]
    assert len(table["rows"]) == 50 and table["truncated"] is True
    assert table["rows"][0] == ["0", f"row 0 {'x' * 40}"]
    assert len(Path(result.details["csv"]).read_text().splitlines()) == 501


@pytest.mark.parametrize(("sql", "says"), [
    ("SELECT * FROM read_csv('/etc/passwd')", "The query was refused: Function read_csv()"),
    ("SELECT 1; SELECT 2", "The query was refused: Only a single read-only SELECT"),
    ("SELECT * FROM mine", "The query failed: Catalog Error: Table with name mine does not"),
    ("SELEC 1", "The query failed: Parser Error: syntax error"),
])
async def test_run_sql_errors_are_for_the_model(service: DataService, sql: str,
                                                says: str) -> None:
    result = await call("run_sql", context(service, "*", "chat-b"), sql=sql)
    assert result.is_error and result.content.startswith(says), result.content


@pytest.mark.parametrize(("kind", "sql", "extra"), [
    ("line", "SELECT date_trunc('month', date) AS month, region, sum(amount) AS total "
             "FROM sales GROUP BY ALL ORDER BY 1", {"group": "region"}),
    ("scatter", "SELECT units, amount FROM sales", {}),
    ("histogram", "SELECT amount FROM sales", {}),
    ("pie", "SELECT product, sum(units) AS units FROM sales GROUP BY 1", {"title": "Cost $5"}),
    ("bar", "SELECT product, sum(units) AS u, sum(amount) AS a FROM sales GROUP BY 1",
     {"x": None, "y": None}),  # null for optional arguments: their defaults
])
async def test_every_chart_kind_makes_a_png(service: DataService, kind: str, sql: str,
                                            extra: dict) -> None:
    result = await call("make_chart", context(service), sql=sql, kind=kind, **extra)
    assert not result.is_error, result.content
    path = Path(result.details["image"])
    assert png_size(path) == (900, 500) and path.stat().st_size > 5_000
    assert path.parent == service.data_dir / "artifacts" / "run1"
    assert result.content.startswith(f"Drew a {kind}")


@pytest.mark.parametrize(("arguments", "says"), [
    ({"sql": "SELECT region, sum(amount) FROM sales GROUP BY 1", "kind": "bar", "x": "zone"},
     "There is no column 'zone' in the result; its columns are: region, sum(amount)."),
    ({"sql": "SELECT region, product FROM sales", "kind": "line"},
     "There is no numeric column to plot against region"),
    ({"sql": "SELECT n, label FROM wide", "kind": "bar"}, "That makes 500 bars; at most 60"),
    ({"sql": "SELECT region FROM sales", "kind": "histogram"}, "A histogram needs a numeric"),
    ({"sql": "SELECT 1 AS x WHERE false", "kind": "bar"}, "The query returned no rows"),
    ({"sql": "SELECT region, -sum(amount) FROM sales GROUP BY 1", "kind": "pie"},
     "A pie chart needs positive values."),
    ({"sql": "SELECT 1", "kind": "donut"}, "Invalid arguments for make_chart: kind must be"),
])
async def test_a_chart_that_cannot_be_drawn_says_what_to_change(service: DataService,
                                                                arguments: dict,
                                                                says: str) -> None:
    result = await DATA_TOOLS["make_chart"](context(service), arguments)
    assert result.is_error and says in result.content, result.content


async def test_without_the_data_service_the_tools_say_so(tmp_path: Path) -> None:
    ctx = ToolContext("r", "s", "k", "a", tmp_path)
    with pytest.raises(Exception, match="data tools are not available"):
        await DATA_TOOLS["list_datasets"](ctx, {})


def test_tool_results_are_json_for_the_event_store(service: DataService) -> None:
    schemas = [t.schema() for t in DATA_TOOLS.values()]
    assert json.loads(json.dumps(schemas))[3]["function"]["parameters"]["properties"]["kind"] == {
        "enum": ["bar", "line", "scatter", "histogram", "pie"],
        "description": "bar, line, scatter, histogram (of one numeric column) or pie."}


async def test_an_agent_without_datasets_sees_only_its_chat_s_files(config_dir: Path,
                                                                    data_dir: Path) -> None:
    """ToolContext.datasets comes from agent.yaml through the runner."""
    from pluto.runtime.testing import Scripted, ScriptedModel
    from pluto.runtime.model import ToolCall as Call

    write_agent(config_dir, "narrow", "tools: [run_sql]\ndatasets: [nothing_here]\n")
    (config_dir / "routes.yaml").write_text("default: narrow\n")
    model = ScriptedModel(Scripted(tool_calls=[Call("c1", "run_sql",
                                                    '{"sql": "SELECT count(*) FROM sales"}')]),
                          Scripted(text="done"))
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=model) as gw:
        p = RecordingProvider()
        gw.add_provider(p)
        await p.say("count the sales")
        assert await p.wait_finals(1, timeout=30) == ["done"]
    said = model.calls[1][-1]["content"]
    assert said.startswith("The query failed: Catalog Error: Table with name sales does not")


# ---- issue 18: the gate, introspection, CSV downloads, retention --------------------------


@pytest.mark.parametrize("sql", [
    "SELECT * FROM duckdb_databases()", "SELECT path FROM duckdb_databases",
    "SELECT * FROM duckdb_settings()", "SELECT current_setting('allowed_paths')",
    "SELECT * FROM pragma_database_list", "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM (SELECT * FROM \"duckdb_databases\"())",
])
async def test_introspection_that_shows_server_paths_is_refused(service: DataService,
                                                                sql: str) -> None:
    result = await call("run_sql", context(service), sql=sql)
    assert result.is_error and result.content.startswith("The query was refused: ")
    assert "is not available here: it describes the server" in result.content
    assert str(service.data_dir) not in result.content


async def test_a_20k_character_query_never_stalls_the_loop(service: DataService,
                                                            monkeypatch) -> None:
    """The gate's fallback scan was quadratic (3.5–9 s of the GIL for 20,000 characters, in
    the gateway's process). Now it is linear and runs only in the query's child: nothing of it
    runs here, and a probe on the loop keeps ticking (the bound is loose: the machine is
    shared; the old stall was seconds)."""
    from pluto.runtime.data import child
    from pluto.runtime.data.child import MAX_SQL_CHARS, _words

    def not_here(*args: object) -> None:
        raise AssertionError("the SQL gate ran in the gateway's process")

    monkeypatch.setattr(child, "check_sql", not_here)
    monkeypatch.setattr(child, "referenced_names", not_here)

    hostile = ["SELECT " + "a" * (MAX_SQL_CHARS - 8),  # one long word, no '('
               "SELECT " + "a " * ((MAX_SQL_CHARS - 8) // 2),
               "SELECT " + "(" * 3000 + "1" + ")" * 3000 + " x" * 6000]
    loop = asyncio.get_running_loop()
    ticks: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            before = loop.time()
            await asyncio.sleep(0.005)
            ticks.append(loop.time() - before)

    watcher = asyncio.create_task(probe())
    for sql in hostile:
        assert len(sql) <= MAX_SQL_CHARS
        result = await call("run_sql", context(service), sql=sql)
        assert result.is_error and "Traceback" not in result.content
    done.set()
    await watcher
    assert ticks and max(ticks) < 0.5, f"the loop stalled for {max(ticks):.3f} s"
    monkeypatch.undo()
    calls, words = _words("SELECT f (x), g\n(y), h FROM t")
    assert calls == {"f", "g"} and words == {"select", "f", "x", "g", "y", "h", "from", "t"}


async def test_csv_downloads_neutralize_formula_cells(service: DataService) -> None:
    sql = ("SELECT * FROM (VALUES ('=HYPERLINK(\"http://x\",\"y\")', -4, '-4'), "
           "('=cmd|'' /C calc''!A0', 1, '+1.5'), ('@SUM(A1)', 2, '-2+3'), ('plain', 3, 'ok')) "
           "AS t(\"=label\", n, s)")
    result = await call("run_sql", context(service), sql=sql)
    assert not result.is_error, result.content
    rows = list(csv.reader(Path(result.details["csv"]).open()))
    assert rows == [["'=label", "n", "s"],
                    ["'=HYPERLINK(\"http://x\",\"y\")", "-4", "-4"],
                    ["'=cmd|' /C calc'!A0", "1", "+1.5"],
                    ["'@SUM(A1)", "2", "'-2+3"],
                    ["plain", "3", "ok"]]
    assert result.details["table"]["rows"][0][0] == '=HYPERLINK("http://x","y")'  # shown as is


def test_retention_deletes_old_files_then_the_oldest_over_the_size_limit(
        tmp_path: Path) -> None:
    import os
    import time

    from pluto.runtime.data.service import Retention

    service = DataService(tmp_path, demo=False,
                          retention=Retention(max_age_days=7, max_total_bytes=2500))
    now = time.time()
    made = {}
    for name, age_days in (("uploads/tg/1/old.csv", 8), ("artifacts/r1/a.csv", 3),
                           ("artifacts/r2/b.png", 2), ("uploads/web/c.csv", 1),
                           ("artifacts/r3/d.csv", 0)):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
        os.utime(path, (now - age_days * 86400, now - age_days * 86400))
        made[name] = path
    assert service.sweep(now) == 3  # the old one, then the two oldest of the rest
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["artifacts/r3/d.csv", "uploads/web/c.csv"]
    assert (tmp_path / "artifacts/r1").exists()  # just emptied: a run may be about to write
    os.utime(tmp_path / "uploads/tg/1", (now - 2 * 3600,) * 2)
    assert service.sweep(now) == 0
    assert not (tmp_path / "uploads/tg/1").exists()  # empty and settled: removed
    (tmp_path / "datasets").mkdir()
    for name in (".ingest-abc.duckdb", ".ingest-abc.tmp", ".ingest-new.duckdb", "kept.duckdb"):
        (tmp_path / "datasets" / name).write_bytes(b"x")
        if name != ".ingest-new.duckdb":
            os.utime(tmp_path / "datasets" / name, (now - 2 * 86400,) * 2)
    assert service.sweep(now) == 2  # what a killed load left a day ago; not a load running
    assert sorted(p.name for p in (tmp_path / "datasets").iterdir()) == [
        ".ingest-new.duckdb", "kept.duckdb"]


async def test_a_refused_upload_is_deleted_at_once(tmp_path: Path) -> None:
    from pluto.runtime.data import DataError

    service = DataService(tmp_path, demo=False)
    sent = tmp_path / "uploads" / "web" / "chat1" / "broken.csv"
    sent.parent.mkdir(parents=True)
    sent.write_text("a,b\n1,2\n3\n")
    with pytest.raises(DataError, match="line 3 has 1 fields"):
        await service.add_upload(sent, "broken.csv", "text/csv", "web:chat1")
    assert not sent.exists()
    elsewhere = tmp_path / "mine.xlsx"  # not an upload: never deleted
    elsewhere.write_bytes(b"PK")
    with pytest.raises(DataError):
        await service.add_upload(elsewhere, "mine.xlsx", "application/octet-stream", "x")
    assert elsewhere.exists()


async def test_a_long_result_says_its_total_for_people(service: DataService) -> None:
    result = await call("run_sql", context(service), sql="SELECT * FROM range(336776) t(n)")
    table = result.details["table"]
    assert len(table["rows"]) == 50 and table["total_rows"] == 336_776
    assert result.details["row_count"] == 336_776
    assert len(Path(result.details["csv"]).read_text().splitlines()) == 336_777
