"""What runs inside the Python sandbox: one interpreter, one piece of code, then exit.

Run as a script (``python -I -S -B runner.py LIMITS``) inside bubblewrap, as an unprivileged
user, this file imports only the standard library and what the analysis needs (numpy, pandas,
matplotlib, duckdb) — nothing of Pluto. It:

1. imports those libraries (a warm sandbox does it before any code is known), limits itself
   (CPU time, address space, processes, open files, file size) and says ``ready``;
2. receives one request on fd 0 (a Unix socket): the code, and the datasets' files as open
   file descriptors (SCM_RIGHTS; the sandbox sees no path of the gateway's), then closes it;
3. runs the code with ``pd``, ``np``, ``plt``, ``sql(...)``, ``load(name)`` and ``show(df)``;
4. sends back one result on its private copy of fd 1: a JSON header (output, error, tables as
   JSON cells) followed by raw frames (PNG figures, files written to the work dir, CSVs).

Everything it sends is treated by the gateway as hostile input (sizes capped, JSON only,
PNG signatures checked): the code it runs could forge any of it.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import os
import re
import resource
import signal
import socket
import stat
import struct
import sys
import traceback
from typing import Any

LIMITS: dict[str, Any] = {}
_OUT: Any = None  # the protocol: a private copy of fd 1 (fd 1 and 2 go to /dev/null)
duckdb: Any = None
np: Any = None
pd: Any = None
plt: Any = None


def boot() -> None:
    """Take the protocol's fd, import the libraries (a warm sandbox does it ahead)."""
    global LIMITS, _OUT, duckdb, np, pd, plt
    LIMITS = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    os.nice(10)  # behind the gateway for the CPU (the code cannot undo it: RLIMIT_NICE is 0)
    _OUT = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sys.path.insert(0, "/site")  # the allowed packages, and nothing else
    import duckdb as _duckdb
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as _plt
    import numpy as _np
    import pandas as _pd

    duckdb, np, pd, plt = _duckdb, _np, _pd, _plt
    plt.figure()  # the font list is built now (warm), not when the code draws its first text
    plt.close("all")


WORK = "/work"
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def send(data: bytes) -> None:
    _OUT.write(struct.pack(">I", len(data)) + data)


def limit_resources() -> None:
    """Limits counted from what the warm interpreter already uses."""
    with open("/proc/self/status") as f:
        found = re.search(r"VmSize:\s+(\d+)", f.read())
    used_vm = int(found.group(1)) * 1024 if found else 0
    cpu_used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(cpu_used.ru_utime + cpu_used.ru_stime) + int(LIMITS.get("cpu_seconds", 30)) + 1
    memory = used_vm + int(LIMITS.get("memory_mb", 1024)) * 2**20
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails, not kills
    for kind, value in ((resource.RLIMIT_AS, memory),
                        (resource.RLIMIT_NOFILE, int(LIMITS.get("open_files", 64))),
                        (resource.RLIMIT_FSIZE, int(LIMITS.get("file_mb", 16)) * 2**20),
                        (resource.RLIMIT_NPROC, int(LIMITS.get("processes", 32))),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(kind, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))  # SIGXCPU, then SIGKILL


# seccomp: calls no analysis needs, that widen the kernel's surface (x86_64 numbers)
_DENIED_CALLS = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
    "perf_event_open": 298, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_by_handle_at": 304, "kexec_load": 246, "init_module": 175,
    "finit_module": 313, "swapon": 167, "reboot": 169, "acct": 163}
_DENIED_CALLS.update(fork=57, vfork=58)  # threads only: see deny_syscalls
_CLONE, _CLONE3, _CLONE_NEWUSER, _CLONE_THREAD = 56, 435, 0x10000000, 0x00010000


def deny_syscalls() -> bool:
    """A seccomp filter (x86_64 only): the calls above fail with EPERM, and clone unless it
    makes a thread (no new process: the address-space limit is per process, so each fork
    would bring another gigabyte) or with CLONE_NEWUSER (no new user namespace: the root case
    has none to stop it); clone3 answers ENOSYS (the C library then uses clone, whose flags
    the filter can read); x32 calls and other architectures' are refused. Set after the
    libraries are imported, before any code."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        return False
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, 0x80000000),
            (0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, eperm),
            (0x15, 0, 1, _CLONE3), (0x06, 0, 0, enosys)]
    for number in _DENIED_CALLS.values():
        prog += [(0x15, 0, 1, number), (0x06, 0, 0, eperm)]
    prog += [(0x15, 0, 4, _CLONE), (0x20, 0, 0, 16), (0x45, 1, 0, _CLONE_NEWUSER),
             (0x45, 1, 0, _CLONE_THREAD), (0x06, 0, 0, eperm), (0x06, 0, 0, allow)]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(prog))(*[Filter(*step) for step in prog])
    program = Program(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp could not be set")  # not run unfiltered
    return True


def receive(idle: float) -> tuple[dict[str, Any], list[int]]:
    """The one request: length-prefixed JSON, with the datasets' descriptors."""
    sock = socket.socket(fileno=0)
    sock.settimeout(idle)
    fds: list[int] = []
    data = b""
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            chunk, ancdata, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
            for level, kind, raw in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += list(struct.unpack(f"{len(raw) // 4}i", raw[: len(raw) // 4 * 4]))
            if not chunk:
                raise SystemExit(0)  # the gateway went away, or closed the idle sandbox
            data += chunk
    except socket.timeout:
        raise SystemExit(0) from None  # idle too long: a new one is started when needed
    finally:
        sock.close()
    return json.loads(data[4:]), fds


class Capped(io.TextIOBase):
    """stdout/stderr: the first `limit` characters are kept, the rest only counted."""

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0
        self.limit = limit

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        text = str(text)
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def text(self) -> str:
        return "".join(self.parts)


def plain(value: Any) -> Any:
    """A cell as JSON: numbers, text, booleans, null; times as ISO text."""
    if value is None or value is pd.NaT:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else (None if math.isnan(value) else str(value))
    if isinstance(value, str):
        return value[:1000]
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(value, "isoformat"):
        return value.isoformat(sep=" ") if isinstance(value, pd.Timestamp) else value.isoformat()
    return str(value)[:1000]


def sql_type(dtype: Any) -> str:
    kind = getattr(dtype, "kind", "O")
    return {"i": "BIGINT", "u": "UBIGINT", "f": "DOUBLE", "b": "BOOLEAN",
            "M": "TIMESTAMP", "m": "INTERVAL"}.get(kind, "VARCHAR")


def csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    if isinstance(value, str) and text.startswith(_FORMULA_START) \
            and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def frame_of(value: Any) -> Any:
    """A DataFrame for a DataFrame or Series, else None."""
    if isinstance(value, pd.Series):
        value = value.to_frame(name=value.name if value.name is not None else "value")
    if not isinstance(value, pd.DataFrame):
        return None
    if not isinstance(value.index, pd.RangeIndex) or value.index.name is not None:
        try:
            value = value.reset_index()
        except ValueError:  # an index named like a column
            pass
    return value


def table_of(df: Any, name: str, blobs: list[bytes]) -> dict[str, Any]:
    rows_cap, csv_cap = int(LIMITS.get("table_rows", 100)), int(LIMITS.get("csv_bytes", 8 << 20))
    columns = [" ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in df.columns]
    head = df.head(rows_cap)
    rows = [[plain(v) for v in row] for row in head.itertuples(index=False, name=None)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    for row in df.itertuples(index=False, name=None):
        writer.writerow([csv_cell(plain(v)) for v in row])
        if buffer.tell() > csv_cap:
            break
    data = buffer.getvalue().encode()
    csv_index = None
    if len(data) <= csv_cap:
        blobs.append(data)
        csv_index = len(blobs) - 1
    return {"name": name, "columns": columns, "types": [sql_type(t) for t in df.dtypes],
            "rows": rows, "total_rows": len(df), "csv": csv_index}


def figures(blobs: list[bytes], notes: list[str]) -> list[dict[str, Any]]:
    out = []
    max_pixels = int(LIMITS.get("figure_pixels", 4_000_000))
    for number in plt.get_fignums()[: int(LIMITS.get("max_figures", 5))]:
        fig = plt.figure(number)
        width, height = fig.get_size_inches()
        dpi = min(100.0, math.sqrt(max_pixels / max(width * height, 1e-6)))
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            notes.append(f"figure {number} could not be drawn: {type(e).__name__}: {e}"[:300])
            continue
        blobs.append(buffer.getvalue())
        title = fig.axes[0].get_title() if fig.axes else ""
        out.append({"index": len(blobs) - 1, "title": title[:200]})
    if len(plt.get_fignums()) > int(LIMITS.get("max_figures", 5)):
        notes.append(f"only the first {LIMITS.get('max_figures', 5)} figures were kept")
    plt.close("all")
    return out


def work_files(blobs: list[bytes], notes: list[str]) -> list[dict[str, Any]]:
    """Regular files the code wrote under the work dir (no links, capped in count and size)."""
    out: list[dict[str, Any]] = []
    cap, total_cap = int(LIMITS.get("file_mb", 16)) * 2**20, int(LIMITS.get("files_mb", 32)) * 2**20
    total, count_cap = 0, int(LIMITS.get("max_files", 10))
    for top, dirs, names in os.walk(WORK, followlinks=False):
        for d in dirs:
            if os.path.islink(os.path.join(top, d)):
                notes.append(f"{os.path.relpath(os.path.join(top, d), WORK)} is a link to a "
                             "folder, not a regular file: not offered")
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and not os.path.islink(os.path.join(top, d)))
        for name in sorted(names):
            path = os.path.join(top, name)
            shown = os.path.relpath(path, WORK)
            st = os.lstat(path)
            if name.startswith("."):
                continue
            if not stat.S_ISREG(st.st_mode):
                notes.append(f"{shown} is not a regular file (a link?): not offered")
                continue
            if len(out) >= count_cap or st.st_size > cap or total + st.st_size > total_cap:
                notes.append(f"{shown} ({st.st_size:,} bytes) is over the file caps: not offered")
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read(cap + 1)[:cap]
            blobs.append(data)
            total += len(data)
            out.append({"name": shown, "index": len(blobs) - 1})
    return out


def attach(con: Any, names: list[str], bound: set[str], fds: list[int]) -> None:
    """The datasets, read-only, on DuckDB's search path: bound at /data (a gateway not
    running as root), else an fd passed to us."""
    attached = []
    passed = iter(fds)
    for name in names:
        where = f"/data/{name}.duckdb" if name in bound else f"/proc/self/fd/{int(next(passed))}"
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
            continue
        con.execute(f"ATTACH '{where}' AS \"{name}\" (READ_ONLY)")
        attached.append(f'"{name}"')
    if attached:
        con.execute(f"SET search_path = '{','.join(attached)}'")


def execute(code: str, scope: dict[str, Any], shown: list[tuple[str, Any]],
            header: dict[str, Any]) -> None:
    """Run the code; its last expression's value is shown (a DataFrame) or said (its repr),
    its error told as the code's own lines (never ours)."""
    try:
        tree = ast.parse(code, "<code>", "exec")
        last = None
        if tree.body and isinstance(tail := tree.body[-1], ast.Expr):
            tree.body.pop()
            last = ast.Expression(tail.value)
        exec(compile(tree, "<code>", "exec"), scope)
        value = eval(compile(last, "<code>", "eval"), scope) if last is not None else None
        if value is not None:
            if frame_of(value) is not None:
                shown.append(("result", value))
            elif not (isinstance(value, list) and all(hasattr(v, "figure") for v in value)) \
                    and not hasattr(value, "figure"):  # plt.plot's artists: the figure says it
                header["value"] = repr(value)[:4000]
    except BaseException as e:  # noqa: BLE001 - the code's own error, for the model to read
        frames = traceback.extract_tb(e.__traceback__)
        mine = [f for f in frames if f.filename == "<code>"]
        lines = [f"  line {f.lineno}" + (f", in {f.name}" if f.name != "<module>" else "")
                 for f in mine[-5:]]
        header["error"] = "\n".join([*lines, f"{type(e).__name__}: {e}"])[:4000]
        header["memory"] = isinstance(e, MemoryError)


def tables_of(shown: list[tuple[str, Any]], blobs: list[bytes], notes: list[str]) -> list[Any]:
    tables = []
    for name, value in shown[: int(LIMITS.get("max_tables", 5))]:
        df = frame_of(value)
        if df is None:
            notes.append(f"show({name!r}): not a DataFrame or Series")
            continue
        try:
            tables.append(table_of(df, name, blobs))
        except Exception as e:  # noqa: BLE001
            notes.append(f"{name}: could not be sent as a table ({type(e).__name__})")
    return tables


def run(request: dict[str, Any], fds: list[int]) -> None:
    names = request.get("datasets", [])
    con = duckdb.connect(":memory:", config={"threads": 1})
    attach(con, names, set(request.get("bound", [])), fds)
    shown: list[tuple[str, Any]] = []

    def sql(query: str) -> Any:
        """Run SQL (DuckDB) over the datasets; a DataFrame."""
        return con.sql(query).df()

    def load(name: str) -> Any:
        """A whole dataset as a DataFrame."""
        if name not in names:
            raise KeyError(f"no dataset {name!r}; the datasets are: {', '.join(names) or 'none'}")
        return con.sql(f'SELECT * FROM "{name}"."{name}"').df()

    def show(value: Any, name: str = "") -> None:
        """Send a DataFrame (or Series) back as a table."""
        shown.append((name or f"table {len(shown) + 1}", value))

    out, err = Capped(int(LIMITS.get("output_chars", 20_000))), Capped(
        int(LIMITS.get("output_chars", 20_000)))
    sys.stdout, sys.stderr = out, err
    scope: dict[str, Any] = {"__name__": "__main__", "pd": pd, "np": np, "plt": plt,
                             "duckdb": duckdb, "sql": sql, "load": load, "show": show,
                             "datasets": list(names)}
    header: dict[str, Any] = {"error": None, "value": None}
    execute(request["code"], scope, shown, header)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    blobs: list[bytes] = []
    notes: list[str] = []
    tables = tables_of(shown, blobs, notes)
    header.update(stdout=out.text(), stdout_dropped=out.dropped, stderr=err.text(),
                  stderr_dropped=err.dropped, tables=tables,
                  figures=figures(blobs, notes), files=work_files(blobs, notes), notes=notes,
                  blobs=[len(b) for b in blobs])
    send(json.dumps(header, default=str).encode())
    for blob in blobs:
        send(blob)


def main() -> None:
    boot()
    limit_resources()
    deny_syscalls()
    send(json.dumps({"ready": True}).encode())
    request, fds = receive(float(LIMITS.get("idle_seconds", 600)))
    run(request, fds)


if __name__ == "__main__":
    main()
