"""One gateway's data: the warehouse made on first use, queried within a scope.

The warehouse is opened, and prepared, the first time anything needs it: the datasets the
configuration registers are loaded when missing or changed, and on the very first run the
demo dataset is made (once: removing it keeps it removed). Nothing here is imported or done
at start-up, so a gateway that never touches data pays nothing for it.

Files sent in a chat belong to that conversation: the owner of such a dataset is the
session key of the chat it was sent in, so it stays with the chat across `/new`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pluto.runtime.files import SharedFiles
from pluto.errors import StorageError

from .filetypes import FORMATS, MIME_FORMATS, SPREADSHEETS

if TYPE_CHECKING:  # DuckDB is imported on first use, not with this module
    from .ingest_limits import IngestLimits
    from .sandbox import QueryResult
    from .warehouse import DatasetInfo, Scope, Warehouse

log = logging.getLogger(__name__)

DEMO_MARK = ".demo-made"


@dataclass(frozen=True, slots=True)
class DatasetSource:
    """A file or folder the configuration registers as a global dataset."""

    name: str
    path: Path


@dataclass(frozen=True, slots=True)
class QueryLimits:
    timeout: float = 10.0  # seconds per query
    memory_limit: str = "256MB"  # per query
    threads: int = 1
    csv_max_rows: int = 1_000_000  # rows kept in a query's CSV artifact


@dataclass(frozen=True, slots=True)
class Retention:
    """How long files sent in chats (``uploads/``) and results and charts (``artifacts/``)
    are kept: at most ``max_age_days`` old, at most ``max_total_bytes`` together (the oldest
    go first). Datasets are not touched: they stay until removed."""

    max_age_days: float = 30.0
    max_total_bytes: int = 2 * 2**30
    every_seconds: float = 600.0  # how often a sweep runs at most


class DataService:
    def __init__(self, data_dir: Path, sources: Sequence[DatasetSource] = (), *,
                 demo: bool = True, max_upload_bytes: int = 100 * 2**20,
                 limits: QueryLimits = QueryLimits(), retention: Retention = Retention(),
                 ingest: IngestLimits | None = None, files: SharedFiles | None = None) -> None:
        self.data_dir = Path(data_dir).absolute()
        # several instances: datasets, results and charts in the shared file store too
        self.files = files if files is not None else SharedFiles(self.data_dir)
        self._syncing: asyncio.Lock | None = None
        self.root = self.data_dir / "datasets"
        self.artifacts = self.data_dir / "artifacts"
        self.uploads = self.data_dir / "uploads"
        self.retention = retention
        self.ingest_limits = ingest
        self._swept = 0.0  # time.monotonic() of the last sweep
        self.sources = tuple(sources)
        self.demo = demo
        self.max_upload_bytes = max_upload_bytes
        self.limits = limits
        self.problems: list[str] = []  # registered datasets that could not be loaded
        self._warehouse: Warehouse | None = None
        self._lock = threading.Lock()

    # ---- the warehouse, prepared once --------------------------------------------------

    def warehouse(self) -> Warehouse:
        """The warehouse, prepared on the first call (blocking: from async code use `ready`)."""
        with self._lock:
            if self._warehouse is None:
                from .warehouse import Warehouse

                from .ingest_limits import IngestLimits

                warehouse = Warehouse(self.root, max_file_bytes=2**40,  # admins' files: no cap
                                      limits=self.ingest_limits or IngestLimits())
                self._load_sources(warehouse)
                self._make_demo(warehouse)
                self._warehouse = warehouse
            return self._warehouse

    async def ready(self) -> Warehouse:
        return await asyncio.to_thread(self.warehouse)

    def _load_sources(self, warehouse: Warehouse) -> None:
        from .ingest import DatasetError, source_fingerprint

        for source in self.sources:
            try:
                current = source_fingerprint(source.path)
                known = {d.name: d for d in warehouse.list()}.get(source.name)
                if known is not None and known.owner is None and known.fingerprint == current:
                    continue
                info = warehouse.ingest(source.path, source.name, replace=True)
                log.info("dataset %s loaded from %s: %d rows", info.name, source.path, info.rows)
            except (DatasetError, OSError) as e:
                problem = f"dataset {source.name} ({source.path}): {e}"
                self.problems.append(problem)
                log.error("%s", problem)

    def _make_demo(self, warehouse: Warehouse) -> None:
        mark = self.root / DEMO_MARK
        if not self.demo or mark.exists():
            return
        from .demo import ensure_demo
        from .ingest import DatasetError

        try:
            ensure_demo(warehouse)
        except DatasetError as e:  # e.g. another process made it at the same moment
            log.info("demo dataset not made: %s", e)
        except Exception:
            log.exception("the demo dataset could not be made")
            return
        mark.touch()

    # ---- reading -----------------------------------------------------------------------

    @staticmethod
    def scope(owner: str | None, allowed: Sequence[str] | str) -> Scope:
        """What a conversation sees: its own uploads, and the global datasets its agent lists
        (``"*"``: all of them)."""
        from .warehouse import Scope

        if isinstance(allowed, str):
            allowed = "*" if allowed == "*" else (allowed,)
        return Scope(owner, allowed)

    async def visible(self, scope: Scope | None) -> list[DatasetInfo]:
        warehouse = await self.synced(scope)
        return await asyncio.to_thread(warehouse.list, scope)

    async def get(self, name: str, scope: Scope | None) -> DatasetInfo:
        warehouse = await self.synced(scope)
        return await asyncio.to_thread(warehouse.get, name, scope)

    async def query(self, sql: str, scope: Scope | None, *, max_rows: int = 1000,
                    csv_path: Path | None = None) -> QueryResult:
        warehouse = await self.synced(scope)
        if self.sweep_due():
            await asyncio.to_thread(self.sweep)
            await self._prune_shared()
        limits = self.limits
        return await warehouse.query(sql, scope, timeout=limits.timeout, max_rows=max_rows,
                                     memory_limit=limits.memory_limit, threads=limits.threads,
                                     csv_path=csv_path, csv_max_rows=limits.csv_max_rows)

    def artifact(self, run_id: str, stem: str, suffix: str) -> Path:
        """A new file path under ``artifacts/<run_id>/`` (the directory is made)."""
        folder = self.artifacts / (re.sub(r"[^A-Za-z0-9_-]", "_", run_id)[:64] or "run")
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{stem}-{uuid.uuid4().hex[:8]}{suffix}"

    async def publish(self, path: Path) -> bool:
        """Keep an artifact (a result, a chart) in the shared file store, so that a link to it
        works on every instance; False (logged) when it could not be kept."""
        try:
            await self.files.publish(path)
        except (StorageError, OSError) as e:
            log.warning("%s is only on this instance: %s", path.name, e)
            return False
        return True

    # ---- several instances: datasets in the shared file store ---------------------------

    async def synced(self, scope: Scope | None = None) -> Warehouse:
        """The warehouse, with the datasets other instances loaded or removed since the last
        look brought here (one query): the changed files ``scope`` can see are fetched (all
        of them without a scope); the names of the others are known, and kept free."""
        warehouse = await self.ready()
        if not self.files.shared:
            return warehouse
        if self._syncing is None:
            self._syncing = asyncio.Lock()
        async with self._syncing:
            try:
                listed = await self.files.blobs.listing("datasets/")
            except StorageError as e:  # the datasets of this instance still answer
                log.warning("datasets of other instances cannot be listed now: %s", e)
                return warehouse
            remote = {key.removeprefix("datasets/").removesuffix(".duckdb"): (sha, meta)
                      for key, _, sha, meta in listed if key.endswith(".duckdb")}
            local = {d.name: d for d in await asyncio.to_thread(warehouse.list)}
            warehouse.elsewhere = set(remote) - set(local)
            for name, (sha, meta) in remote.items():
                mine = local.get(name)
                if mine is not None and (mine.blob == sha or not mine.blob and mine.owner is None):
                    continue  # up to date; or an admin's dataset of this instance
                if _sees(scope, name, meta):
                    await self._adopt(warehouse, name, sha, meta)
            for name, mine in local.items():
                if mine.blob and name not in remote:  # removed on another instance
                    await asyncio.to_thread(warehouse.forget, name)
        return warehouse

    async def _adopt(self, warehouse: Warehouse, name: str, sha: str, meta: str) -> None:
        import json

        tmp = self.root / f".ingest-{uuid.uuid4().hex}.duckdb"
        try:
            if await self.files.blobs.fetch(_dataset_key(name), tmp):
                await asyncio.to_thread(warehouse.adopt, name, json.loads(meta), tmp, sha)
                log.info("dataset %s fetched from the shared file store", name)
        except (StorageError, ValueError, KeyError, OSError) as e:
            log.warning("dataset %s could not be fetched from the shared file store: %s",
                        name, e)
        finally:
            tmp.unlink(missing_ok=True)

    async def _share_dataset(self, info: DatasetInfo) -> DatasetInfo:
        import dataclasses
        import json

        from .ingest import DatasetError
        from .warehouse import entry_of

        warehouse = await self.ready()
        try:
            sha = await self.files.publish(info.path, meta=json.dumps(entry_of(info)))
        except StorageError as e:
            await asyncio.to_thread(warehouse.forget, info.name)
            raise DatasetError(f"{info.source} could not be kept for every instance: {e}") \
                from None
        except BaseException:
            await asyncio.to_thread(warehouse.forget, info.name)
            raise
        await asyncio.to_thread(warehouse.mark_shared, info.name, sha)
        return dataclasses.replace(info, blob=sha)

    async def _prune_shared(self) -> None:
        """The retention policy for the shared copies of results, charts and files sent."""
        if not self.files.shared:
            return
        try:
            gone = await self.files.blobs.prune(
                ("artifacts/", "uploads/"), time.time() - self.retention.max_age_days * 86400,
                self.files.max_total)
        except StorageError as e:
            log.warning("retention of the shared file store failed: %s", e)
            return
        if gone:
            log.info("retention: deleted %d old file(s) from the shared file store", gone)

    # ---- changing ----------------------------------------------------------------------

    async def add_upload(self, path: Path, filename: str, mime_type: str,
                         owner: str) -> DatasetInfo:
        """A file sent in a chat, as a dataset of that conversation. Sending a file of the
        same name again replaces the conversation's own dataset of that name. Several
        instances: the dataset is kept in the shared file store too, so that every instance
        can query it (one over the store's caps is refused, and not kept here either)."""
        await self.synced(self.scope(owner, ()))  # its own datasets: one may be replaced
        info = await asyncio.to_thread(self._add_upload, Path(path), filename, mime_type, owner)
        if self.files.shared:
            info = await self._share_dataset(info)
        return info

    def _add_upload(self, path: Path, filename: str, mime_type: str, owner: str) -> DatasetInfo:
        from .ingest import DatasetError, human_size
        from .warehouse import dataset_name

        warehouse = self.warehouse()
        filename = upload_filename(filename, mime_type)
        size = path.stat().st_size if path.is_file() else 0
        if size > self.max_upload_bytes:
            self._discard(path)  # refused: not kept on disk a moment longer
            raise DatasetError(f"{filename} is {human_size(size)}; files sent in a chat may be "
                               f"at most {human_size(self.max_upload_bytes)}.")
        if self.sweep_due():
            self.sweep()
        staging = self.root / f".upload-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            staged = staging / filename
            os.symlink(path.resolve(), staged)
            name = dataset_name(staged)
            mine = {d.name: d for d in warehouse.list()}.get(name)
            replace = mine is not None and mine.owner == owner
            return warehouse.ingest(staged, name if replace else None, owner=owner,
                                    replace=replace)
        except DatasetError:
            self._discard(path)  # a refused file is not kept
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _discard(self, path: Path) -> None:
        """Delete a file sent in a chat, when it is one (under ``uploads/``)."""
        try:
            if path.resolve().is_relative_to(self.uploads.resolve()):
                path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not delete the refused upload %s: %s", path.name, e)

    # ---- retention ---------------------------------------------------------------------

    def sweep_due(self) -> bool:
        return time.monotonic() - self._swept >= self.retention.every_seconds or not self._swept

    def sweep(self, now: float | None = None) -> int:
        """Apply the retention policy to ``uploads/`` and ``artifacts/``: delete files older
        than the age limit, then the oldest until the rest fit the size limit. Blocking (call
        it in a thread). Returns how many files were deleted."""
        self._swept = time.monotonic()
        now = time.time() if now is None else now
        files: list[tuple[float, int, Path]] = []
        for top in (self.uploads, self.artifacts):
            for dirpath, _, names in os.walk(top):
                for name in names:
                    path = Path(dirpath) / name
                    try:
                        st = path.lstat()
                    except OSError:
                        continue
                    files.append((st.st_mtime, st.st_size, path))
        files.sort()
        oldest_kept = now - self.retention.max_age_days * 86400
        total = sum(size for _, size, _ in files)
        deleted = 0
        for mtime, size, path in files:
            if mtime >= oldest_kept and total <= self.retention.max_total_bytes:
                break
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            deleted += 1
        for top in (self.uploads, self.artifacts):
            _remove_empty_dirs(top)
        deleted += self._leftovers(now)
        if deleted:
            log.info("retention: deleted %d old upload and artifact file(s)", deleted)
        return deleted

    async def remove(self, name: str, scope: Scope | None) -> None:
        warehouse = await self.synced(scope)
        dataset = await asyncio.to_thread(warehouse.get, name, scope)
        await asyncio.to_thread(warehouse.remove, name, scope)
        if dataset.blob:
            await self.files.forget(_dataset_key(name))


    def _leftovers(self, now: float, settle: float = 86400.0) -> int:
        """Half-made loads a killed process left in ``datasets/`` (``.ingest-*``, ``.upload-*``)
        a day ago or more: no load takes that long."""
        found = 0
        for path in self.root.glob(".*"):
            if not path.name.startswith((".ingest-", ".upload-")):
                continue
            try:
                if path.lstat().st_mtime > now - settle:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                found += 1
            except OSError:
                continue
        return found


def _dataset_key(name: str) -> str:
    return f"datasets/{name}.duckdb"


def _sees(scope: Scope | None, name: str, meta: str) -> bool:
    """Whether ``scope`` sees a dataset kept in the shared file store (its catalog entry)."""
    import json

    if scope is None:
        return True
    try:
        owner = json.loads(meta).get("owner")
    except (ValueError, AttributeError):
        return False
    if owner is not None:
        return owner == scope.session_id
    return scope.allowed == "*" or name in scope.allowed


def _remove_empty_dirs(top: Path, settle: float = 3600.0) -> None:
    """Remove empty folders not changed for ``settle`` seconds (a run's new artifacts folder
    is empty until its first file is written)."""
    recent = time.time() - settle
    for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
        if Path(dirpath) != top:
            try:
                if os.stat(dirpath).st_mtime < recent:
                    os.rmdir(dirpath)
            except OSError:
                pass  # not empty, or gone


def is_data_file(filename: str, mime_type: str) -> bool:
    """Whether a file sent in a chat is meant as data (or is a spreadsheet to refuse)."""
    suffix = Path(filename).suffix.lower()
    return suffix in FORMATS or suffix in SPREADSHEETS or mime_type.lower() in MIME_FORMATS


def upload_filename(filename: str, mime_type: str) -> str:
    """A safe file name that keeps what the user called it, with a suffix DuckDB can read."""
    name = re.sub(r"[\x00-\x1f/\\]+", "_", Path(filename.replace("\\", "/")).name).strip(" .")
    name = name or "upload"
    stem, suffix = os.path.splitext(name)
    if suffix.lower() not in FORMATS and suffix.lower() not in SPREADSHEETS:
        extra = MIME_FORMATS.get(mime_type.lower())
        stem, suffix = (name, extra) if extra else (stem, suffix)
    return f"{stem[:100]}{suffix}"
