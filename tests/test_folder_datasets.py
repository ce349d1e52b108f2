"""A folder of files is one dataset: files that add or lack a column are merged by name,
but a malformed, headerless or unrelated file is refused by name in one sentence — never
merged silently as extra column0..N columns — and nothing is left behind."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pluto.runtime.data import DatasetError, Warehouse
from tests.test_data_cli import pluto
from tests.test_warehouse import write

HEADER = "region,amount,day\n"


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "datasets")


def folder(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        write(tmp_path / "parts" / name.replace("_", "."), text)
    return tmp_path / "parts"


@pytest.mark.parametrize(("bad", "says"), [
    ("1,2,3\n4,5,6\n", "c.csv does not match a.csv: its columns (column0, column1, column2) "
                       "share no name with region, amount, day. Give every file of the folder "
                       "the same header, or move that file out, and add it again."),
    ("name;kind\nx;y\n", "c.csv does not match a.csv: its columns (name, kind) share no name "
                         "with region, amount, day."),
    ("this is not\na csv file, at all; just text\n", "Could not read c.csv: line 2 has 2 "
                                                    "fields but the first line has 1."),
])
def test_a_malformed_csv_in_a_folder_is_refused_by_name(wh: Warehouse, tmp_path: Path,
                                                        bad: str, says: str) -> None:
    parts = folder(tmp_path, a_csv=HEADER + "North,1,2024-01-01\n",
                   b_csv=HEADER + "South,2,2024-01-02\n", c_csv=bad)
    with pytest.raises(DatasetError) as raised:
        wh.ingest(parts)
    assert str(raised.value).startswith(says), str(raised.value)
    assert str(tmp_path) not in str(raised.value)
    assert wh.list() == [] and not list(wh.root.glob(".ingest-*"))


def test_a_file_that_adds_a_column_is_still_merged(wh: Warehouse, tmp_path: Path) -> None:
    parts = folder(tmp_path, a_csv=HEADER + "North,1,2024-01-01\n",
                   b_csv="amount,region,day,note\n2,South,2024-01-02,late\n")
    info = wh.ingest(parts)
    assert [c.name for c in info.columns] == ["region", "amount", "day", "note"]
    assert info.rows == 2


def test_a_json_file_of_other_keys_is_refused(wh: Warehouse, tmp_path: Path) -> None:
    parts = folder(tmp_path, a_json='[{"region": "North", "amount": 1}]',
                   b_json='[{"user": "x", "score": 3}]')
    with pytest.raises(DatasetError, match=r"^b.json does not match a.json: its columns "
                                           r"\(user, score\) share no name with region, amount"):
        wh.ingest(parts)


def test_a_parquet_file_of_another_table_is_refused(wh: Warehouse, tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT 'North' AS region, 1 AS amount) TO "
                    f"'{tmp_path / 'parts' / 'a.parquet'}'")
        con.execute(f"COPY (SELECT 42 AS other) TO '{tmp_path / 'parts' / 'b.parquet'}'")
    with pytest.raises(DatasetError, match=r"^b.parquet does not match a.parquet"):
        wh.ingest(tmp_path / "parts")


def test_pluto_data_add_folder_says_so_in_one_sentence(config_dir: Path, data_dir: Path,
                                                       tmp_path: Path) -> None:
    parts = folder(tmp_path, a_csv=HEADER + "North,1,2024-01-01\n", b_csv="1,2,3\n4,5,6\n")
    added = pluto("add", str(parts), config=config_dir, data_dir=data_dir)
    assert added.returncode == 1
    assert added.stderr.strip() == (
        "pluto data add: b.csv does not match a.csv: its columns (column0, column1, column2) "
        "share no name with region, amount, day. Give every file of the folder the same "
        "header, or move that file out, and add it again.")
    listed = pluto("list", config=config_dir, data_dir=data_dir)
    assert "parts" not in listed.stdout
