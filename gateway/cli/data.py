"""``pluto data add|list|rm|share``: the datasets of the warehouse, from the command line.

Only argparse and pathlib are imported up front (``pluto --help`` stays fast); DuckDB comes
with the first command that needs it. A dataset added here is global: every agent whose
``datasets`` is ``"*"`` or names it can query it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pluto.settings import PlutoConfig
    from pluto.runtime.data import DatasetInfo, Warehouse

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(subs: Any) -> list[argparse.ArgumentParser]:
    """The ``data`` command and its actions (returned to get the common options)."""
    data = subs.add_parser("data", help="datasets: add a file, list, remove, share")
    acts = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    add = acts.add_parser("add", help="load a CSV, TSV, Parquet, JSON or NDJSON file (or a "
                          "folder of them) as a dataset agents can query")
    add.add_argument("file", type=Path, help="the file or folder")
    add.add_argument("--name", help="the dataset's name (default: from the file name)")
    add.add_argument("--replace", action="store_true",
                     help="replace the dataset of that name with this file")
    add.add_argument("--null", metavar="TEXT", action="append", dest="nulls",
                     help="CSV/TSV: a text that means no value (repeat for several; default: "
                     "NA, N/A, NULL and the empty field)")
    add.add_argument("--delimiter", metavar="CHAR",
                     help="CSV: the field separator (default: detected)")
    header = add.add_mutually_exclusive_group()
    header.add_argument("--header", dest="header", action="store_const", const=True,
                        help="CSV: the first line holds the column names (default: detected)")
    header.add_argument("--no-header", dest="header", action="store_const", const=False,
                        help="CSV: the first line is data (columns are named column0, ...)")
    add.add_argument("--type", metavar="COLUMN=TYPE", action="append", dest="types",
                     help="CSV: a column's type, e.g. --type zip=VARCHAR --type price="
                     "DECIMAL(10,2) (repeat; default: detected)")
    listed = acts.add_parser("list", help="the datasets: rows, columns, owner, source")
    rm = acts.add_parser("rm", help="remove a dataset")
    rm.add_argument("name")
    share = acts.add_parser("share", help="make a dataset sent in a chat global (visible to "
                            "every agent whose datasets allow it)")
    share.add_argument("name")
    return [add, listed, rm, share]


def data_command(args: argparse.Namespace, config: PlutoConfig, config_dir: Path,
                 data_dir: Path) -> int:
    from pluto.gateway.pipeline.data_commands import data_service
    from pluto.runtime.data import DataError

    service = data_service(config, config_dir, data_dir)
    try:
        warehouse = service.warehouse()
        for problem in service.problems:
            print(f"pluto data: {problem}", file=sys.stderr)
        match args.data_command:
            case "add":
                return _add(warehouse, args)
            case "list":
                return _list(warehouse)
            case "rm":
                warehouse.remove(args.name)
                print(f"Removed dataset {args.name}.")
            case "share":
                return _share(warehouse, args.name)
    except DataError as e:
        print(f"pluto data {args.data_command}: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _add(warehouse: Warehouse, args: argparse.Namespace) -> int:
    from pluto.gateway.pipeline.data_commands import shape
    from pluto.runtime.data import DataError, dataset_name
    from pluto.runtime.data.warehouse import DatasetExists

    file: Path = args.file
    name = args.name or (dataset_name(file) if file.exists() else None)
    try:
        options = _csv_options(args)
        with _progress(file):
            info = warehouse.ingest(file, name, replace=args.replace, csv=options)
    except DatasetExists as e:
        if args.replace:  # it is a chat's: --replace replaces global datasets only
            raise DataError(f"A dataset named {e.name} was sent in a chat and belongs to it; "
                            f"remove it first (pluto data rm {e.name}) or give this one "
                            "another --name.") from None
        raise DataError(f"A dataset named {e.name} already exists. Add --replace to replace "
                        f"it, or --name to give this one another name.") from None
    from pluto.runtime.data import sql_name

    quoted = sql_name(info.name)
    print(f"Added dataset {info.name}: {shape(info)} "
          f"({', '.join(c.name for c in info.columns[:8])}"
          f"{', …' if len(info.columns) > 8 else ''})."
          + (f" {info.name} is an SQL keyword: write it {quoted} in queries."
             if quoted != info.name else ""))
    return EXIT_OK


def _csv_options(args: argparse.Namespace) -> Any:
    from pluto.runtime.data import DataError
    from pluto.runtime.data.ingest_limits import CsvOptions

    types: dict[str, str] = {}
    for given in args.types or ():
        column, sep, kind = given.partition("=")
        if not sep or not column.strip() or not kind.strip():
            raise DataError(f"--type {given!r}: write it as COLUMN=TYPE, e.g. zip=VARCHAR.")
        types[column.strip()] = kind.strip()
    if args.delimiter is not None and len(args.delimiter.encode()) != 1:
        raise DataError(f"--delimiter {args.delimiter!r}: give one character, e.g. ';'.")
    nulls = tuple(args.nulls) if args.nulls is not None else None
    return CsvOptions(nulls=nulls, delimiter=args.delimiter, header=args.header, types=types)


@contextmanager
def _progress(file: Path) -> Iterator[None]:
    """Say what is loading (a big file takes a while): a spinner on a terminal, one line
    otherwise."""
    from pluto.runtime.data.ingest import human_size

    size = sum(f.stat().st_size for f in file.rglob("*") if f.is_file()) if file.is_dir() \
        else file.stat().st_size if file.is_file() else 0
    what = f"Loading {file.name} ({human_size(size)})…"
    if not sys.stderr.isatty():
        if size >= 2**20:
            print(what, file=sys.stderr, flush=True)
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(what):
        yield


def _list(warehouse: Warehouse) -> int:
    datasets = warehouse.list()
    if not datasets:
        print("No datasets. Add one with: pluto data add FILE")
        return EXIT_OK
    rows = [("NAME", "ROWS", "COLUMNS", "SIZE", "OWNER", "SOURCE")]
    rows += [(d.name, f"{d.rows:,}", str(len(d.columns)), _size(d), _owner(d), d.source)
             for d in datasets]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.rjust(w) if i in (1, 2, 3) else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return EXIT_OK


def _share(warehouse: Warehouse, name: str) -> int:
    if warehouse.get(name).owner is None:
        print(f"Dataset {name} is already global.")
        return EXIT_OK
    warehouse.share(name)
    print(f"Dataset {name} is now global: agents whose datasets are \"*\" or name it can "
          "query it.")
    return EXIT_OK


def _owner(d: DatasetInfo) -> str:
    return "global" if d.owner is None else f"chat {d.owner}"


def _size(d: DatasetInfo) -> str:
    """The size of the data as it was given (the file's); a dataset's own file has a floor of
    a few hundred KB, which says nothing about a 16-row table."""
    from pluto.runtime.data.ingest import human_size

    return human_size(d.source_bytes or d.size_bytes)
