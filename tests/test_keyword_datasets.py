"""Datasets named like SQL keywords (`semi.csv`, `anti.csv`, `asof.csv`, `positional.csv`):
accepted under their own name, queried with the name double-quoted by every path (the
tools, /sql, /describe), told how to quote it when a query forgets; and no error a model or
user reads ever carries a server path."""

from __future__ import annotations

from pathlib import Path

import pytest

from pluto.runtime.data import DataError, DataService, QueryError, run_query, sql_name
from pluto.runtime.data.chart import ChartError, draw, plan
from pluto.runtime.data_tools import DATA_TOOLS
from pluto.runtime.tools import ToolContext, ToolResult
from tests.test_data_commands import ask, gw, notices, p, until, upload  # noqa: F401

KEYWORDS = ("semi", "anti", "asof", "positional")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> DataService:
    service = DataService(tmp_path_factory.mktemp("data"), demo=False)
    files = tmp_path_factory.mktemp("files")
    for word in KEYWORDS:
        source = files / f"{word}.csv"
        source.write_text("region,amount\nNorth,12.5\nSouth,3.25\nNorth,1\n")
        assert service.warehouse().ingest(source).name == word  # named from the file
    return service


def context(service: DataService) -> ToolContext:
    return ToolContext("run1", "s1", "chat-a", "default", service.data_dir,
                       {"data": service}, "*")


async def call(service: DataService, tool: str, **arguments: object) -> ToolResult:
    return await DATA_TOOLS[tool](context(service), arguments)


def test_keywords_are_quoted_and_plain_names_are_not() -> None:
    assert [sql_name(w) for w in KEYWORDS] == [f'"{w}"' for w in KEYWORDS]
    assert sql_name("sales") == "sales"
    assert sql_name("select_data") == "select_data"


@pytest.mark.parametrize("word", KEYWORDS)
async def test_run_sql_and_make_chart_answer_over_a_keyword_dataset(service: DataService,
                                                                    word: str) -> None:
    sql = f'SELECT region, sum(amount) AS total FROM "{word}" GROUP BY 1 ORDER BY 1'
    result = await call(service, "run_sql", sql=sql)
    assert not result.is_error, result.content
    assert result.details["table"]["rows"] == [["North", "13.50"], ["South", "3.25"]]
    chart = await call(service, "make_chart", sql=sql, kind="bar")
    assert not chart.is_error, chart.content
    assert Path(chart.details["image"]).read_bytes()[:4] == b"\x89PNG"


async def test_every_tool_tells_the_model_to_quote_it(service: DataService) -> None:
    listed = await call(service, "list_datasets")
    assert '- semi: 3 rows; columns' not in listed.content
    assert 'semi (an SQL keyword: write it "semi" in queries)' in listed.content
    described = await call(service, "describe_dataset", name="semi")
    assert not described.is_error, described.content
    assert 'Query it as the table "semi".' in described.content
    assert "North" in described.content  # the sample rows came back


@pytest.mark.parametrize("tool", ["run_sql", "make_chart"])
async def test_an_unquoted_keyword_is_explained_without_a_server_path(
        service: DataService, tool: str) -> None:
    extra = {"kind": "bar"} if tool == "make_chart" else {}
    result = await call(service, tool, sql="SELECT region, amount FROM semi", **extra)
    assert result.is_error
    assert 'semi is an SQL keyword: write the table name in double quotes, e.g. ' \
           'SELECT * FROM "semi".' in result.content
    assert str(service.data_dir) not in result.content and ".duckdb" not in result.content


async def test_a_broken_dataset_file_is_named_not_located(tmp_path: Path) -> None:
    service = DataService(tmp_path / "data", demo=False)
    source = tmp_path / "positional.csv"
    source.write_text("a\n1\n")
    info = service.warehouse().ingest(source)
    info.path.write_bytes(b"not a database" * 100)
    with pytest.raises(QueryError) as raised:
        await run_query('SELECT * FROM "positional"', [info])
    assert str(tmp_path) not in str(raised.value) and "positional" in str(raised.value)
    chart = await call(service, "make_chart", sql='SELECT * FROM "positional"', kind="bar")
    assert chart.is_error and str(tmp_path) not in chart.content


async def test_a_chart_that_cannot_be_saved_says_so_without_the_path(service: DataService,
                                                                     tmp_path: Path) -> None:
    result = await run_query('SELECT region, amount FROM "asof"', service.warehouse().list())
    gone = tmp_path / "no such folder" / "chart.png"
    with pytest.raises(ChartError) as raised:
        draw(result, plan(result, "bar"), gone)
    assert isinstance(raised.value, DataError)
    assert "could not be saved" in str(raised.value) and str(tmp_path) not in str(raised.value)


async def test_a_keyword_file_sent_in_a_chat_answers_sql_and_describe(
        gw, p, tmp_path: Path) -> None:  # noqa: F811 - fixtures
    csv = "region,amount\nNorth,12.50\nSouth,3.25\n"
    await p.say("", attachments=(upload(tmp_path, "semi.csv", csv),))
    assert await until(lambda: notices(p) or None) == [
        "Added dataset `semi`: 2 rows × 2 columns. Ask me about it, or try `/describe semi`."]
    listed = await ask(p, "/datasets")
    assert "`semi`" in listed
    assert (await ask(p, '/sql SELECT sum(amount) AS s FROM "semi"')).splitlines()[2] == \
        "| 15.75 |"
    unquoted = await ask(p, "/sql SELECT * FROM semi")
    assert 'write the table name in double quotes, e.g. SELECT * FROM "semi"' in unquoted
    assert str(tmp_path) not in unquoted
    assert (await ask(p, "/describe semi")).startswith("**semi**: 2 rows × 2 columns")
