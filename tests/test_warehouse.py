"""The DuckDB warehouse: ingest of each format with types kept, folders, limits, broken
files that leave nothing behind, names, scopes, the catalog, and the demo dataset."""

from __future__ import annotations

import json
import threading
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from pluto.runtime.data import DatasetError, DatasetNotFound, Scope, Warehouse, ensure_demo


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "datasets")


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def table(wh: Warehouse, name: str) -> list[tuple]:
    with duckdb.connect(str(wh.get(name).path), read_only=True) as con:
        return con.execute(f"SELECT * FROM {name}").fetchall()


def types(wh: Warehouse, name: str) -> dict[str, str]:
    return {c.name: c.type for c in wh.get(name).columns}


TYPED_CSV = (
    "day,at,amount,ok,n,label,ratio\n"
    "2024-01-02,2024-01-02 10:11:12,12.50,true,5,hello,1e3\n"
    '2024-02-03,2024-02-03 00:00:00,-3.25,false,-7,"x, y",0.5\n'
)


# ---- formats ------------------------------------------------------------------------


def test_csv_keeps_dates_timestamps_decimals_booleans_integers(wh: Warehouse,
                                                               tmp_path: Path) -> None:
    info = wh.ingest(write(tmp_path / "Typed File.csv", TYPED_CSV))
    assert (info.name, info.rows, info.source) == ("typed_file", 2, "Typed File.csv")
    assert info.owner is None
    assert types(wh, "typed_file") == {
        "day": "DATE", "at": "TIMESTAMP", "amount": "DECIMAL(18,2)", "ok": "BOOLEAN",
        "n": "BIGINT", "label": "VARCHAR", "ratio": "DOUBLE"}
    assert table(wh, "typed_file")[1] == (date(2024, 2, 3), datetime(2024, 2, 3), Decimal("-3.25"),
                                         False, -7, "x, y", 0.5)
    assert info.path == wh.root / "typed_file.duckdb" and info.size_bytes > 0


def test_csv_long_or_exponent_numbers_stay_double(wh: Warehouse, tmp_path: Path) -> None:
    wh.ingest(write(tmp_path / "d.csv", "a,b\n1.5,123456789012345.12345\n2e-3,1.0\n"))
    assert types(wh, "d") == {"a": "DOUBLE", "b": "DOUBLE"}


def test_tsv(wh: Warehouse, tmp_path: Path) -> None:
    wh.ingest(write(tmp_path / "t.tsv", "city\tpop\tshare\nOslo, NO\t700000\t0.13\n"))
    assert types(wh, "t") == {"city": "VARCHAR", "pop": "BIGINT", "share": "DECIMAL(18,2)"}
    assert table(wh, "t") == [("Oslo, NO", 700000, Decimal("0.13"))]


def test_parquet_keeps_its_types(wh: Warehouse, tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    with duckdb.connect() as con:
        con.execute("COPY (SELECT DATE '2024-01-01' + range::INT AS d, "
                    "range::DECIMAL(10,2) AS amt, range % 2 = 0 AS even, "
                    "TIMESTAMP '2024-01-01 12:00' AS ts FROM range(5)) "
                    f"TO '{path}' (FORMAT parquet)")
    info = wh.ingest(path, "sales_2024")
    assert info.rows == 5
    assert types(wh, "sales_2024") == {"d": "DATE", "amt": "DECIMAL(10,2)", "even": "BOOLEAN",
                                       "ts": "TIMESTAMP"}


def test_json_array_and_ndjson(wh: Warehouse, tmp_path: Path) -> None:
    wh.ingest(write(tmp_path / "a.json", '[{"a": 1, "d": "2024-01-01"}, {"a": 2, "d": null}]'))
    assert types(wh, "a") == {"a": "BIGINT", "d": "DATE"}
    wh.ingest(write(tmp_path / "n.ndjson", '{"a": 1, "b": "x"}\n{"a": 2, "c": true}\n'))
    assert types(wh, "n") == {"a": "BIGINT", "b": "VARCHAR", "c": "BOOLEAN"}
    assert table(wh, "n") == [(1, "x", None), (2, None, True)]
    wh.ingest(write(tmp_path / "l.jsonl", '{"a": 1}\n'))
    assert wh.get("l").rows == 1


def test_folder_is_one_dataset_unioned_by_name(wh: Warehouse, tmp_path: Path) -> None:
    write(tmp_path / "parts" / "p1.csv", "a,amt\n1,2.50\n2,3.10\n")
    write(tmp_path / "parts" / "p2.csv", "amt,a,extra\n4.25,3,x\n")
    write(tmp_path / "parts" / ".hidden.txt", "ignored")
    info = wh.ingest(tmp_path / "parts")
    assert (info.name, info.rows) == ("parts", 3)
    assert types(wh, "parts") == {"a": "BIGINT", "amt": "DECIMAL(18,2)", "extra": "VARCHAR"}
    assert sorted(table(wh, "parts")) == [(1, Decimal("2.50"), None), (2, Decimal("3.10"), None),
                                          (3, Decimal("4.25"), "x")]


def test_folder_of_mixed_formats_is_refused(wh: Warehouse, tmp_path: Path) -> None:
    write(tmp_path / "mix" / "a.csv", "a\n1\n")
    write(tmp_path / "mix" / "b.json", '[{"a": 1}]')
    with pytest.raises(DatasetError, match="mixes file formats"):
        wh.ingest(tmp_path / "mix")


def test_size_limit_is_checked_before_reading(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "datasets", max_file_bytes=1000)
    garbage = write(tmp_path / "big.csv", bytes(range(256)) * 8)  # unreadable, and too big
    with pytest.raises(DatasetError, match=r"big.csv is 2 KB; the limit is 1000 B"):
        wh.ingest(garbage)
    write(tmp_path / "folder" / "a.csv", "a\n" + "1\n" * 300)
    write(tmp_path / "folder" / "b.csv", "a\n" + "1\n" * 300)
    with pytest.raises(DatasetError, match="the limit is"):
        wh.ingest(tmp_path / "folder")
    assert wh.list() == []


# ---- broken files -------------------------------------------------------------------

LATE_RAGGED = "a,b,c\n" + "".join(f"{i},{i * 2},x{i}\n" for i in range(30000)) + "1,2\n"

BROKEN = [
    ("ragged.csv", "a,b,c\n1,2,3\n4,5\n6,7,8\n", r"line 3 has 2 fields but the first line has 3"),
    ("long.csv", "a,b,c\n1,2,3\n4,5,6,7\n", r"line 3 has 4 fields but the first line has 3"),
    ("title.csv", "Report\n\na;b\n1;2\n", r"line 3 has 2 fields but the first line has 1"),
    ("late.csv", LATE_RAGGED, r"line 30002 has 2 fields but the header has 3"),
    ("latin1.csv", "name,x\nJos\xe9,1\n".encode("latin-1"),
     r"line 2 is not UTF-8 text. Save it as UTF-8"),
    ("empty.csv", b"", r"empty.csv is empty"),
    ("garbage.csv", bytes((i * 7919) % 256 for i in range(4000)), r"Could not read garbage.csv"),
    ("header.csv", "a,b\n", r"header.csv has no data rows"),
    ("sheet.xlsx", b"PK\x03\x04 not really", r"not a supported file type \(.xlsx\)"),
    ("noext", "a,b\n1,2\n", r"not a supported file type \(no extension\)"),
    ("fake.parquet", "a,b\n1,2\n", r"not a valid Parquet file"),
    ("broken.json", '{"a": 1,\n',
     r"not valid JSON \(record \d+, byte \d+: unexpected end of data\)"),
]


@pytest.mark.parametrize(("filename", "content", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_file_gives_a_clear_error_and_leaves_nothing(
        wh: Warehouse, tmp_path: Path, filename: str, content: str | bytes, message: str) -> None:
    wh.ingest(write(tmp_path / "ok.csv", "a\n1\n"))
    before = sorted(p.name for p in wh.root.iterdir())
    with pytest.raises(DatasetError, match=message) as caught:
        wh.ingest(write(tmp_path / "in" / filename, content))
    text = str(caught.value)
    assert "Traceback" not in text and len(text) < 300 and text.count(". ") <= 2, text
    assert sorted(p.name for p in wh.root.iterdir()) == before
    assert [d.name for d in wh.list()] == ["ok"]


def test_missing_source(wh: Warehouse, tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="nope.csv does not exist"):
        wh.ingest(tmp_path / "nope.csv")


# ---- names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Sales", "1sales", "sales-2024", "", "a" * 64, "select",
                                  "memory", "system", "main", "temp"])
def test_invalid_names_are_refused(wh: Warehouse, tmp_path: Path, name: str) -> None:
    with pytest.raises(DatasetError, match="dataset name|reserved"):
        wh.ingest(write(tmp_path / "x.csv", "a\n1\n"), name)


@pytest.mark.parametrize(("filename", "derived"), [
    ("Sales 2024.csv", "sales_2024"), ("2024.csv", "d_2024"), ("select.csv", "select_data"),
    ("Продажи.csv", "dataset"), (f"{'x' * 80}.csv", "x" * 63)])
def test_names_are_derived_from_file_names(wh: Warehouse, tmp_path: Path, filename: str,
                                           derived: str) -> None:
    assert wh.ingest(write(tmp_path / filename, "a\n1\n")).name == derived


def test_taken_names(wh: Warehouse, tmp_path: Path) -> None:
    source = write(tmp_path / "sales.csv", "a\n1\n")
    assert wh.ingest(source).name == "sales"
    assert wh.ingest(source).name == "sales_2"  # derived: made unique
    with pytest.raises(DatasetError, match="already exists"):
        wh.ingest(source, "sales")  # explicit: refused
    with pytest.raises(DatasetError, match="already exists"):
        wh.ingest(source, "sales", owner="s1", replace=True)  # not the owner
    write(source, "a\n1\n2\n")
    assert wh.ingest(source, "sales", replace=True).rows == 2


def test_concurrent_ingests_get_distinct_names(wh: Warehouse, tmp_path: Path) -> None:
    source = write(tmp_path / "same.csv", "a\n1\n")
    names: list[str] = []
    threads = [threading.Thread(target=lambda: names.append(wh.ingest(source).name))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(names) == ["same", "same_2", "same_3", "same_4"]


# ---- scope, catalog, remove, share ---------------------------------------------------


def test_scopes(wh: Warehouse, tmp_path: Path) -> None:
    source = write(tmp_path / "x.csv", "a\n1\n")
    wh.ingest(source, "public")
    wh.ingest(source, "secret")
    wh.ingest(source, "a_upload", owner="session-a")
    wh.ingest(source, "b_upload", owner="session-b")
    a = Scope("session-a", ["public"])
    b = Scope("session-b", "*")
    assert [d.name for d in wh.list(a)] == ["a_upload", "public"]
    assert [d.name for d in wh.list(b)] == ["b_upload", "public", "secret"]
    assert len(wh.list()) == 4
    with pytest.raises(DatasetNotFound) as caught:
        wh.get("b_upload", a)
    assert "b_upload" not in str(caught.value).split("Available:")[1]
    with pytest.raises(DatasetNotFound):
        wh.get("secret", a)
    with pytest.raises(DatasetNotFound):
        wh.remove("a_upload", b)
    assert wh.share("a_upload").owner is None
    assert "a_upload" in [d.name for d in wh.list(b)]
    assert "a_upload" not in [d.name for d in wh.list(a)]  # global now, and not allowed for a


def test_catalog_survives_a_restart_and_remove_deletes_the_file(wh: Warehouse,
                                                                tmp_path: Path) -> None:
    info = wh.ingest(write(tmp_path / "x.csv", "a,b\n1,2024-01-01\n"), owner="s1")
    again = Warehouse(wh.root)
    assert again.get("x") == info
    raw = json.loads((wh.root / "catalog.json").read_text())
    assert raw["datasets"]["x"]["columns"] == [["a", "BIGINT"], ["b", "DATE"]]
    again.remove("x", Scope("s1", []))
    assert not info.path.exists() and wh.list() == []


def test_a_dataset_file_that_is_gone_or_a_symlink_is_not_listed(wh: Warehouse,
                                                                tmp_path: Path) -> None:
    source = write(tmp_path / "x.csv", "a\n1\n")
    gone, linked = wh.ingest(source, "gone"), wh.ingest(source, "linked")
    gone.path.unlink()
    linked.path.unlink()
    linked.path.symlink_to(tmp_path / "x.csv")
    wh.ingest(source, "kept")
    assert [d.name for d in wh.list()] == ["kept"]


def test_an_error_in_a_folder_names_the_bad_file(wh: Warehouse, tmp_path: Path) -> None:
    write(tmp_path / "parts" / "a.json", '[{"a": 1}]')
    write(tmp_path / "parts" / "b.json", '[{"a": 2}, {"a": ')
    with pytest.raises(DatasetError, match="Could not read b.json: it is not valid JSON"):
        wh.ingest(tmp_path / "parts")


# ---- the demo -----------------------------------------------------------------------


def test_demo_is_deterministic_and_made_once(tmp_path: Path) -> None:
    first, second = Warehouse(tmp_path / "one"), Warehouse(tmp_path / "two")
    info = ensure_demo(first)
    assert ensure_demo(first) == info
    assert (info.name, info.owner, info.rows) == ("sales", None, 2000)
    assert [(c.name, c.type) for c in info.columns] == [
        ("date", "DATE"), ("region", "VARCHAR"), ("product", "VARCHAR"), ("units", "INTEGER"),
        ("amount", "DECIMAL(10,2)"), ("returned", "BOOLEAN")]
    ensure_demo(second)
    assert table(first, "sales") == table(second, "sales")
    rows = table(first, "sales")
    assert {r[1] for r in rows} == {"North", "South", "East", "West"}
    assert len({r[2] for r in rows}) == 5
    days = [r[0] for r in rows]
    assert (min(days), max(days)) == (date(2023, 1, 1), date(2024, 12, 31))
    assert 0 < sum(r[5] for r in rows) < 200
