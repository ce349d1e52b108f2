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
