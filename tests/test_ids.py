"""Ids: random, unique, and never shared with a forked child; ordered ids sort by time."""

from __future__ import annotations

import os
import re
import time

import pytest

from pluto.ids import new_id, ordered_id


def test_ids_are_32_hex_digits_and_unique() -> None:
    ids = [new_id() for _ in range(20_000)]  # several pools' worth
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_never_draws_the_parents_next_ids() -> None:
    new_id()  # the pool is filled: the next ids sit in memory
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, "".join(new_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = pipe.read()
    os.waitpid(pid, 0)
    ours = "".join(new_id() for _ in range(4))
    assert len(theirs) == 128 and theirs != ours


def test_ordered_ids_are_32_hex_digits_unique_and_sort_by_the_time_they_were_made() -> None:
    # drawn between random ids, so the shared pool is cut at every boundary
    made = [(ordered_id(), new_id())[0] for _ in range(20_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made)
    assert len(set(made)) == len(made)
    assert len({i[12:] for i in made}) == len(made)  # the 80 random bits differ too
    before = after = ordered_id()
    while after[:12] == before[:12]:  # the next millisecond (ids of one are in no order)
        after = ordered_id()
    assert before < after
    assert int(after[:12], 16) == pytest.approx(time.time() * 1000, abs=1000)
