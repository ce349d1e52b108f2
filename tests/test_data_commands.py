"""/sql, /datasets and /describe in any chat with no model, and files sent in a chat: each
becomes a dataset of that conversation only, a broken one is refused in one sentence."""

from __future__ import annotations

import asyncio
import re
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from pluto.gateway.app import Gateway
from pluto.settings import PlutoConfig
from pluto.gateway.delivery.render import render
from pluto.providers.telegram.markup import TELEGRAM_HTML
from pluto.types import MARKDOWN, PLAIN, Attachment, Capabilities
from pluto.runtime.data import markdown_table
from pluto.runtime.testing import ScriptedModel
from tests.helpers.gateway import RecordingProvider, write_agent

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
BY_REGION = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 1"


@pytest.fixture
async def gw(config_dir: Path, data_dir: Path):
    model = ScriptedModel()
    cfg = PlutoConfig(data_dir=data_dir, data={"max_upload_mb": 0.01})
    async with Gateway(config_dir, config=cfg, model_factory=model) as gateway:
        gateway.model = model  # type: ignore[attr-defined]
        yield gateway


@pytest.fixture
async def p(gw: Gateway) -> RecordingProvider:
    provider = RecordingProvider(capabilities=Capabilities(max_message_length=4000,
                                                           markup=MARKDOWN))
    gw.add_provider(provider)
    await provider.running.wait()
    return provider


async def until(check: Callable[[], T | None], timeout: float = 30) -> T:
    """Wait for ``check`` to return something (the gateway answers on its own tasks)."""
    async def poll() -> T:
        while (found := check()) is None:
            await asyncio.sleep(0.01)
        return found
    return await asyncio.wait_for(poll(), timeout)


async def ask(p: RecordingProvider, text: str, chat: str = "c1", **kw: object) -> str:
    """The reply (or error) to one message."""
    before = len(p.sent)
    await p.say(text, chat=chat, **kw)
    return await until(lambda: next((m.text for m in p.sent[before:]
                                     if m.kind in ("reply", "error")), None))


def upload(tmp_path: Path, name: str, content: str | bytes, mime: str = "text/csv") -> Attachment:
    path = tmp_path / "inbox" / f"file-{len(name)}-{abs(hash(name))}"  # providers' own names
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return Attachment(filename=name, mime_type=mime, size=path.stat().st_size, path=path)


def notices(p: RecordingProvider) -> list[str]:
    return [m.text for m in p.sent if m.kind == "notice"]


# ---- commands -------------------------------------------------------------------------


async def test_datasets_describe_and_sql_need_no_model(gw: Gateway, p: RecordingProvider):
    listed = await ask(p, "/datasets")
    assert "- `sales` — 2,000 rows × 6 columns" in listed and "/describe sales" in listed
    described = await ask(p, "/describe sales")
    assert described.startswith("**sales**: 2,000 rows × 6 columns")
    assert "| region   | VARCHAR       | East       | West       |         4 |" in described
    table = await ask(p, f"/sql {BY_REGION}")
    assert table.splitlines()[:3] == ["| region |     total |", "| ------ | --------: |",
                                      "| East   | 131597.06 |"]
    assert table.endswith("(4 rows)")
    fenced = await ask(p, f"/sql@pluto_bot ```sql\n{BY_REGION}\n```")
    assert fenced == table
    assert gw.model.calls == []  # type: ignore[attr-defined]


async def test_long_results_show_the_first_rows_and_say_how_many(p: RecordingProvider):
    table = await ask(p, "/sql SELECT * FROM sales")
    assert len(table.splitlines()) == 2 + 25 + 2
    assert re.search(r"\(showing 25 of 2,000 rows; all of them are in "
                     r"artifacts/sql-\w+/result-\w+\.csv in the data dir\)$", table), table
    wide = await ask(p, "/sql SELECT avg(amount) AS mean, 1/3 AS third FROM sales")
    assert "| 266.8 | 0.3333 |" in wide  # rounded for people; the CSV keeps every digit
    empty = await ask(p, "/sql SELECT * FROM sales WHERE false")
    assert empty.endswith("(no rows)")


@pytest.mark.parametrize(("command", "reply"), [
    ("/sql", "Send a query after /sql, e.g. `/sql SELECT region, sum(amount) FROM sales "
             "GROUP BY 1`. `/datasets` lists the tables."),
    ("/sql SELEC 1", 'The query failed: Parser Error: syntax error at or near "SELEC"'),
    ("/sql SELECT * FROM salez", 'The query failed: Catalog Error: Table with name salez does '
                                 'not exist! Did you mean "sales"?'),
    ("/sql DROP TABLE sales", "The query was refused: Only a single read-only SELECT is "
                              "allowed; got DROP."),
    ("/sql SELECT * FROM read_text('/etc/passwd')", "The query was refused: Function "
     "read_text() is not allowed: the sandbox cannot read files, run dynamic SQL or change "
     "state. Query the datasets by their table names, e.g. SELECT * FROM sales LIMIT 5."),
    ("/describe", "Which dataset? Send `/describe NAME`; `/datasets` lists them."),
    ("/describe nope", "There is no dataset named 'nope'. Available: sales."),
])
async def test_bad_commands_get_one_plain_answer(p: RecordingProvider, command: str,
                                                 reply: str):
    assert await ask(p, command) == reply


def test_values_never_turn_into_markup() -> None:
    table = markdown_table(["a_b", "x"], [["2*3*4", "__init__"], ["a|b", "[l](u) `c` ~s~"]])
    for dialect in (PLAIN, TELEGRAM_HTML):
        text = render(table, dialect)
        for value in ("a_b", "2*3*4", "__init__", "a|b", "[l](u) `c` ~s~"):
            assert value in text, (dialect, value, text)
    assert "snake_case" in markdown_table(["snake_case"], [])  # readable in a terminal


async def test_help_lists_the_data_commands(p: RecordingProvider):
    helped = await ask(p, "/help")
    assert "`/sql` — run a read-only SQL query" in helped and "`/datasets`" in helped


# ---- files sent in a chat -------------------------------------------------------------


async def test_a_file_with_a_question_becomes_a_dataset_the_agent_is_told_of(
        gw: Gateway, p: RecordingProvider, tmp_path: Path):
    csv = "region,amount,day\nNorth,12.50,2024-01-02\nSouth,3.25,2024-02-03\n"
    answer = await ask(p, "which region sold most?",
                       attachments=(upload(tmp_path, "Q3 Sales.csv", csv),))
    assert notices(p) == ["Added dataset `q3_sales`: 2 rows × 3 columns."]
    told = gw.model.calls[-1][-1]["content"]  # type: ignore[attr-defined]
    assert answer == f"echo: {told}"
    assert told.startswith("which region sold most?\n\n[The user sent the file Q3 Sales.csv; "
                           "it is now the dataset q3_sales (2 rows × 3 columns: region VARCHAR, "
                           "amount DECIMAL(18,2), day DATE). Query it as the table q3_sales.]")
    assert (await ask(p, "/sql SELECT sum(amount) AS s FROM q3_sales")).splitlines()[2] == \
        "| 15.75 |"


async def test_a_file_alone_is_added_and_the_next_question_knows_of_it(
        gw: Gateway, p: RecordingProvider, tmp_path: Path):
    await p.say("", attachments=(upload(tmp_path, "prices.json", '[{"item": "a", "p": 1}]',
                                        "application/json"),))
    assert await until(lambda: notices(p) or None) == [
        "Added dataset `prices`: 1 row × 2 columns. Ask me about it, or try `/describe prices`."]
    assert gw.model.calls == []  # type: ignore[attr-defined]
    await ask(p, "what costs most?")
    history = [m["content"] for m in gw.model.calls[-1]]  # type: ignore[attr-defined]
    assert history[-2].startswith("[The user sent the file prices.json; it is now the dataset "
                                  "prices (1 row × 2 columns: item VARCHAR, p BIGINT).")
    assert history[-1] == "what costs most?"


@pytest.mark.parametrize(("filename", "content", "says"), [
    ("ragged.csv", "a,b\n1,2\n3\n", "Could not read ragged.csv: line 3 has 1 fields but the "
                                    "first line has 2. Give every row the same fields and "
                                    "send it again."),
    ("big.csv", "a\n" + "1\n" * 6000, "big.csv is 12 KB; files sent in a chat may be at most "
                                      "10 KB."),
    ("book.xlsx", b"PK\x03\x04", "book.xlsx is not a supported file type (.xlsx). Send CSV, "
                                 "TSV, Parquet, JSON or NDJSON."),
    ("empty.csv", "", "empty.csv is empty."),
])
async def test_a_broken_file_is_one_sentence_and_leaves_nothing(
        gw: Gateway, p: RecordingProvider, tmp_path: Path, filename: str,
        content: str | bytes, says: str):
    await ask(p, "/datasets")  # the warehouse exists
    root = gw.data_dir / "datasets"
    before = sorted(os.listdir(root))
    reply = await ask(p, "what is in it?", attachments=(upload(tmp_path, filename, content),))
    assert reply == says
    assert [m.kind for m in p.sent if m.text == says] == ["error"]
    assert sorted(os.listdir(root)) == before
    assert gw.model.calls == []  # type: ignore[attr-defined]


async def test_other_attachments_are_left_to_the_agent(gw: Gateway, p: RecordingProvider,
                                                       tmp_path: Path):
    report = upload(tmp_path, "cat.pdf", b"%PDF-1.4", "application/pdf")  # (pictures:
    assert await ask(p, "nice cat?", attachments=(report,)) == "echo: nice cat?"  # test_images)
    assert notices(p) == []


async def test_an_upload_is_seen_by_its_chat_only(gw: Gateway, p: RecordingProvider,
                                                  tmp_path: Path):
    await ask(p, "here", chat="alice", attachments=(upload(tmp_path, "mine.csv", "x\n1\n"),))
    assert "`mine`" in await ask(p, "/datasets", chat="alice")
    assert "`mine`" not in await ask(p, "/datasets", chat="bob")
    assert "does not exist" in await ask(p, "/sql SELECT * FROM mine", chat="bob")
    assert await ask(p, "/describe mine", chat="bob") == ("There is no dataset named 'mine'. "
                                                          "Available: sales.")
    await ask(p, "/new", chat="alice")  # a fresh conversation in the same chat keeps its files
    assert (await ask(p, "/sql SELECT x FROM mine", chat="alice")).splitlines()[2] == "|   1 |"
    await ask(p, "again", chat="alice", attachments=(upload(tmp_path, "mine.csv",
                                                            "x\n1\n2\n"),))
    assert notices(p)[-1] == "Added dataset `mine`: 2 rows × 1 column."  # replaced


async def test_an_agent_without_global_datasets_still_sees_its_chat_s_files(
        config_dir: Path, data_dir: Path, tmp_path: Path):
    write_agent(config_dir, "private", "description: no shared data\n")
    (config_dir / "routes.yaml").write_text("default: private\n")
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=ScriptedModel()) as gw:
        p = RecordingProvider(capabilities=Capabilities(max_message_length=4000,
                                                        markup=MARKDOWN))
        gw.add_provider(p)
        await p.running.wait()
        assert (await ask(p, "/datasets")).startswith("No datasets here yet.")
        await ask(p, "hi", attachments=(upload(tmp_path, "own.csv", "a\n1\n"),))
        assert "`own`" in await ask(p, "/datasets")


# ---- the terminal ---------------------------------------------------------------------


def pluto(*args: str, data_dir: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("pluto")
    cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env["PLUTO_DATA_DIR"] = str(data_dir)
    return subprocess.run([*cmd, *args, "--config", str(ROOT / "config")], input=stdin,
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_pluto_run_answers_sql_and_stays_lazy(data_dir: Path) -> None:
    hello = pluto("run", "hello", data_dir=data_dir)
    assert hello.returncode == 0 and "/sql SELECT region" in hello.stdout
    assert not (data_dir / "datasets").exists()  # no data work for a plain message
    out = pluto("run", f"/sql {BY_REGION}", data_dir=data_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == ["| region |     total |", "| ------ | --------: |",
                                           "| East   | 131597.06 |"]
    bad = pluto("run", "/sql COPY sales TO '/tmp/out.csv'", data_dir=data_dir)
    assert bad.returncode == 1  # a failed command fails the script
    assert bad.stderr.strip() == ("! The query was refused: Only a single read-only SELECT is "
                                  "allowed; got COPY.")
    assert "Traceback" not in bad.stdout + bad.stderr


def test_pluto_chat_lists_describes_and_queries(data_dir: Path) -> None:
    out = pluto("chat", data_dir=data_dir,
                stdin="/datasets\n/describe sales\n/sql SELECT count(*) AS n FROM sales\n")
    assert out.returncode == 0, out.stderr
    assert "- `sales` — 2,000 rows × 6 columns" in out.stdout
    assert "**sales**: 2,000 rows × 6 columns" in out.stdout
    assert "| 2000 |" in out.stdout and "Traceback" not in out.stderr
