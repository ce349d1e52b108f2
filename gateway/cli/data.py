"""``pluto data add|list|rm|share``: the datasets of the warehouse, from the command line.

Only argparse and pathlib are imported up front (``pluto --help`` stays fast); DuckDB comes
with the first command that needs it. A dataset added here is global: every agent whose
``datasets`` is ``"*"`` or names it can query it.
"""

from __future__ import annotations

import argparse
import sys
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
                return _add(warehouse, args.file, args.name, args.replace)
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


def _add(warehouse: Warehouse, file: Path, name: str | None, replace: bool) -> int:
    from pluto.runtime.data import dataset_name

    if replace and name is None:
        name = dataset_name(file)
    info = warehouse.ingest(file, name, replace=replace)
    from pluto.gateway.pipeline.data_commands import shape

    print(f"Added dataset {info.name}: {shape(info)} "
          f"({', '.join(c.name for c in info.columns[:8])}"
          f"{', …' if len(info.columns) > 8 else ''}).")
    return EXIT_OK


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
    from pluto.runtime.data.ingest import human_size

    return human_size(d.size_bytes)
