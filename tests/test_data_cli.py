"""``pluto data add|list|rm|share`` as a real subprocess, datasets registered in pluto.yaml,
and the demo dataset: made once, lazily, and gone for good once removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pluto.settings import load_pluto_config
from pluto.gateway.pipeline.data_commands import data_service
from pluto.runtime.data import DataService, Warehouse

ROOT = Path(__file__).resolve().parent.parent


def pluto(*args: str, config: Path, data_dir: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("pluto")
    cmd = [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env["PLUTO_DATA_DIR"] = str(data_dir)
    return subprocess.run([*cmd, "data", *args, "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_add_list_rm_share(config_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    good = tmp_path / "Orders 2024.csv"
    good.write_text("id,amount,day,paid\n1,9.99,2024-03-01,true\n2,20.00,2024-03-02,false\n")
    added = pluto("add", str(good), config=config_dir, data_dir=data_dir)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == ("Added dataset orders_2024: 2 rows × 4 columns "
                                    "(id, amount, day, paid).")
    Warehouse(data_dir / "datasets").ingest(good, "chat_file", owner="telegram:42")

    listed = pluto("list", config=config_dir, data_dir=data_dir)
    lines = listed.stdout.splitlines()
    assert listed.returncode == 0 and lines[0].split() == ["NAME", "ROWS", "COLUMNS", "SIZE",
                                                           "OWNER", "SOURCE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"chat_file", "orders_2024", "sales"}  # the demo, made on first use
    assert rows["orders_2024"][1:3] == ["2", "4"] and rows["orders_2024"][-3:] == [
        "global", "Orders", "2024.csv"]
    assert rows["chat_file"][5:7] == ["chat", "telegram:42"]

    shared = pluto("share", "chat_file", config=config_dir, data_dir=data_dir)
    assert shared.returncode == 0 and "chat_file is now global" in shared.stdout
    assert "already global" in pluto("share", "chat_file", config=config_dir,
                                     data_dir=data_dir).stdout

    good.write_text("id\n1\n2\n3\n")
    again = pluto("add", str(good), "--name", "orders_2024", config=config_dir,
                  data_dir=data_dir)
    assert again.returncode == 1 and "already exists" in again.stderr
    replaced = pluto("add", str(good), "--replace", config=config_dir, data_dir=data_dir)
    assert replaced.stdout.startswith("Added dataset orders_2024: 3 rows × 1 column")

    removed = pluto("rm", "orders_2024", config=config_dir, data_dir=data_dir)
    assert removed.returncode == 0 and removed.stdout.strip() == "Removed dataset orders_2024."
    gone = pluto("rm", "orders_2024", config=config_dir, data_dir=data_dir)
    assert gone.returncode == 1 and gone.stderr.strip() == (
        "pluto data rm: There is no dataset named 'orders_2024'. Available: chat_file, sales.")


@pytest.mark.parametrize(("args", "says"), [
    (["add", "{tmp}/ragged.csv"], "pluto data add: Could not read ragged.csv: line 3 has 1 "
                                  "fields but the first line has 2. Give every row the same "
                                  "fields and send it again."),
    (["add", "{tmp}/missing.csv"], "pluto data add: missing.csv does not exist."),
    (["add", "{tmp}/ragged.csv", "--name", "Bad Name"], "pluto data add: Invalid dataset name "
     "'Bad Name': use 1 to 63 lower-case letters, digits and underscores, starting with a "
     "letter."),
])
def test_a_broken_add_is_one_line_and_leaves_nothing(config_dir: Path, data_dir: Path,
                                                     tmp_path: Path, args: list[str],
                                                     says: str) -> None:
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n")
    assert pluto("list", config=config_dir, data_dir=data_dir).returncode == 0
    before = sorted(os.listdir(data_dir / "datasets"))
    out = pluto(*[a.format(tmp=tmp_path) for a in args], config=config_dir, data_dir=data_dir)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == says and "Traceback" not in out.stderr
    assert sorted(os.listdir(data_dir / "datasets")) == before


def write_config(config_dir: Path, data_yaml: str) -> None:
    path = config_dir / "pluto.yaml"
    text = path.read_text()
    start = text.index("\ndata:")
    end = text.index("\nlog_level:")
    path.write_text(text[:start] + "\n" + data_yaml + text[end:])


def test_registered_datasets_load_when_missing_or_changed(config_dir: Path,
                                                          data_dir: Path) -> None:
    (config_dir / "files").mkdir()
    source = config_dir / "files" / "stock.csv"
    source.write_text("item,qty\nbolt,10\nnut,20\n")
    write_config(config_dir, "data:\n  demo: false\n  datasets:\n"
                             "    - {name: stock, path: files/stock.csv}\n"
                             "    - {name: lost, path: files/lost.parquet}\n")
    config = load_pluto_config(config_dir)

    def fresh() -> DataService:
        return data_service(config, config_dir, data_dir)

    first = fresh()
    assert [(d.name, d.rows) for d in first.warehouse().list()] == [("stock", 2)]
    assert first.problems == ["dataset lost (" + str(config_dir / "files" / "lost.parquet")
                              + "): lost.parquet does not exist."]
    made = first.warehouse().get("stock").created_at
    assert fresh().warehouse().get("stock").created_at == made  # unchanged: not loaded again
    source.write_text("item,qty\nbolt,10\nnut,20\nwasher,5\n")
    assert fresh().warehouse().get("stock").rows == 3

    listed = pluto("list", config=config_dir, data_dir=data_dir)
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].split()[:2] == ["stock",
                                                                                   "3"]
    assert "pluto data: dataset lost (" in listed.stderr


def test_the_demo_is_made_once_and_stays_removed(data_dir: Path) -> None:
    service = DataService(data_dir)
    assert [d.name for d in service.warehouse().list()] == ["sales"]
    service.warehouse().remove("sales")
    assert DataService(data_dir).warehouse().list() == []
    assert DataService(data_dir / "other", demo=False).warehouse().list() == []


def test_duplicate_registered_names_are_a_config_error(config_dir: Path,
                                                       data_dir: Path) -> None:
    write_config(config_dir, "data:\n  datasets:\n    - {name: a, path: x.csv}\n"
                             "    - {name: a, path: y.csv}\n")
    out = pluto("list", config=config_dir, data_dir=data_dir)
    assert out.returncode == 2
    assert "data.datasets: Value error, dataset names must be unique; repeated: a" in out.stderr


def test_the_cli_parser_stays_light() -> None:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "pluto.gateway.cli", "data",
                          "--help"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 0 and "add" in out.stdout and "share" in out.stdout
    assert " duckdb" not in out.stderr and " matplotlib" not in out.stderr


# ---- issue 17: NA is NULL, options for the rest, a name clash refused --------------------


def test_na_markers_are_null_and_avg_works(config_dir: Path, data_dir: Path,
                                           tmp_path: Path) -> None:
    """R-style NA (as in nycflights13's CSVs), N/A, NULL and empty fields load as NULL, so a
    numeric column stays numeric."""
    flights = tmp_path / "flights.csv"
    flights.write_text("year,dep_delay,carrier,tailnum\n2013,2,UA,N14228\n2013,NA,AA,NA\n"
                       "2013,-4,N/A,\n2013,NULL,B6,N619AA\n")
    added = pluto("add", str(flights), config=config_dir, data_dir=data_dir)
    assert added.returncode == 0, added.stderr
    info = Warehouse(data_dir / "datasets").get("flights")
    assert {c.name: c.type for c in info.columns} == {
        "year": "BIGINT", "dep_delay": "BIGINT", "carrier": "VARCHAR", "tailnum": "VARCHAR"}
    import asyncio

    result = asyncio.run(Warehouse(data_dir / "datasets").query(
        "SELECT avg(dep_delay), count(dep_delay), count(carrier), count(tailnum) FROM flights"))
    assert result.rows == ((-1.0, 2, 3, 2),)


def test_add_options_nulls_delimiter_header_and_types(config_dir: Path, data_dir: Path,
                                                      tmp_path: Path) -> None:
    semi = tmp_path / "zips.csv"
    semi.write_text("01234;-;NA\n02139;7;x\n")
    out = pluto("add", str(semi), "--delimiter", ";", "--no-header", "--null", "-",
                "--type", "column0=VARCHAR", config=config_dir, data_dir=data_dir)
    assert out.returncode == 0, out.stderr
    info = Warehouse(data_dir / "datasets").get("zips")
    assert [(c.name, c.type) for c in info.columns] == [
        ("column0", "VARCHAR"), ("column1", "BIGINT"), ("column2", "VARCHAR")]
    import asyncio

    rows = asyncio.run(Warehouse(data_dir / "datasets").query(
        "SELECT * FROM zips ORDER BY 1")).rows
    assert rows == (("01234", None, "NA"), ("02139", 7, "x"))  # NA is text when --null is given


@pytest.mark.parametrize(("args", "says"), [
    (["--type", "nope=INT"], "--type names no column 'nope'; the columns are a, b."),
    (["--type", "a=BOGUS"], "'BOGUS' is not a column type; use e.g. VARCHAR, BIGINT, DOUBLE, "
                            "DECIMAL(18,2), DATE, TIMESTAMP."),
    (["--type", "b=INTEGER"], "Could not read t.csv: line 2: 'x' in column b is not an "
                              "INTEGER. Give that column another type (--type), or fix the "
                              "file."),
    (["--type", "a"], "--type 'a': write it as COLUMN=TYPE, e.g. zip=VARCHAR."),
    (["--delimiter", ";;"], "--delimiter ';;': give one character, e.g. ';'."),
    (["--type", "a=INT", "--json"], "t.json is JSON: --null, --delimiter, --header and --type "
                                    "apply to CSV and TSV files only."),
    (["--type", "a=INT); DROP TABLE x; --"], "'INT); DROP TABLE x; --' is not a column type; "
                                             "use e.g. VARCHAR, BIGINT, DOUBLE, DECIMAL(18,2), "
                                             "DATE, TIMESTAMP."),
])
def test_bad_add_options_are_one_line(config_dir: Path, data_dir: Path, tmp_path: Path,
                                      args: list[str], says: str) -> None:
    (tmp_path / "t.csv").write_text("a,b\n1,x\n")
    (tmp_path / "t.json").write_text('[{"a": 1, "b": "x"}]')
    source = tmp_path / ("t.json" if "--json" in args else "t.csv")
    args = [a for a in args if a != "--json"]
    out = pluto("add", str(source), *args, config=config_dir, data_dir=data_dir)
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.strip() == f"pluto data add: {says}"


def test_a_name_clash_is_refused_and_points_to_replace(config_dir: Path, data_dir: Path,
                                                       tmp_path: Path) -> None:
    stocks = tmp_path / "stocks.csv"
    stocks.write_text("sym,price\nA,1\n")
    assert pluto("add", str(stocks), config=config_dir, data_dir=data_dir).returncode == 0
    again = pluto("add", str(stocks), config=config_dir, data_dir=data_dir)
    assert again.returncode == 1
    assert again.stderr.strip() == ("pluto data add: A dataset named stocks already exists. "
                                    "Add --replace to replace it, or --name to give this one "
                                    "another name.")
    names = [d.name for d in Warehouse(data_dir / "datasets").list()]
    assert "stocks_2" not in names
    Warehouse(data_dir / "datasets").ingest(stocks, "chats", owner="web:1")
    theirs = pluto("add", str(stocks), "--name", "chats", "--replace", config=config_dir,
                   data_dir=data_dir)
    assert theirs.returncode == 1 and theirs.stderr.strip() == (
        "pluto data add: A dataset named chats was sent in a chat and belongs to it; remove it "
        "first (pluto data rm chats) or give this one another --name.")
    listed = pluto("list", config=config_dir, data_dir=data_dir).stdout
    assert [ln.split()[3:5] for ln in listed.splitlines() if ln.startswith("stocks")] == [
        ["14", "B"]]  # the size of the data given, not DuckDB's file (a few hundred KB)


def test_a_big_add_says_what_it_is_loading(config_dir: Path, data_dir: Path,
                                           tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    with big.open("w") as f:
        f.write("id,value\n")
        f.writelines(f"{i},{i * 0.5}\n" for i in range(120_000))
    out = pluto("add", str(big), config=config_dir, data_dir=data_dir)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("Loading big.csv (1.")
    assert out.stdout.startswith("Added dataset big: 120,000 rows")


# ---- issue 18: ingest runs in a child process, with caps --------------------------------


def test_a_file_with_too_many_columns_is_refused_cheaply(tmp_path: Path) -> None:
    from pluto.runtime.data import DatasetError
    from pluto.runtime.data.ingest_limits import IngestLimits

    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(50_000)) + "\n" + ",".join(
        "1" for _ in range(50_000)) + "\n")
    wh = Warehouse(tmp_path / "datasets")
    with pytest.raises(DatasetError, match=r"^wide.csv has 50,000 columns; a dataset may have "
                                           r"at most 2,000.$"):
        wh.ingest(wide)
    narrow = Warehouse(tmp_path / "other", limits=IngestLimits(max_columns=3))
    (tmp_path / "four.parquet").write_bytes(b"")
    json_file = tmp_path / "four.json"
    json_file.write_text('[{"a": 1, "b": 2, "c": 3, "d": 4}]')
    with pytest.raises(DatasetError, match="four.json has 4 columns; a dataset may have at "
                                           "most 3."):
        narrow.ingest(json_file)
    assert wh.list() == [] and narrow.list() == []
    assert [p.name for p in (tmp_path / "datasets").iterdir() if p.name.startswith(".ingest")
            ] == []


def test_a_file_that_expands_past_the_row_cap_is_refused(tmp_path: Path) -> None:
    """A small Parquet file of many repeated rows (the audit's 1.4 MB file became 300 M rows)."""
    import duckdb

    from pluto.runtime.data import DatasetError
    from pluto.runtime.data.ingest_limits import IngestLimits

    small = tmp_path / "bomb.parquet"
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT 1 AS x FROM range(3000000)) TO '{small}' (FORMAT parquet)")
    assert small.stat().st_size < 200_000
    wh = Warehouse(tmp_path / "datasets", limits=IngestLimits(max_rows=1_000_000))
    with pytest.raises(DatasetError, match=r"^bomb.parquet has more than 1,000,000 rows, the "
                                           r"limit for a dataset.$"):
        wh.ingest(small)
    assert wh.list() == []


def test_ingest_memory_and_time_are_capped_in_the_child(tmp_path: Path) -> None:
    from pluto.runtime.data import DatasetError
    from pluto.runtime.data.ingest_limits import IngestLimits

    source = tmp_path / "t.csv"
    source.write_text("a,b\n" + "".join(f"{i},{'x' * 200}\n" for i in range(20_000)))
    tight = Warehouse(tmp_path / "datasets", limits=IngestLimits(memory_limit="1MB",
                                                                 max_file_bytes=2**20 // 4))
    with pytest.raises(DatasetError) as caught:
        tight.ingest(source)
    assert str(caught.value).startswith(("Loading t.csv needed more than its memory limit",
                                         "t.csv makes a dataset larger than"))
    assert tight.list() == []
    assert not [p for p in (tmp_path / "datasets").iterdir() if p.name.startswith(".ingest")]
