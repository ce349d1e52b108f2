"""What a provider keeps in memory about recent messages (ids seen, threads joined, runs
finished), bounded: the oldest entry goes once there are more than a given number."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(kept: OrderedDict[K, V], key: K, value: V, most: int) -> None:
    """Keep ``key`` (with ``value``) as the newest entry of ``kept``; forget the oldest ones
    beyond ``most``."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > most:
        kept.popitem(last=False)
