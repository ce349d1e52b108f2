"""The SQL sandbox: results, limits, scoping, and the escape corpus (each attempt is refused
or stopped, and nothing is written anywhere)."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import pickle
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from pluto.runtime.data import (
    DataError,
    QueryError,
    QueryMemoryError,
    QueryRefused,
    QueryResult,
    QueryTimeout,
    Scope,
    Warehouse,
    check_sql,
    ensure_demo,
    format_table,
    run_query,
    write_csv,
)
from pluto.runtime.data import child, sandbox
from tests.helpers.served import wait_for

MARK = f"pluto_escape_{uuid.uuid4().hex[:8]}"  # in every path the corpus tries to write


@dataclass(frozen=True)
class Env:
    wh: Warehouse
    base: Path  # holds datasets/ and outside/
    outside: Path  # a directory next to the warehouse with a secret CSV


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    base = tmp_path_factory.mktemp("sandbox")
    wh = Warehouse(base / "datasets")
    ensure_demo(wh)
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("token\nTOP-SECRET-42\n")
    wh.ingest(outside / "secret.csv", "secret_global")
    wh.ingest(outside / "secret.csv", "b_upload", owner="session-b")
    (wh.root / "link").symlink_to("/etc")
    return Env(wh, base, outside)


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for root in roots for p in [root, *root.rglob("*")]}


def no_marked_files() -> list[str]:
    return [p for p in os.listdir("/tmp") if MARK in p]


# ---- results --------------------------------------------------------------------------


async def test_a_select_returns_typed_rows(env: Env) -> None:
    result = await env.wh.query("SELECT date, region, amount, returned FROM sales "
                                "ORDER BY date, region, product LIMIT 2")
    assert result.columns == ("date", "region", "amount", "returned")
    assert result.column_types == ("DATE", "VARCHAR", "DECIMAL(10,2)", "BOOLEAN")
    assert result.rows[0][0] == date(2023, 1, 1) and isinstance(result.rows[0][2], Decimal)
    assert (result.total_rows, result.truncated) == (2, False)
    assert 0 < result.elapsed < 5


@pytest.mark.parametrize("sql", [
    "WITH t AS (SELECT 1 AS x) SELECT * FROM t", "VALUES (1), (2)", "DESCRIBE sales",
    "SUMMARIZE sales", "SHOW TABLES", "FROM sales SELECT count(*)",
    "SELECT count(*) FROM sales.sales",
    "SELECT * FROM (PIVOT sales ON region IN ('North', 'South') USING sum(amount) "
    "GROUP BY product)",
    "SELECT * FROM duckdb_tables()"])
async def test_read_only_forms_pass(env: Env, sql: str) -> None:
    assert (await env.wh.query(sql)).columns


async def test_rows_are_capped(env: Env) -> None:
    result = await env.wh.query("SELECT * FROM sales", max_rows=10)
    assert (len(result.rows), result.truncated, result.total_rows) == (10, True, None)


async def test_csv_artifact_holds_the_full_result(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    result = await env.wh.query("SELECT * FROM sales ORDER BY ALL", max_rows=5, csv_path=path)
    assert (len(result.rows), result.total_rows, result.truncated) == (5, 2000, True)
    assert result.csv_path == path
    lines = list(csv.reader(path.open()))
    assert len(lines) == 2001 and lines[0] == list(result.columns)
    assert lines[1][0] == "2023-01-01" and lines[1][5] in ("true", "false")
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]
    capped = await env.wh.query("SELECT * FROM sales", csv_path=path, csv_max_rows=100)
    assert capped.total_rows is None and len(path.read_text().splitlines()) == 101
    write_csv(result, tmp_path / "rows.csv")
    assert len((tmp_path / "rows.csv").read_text().splitlines()) == 6


def test_format_table_stays_within_its_budget() -> None:
    rows = tuple((i, "a|b\nc" * 30, None) for i in range(500))
    result = QueryResult(("n", "text", "empty"), ("INTEGER", "VARCHAR", "VARCHAR"), rows, 500,
                         False, 0.1)
    text = format_table(result, max_bytes=1000)
    assert len(text.encode()) <= 1000 and text.startswith("n | text | empty\n0 | a\\|b\\nc")
    assert text.endswith("of 500 rows; aggregate or add LIMIT to see the rest)")
    small = QueryResult(("x",), ("INTEGER",), ((1,),), 1, False, 0.1)
    assert format_table(small) == "x\n1\n(1 row)"


# ---- the gate -------------------------------------------------------------------------


def test_parse_errors_are_query_errors_without_traceback() -> None:
    with pytest.raises(QueryError, match="syntax error at or near") as caught:
        check_sql("SELEC 1")
    assert "Traceback" not in str(caught.value) and not isinstance(caught.value, QueryRefused)


def test_too_long_and_empty_sql_are_refused() -> None:
    with pytest.raises(QueryRefused, match="longer than"):
        check_sql("SELECT 1" + " " * child.MAX_SQL_CHARS)
    with pytest.raises(QueryRefused, match="empty"):
        check_sql(" ; -- nothing")


def test_denied_functions_cover_their_aliases() -> None:
    with duckdb.connect() as con:
        rows = con.execute("SELECT DISTINCT function_name, alias_of FROM duckdb_functions() "
                           "WHERE alias_of IS NOT NULL").fetchall()
    denied = child.DENIED_FUNCTIONS
    missing = {name for name, alias in rows if alias in denied} - denied
    assert not missing


def test_denied_functions_are_found_when_quoted_or_nested() -> None:
    for sql in ['SELECT * FROM "READ_CSV"(\'x\')', "SELECT (SELECT 1 FROM system.main.glob('/*'))",
                "SELECT * FROM (PIVOT sales ON region USING sum(amount)) WHERE read_text('x')"]:
        with pytest.raises(QueryRefused):
            check_sql(sql)


def test_the_parent_reads_only_allowed_types() -> None:
    evil = pickle.dumps(("rows", [os.system]))
    with pytest.raises(pickle.UnpicklingError):
        sandbox._SafeUnpickler(io.BytesIO(evil)).load()


# ---- the escape corpus ----------------------------------------------------------------

OUT = f"/tmp/{MARK}"
CORPUS: list[tuple[str, type[DataError]]] = [
    ("SELECT * FROM read_csv('/etc/passwd')", QueryRefused),
    ("SELECT * FROM read_csv_auto('/etc/passwd')", QueryRefused),
    ("SELECT * FROM read_text('/etc/passwd')", QueryRefused),
    ("SELECT * FROM read_blob('/etc/passwd')", QueryRefused),
    ("SELECT * FROM glob('/etc/*')", QueryRefused),
    ("SELECT * FROM read_text('/proc/self/environ')", QueryRefused),
    ("SELECT * FROM read_csv('{outside}/secret.csv')", QueryRefused),
    ("SELECT * FROM '/etc/passwd'", QueryError),
    ("SELECT * FROM '{root}/../outside/secret.csv'", QueryError),
    ("SELECT * FROM '{root}/link/passwd'", QueryError),
    ("SELECT * FROM '{root}/b_upload.duckdb'", QueryError),
    ("SELECT * FROM '/proc/self/environ'", QueryError),
    ("SELECT * FROM query('SELECT 1')", QueryRefused),
    ("SELECT * FROM checkpoint()", QueryRefused),
    ("SELECT * FROM enable_logging(storage := 'file', storage_path := '{out}')", QueryRefused),
    ("COPY sales TO '{out}.csv'", QueryRefused),
    ("COPY sales FROM '{outside}/secret.csv'", QueryRefused),
    ("EXPORT DATABASE '{out}'", QueryRefused),
    ("ATTACH '{out}.db' AS x", QueryRefused),
    ("ATTACH '{root}/b_upload.duckdb' AS b (READ_ONLY)", QueryRefused),
    ("DETACH sales", QueryRefused),
    ("INSTALL httpfs", QueryRefused),
    ("LOAD httpfs", QueryRefused),
    ("SET memory_limit = '10GB'", QueryRefused),
    ("SET enable_external_access = true", QueryRefused),
    ("RESET memory_limit", QueryRefused),
    ("PRAGMA database_list", QueryRefused),
    ("CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')", QueryRefused),
    ("CREATE TABLE t AS SELECT 1", QueryRefused),
    ("INSERT INTO sales SELECT * FROM sales", QueryRefused),
    ("UPDATE sales SET units = 0", QueryRefused),
    ("DELETE FROM sales", QueryRefused),
    ("DROP TABLE sales", QueryRefused),
    ("SELECT 1; DROP TABLE sales", QueryRefused),
    ("SELECT 1 /* */; COPY sales TO '{out}.csv'", QueryRefused),
    ("SELECT 1 -- \n; COPY sales TO '{out}.csv'", QueryRefused),
    ("SELECT getenv('HOME')", QueryError),
    ("CALL pragma_version()", QueryRefused),
    ("USE sales", QueryRefused),
    ("CHECKPOINT", QueryRefused),
    ("VACUUM", QueryRefused),
    ("EXPLAIN ANALYZE SELECT 1", QueryRefused),
    ("PIVOT sales ON region USING sum(amount)", QueryRefused),
]


@pytest.mark.parametrize(("template", "error"), CORPUS, ids=[c[0][:40] for c in CORPUS])
async def test_escape_is_refused_or_stopped(env: Env, template: str,
                                             error: type[DataError]) -> None:
    sql = template.format(out=OUT, root=env.wh.root, outside=env.outside)
    before = snapshot(env.base)
    with pytest.raises(error) as caught:
        await env.wh.query(sql, Scope("session-a", ["sales"]), timeout=5)
    message = str(caught.value)
    assert "TOP-SECRET" not in message and "root:" not in message and "Traceback" not in message
    assert snapshot(env.base) == before
    assert no_marked_files() == []


LOCKED = [
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM '{outside}/secret.csv'",
    "COPY sales TO '{out}.csv'", "EXPORT DATABASE '{out}'", "ATTACH '{out}.db' AS x",
    "INSTALL httpfs", "LOAD httpfs", "SET memory_limit = '10GB'",
    "SET enable_external_access = true",
    "RESET lock_configuration", "CREATE TABLE t AS SELECT 1", "DELETE FROM sales",
    "CALL enable_logging(storage := 'file', storage_path := '{out}')",
]


@pytest.mark.parametrize("template", LOCKED)
def test_duckdb_alone_also_refuses(env: Env, template: str) -> None:
    """Layer 3 without the gate: the locked-down connection the child uses."""
    con = child.connect({"memory_limit": "256MB", "threads": 1,
                            "attach": [("sales", str(env.wh.get("sales").path))]})
    before = snapshot(env.base)
    with con, pytest.raises(duckdb.Error):
        con.execute(template.format(out=OUT, outside=env.outside)).fetchall()
    assert snapshot(env.base) == before and no_marked_files() == []


def test_the_child_cannot_write_a_byte_to_a_file(tmp_path: Path) -> None:
    code = ("import runpy, sys; worker = runpy.run_path(sys.argv[1]); "
            "worker['limit_resources']({'memory_limit': '256MB', 'timeout': 5, 'threads': 1}); "
            "f = open(sys.argv[2], 'w'); f.write('x'); f.close()")
    done = subprocess.run([sys.executable, "-I", "-c", code, child.__file__, str(tmp_path / "f")],
                          capture_output=True, timeout=30)
    assert done.returncode != 0 and b"File too large" in done.stderr
    assert (tmp_path / "f").stat().st_size == 0


async def test_the_child_has_no_environment_to_leak(env: Env,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_CANARY", "canary-7f3a")
    with pytest.raises(QueryRefused, match="duckdb_settings is not available here"):
        await env.wh.query("SELECT * FROM duckdb_settings()", max_rows=10_000)
    result = await env.wh.query("SELECT * FROM duckdb_tables()", max_rows=10_000)
    text = repr(result.rows)
    assert "canary-7f3a" not in text and os.environ.get("HOME", "/root") + "/" not in text


async def test_symlinked_dataset_files_are_not_attached(env: Env, tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Fake:
        name: str
        path: Path

    (tmp_path / "evil.duckdb").symlink_to(env.wh.get("secret_global").path)
    with pytest.raises(QueryError, match="data file of dataset evil is missing"):
        await run_query("SELECT * FROM evil", [Fake("evil", tmp_path / "evil.duckdb")])


# ---- scoping --------------------------------------------------------------------------


@pytest.mark.parametrize("sql", ["SELECT * FROM b_upload", "SELECT * FROM b_upload.b_upload",
                                 "SELECT * FROM secret_global", "SHOW ALL TABLES"])
async def test_a_session_sees_only_its_scope(env: Env, sql: str) -> None:
    scope = Scope("session-a", ["sales"])
    try:
        result = await env.wh.query(sql, scope)
    except QueryError as e:
        assert "does not exist" in str(e)
    else:
        assert {(row[0], row[2]) for row in result.rows} == {("sales", "sales")}  # database, table
    owner = await env.wh.query("SELECT token FROM b_upload", Scope("session-b", []))
    assert owner.rows == (("TOP-SECRET-42",),)


# ---- time and memory ------------------------------------------------------------------

CROSS_JOIN = "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b"  # ~minutes


async def test_a_huge_cross_join_is_stopped_by_the_timeout(env: Env) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(QueryTimeout, match="longer than 0.5 s"):
        await env.wh.query(CROSS_JOIN, timeout=0.5)
    assert loop.time() - started < 5
    assert (await env.wh.query("SELECT count(*) FROM sales")).rows == ((2000,),)
    assert sandbox_children() == []


async def test_cancelling_the_task_stops_the_query(env: Env) -> None:
    task = asyncio.create_task(env.wh.query(CROSS_JOIN, timeout=60))
    await wait_for(sandbox_children)  # the query's sandbox runs it (for minutes)
    assert len(sandbox_children()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sandbox_children() == []


@pytest.mark.parametrize("sql", [
    "SELECT length(string_agg(repeat('x', 1000), ',')) FROM range(10000000)",
    "SELECT list(range(100000000))",
    "SELECT length(repeat('x', 3000000000))",  # not counted by DuckDB's memory_limit
])
async def test_a_memory_blow_up_is_stopped(env: Env, sql: str) -> None:
    with pytest.raises(QueryMemoryError, match=r"more than its memory limit \(256MB\)"):
        await env.wh.query(sql, timeout=20)
    assert (await env.wh.query("SELECT 1")).rows == ((1,),)


def sandbox_children() -> list[int]:
    """Live child processes of this test process that run the sandbox."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"child.py" in cmdline:
            found.append(int(pid))
    return found
