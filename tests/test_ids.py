"""Ids: random, unique, and never shared with a forked child."""

from __future__ import annotations

import os
import re

from pluto.ids import new_id


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
