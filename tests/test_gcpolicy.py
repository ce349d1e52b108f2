"""`pluto serve` settles the garbage collector once it is up and then paces its collections by
the event loop (gateway/gcpolicy.py)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator

import pytest

from pluto.gateway import gcpolicy


@pytest.fixture
def collector() -> Iterator[list[tuple[int, int]]]:
    """The collector as it was afterwards; meanwhile, (generation, collected) of each
    collection made."""
    before = gc.get_threshold()
    made: list[tuple[int, int]] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            made.append((info["generation"], info["collected"]))

    gc.callbacks.append(seen)
    try:
        yield made
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
        gc.set_threshold(*before)


def _cycles(n: int) -> None:
    """``n`` lists, each a cycle of its own: garbage that only the collector frees."""
    for _ in range(n):
        garbage: list[object] = []
        garbage.append(garbage)


def test_without_a_loop_settle_freezes_and_collects_the_young_less_often(
        collector: list[tuple[int, int]]) -> None:
    before = gc.get_threshold()
    assert gcpolicy.settle() is None
    assert gc.get_threshold() == (gcpolicy.YOUNG, *before[1:])
    assert gc.get_freeze_count() > 0  # the started process is never walked again
    garbage = [[]]
    garbage[0].append(garbage)  # a cycle made afterwards is still collected
    del garbage
    assert gc.collect() >= 1


async def test_a_quiet_loop_collects_on_its_tick_a_busy_one_defers(
        collector: list[tuple[int, int]]) -> None:
    before = gc.get_threshold()
    pacer = gcpolicy.settle()
    assert pacer is not None
    try:
        assert gc.get_threshold() == (gcpolicy.BACKSTOP, *before[1:])  # the backstop only
        collector.clear()
        _cycles(2 * gcpolicy.YOUNG)  # garbage the collector's own trigger no longer sees
        assert gc.get_count()[0] >= gcpolicy.YOUNG and collector == []
        assert pacer.look(busy=True) is None  # a busy loop defers it ...
        assert collector == []
        # ... and a quiet tick collects it: the loop idles here, so the next tick is on time
        async with asyncio.timeout(5):
            while not collector:
                await asyncio.sleep(0.02)
        assert collector[0][0] == 0 and collector[0][1] >= 2 * gcpolicy.YOUNG
        assert pacer.collections[0] >= 1
        assert gc.get_count()[0] < gcpolicy.YOUNG
    finally:
        pacer.stop()
    assert gc.get_threshold() == before  # the collector's own trigger is back


async def test_a_loop_busy_on_the_cpu_defers_collection_until_the_busy_line(
        collector: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    pacer = gcpolicy.settle()
    assert pacer is not None
    try:
        collector.clear()
        _cycles(2 * gcpolicy.YOUNG)
        for _ in range(3):  # ticks that find the loop's thread busy (on the CPU) all along
            started = time.thread_time()
            while time.thread_time() - started < 1.2 * gcpolicy.TICK:
                sum(range(1000))
            await asyncio.sleep(0)  # (the tick runs, late)
            await asyncio.sleep(gcpolicy.TICK / 10)
        assert collector == [] and pacer.collections == [0, 0, 0]
        monkeypatch.setattr(gcpolicy, "BUSY_YOUNG", gcpolicy.YOUNG)  # past the busy line
        assert pacer.look(busy=True) == 0
        assert collector and collector[0][1] >= 2 * gcpolicy.YOUNG
    finally:
        pacer.stop()


async def test_older_generations_follow_the_young_as_cpythons_own_trigger_does(
        collector: list[tuple[int, int]]) -> None:
    pacer = gcpolicy.settle()
    assert pacer is not None
    pacer.stop()  # (its looks are made by hand here, with no trigger of the collector's own)
    gc.set_threshold(gcpolicy.BACKSTOP, *pacer.restore[1:])
    _, every_middle, every_full = pacer.restore
    chosen = []
    for _ in range((every_middle + 2) * (every_full + 1) + 1):
        _cycles(gcpolicy.YOUNG + gcpolicy.YOUNG // 5)  # (some other objects are freed meanwhile)
        chosen.append(pacer.look(busy=False))
    # a middle collection after ten young ones, a full one after ten middle ones
    assert chosen[:every_middle + 1] == [0] * (every_middle + 1)
    assert chosen.index(1) == every_middle + 1
    assert chosen.index(2) == len(chosen) - 1  # once ten middle ones came before it
    assert chosen.count(1) == every_full + 1
    assert pacer.collections == [chosen.count(0), chosen.count(1), chosen.count(2)]
