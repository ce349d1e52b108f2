"""The data dir's shared files (charts, results, files users sent, datasets), readable on
every instance.

A file is made in this instance's data dir as always, then :meth:`SharedFiles.publish` keeps a
copy in the store's blob store, under its path relative to the data dir. An instance that
needs a file it does not have (a chart another instance drew, linked in a chat; a dataset
loaded elsewhere) calls :meth:`SharedFiles.local`: the file is fetched from the blob store to
the same place in its own data dir — the cache, kept within bounds by the data retention
sweep — off the event loop, one fetch per file at a time.

With SQLite (one instance) nothing is copied or fetched: :meth:`publish` returns at once and
:meth:`local` only finds files that are there.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path, PurePosixPath

from pluto.storage.blobs import FOLDERS, BlobError, BlobNameRefused, LocalBlobs, check_key
from pluto.storage.ports import BlobStore

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 256 * 2**20  # one shared file (storage.files_max_mb)
MAX_TOTAL_BYTES = 4 * 2**30  # every shared file together (storage.files_max_total_mb)
FETCH_TIMEOUT = 120.0  # seconds to fetch one file from the blob store
PARALLEL_FETCHES = 4


class SharedFiles:
    def __init__(self, data_dir: Path, blobs: BlobStore | None = None, *,
                 max_bytes: int = MAX_FILE_BYTES, max_total: int = MAX_TOTAL_BYTES,
                 timeout: float = FETCH_TIMEOUT):
        self.data_dir = Path(data_dir).absolute()
        self.blobs: BlobStore = blobs if blobs is not None else LocalBlobs()
        self.max_bytes = max_bytes
        self.max_total = max_total
        self.timeout = timeout
        self._fetching: dict[str, asyncio.Future[Path | None]] = {}
        self._slots = asyncio.Semaphore(PARALLEL_FETCHES)

    @property
    def shared(self) -> bool:
        """Whether other instances read these files (a shared blob store)."""
        return bool(self.blobs.shared)

    def key(self, path: str | Path) -> str | None:
        """The blob key of a file of a data dir — given relative to it, absolute under this
        instance's, or absolute under another instance's (``…/artifacts/<run>/<file>``,
        ``…/uploads/…``) — or None when it names no shareable file."""
        raw = str(path)
        if "\x00" in raw or "\\" in raw:
            return None
        given = PurePosixPath(raw)
        parts = given.parts
        if given.is_absolute():
            root = self.data_dir.parts
            if parts[:len(root)] == root:
                parts = parts[len(root):]
            else:  # another instance's data dir: from its shared folder on
                at = next((i for i in range(len(parts) - 2, -1, -1) if parts[i] in FOLDERS), None)
                if at is None:
                    return None
                parts = parts[at:]
        try:
            return check_key("/".join(parts))
        except BlobNameRefused:
            return None

    def path(self, key: str) -> Path:
        return self.data_dir / check_key(key)

    async def publish(self, path: str | Path, *, meta: str = "") -> str:
        """Keep the file of this data dir at ``path`` in the blob store (nothing with one
        instance): its SHA-256, or ``""`` when nothing was kept. :class:`BlobTooLarge` past
        a cap, :class:`BlobNameRefused` for a file outside the shared folders."""
        if not self.shared:
            return ""
        key = self.key(path)
        if key is None:
            raise BlobNameRefused(f"{Path(path).name} is not under the data dir's "
                                  f"{', '.join(f + '/' for f in FOLDERS)}")
        return await self.blobs.put(key, self.path(key), meta=meta, max_bytes=self.max_bytes,
                                    max_total=self.max_total)

    async def forget(self, path: str | Path) -> None:
        """Remove a file from the blob store (its local copy is the caller's)."""
        key = self.key(path)
        if self.shared and key is not None:
            await self.blobs.delete(key)

    async def local(self, path: str | Path) -> Path | None:
        """The file in this data dir, fetched from the blob store when it is not here; None
        when it is nowhere (or the name is not a shareable file's). Storage errors raise."""
        key = self.key(path)
        if key is None:
            return None
        here = self._here(key)
        if here is not None or not self.shared:
            return here
        running = self._fetching.get(key)
        if running is None:
            running = asyncio.ensure_future(self._fetch(key))
            self._fetching[key] = running
            running.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(running)

    async def _fetch(self, key: str) -> Path | None:
        async with self._slots:
            try:
                found = await asyncio.wait_for(self.blobs.fetch(key, self.path(key)),
                                               self.timeout)
            except TimeoutError:
                raise BlobError(f"fetching {PurePosixPath(key).name} from the shared file "
                                f"store took longer than {self.timeout:g} s") from None
        if found:
            log.info("files: fetched %s from the shared file store", key)
        return self._here(key) if found else None

    def _here(self, key: str) -> Path | None:
        path = self.data_dir / key
        try:
            real = path.resolve()
            ok = real.is_relative_to(self.data_dir.resolve()) and real.is_file()
        except (OSError, ValueError):
            return None
        return real if ok else None
