"""Random ids (32 hex digits, as ``uuid.uuid4().hex``), from the operating system's secure
random source — fetched 4 KiB at a time, not one system call per id: a message takes several
ids (its run, its frames), and each ``os.urandom`` call hands the GIL over and back."""

from __future__ import annotations

import os
import threading

_POOL_BYTES = 4096
_ID_BYTES = 16

_lock = threading.Lock()
_pool = b""
_at = _POOL_BYTES


def _forget() -> None:
    """(In a forked child.) The parent's pool is the parent's: the child draws its own."""
    global _pool, _at
    _pool, _at = b"", _POOL_BYTES


os.register_at_fork(after_in_child=_forget)


def new_id() -> str:
    """A new random id: 128 bits from ``os.urandom``, as 32 lowercase hex digits."""
    global _pool, _at
    with _lock:
        if _at >= len(_pool):
            _pool, _at = os.urandom(_POOL_BYTES), 0
        chunk = _pool[_at:_at + _ID_BYTES]
        _at += _ID_BYTES
    return chunk.hex()
