"""While a ``pluto`` command starts, young collections are rare (gateway/cli/__init__.py); once
its modules are imported the collector is as it was, and `serve` keeps it for gcpolicy.settle()."""

from __future__ import annotations

import argparse
import gc
import shutil
from pathlib import Path

import pytest

from pluto.gateway.cli import START_YOUNG, main
from pluto.gateway.cli import commands

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path / "config"


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """The collector's thresholds each time a command is dispatched (the command not run)."""
    thresholds: list[tuple[int, int, int]] = []

    def dispatch(args: argparse.Namespace) -> int:
        thresholds.append(gc.get_threshold())
        return 0

    monkeypatch.setattr(commands, "dispatch", dispatch)
    return thresholds


def test_a_command_runs_with_the_default_collector_and_leaves_it_so(config_dir, tmp_path,
                                                                     seen) -> None:
    before = gc.get_threshold()
    assert main(["agents", "--config", str(config_dir), "--data-dir", str(tmp_path)]) == 0
    assert seen == [before]
    assert gc.get_threshold() == before


def test_serve_starts_with_rare_young_collections_and_a_failed_start_restores_them(
        config_dir, tmp_path, seen) -> None:
    before = gc.get_threshold()
    assert main(["serve", "--config", str(config_dir), "--data-dir", str(tmp_path)]) == 0
    assert seen == [(START_YOUNG, *before[1:])]  # until gcpolicy.settle() once it is up
    assert gc.get_threshold() == before  # (here it never got that far)
