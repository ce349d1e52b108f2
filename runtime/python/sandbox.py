"""The Python sandbox: bubblewrap around one interpreter per piece of code, a few kept warm.

A sandbox is ``bwrap`` (Debian's ``bubblewrap``) starting ``runner.py``:

- new network (only a loopback of its own), PID (it sees its own processes; the gateway is not
  in its ``/proc``), IPC, UTS and cgroup namespaces;
- a root of nothing but read-only binds: the system's shared libraries (``/usr/lib``), the
  interpreter and its standard library (site-packages hidden under an empty tmpfs) and, at
  ``/site``, only the packages of numpy, pandas, matplotlib and duckdb and what they need. No
  ``/etc``, no home, no gateway configuration, data dir or secrets; the environment cleared;
- ``/work`` (the current directory) and ``/tmp``: small tmpfs, writable, gone at exit;
- an unprivileged user: as root, bwrap (privileged) hands over to ``setpriv`` which drops to a
  uid of its own per sandbox (``BASE_UID + slot``) with no capabilities and ``no_new_privs``;
  as any other user, a user namespace (``--unshare-user --disable-userns``). Root would ignore
  RLIMIT_NPROC; these users do not;
- rlimits (set by the runner on itself once its libraries are imported): CPU time, address
  space, processes, open files, file size;
- a wall-clock timeout here: the outer bwrap is killed (SIGKILL to its process group), so its
  PID namespace's init dies and the kernel kills everything in the namespace.

The datasets the conversation may read are passed as open read-only file descriptors
(SCM_RIGHTS over the request socket) and attached by DuckDB inside, so a sandbox started
before the question (warm) can still be given exactly that conversation's data.

Results cross back as length-prefixed frames: one JSON header, then raw bytes (PNGs, files,
CSVs) that the header counts — never pickle; every size is capped here.

Without bwrap, or where it cannot create its namespaces, :func:`unavailable` says why in one
sentence and nothing runs: there is no unsandboxed fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pluto.errors import PlutoError

log = logging.getLogger(__name__)

RUNNER = Path(__file__).resolve().with_name("runner.py")
PACKAGES = ("numpy", "pandas", "matplotlib", "duckdb", "pytz")  # and what they require
BASE_UID = 1_560_000  # root: sandbox n runs as uid BASE_UID + n (no such user exists)
SLOTS = 64
READY_TIMEOUT = 60.0  # seconds for a cold interpreter to import pandas and matplotlib
HEADER_LIMIT = 4 * 2**20
MAX_CODE = 100_000  # characters of code per run


class SandboxError(PlutoError):
    """The code could not run, or did not finish; the message is for the model."""


class SandboxUnavailable(SandboxError):
    """No sandbox here (bwrap missing or refused): run_python is off."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout: float = 30.0  # wall-clock seconds per run
    cpu_seconds: int = 30  # CPU time per process
    memory_mb: int = 1024  # address space beyond the warm interpreter's
    processes: int = 16  # tasks (threads count) of the sandbox's user; each may use memory_mb
    open_files: int = 64
    file_mb: int = 16  # the largest file written; each file offered
    files_mb: int = 32  # all files offered together
    work_mb: int = 64  # the tmpfs of /work, and of /tmp
    max_files: int = 10
    max_figures: int = 5
    max_tables: int = 5
    table_rows: int = 100  # rows of each table sent back (the CSV has them all)
    csv_bytes: int = 8 * 2**20
    figure_pixels: int = 4_000_000
    output_chars: int = 20_000  # of stdout, and of stderr
    idle_seconds: float = 600.0  # a warm sandbox nobody used exits

    def runner_args(self) -> str:
        return json.dumps(asdict(self))

    def reply_limit(self) -> int:
        return (HEADER_LIMIT + self.files_mb * 2**20 + self.max_figures * 8 * 2**20
                + self.max_tables * self.csv_bytes)


@dataclass(slots=True)
class Figure:
    png: bytes
    title: str


@dataclass(slots=True)
class Table:
    name: str
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    total_rows: int
    csv: bytes | None


@dataclass(slots=True)
class Outcome:
    """What one run gave back, checked."""

    stdout: str = ""
    stderr: str = ""
    dropped: int = 0  # characters of output not kept
    error: str | None = None
    memory: bool = False  # the error is a MemoryError
    value: str | None = None  # repr of the last expression, when not a table
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    warm: bool = False


# ---- where it can run --------------------------------------------------------------------


def _which(name: str) -> str | None:
    found = shutil.which(name)
    return found if found is None else os.path.realpath(found)


@functools.cache
def _requirements() -> tuple[tuple[Path, str], ...]:
    """(site dir, top-level entry) of each allowed package and what it requires."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    seen: set[str] = set()
    entries: dict[str, Path] = {}
    todo = list(PACKAGES)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SandboxUnavailable(f"the package {name} is not installed") from None
        base = Path(str(dist.locate_file(""))).resolve()
        for file in dist.files or ():
            parts = file.parts
            if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(".pth"):
                entries.setdefault(parts[0], base)
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return tuple(sorted((base, entry) for entry, base in entries.items()))


def _ro(path: str | Path, where: str | Path | None = None) -> list[str]:
    return ["--ro-bind", str(path), str(where or path)]


@functools.cache
def _layout() -> tuple[str, ...]:
    """The bwrap options for the file system (the same for every sandbox)."""
    exe = Path(sys.executable).resolve()
    stdlib = Path(sysconfig.get_path("stdlib")).resolve()
    options = ["--dev", "/dev", "--proc", "/proc"]
    for top in ("/usr/lib", "/usr/lib64"):
        if os.path.isdir(top):
            options += _ro(top)
    for link in ("/lib", "/lib64"):
        target = os.readlink(link) if os.path.islink(link) else None
        if target is not None:
            options += ["--symlink", target, link]
        elif os.path.isdir(link):
            options += _ro(link)
    for extra in ("/etc/ld.so.cache", "/usr/share/zoneinfo"):
        if os.path.exists(extra):
            options += _ro(extra)
    options += _ro(exe) + _ro(stdlib)
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and library and os.path.exists(os.path.join(libdir, library)) \
            and not os.path.realpath(libdir).startswith("/usr/lib"):
        options += _ro(os.path.realpath(os.path.join(libdir, library)),
                       os.path.join(libdir, library))
    for site in {Path(p).resolve() for p in sysconfig.get_paths().values()}:
        if site.is_relative_to(stdlib) and site != stdlib and site.is_dir():
            options += ["--tmpfs", str(site)]  # the gateway's packages: hidden
    options += ["--perms", "0755", "--dir", "/site"]
    for base, entry in _requirements():
        options += _ro(base / entry, f"/site/{entry}")
    options += _ro(RUNNER, "/pluto/runner.py")
    return ("--tmpfs", "/", *_parents(options), *options)


def _parents(options: list[str]) -> list[str]:
    """``--perms 0755 --dir`` for each folder above a mount point that is not itself inside
    a mount (bwrap would make them 0700, closed to the sandbox's user)."""
    binds = [options[i + 2] for i, o in enumerate(options) if o in ("--ro-bind", "--symlink")]
    binds += [options[i + 1] for i, o in enumerate(options) if o in ("--tmpfs", "--dir")]
    mounts = [Path(b) for b in binds]
    folders: set[Path] = set()
    for mount in mounts:
        for parent in mount.parents:
            if parent != Path("/") and not any(parent.is_relative_to(m) for m in mounts):
                folders.add(parent)
    out: list[str] = []
    for folder in sorted(folders, key=lambda p: (len(p.parts), str(p))):
        out += ["--perms", "0755", "--dir", str(folder)]
    return out


def _identity(slot: int) -> tuple[list[str], list[str]]:
    """(bwrap options, the command before python) for the unprivileged user."""
    if os.geteuid() != 0:
        return ["--unshare-user", "--disable-userns"], []
    uid = BASE_UID + slot
    setpriv = _which("setpriv")
    assert setpriv is not None
    return ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", *_ro(setpriv)], [
        setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--bounding-set=-all", "--"]


def command(limits: Limits, slot: int, *python: str,
            binds: Sequence[tuple[str, Path]] = ()) -> list[str]:
    """The full command line of sandbox number ``slot`` running ``python`` (arguments after
    the interpreter; default: the runner), with ``binds`` (datasets) read-only under /data."""
    bwrap = _which("bwrap")
    assert bwrap is not None
    ids, prefix = _identity(slot)
    work = str(limits.work_mb * 2**20)
    data = ["--perms", "0755", "--dir", "/data"] if binds else []
    for name, path in binds:
        data += _ro(path, f"/data/{name}.duckdb")
    return [bwrap, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            *_layout(), *ids, *data,
            "--perms", "1777", "--size", work, "--tmpfs", "/tmp",
            "--perms", "1777", "--size", work, "--tmpfs", "/work", "--chdir", "/work",
            "--clearenv", "--setenv", "HOME", "/work", "--setenv", "TMPDIR", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "MPLCONFIGDIR", "/tmp/matplotlib",
            "--setenv", "MPLBACKEND", "Agg", "--setenv", "OPENBLAS_NUM_THREADS", "1",
            "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "MALLOC_ARENA_MAX", "2",
            "--", *prefix, str(Path(sys.executable).resolve()), "-I", "-S", "-B",
            *(python or ("/pluto/runner.py", limits.runner_args()))]


_probe_lock = threading.Lock()
_probed: dict[str, str | None] = {}


def unavailable() -> str | None:
    """Why run_python cannot run here, in one sentence; None when it can. Tried once per
    process (a sandbox started and stopped, about 50 ms): call it off the event loop."""
    with _probe_lock:
        if "why" not in _probed:
            _probed["why"] = _probe()
            if _probed["why"]:
                log.warning("run_python is off: %s", _probed["why"])
        return _probed["why"]


def _reset_probe() -> None:
    """Forget the probe's answer (tests hide bwrap through PATH)."""
    with _probe_lock:
        _probed.clear()
    _layout.cache_clear()


def _probe() -> str | None:
    if _which("bwrap") is None:
        return ("bubblewrap (bwrap) is not installed, so run_python is off (code never runs "
                "unsandboxed): apt-get install bubblewrap")
    if os.geteuid() == 0 and _which("setpriv") is None:
        return ("setpriv (util-linux) is not installed, so run_python is off: the gateway runs "
                "as root and sandboxed code must not: apt-get install util-linux")
    try:
        argv = command(Limits(), SLOTS - 1, "-c", "import sys; sys.path.insert(0, '/site'); "
                       "import numpy, pandas, duckdb, matplotlib")
    except SandboxUnavailable as e:
        return f"{e}, so run_python is off: pip install 'pluto-gateway' with its dependencies"
    try:
        done = subprocess.run(argv, capture_output=True, timeout=READY_TIMEOUT, env={},
                              umask=0o022)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap could not be started ({e}), so run_python is off"
    if done.returncode != 0:
        said = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        return (f"bubblewrap cannot create its sandbox here ({said[:160]}), so run_python is "
                "off: allow user namespaces (or run the gateway where bwrap works)")
    return None


# ---- one sandbox -------------------------------------------------------------------------


_NO_ENV: dict[str, str] = {}  # nothing of the gateway's environment reaches bwrap


class _Slots:
    def __init__(self) -> None:
        self.free = set(range(SLOTS - 1))  # the last one is the probe's
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            if not self.free:
                raise SandboxError("Too many Python sandboxes are running; try again shortly.")
            return self.free.pop()

    def give(self, slot: int) -> None:
        with self.lock:
            self.free.add(slot)


_SLOTS = _Slots()


class Sandbox:
    """One started interpreter, used for one run (blocking methods: call them in a thread)."""

    def __init__(self, limits: Limits, binds: Sequence[tuple[str, Path]] = ()) -> None:
        self.limits = limits
        self.binds = tuple(binds)  # datasets bound read-only at start, instead of passed fds
        self.slot = _SLOTS.take()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = ours
        try:
            self.proc = subprocess.Popen(command(limits, self.slot, binds=self.binds),
                                         stdin=theirs.fileno(),
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         start_new_session=True, env=_NO_ENV, close_fds=True,
                                         umask=0o022)  # the mount points bwrap makes: 0755
        except BaseException:
            ours.close()
            _SLOTS.give(self.slot)
            raise
        finally:
            theirs.close()
        self.ready = False
        self.started = time.monotonic()
        self._released = False

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        frame = self._frame(time.monotonic() + timeout, HEADER_LIMIT)
        if frame is None or json.loads(frame).get("ready") is not True:
            raise SandboxError("The Python sandbox did not start.")
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, code: str, datasets: Sequence[tuple[str, Path]]) -> Outcome:
        """Send the code and the datasets, wait for the result (the wall-clock timeout)."""
        started = time.monotonic()
        deadline = started + self.limits.timeout
        fds: list[int] = []
        try:
            bound = {name for name, _ in self.binds}
            for name, path in datasets:
                if name not in bound:
                    fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
            request = json.dumps({"code": code, "datasets": [n for n, _ in datasets],
                                  "bound": sorted(bound)}).encode()
            data = struct.pack(">I", len(request)) + request
            sent = self.sock.sendmsg([data[: 1 << 16]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                          struct.pack(f"{len(fds)}i", *fds))]
                                     if fds else [])
            if sent < len(data):
                self.sock.sendall(data[sent:])
        except OSError as e:
            raise SandboxError(f"The code could not be handed to the sandbox ({e.strerror}).") \
                from None
        finally:
            for fd in fds:
                os.close(fd)
        outcome = self._result(deadline)
        outcome.elapsed = time.monotonic() - started
        return outcome

    def _result(self, deadline: float) -> Outcome:
        total = self.limits.reply_limit()
        head = self._frame(deadline, HEADER_LIMIT)
        if head is None:
            raise self._why_ended()
        try:
            header = json.loads(head)
            sizes = [int(n) for n in header["blobs"]][:64]
        except (ValueError, KeyError, TypeError):
            raise SandboxError("The sandbox sent a reply that is not valid.") from None
        if sum(sizes) > total:
            raise SandboxError("The code's results are too large to send back.")
        blobs = []
        for _ in sizes:
            blob = self._frame(deadline, total)
            if blob is None:
                raise self._why_ended()
            blobs.append(blob)
        return _outcome(header, blobs, self.limits)

    def _why_ended(self) -> SandboxError:
        if time.monotonic() >= self._deadline_seen:
            return SandboxError(f"The code ran longer than {self.limits.timeout:g} s and was "
                                "stopped. Work on less data, or simplify it.")
        try:
            code = self.proc.wait(timeout=5)  # (bwrap exits 128 + the signal that killed it)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL,
                    128 + signal.SIGKILL):
            return SandboxError("The code used up its CPU time or memory and was stopped.")
        return SandboxError(f"The Python sandbox ended before answering (exit code {code}).")

    _deadline_seen = float("inf")

    def _frame(self, deadline: float, limit: int) -> bytes | None:
        """One length-prefixed frame, or None (ended, timed out: the sandbox is killed)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()  # (select() fails for descriptors past 1023: a busy gateway)
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        size = None
        buffer = bytearray()
        while True:
            want = 4 if size is None else size
            while len(buffer) < want:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._deadline_seen = deadline
                    self.kill()
                    return None
                if not poller.poll(min(left, 1.0) * 1000):
                    continue
                chunk = os.read(fd, min(want - len(buffer), 1 << 20))
                if not chunk:
                    self.kill()
                    return None
                buffer += chunk
            if size is not None:
                return bytes(buffer)
            size = struct.unpack(">I", buffer)[0]
            if size > limit:
                self.kill()
                raise SandboxError("The sandbox sent more data than allowed.")
            buffer = bytearray()

    def kill(self) -> None:
        """SIGKILL to the outer bwrap's process group: its PID namespace dies with it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def close(self) -> None:
        """Kill and reap it, and give its slot back (blocking, briefly)."""
        if self._released:
            return
        self._released = True
        self.kill()
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        _SLOTS.give(self.slot)


def _outcome(header: dict[str, Any], blobs: list[bytes], limits: Limits) -> Outcome:
    """The runner's reply, checked field by field (it may have been forged by the code)."""
    def text(key: str, cap: int) -> str:
        value = header.get(key)
        return value[:cap] if isinstance(value, str) else ""

    def blob(index: Any) -> bytes | None:
        return blobs[index] if isinstance(index, int) and 0 <= index < len(blobs) else None

    out = Outcome(stdout=text("stdout", limits.output_chars),
                  stderr=text("stderr", limits.output_chars),
                  error=text("error", 4000) or None, memory=header.get("memory") is True,
                  value=text("value", 4000) or None)
    for key in ("stdout_dropped", "stderr_dropped"):
        if isinstance(header.get(key), int):
            out.dropped += max(0, header[key])
    out.notes = [n[:300] for n in header.get("notes") or [] if isinstance(n, str)][:20]
    for t in (header.get("tables") or [])[: limits.max_tables]:
        try:
            columns = [str(c)[:200] for c in t["columns"]][:500]
            rows = [[_cell(v) for v in row[: len(columns)]] for row in t["rows"]]
            out.tables.append(Table(str(t["name"])[:100], columns,
                                    [str(x)[:20] for x in t["types"]][: len(columns)],
                                    rows[: limits.table_rows], int(t["total_rows"]),
                                    blob(t.get("csv"))))
        except (KeyError, TypeError, ValueError):
            out.notes.append("a table the sandbox sent was not valid and was dropped")
    for f in (header.get("figures") or [])[: limits.max_figures]:
        png = blob(f.get("index")) if isinstance(f, dict) else None
        if png is not None and png.startswith(b"\x89PNG\r\n\x1a\n"):
            out.figures.append(Figure(png, str(f.get("title") or "")[:200]))
    for f in (header.get("files") or [])[: limits.max_files]:
        data = blob(f.get("index")) if isinstance(f, dict) else None
        if data is not None and isinstance(f.get("name"), str):
            out.files.append((f["name"], data))
    return out


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)[:1000]


def passable(datasets: Sequence[tuple[str, Path]]) -> bool:
    """Whether the datasets may go to a warm sandbox as open file descriptors: only when the
    sandbox's user can neither change the files' mode nor reopen them for writing through
    ``/proc/self/fd`` — the gateway runs as root (the sandbox as another uid, not the owner)
    and no file is writable by others. Otherwise (a gateway running as its own user: the
    sandbox shares its uid) they are bound read-only into a sandbox started for the run."""
    if os.geteuid() != 0:
        return False
    try:
        return all(not os.stat(path).st_mode & 0o002 for _, path in datasets)
    except OSError:
        return False


# ---- the pool ----------------------------------------------------------------------------


class Pool:
    """Up to ``warm`` sandboxes started ahead (libraries imported, waiting for code), each
    used once; at most ``max_running`` running code at a time. Loop-agnostic: its blocking
    work runs in its own threads, so one pool serves every event loop of the process."""

    def __init__(self, limits: Limits = Limits(), *, warm: int = 1, max_running: int = 4) -> None:
        self.limits = limits
        self.warm = warm
        self.max_running = max_running
        self._idle: list[Sandbox] = []
        self._starting = 0
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=max_running + warm + 1,
                                           thread_name_prefix="pluto-python")
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())
        self.closed = False

    @property
    def idle(self) -> int:
        """Sandboxes started and waiting for code (the warm pool)."""
        return len(self._idle)

    async def run(self, code: str, datasets: Sequence[tuple[str, Path]] = ()) -> Outcome:
        """Run ``code`` in a sandbox (a warm one when there is one) with ``datasets``
        attached; raises :class:`SandboxError` (or SandboxUnavailable)."""
        loop = asyncio.get_running_loop()
        why = await loop.run_in_executor(self._threads, unavailable)
        if why is not None:
            raise SandboxUnavailable(why)
        if len(code) > MAX_CODE:
            raise SandboxError(f"The code is longer than {MAX_CODE:,} characters; shorten it.")
        async with self._gates.setdefault(loop, asyncio.Semaphore(self.max_running)):
            taking = loop.run_in_executor(self._threads, self._take, tuple(datasets))
            try:
                sandbox, warm = await asyncio.shield(taking)
            except asyncio.CancelledError:  # the sandbox still starting is closed once up
                taking.add_done_callback(self._discard)
                raise
            self.refill()
            try:
                outcome = await loop.run_in_executor(self._threads, sandbox.run, code, datasets)
            except BaseException:
                sandbox.kill()  # cancelled, or failed: nothing of it keeps running
                raise
            finally:
                self._threads.submit(sandbox.close)
        outcome.warm = warm
        return outcome

    def _discard(self, taking: asyncio.Future[tuple[Sandbox, bool]]) -> None:
        if not taking.cancelled() and taking.exception() is None:
            self._threads.submit(taking.result()[0].close)

    def _take(self, datasets: Sequence[tuple[str, Path]] = ()) -> tuple[Sandbox, bool]:
        """A warm sandbox, or one started now (with the datasets bound, when they may not be
        passed as fds)."""
        binds = tuple(datasets) if datasets and not passable(datasets) else ()
        with self._lock:
            while self._idle and not binds:
                sandbox = self._idle.pop(0)
                if sandbox.alive():
                    return sandbox, True
                self._threads.submit(sandbox.close)
        sandbox = Sandbox(self.limits, binds)
        try:
            sandbox.wait_ready()
        except BaseException:
            sandbox.close()
            raise
        return sandbox, False

    def refill(self) -> None:
        """Start sandboxes in the background until ``warm`` are idle or starting."""
        with self._lock:
            wanted = self.warm - len(self._idle) - self._starting
            if self.closed or wanted <= 0:
                return
            self._starting += wanted
        for _ in range(wanted):
            self._threads.submit(self._start_one)

    def _start_one(self) -> None:
        sandbox = None
        try:
            if unavailable() is None:
                sandbox = Sandbox(self.limits)
                sandbox.wait_ready()
        except Exception as e:  # noqa: BLE001 - a warm one is an optimisation
            log.warning("a warm Python sandbox could not be started: %s", e)
            if sandbox is not None:
                sandbox.close()
            sandbox = None
        with self._lock:
            self._starting -= 1
            if sandbox is not None and not self.closed:
                self._idle.append(sandbox)
                sandbox = None
        if sandbox is not None:
            sandbox.close()

    def close(self) -> None:
        """Stop the idle sandboxes (blocking, briefly); running ones end with their run."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for sandbox in idle:
            sandbox.close()


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool(limits: Limits | None = None) -> Pool:
    """The process's pool (made on first use; ``limits`` count only then)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = Pool(limits or Limits())
        return _pool
