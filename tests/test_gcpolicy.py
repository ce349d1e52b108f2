"""`pluto serve` settles the garbage collector once it is up (gateway/gcpolicy.py)."""

from __future__ import annotations

import gc

from pluto.gateway import gcpolicy


def test_settle_freezes_what_exists_and_collects_the_young_less_often():
    before = gc.get_threshold()
    try:
        gcpolicy.settle()
        assert gc.get_threshold() == (gcpolicy.YOUNG, *before[1:])
        assert gc.get_freeze_count() > 0  # the started process is never walked again
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle made afterwards is still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
