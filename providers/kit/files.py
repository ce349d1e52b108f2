"""Files users send (downloaded under a size cap) and files a reply carries (read off the loop).

A person is told in one sentence why a file was not read (:func:`too_large`,
:func:`not_downloaded`); the file is then left out and the message goes on without it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import Literal

from pluto.errors import DeliveryRefused, PlutoError
from pluto.types import Attachment

MEGABYTE = 1024 * 1024
CHUNK = 64 * 1024  # bytes read at a time from a platform's download


class TooLarge(PlutoError):
    """A download went over its cap (it was stopped there)."""


def max_bytes(max_mb: float) -> int:
    """A ``max_download_mb`` setting in bytes."""
    return int(max_mb * MEGABYTE)


def too_large(name: str, max_mb: float) -> str:
    """What a person is told when their file is over the cap."""
    return f"The file {name} is too large for me to read (the limit is {max_mb:g} MB)."


def not_downloaded(name: str) -> str:
    """What a person is told when their file could not be fetched from the platform."""
    return f"I could not download the file {name}; please send it again."


def safe_filename(name: str) -> str:
    """A name that stays inside its folder: no separators, no leading dots, at most 100 chars."""
    base = re.sub(r"[^A-Za-z0-9._ -]+", "_", Path(name.replace("\\", "/")).name).strip(" .")
    return (base or "file")[-100:]


def kind_of(mime: str) -> Literal["file", "image"]:
    """``image`` for an ``image/*`` type, else ``file``."""
    return "image" if mime.startswith("image/") else "file"


async def save_stream(blocks: AsyncIterable[bytes], path: Path, limit: int,
                      each: Callable[[bytes], object] | None = None) -> int:
    """Write ``blocks`` to ``path`` (its folder made), file writes off the loop; the size.
    :class:`TooLarge` as soon as more than ``limit`` bytes came. ``each`` sees every block
    (a checksum). On any failure the partial file is removed."""
    size = 0
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    try:
        with await asyncio.to_thread(path.open, "wb") as out:
            async for block in blocks:
                size += len(block)
                if size > limit:
                    raise TooLarge(f"more than {limit} bytes")
                if each is not None:
                    each(block)
                await asyncio.to_thread(out.write, block)
    except BaseException:
        await asyncio.to_thread(path.unlink, missing_ok=True)
        raise
    return size


async def save_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (its folder made), off the loop."""
    await asyncio.to_thread(_save, path, data)


def _save(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def read_outgoing(attachment: Attachment, limit: int | None = None) -> bytes:
    """The bytes of a file a reply carries, read off the loop; :class:`DeliveryRefused` when
    it has no path, can no longer be read, or is over ``limit`` bytes (the platform's cap)."""
    if attachment.path is None:
        raise DeliveryRefused(f"the file {attachment.filename} has no path")
    try:
        data = await asyncio.to_thread(_read, attachment.path, limit)
    except OSError:
        raise DeliveryRefused(f"the file {attachment.filename} can no longer be read") from None
    if limit is not None and len(data) > limit:
        raise DeliveryRefused(f"the file {attachment.filename} is larger than the platform "
                              f"takes ({limit:,} bytes)")
    return data


def _read(path: Path, limit: int | None) -> bytes:
    if limit is None:
        return path.read_bytes()
    with path.open("rb") as f:
        return f.read(limit + 1)  # one byte more tells that it is over
