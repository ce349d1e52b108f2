"""The agent registry: finds agent directories, loads them lazily, keeps the recently used.

Listing reads only directory names, so a gateway with 10,000 agents starts at once; an agent's
files are read the first time it is needed, and again only when they change (checked by
modification time). At most ``cache_size`` agents are held in memory (least recently used go).

A run holds the :class:`AgentSpec` it started with, so a reload never changes a run mid-way.
An edit that breaks an agent does not take it down: the last good definition keeps serving and
the error is kept in :attr:`AgentRegistry.errors` (and logged once) until the files are fixed.

Agents deployed through the admin API live in the last directory (``<data_dir>/agents``) and
override a file-based agent of the same name; :func:`save_agent` writes them atomically.

Async code uses :meth:`AgentRegistry.load` and :meth:`AgentRegistry.list_names`: the files are
read in a worker thread, never on the event loop. ``get`` and ``names`` are the same, blocking,
for offline commands and for code already in a worker thread. The cache is shared by both, under
a lock held only around the cache itself (never while files are read).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from pluto.agents.spec import NAME_RE, AgentSpec, load_agent
from pluto.errors import ConfigError, UnknownAgent

log = logging.getLogger(__name__)

Stamp = tuple[str, int, int, int, int]  # resolved dir, its inode, newest mtime, files, bytes


@dataclass(slots=True)
class _Entry:
    stamp: Stamp
    spec: AgentSpec
    source: Path
    checked: float = 0.0  # monotonic time of the last look at the files


class AgentRegistry:
    def __init__(self, *dirs: Path, cache_size: int = 256, recheck_seconds: float = 0.25,
                 serve_stale_seconds: float = 2.0,
                 key_envs: Collection[str] = (),
                 known_tools: Collection[str] | Callable[[], Collection[str]] | None = None):
        self.dirs = list(dirs)
        self.key_envs = frozenset(key_envs)  # what an agent may name in api_key_env
        # the tools an agent may list, or a function that tells them (None: not checked)
        self.known_tools = known_tools
        self.cache_size = cache_size
        self.recheck_seconds = recheck_seconds  # files are looked at no more often than this
        # (async callers) a definition looked at less than this ago is served while the next
        # look is under way (:meth:`load`); older — or with recheck_seconds 0: files looked
        # at for every caller —, they wait for the look
        self.serve_stale_seconds = serve_stale_seconds
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self.errors: dict[str, ConfigError] = {}  # agents whose files are broken right now
        self._reported: dict[str, Stamp] = {}
        self._lock = threading.Lock()  # the cache, errors and _reported; never held over I/O
        # (per event loop) the look at an agent's files under way: callers meanwhile share it
        self._looking: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future[AgentSpec]] = {}

    async def load(self, name: str) -> AgentSpec:
        """:meth:`get` for async code: a definition looked at a moment ago comes from memory,
        else the files are checked (and read if changed) in a worker thread — once for every
        caller that asks meanwhile (a burst of messages when the last look gets old would
        otherwise send each to a thread to look at the same files).

        While that look is under way, a definition looked at less than
        :attr:`serve_stale_seconds` ago is served as it is: the look goes on behind the
        callers, not in front of them. On a busy loop the worker thread waits for the
        interpreter's lock at every file system call, and the callers for the loop's turns
        after it: in a burst of 1,000 questions, a quarter of them waited 85–310 ms here for
        files that had not changed. An edit is seen by the first message after the look."""
        now = time.monotonic()
        spec = self._recent(name, now)
        if spec is not None:
            return spec
        key = (asyncio.get_running_loop(), name)
        looking = self._looking.get(key)
        if looking is None:
            looking = self._looking[key] = asyncio.ensure_future(asyncio.to_thread(self.get, name))
            looking.add_done_callback(lambda done: self._looked(key, done))
        if self.recheck_seconds > 0 and (
                spec := self._recent(name, now, self.serve_stale_seconds)) is not None:
            return spec
        return await asyncio.shield(looking)  # (one caller cancelled: the others still wait)

    def _looked(self, key: tuple[asyncio.AbstractEventLoop, str],
                done: asyncio.Future[AgentSpec]) -> None:
        if self._looking.get(key) is done:
            del self._looking[key]
        if not done.cancelled():
            done.exception()  # (retrieved: every caller that waited has raised it already)

    async def list_names(self) -> list[str]:
        """:meth:`names` for async code: the directories are listed in a worker thread."""
        return await asyncio.to_thread(self.names)

    def names(self) -> list[str]:
        found: set[str] = set()
        for d in self.dirs:
            if d.is_dir():
                found.update(p.name for p in d.iterdir()
                             if NAME_RE.fullmatch(p.name) and _defines_agent(p))
        return sorted(found)

    def __contains__(self, name: str) -> bool:
        return self.dir_of(name) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)  # agents held in memory

    def dir_of(self, name: str) -> Path | None:
        if not NAME_RE.fullmatch(name):
            return None
        for d in reversed(self.dirs):  # later dirs (dynamic agents) override earlier ones
            if _defines_agent(d / name):
                return d / name
        return None

    def get(self, name: str) -> AgentSpec:
        """The agent's current definition, or the last good one while its files are broken.
        Blocking (file system calls): from async code use :meth:`load`.

        Raises :class:`UnknownAgent`, or :class:`ConfigError` when it has never loaded."""
        now = time.monotonic()
        spec = self._recent(name, now)
        if spec is not None:
            return spec  # looked at a moment ago: no file system calls
        with self._lock:
            entry = self._cache.get(name)
        agent_dir = self.dir_of(name)
        if agent_dir is None and entry is not None and entry.source.is_dir():
            agent_dir = entry.source  # agent.yaml is gone mid-edit: a broken edit, not a removal
        if agent_dir is None:
            with self._lock:
                self._cache.pop(name, None)
                self.errors.pop(name, None)
            raise UnknownAgent(name)
        stamp = _stamp(agent_dir)
        kept = entry if entry is not None and entry.source == agent_dir else None
        if kept is not None and kept.stamp == stamp:
            with self._lock:
                kept.checked = now
                self._touch(name)
            return kept.spec
        try:
            spec = load_checked(agent_dir, self.key_envs, self.known_tool_names(),
                                self.__contains__)
        except ConfigError as e:
            self._broken(name, e, stamp, kept)
            if kept is not None:
                return kept.spec
            raise
        self._store(name, _Entry(stamp, spec, agent_dir, now), replaced=entry is not None)
        return spec

    def _broken(self, name: str, e: ConfigError, stamp: Stamp, kept: _Entry | None) -> None:
        with self._lock:
            self.errors[name] = e
            report = self._reported.get(name) != stamp
            self._reported[name] = stamp
            if kept is not None:
                self._touch(name)
        if report:
            log.error("agent %s: its files have errors%s:\n%s", name,
                      "; the last good definition keeps serving" if kept else "", e)

    def _store(self, name: str, entry: _Entry, *, replaced: bool) -> None:
        with self._lock:
            fixed = self.errors.pop(name, None) is not None
            self._reported.pop(name, None)
            current = self._cache.get(name)
            if current is None or current.checked <= entry.checked:  # not older than it
                self._cache[name] = entry
                self._touch(name)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if fixed:
            log.info("agent %s: fixed, reloaded", name)
        elif replaced:
            log.info("agent %s: changed, reloaded", name)

    def _recent(self, name: str, now: float, within: float | None = None) -> AgentSpec | None:
        """The cached definition if its files were looked at less than ``within`` seconds
        ago (default: recheck_seconds)."""
        with self._lock:
            entry = self._cache.get(name)
            if entry is None or now - entry.checked >= (
                    self.recheck_seconds if within is None else within):
                return None
            self._cache.move_to_end(name)
            return entry.spec

    def _touch(self, name: str) -> None:
        if name in self._cache:  # (with the lock held) another thread may have evicted it
            self._cache.move_to_end(name)

    def load_fresh(self, name: str) -> AgentSpec:
        """Load from the files, ignoring the cache; raises on any error (for checks)."""
        agent_dir = self.dir_of(name)
        if agent_dir is None:
            raise UnknownAgent(name)
        return load_checked(agent_dir, self.key_envs, self.known_tool_names(),
                            self.__contains__)

    def known_tool_names(self) -> Collection[str] | None:
        """What ``tools:`` may name (None: not checked)."""
        known = self.known_tools
        return known() if callable(known) else known

    def allow_key_envs(self, key_envs: Collection[str]) -> None:
        """``agents.api_key_envs`` changed in pluto.yaml: every agent is looked at again."""
        with self._lock:
            changed = frozenset(key_envs) != self.key_envs
            self.key_envs = frozenset(key_envs)
            if changed:  # the files did not change, so their stamps alone would not tell
                self._cache.clear()
                self._reported.clear()

    def forget(self, name: str) -> None:
        """Look at the agent's files again on its next use (they were just written)."""
        with self._lock:
            if (entry := self._cache.get(name)) is not None:
                entry.checked = 0.0

    def refresh(self) -> dict[str, ConfigError]:
        """Reload the agents in memory whose files changed; return the current errors.
        Blocking: async code runs it in a worker thread."""
        with self._lock:
            held = list(self._cache)
        for name in held:
            self.forget(name)
            try:
                self.get(name)
            except (UnknownAgent, ConfigError):
                with self._lock:
                    self._cache.pop(name, None)
        with self._lock:
            orphans = [n for n in self.errors if n not in self._cache]
        for name in orphans:
            if self.dir_of(name) is None:
                with self._lock:
                    self.errors.pop(name, None)
        with self._lock:
            return dict(self.errors)

    def check_all(self) -> list[ConfigError]:
        """Load every agent from its files; return the errors (for checks, not for serving)."""
        errors = []
        for name in self.names():
            try:
                self.load_fresh(name)
            except ConfigError as e:
                errors.append(e)
        return errors

    def is_dynamic(self, name: str) -> bool:
        """Whether the agent comes from the last directory (the admin API's)."""
        found = self.dir_of(name)
        return found is not None and len(self.dirs) > 1 and found.parent == self.dirs[-1]


def load_checked(agent_dir: Path, key_envs: Collection[str] = (),
                 known_tools: Collection[str] | None = None,
                 is_agent: Callable[[str], bool] | None = None) -> AgentSpec:
    """:func:`load_agent`, with any failure reported as a :class:`ConfigError` naming the file
    (a YAML nested too deeply, an unreadable path), never as a crash."""
    try:
        return load_agent(agent_dir, key_envs, known_tools, is_agent)
    except ConfigError:
        raise
    except RecursionError:
        problem = "the YAML is nested too deeply"
    except (OSError, ValueError, TypeError) as e:
        problem = f"cannot load the agent: {e}"
    raise ConfigError([(str(agent_dir / "agent.yaml"), None, "", problem)])


def _defines_agent(agent_dir: Path) -> bool:
    """An ``agent.yaml`` is there: a file — or something else (a FIFO, a directory), which
    loading then refuses with a ConfigError rather than calling the agent unknown."""
    return (agent_dir / "agent.yaml").exists()


def _stamp(agent_dir: Path) -> Stamp:
    newest = count = size = 0
    try:
        for p in agent_dir.iterdir():
            if p.is_file():
                st = p.stat()
                newest, count, size = max(newest, st.st_mtime_ns), count + 1, size + st.st_size
        return (str(agent_dir.resolve()), agent_dir.stat().st_ino, newest, count, size)
    except OSError:
        return (str(agent_dir), 0, 0, 0, 0)


# agents written through the admin API ----------------------------------------------------------

def stage_agent(root: Path, name: str, files: dict[str, bytes]) -> Path:
    """Write an agent's files into a fresh staging directory under ``root`` (not yet live).

    Returns ``<root>/.staging/<id>/<name>``, which :func:`load_agent` can validate and
    :func:`publish_agent` puts in place."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"invalid agent name {name!r}")
    staged = root / ".staging" / uuid.uuid4().hex / name
    staged.mkdir(parents=True)
    for filename, data in files.items():
        path = staged / filename
        if path.parent != staged:
            raise ValueError(f"invalid file name {filename!r}")
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return staged


def publish_agent(root: Path, staged: Path) -> bool:
    """Put a staged agent in place of ``<root>/<name>``; True when it replaced one.

    Two renames within one call: nothing else in this process runs in between."""
    final = root / staged.name
    old = None
    if final.exists():
        old = root / ".staging" / f"old-{uuid.uuid4().hex}"
        os.rename(final, old)
    os.rename(staged, final)
    shutil.rmtree(staged.parent, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(root)
    return old is not None


def remove_agent(root: Path, name: str) -> bool:
    final = root / name
    if not NAME_RE.fullmatch(name) or not final.is_dir():
        return False
    trash = root / ".staging" / f"old-{uuid.uuid4().hex}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    os.rename(final, trash)
    shutil.rmtree(trash, ignore_errors=True)
    _fsync_dir(root)
    return True


def discard_staged(staged: Path) -> None:
    shutil.rmtree(staged.parent, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
