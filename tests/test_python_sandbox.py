"""run_python's sandbox (issue 34): what hostile code tries, each refused or killed, every
attempt strictly bounded (small limits, short timeouts: the machine is shared); then the
scripted-model scenario (a trend fitted and plotted: a PNG and a table in the chat), /py, and
doctor's line when bubblewrap is missing.

Every test here runs real sandboxes: bwrap must work (scripts/test.sh installs it)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall as Call
from pluto.runtime.python import sandbox
from pluto.runtime.python.sandbox import BASE_UID, SLOTS, Limits, Pool, SandboxError
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from pluto.types import MARKDOWN, Capabilities, ToolEnd
from tests.helpers.gateway import RecordingProvider, write_agent

SMALL = Limits(timeout=8, cpu_seconds=6, memory_mb=256, processes=16, open_files=64,
               file_mb=4, files_mb=8, work_mb=16, output_chars=2000)


@pytest.fixture(scope="module")
def pool():
    assert sandbox.unavailable() is None, sandbox.unavailable()
    made = Pool(SMALL, warm=1, max_running=5)
    yield made
    made.close()


async def run(pool: Pool, code: str, **limits: object) -> sandbox.Outcome:
    """Run ``code`` in the shared pool, or (``limits`` changed) in a pool of its own."""
    if not limits:
        return await pool.run(code)
    strict = Pool(_limits(**limits), warm=0, max_running=5)
    try:
        return await strict.run(code)
    finally:
        strict.close()


def _limits(**changes: object) -> Limits:
    from dataclasses import replace

    return replace(SMALL, **changes)  # type: ignore[arg-type]


def sandbox_tasks() -> dict[int, int]:
    """uid -> how many tasks, for the sandboxes' uids (root: BASE_UID + slot)."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if BASE_UID <= uid < BASE_UID + SLOTS:
            found[uid] = found.get(uid, 0) + 1
    return found


async def until(condition, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    async def wait():  # type: ignore[no-untyped-def]
        while not (value := condition()):
            await asyncio.sleep(0.05)
        return value
    return await asyncio.wait_for(wait(), timeout)


# ---- what works ------------------------------------------------------------------------


async def test_a_run_returns_output_a_table_a_figure_and_files(pool: Pool) -> None:
    out = await pool.run("print('hi')\nplt.plot([1, 2, 3]); plt.title('up')\n"
                         "open('report.csv', 'w').write('a,b\\n1,2\\n')\n"
                         "pd.DataFrame({'x': [1, 2], 'y': [0.5, None]})")
    assert out.error is None and out.stdout == "hi\n"
    [table] = out.tables
    assert (table.columns, table.types, table.rows, table.total_rows) == (
        ["x", "y"], ["BIGINT", "DOUBLE"], [[1, 0.5], [2, None]], 2)
    [figure] = out.figures
    assert figure.png.startswith(b"\x89PNG") and figure.title == "up"
    assert out.files == [("report.csv", b"a,b\n1,2\n")]


async def test_a_warm_sandbox_answers_the_second_run(pool: Pool) -> None:
    await pool.run("1")
    await until(lambda: pool.idle)  # the refill
    assert (await pool.run("2")).warm is True


async def test_the_code_s_error_comes_back_without_the_runner_s_frames(pool: Pool) -> None:
    out = await pool.run("x = 1\n\ndef f():\n    return 1 / 0\n\nf()")
    assert out.error == "  line 6\n  line 4, in f\nZeroDivisionError: division by zero"
    assert "runner" not in out.error


async def test_a_gateway_with_many_open_files_still_gets_the_reply(pool: Pool) -> None:
    """The sandbox's pipe gets a descriptor past 1023 (select() would fail there)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        out = await run(pool, "21 * 2", timeout=20)  # a pool of its own: a new pipe
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert out.value == "42"


# ---- escapes ---------------------------------------------------------------------------


async def test_no_network_not_even_the_gateway_s_loopback(pool: Pool) -> None:
    connected: list[bool] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.append(True)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        out = await pool.run(f"""
import socket
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("10.0.0.1", 80), ("::1", {port})]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family)
    s.settimeout(2)
    try:
        s.connect((host, port))
        print(host, "CONNECTED")
    except OSError as e:
        print(host, "refused")
try:
    socket.getaddrinfo("example.com", 80)
    print("dns CONNECTED")
except OSError:
    print("dns refused")
""")
    finally:
        server.close()
        await server.wait_closed()
    print(out.stdout)
    assert "CONNECTED" not in out.stdout and out.stdout.count("refused") == 5
    assert connected == []


async def test_no_host_files_config_data_dir_or_secrets(pool: Pool, config_dir: Path,
                                                        data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "pluto.db").write_text("secret rows")
    secret = "sk-sandbox-must-not-see-0123456789"
    os.environ["PLUTO_TEST_SECRET"] = secret  # the gateway's environment (this process)
    try:
        out = await pool.run(f"""
import os, glob
for path in ["/etc/passwd", "/etc/shadow", {str(config_dir / 'pluto.yaml')!r},
             {str(data_dir / 'pluto.db')!r}, "/work/main/config/pluto.yaml",
             "/proc/{os.getpid()}/environ", "/root/.bash_history"]:
    try:
        open(path).read()
        print(path, "READ")
    except OSError as e:
        print(path, "refused", type(e).__name__)
seen = ""
for path in glob.glob("/proc/*/environ"):
    try:
        seen += open(path, "rb").read().decode(errors="replace")
    except OSError:
        pass
print("environ", sorted(os.environ))
print("secret", {secret!r} in seen)
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
""")
    finally:
        del os.environ["PLUTO_TEST_SECRET"]
    print(out.stdout)
    assert " READ\n" not in out.stdout and out.stdout.count("refused") == 7
    assert "secret False" in out.stdout and secret not in out.stdout
    assert "environ ['HOME', 'LANG', 'MALLOC_ARENA_MAX', 'MPLBACKEND', 'MPLCONFIGDIR', " \
        "'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PWD', 'TMPDIR']" in out.stdout
    pids = eval(out.stdout.split("pids ")[1])  # noqa: S307 - a list of ints we printed
    assert os.getpid() not in pids and max(pids) < 100  # its own PID namespace


async def test_nothing_outside_the_work_dir_can_be_written(pool: Pool, data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    out = await pool.run(f"""
import os
for path in ["/x", "/usr/lib/x", "/site/x", "/site/pandas/__init__.py", "/pluto/runner.py",
             "/etc/x", "/proc/sys/kernel/hostname", {str(data_dir / 'x')!r}]:
    try:
        with open(path, "w") as f:
            f.write("x")
        print(path, "WRITTEN")
    except OSError as e:
        print(path, "refused")
open("/work/fine.txt", "w").write("ok")
""")
    print(out.stdout)
    assert "WRITTEN" not in out.stdout and out.stdout.count("refused") == 8
    assert not (data_dir / "x").exists() and out.files == [("fine.txt", b"ok")]


TAMPER = """
import os, stat
print(int(sql("SELECT sum(x) AS s FROM t").s[0]))
for fd in range(3, 64):
    try:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("t.duckdb"):
            break
    except OSError:
        pass
else:
    fd = None
targets = [f"/proc/self/fd/{fd}"] if fd is not None else []
targets += ["/data/t.duckdb"] if os.path.exists("/data/t.duckdb") else []
for path in targets:
    try:
        open(path, "r+b").write(b"x")
        print(path, "WRITTEN")
    except OSError as e:
        print(path, "refused")
    try:
        os.chmod(path, 0o666)
        print(path, "CHMOD")
    except OSError:
        print(path, "no chmod")
if fd is not None:
    try:
        os.fchmod(fd, 0o666)
        print("fd CHMOD")
    except OSError:
        print("fd no chmod")
"""


@pytest.mark.parametrize("mode", [0o644, 0o666])
async def test_the_datasets_cannot_be_changed(pool: Pool, tmp_path: Path, mode: int) -> None:
    """Passed as fds (the gateway is root: the sandbox's uid owns nothing), or bound read-only
    (a file others may write: like a gateway running as its own user, where the sandbox shares
    its uid), a dataset can be read and never written, nor its mode changed."""
    import duckdb
    import hashlib

    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT range AS x FROM range(10)")
    path.chmod(mode)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sandbox.passable([("t", path)]) is (mode == 0o644)
    out = await pool.run(TAMPER, [("t", path)])
    print(out.stdout, out.error)
    assert out.stdout.startswith("45\n") and out.error is None
    assert "WRITTEN" not in out.stdout and "CHMOD" not in out.stdout
    assert out.stdout.count("refused") >= 1
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert path.stat().st_mode & 0o777 == mode


async def test_links_to_outside_paths_are_never_offered(pool: Pool, data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "pluto.db").write_text("secret rows")
    out = await pool.run(f"""
import os
os.symlink("/etc/shadow", "shadow.txt")
os.symlink("/proc/1/environ", "environ.txt")
os.symlink({str(data_dir / 'pluto.db')!r}, "db.txt")
os.mkdir("sub")
os.symlink("/", "sub/root")
try:
    os.link("/pluto/runner.py", "hard.py")
    print("LINKED")
except OSError:
    print("no hard link")
open("ok.txt", "w").write("fine")
""")
    assert out.stdout == "no hard link\n"
    assert out.files == [("ok.txt", b"fine")]
    assert sum("not a regular file" in n for n in out.notes) == 4, out.notes


async def test_no_new_namespaces_ptrace_or_io_uring(pool: Pool) -> None:
    """seccomp (x86_64): the code cannot make a user namespace of its own (with one it would
    hold every capability there), nor ptrace, nor reach io_uring or bpf; threads still work."""
    out = await pool.run("""
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
for name, call in [("unshare", lambda: libc.unshare(0x10000000)),
                   ("ptrace", lambda: libc.ptrace(16, 1, 0, 0)),
                   ("io_uring", lambda: libc.syscall(425, 8, ctypes.c_void_p(0))),
                   ("bpf", lambda: libc.syscall(321, 0, 0, 0))]:
    print(name, call(), ctypes.get_errno())
done = []
worker = threading.Thread(target=lambda: done.append(True))
worker.start()
worker.join()
print("thread", done)
""")
    assert out.stdout.splitlines() == ["unshare -1 1", "ptrace -1 1", "io_uring -1 1",
                                       "bpf -1 1", "thread [True]"]


async def test_a_returned_object_never_runs_code_here(pool: Pool, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    out = await pool.run(f"""
import os, pickle
class Evil:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
    def __repr__(self):
        return "Evil()"
show(Evil(), "evil")
pd.DataFrame({{"obj": [Evil()]}}).assign(blob=[pickle.dumps(Evil())])
""")
    assert out.error is None and not marker.exists()
    assert out.tables[0].rows[0][0] == "Evil()"  # text: nothing here unpickles
    assert isinstance(out.tables[0].rows[0][1], str)
    assert "show('evil'): not a DataFrame or Series" in out.notes


async def test_a_forged_reply_is_refused(pool: Pool) -> None:
    forge = """
import os, stat, struct, pickle
for fd in range(3, 32):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            break
    except OSError:
        pass
payload = {payload}
os.write(fd, struct.pack(">I", len(payload)) + payload)
"""
    with pytest.raises(SandboxError, match="not valid"):
        await pool.run(forge.format(payload="pickle.dumps(os.system)"))
    with pytest.raises(SandboxError, match="too large"):
        await pool.run(forge.format(payload="b'{\"blobs\": [4000000000]}'"))


async def test_no_process_can_be_made_and_threads_stop_at_the_limit(pool: Pool) -> None:
    """seccomp refuses fork (each process would bring its own address-space allowance);
    RLIMIT_NPROC, which binds the sandbox's user (root's would be ignored), caps threads."""
    out = await pool.run("""
import os, subprocess, sys, threading
try:
    os.fork()
    print("FORKED")
except OSError as e:
    print("fork refused", e.errno)
try:
    subprocess.run([sys.executable, "-c", "pass"])
    print("SPAWNED")
except OSError as e:
    print("spawn refused", e.errno)
stop = threading.Event()
made = 0
for _ in range(64):
    try:
        threading.Thread(target=stop.wait).start()
    except RuntimeError:
        print("thread refused")
        break
    made += 1
stop.set()
print("threads", made)
""")
    lines = out.stdout.splitlines()
    assert lines[:3] == ["fork refused 1", "spawn refused 1", "thread refused"], out.stdout
    assert int(lines[3].split()[1]) < SMALL.processes


async def test_a_fork_bomb_is_killed_with_its_namespace(pool: Pool) -> None:
    with pytest.raises(SandboxError, match="ran longer than 3 s"):
        await run(pool, """
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.05)
""", timeout=3)
    await until(lambda: max(sandbox_tasks().values(), default=0) <= 2)


async def test_memory_bombs_hit_the_address_space_limit(pool: Pool) -> None:
    big = await pool.run("x = bytearray(2 * 2**30)")
    assert big.memory and big.error.endswith("MemoryError: ")
    grow = await pool.run("chunks = []\nwhile True:\n    chunks.append(np.ones(2**23))")
    assert grow.memory and "MemoryError" in grow.error


async def test_an_infinite_loop_is_stopped_by_the_clock(pool: Pool) -> None:
    started = time.monotonic()
    with pytest.raises(SandboxError, match="ran longer than 2 s and was stopped"):
        await run(pool, "while True:\n    pass", timeout=2)
    print(f"stopped after {time.monotonic() - started:.1f} s")


async def test_cpu_time_is_limited_too(pool: Pool) -> None:
    with pytest.raises(SandboxError, match="CPU time"):
        await run(pool, "while True:\n    pass", cpu_seconds=1, timeout=30)


async def test_huge_output_tables_and_files_are_capped(pool: Pool) -> None:
    out = await pool.run("""
print("x" * 5_000_000)
for i in range(100_000):
    print(i)
for i in range(15):
    open(f"f{i:02}.txt", "w").write("x")
try:
    open("big.bin", "wb").write(b"x" * (6 * 2**20))
except OSError as e:
    print("big", e.errno)
pd.DataFrame({"n": range(3_000_000)})
""")
    assert len(out.stdout) == SMALL.output_chars and out.dropped > 5_000_000
    [table] = out.tables
    assert len(table.rows) == SMALL.table_rows and table.total_rows == 3_000_000
    assert table.csv is None  # over the CSV cap: not sent
    assert len(out.files) == SMALL.max_files
    big = [f for f in out.files if f[0] == "big.bin"]
    assert not big or len(big[0][1]) <= SMALL.file_mb * 2**20


async def test_healthz_answers_while_five_sandboxes_burn_cpu(config_dir: Path, data_dir: Path,
                                                             monkeypatch) -> None:
    from tests.helpers.served import API_KEY, served, url

    monkeypatch.setenv("PLUTO_TEST_API_KEYS", API_KEY)
    burners = Pool(_limits(timeout=3), warm=0, max_running=5)
    async with served(config_dir, data_dir) as gw, aiohttp.ClientSession() as http:
        burning = [asyncio.create_task(burners.run("while True:\n    pass")) for _ in range(5)]
        await until(lambda: len(sandbox_tasks()) >= 5 or all(t.done() for t in burning))
        seconds: list[float] = []
        while not all(t.done() for t in burning):
            started = time.perf_counter()
            async with http.get(url(gw, "/healthz")) as r:
                assert r.status == 200
            seconds.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*burning, return_exceptions=True)
    burners.close()
    print(f"\n/healthz while 5 sandboxes burned CPU: {len(seconds)} answers, median "
          f"{statistics.median(seconds) * 1000:.1f} ms, slowest {max(seconds) * 1000:.1f} ms")
    assert len(seconds) >= 5
    assert all(isinstance(r, SandboxError) and "ran longer" in str(r) for r in results)


# ---- the tool in a conversation, /py, doctor ---------------------------------------------


TREND = '''monthly = sql("SELECT date_trunc('month', date) AS month, sum(amount) AS sales "
                "FROM sales GROUP BY 1 ORDER BY 1")
x = np.arange(len(monthly))
slope, intercept = np.polyfit(x, monthly["sales"], 1)
monthly["trend"] = intercept + slope * x
fig, ax = plt.subplots()
ax.plot(monthly["month"], monthly["sales"], marker="o", label="sales")
ax.plot(monthly["month"], monthly["trend"], label="linear trend")
ax.set_title("Monthly sales and trend")
ax.legend()
print(f"slope per month: {slope:.2f}")
monthly'''


async def test_fit_a_linear_trend_to_monthly_sales_and_plot_it(config_dir: Path,
                                                               data_dir: Path) -> None:
    write_agent(config_dir, "analyst", "tools: [run_python]\ndatasets: [sales]\n")
    (config_dir / "routes.yaml").write_text("default: analyst\n")
    model = ScriptedModel(Scripted(tool_calls=[Call("c1", "run_python",
                                                    __import__("json").dumps({"code": TREND}))]),
                          Scripted(text="Sales trend upward; the chart shows the fit."))
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=model) as gw:
        p = RecordingProvider(capabilities=Capabilities(max_message_length=4000,
                                                        markup=MARKDOWN, can_send_images=True))
        gw.add_provider(p)
        await p.running.wait()
        await p.say("fit a linear trend to monthly sales and plot it")
        assert await p.wait_finals(1, timeout=60) == [
            "Sales trend upward; the chart shows the fit."]
        await until(lambda: [m for m in p.sent if m.attachments])
        [image] = [m.attachments[0] for m in p.sent if m.attachments]
        run_dir = image.path.parent
        events = [e for e in await gw.store.conversations.events(run_dir.name)
                  if isinstance(e, ToolEnd)]
    assert image.kind == "image" and image.path.read_bytes().startswith(b"\x89PNG")
    assert run_dir.parent == data_dir / "artifacts"
    said = model.calls[1][-1]["content"]
    assert said.startswith("Printed:\nslope per month: ")
    assert "Table result:\nmonth | sales | trend\n" in said
    assert "1 figure(s) drawn: sent to the user" in said
    [end] = events
    table = end.details["table"]
    assert table["columns"] == ["month", "sales", "trend"] and table["numeric"] == [
        False, True, True]
    assert Path(end.details["csv"]).read_text().startswith("month,sales,trend\n")
    assert end.details["image"] == str(image.path)


async def test_py_in_a_chat_whose_agent_has_run_python(config_dir: Path,
                                                       data_dir: Path) -> None:
    write_agent(config_dir, "analyst", "tools: [run_python]\ndatasets: [sales]\n")
    write_agent(config_dir, "plain", "tools: []\n")
    (config_dir / "routes.yaml").write_text(
        "default: analyst\nroutes:\n  - match: {chat: other}\n    agent: plain\n")
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=ScriptedModel()) as gw:
        p = RecordingProvider(capabilities=Capabilities(max_message_length=4000,
                                                        markup=MARKDOWN))
        gw.add_provider(p)
        await p.say("/py ```python\nprint(len(load('sales')))\n```")
        await p.say("/py 1/0")
        await p.say("/py 1", chat="other")
        finals = await p.wait_finals(3, timeout=60)
    assert finals[0] == "```\n2000\n```"
    assert finals[1].startswith("The code failed:") and "ZeroDivisionError" in finals[1]
    assert finals[2].startswith("/py works in chats whose agent has the run_python tool")


@pytest.fixture
def no_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    sandbox._reset_probe()
    yield
    monkeypatch.undo()
    sandbox._reset_probe()


def test_doctor_says_why_when_bubblewrap_is_missing(no_bwrap, config_dir: Path,
                                                    data_dir: Path) -> None:
    from pluto.gateway.cli.doctor import _python_sandbox

    args = argparse.Namespace(config=config_dir)
    config = PlutoConfig(data_dir=data_dir)
    quiet = _python_sandbox(args, config)
    write_agent(config_dir, "analyst", "tools: [run_python]\n")
    loud = _python_sandbox(args, config)
    sentence = ("Bubblewrap (bwrap) is not installed, so run_python is off (code never runs "
                "unsandboxed): apt-get install bubblewrap")
    assert quiet.ok and quiet.line() == f"ok    python sandbox: {sentence}."
    assert not loud.ok and loud.line() == (
        f"FAIL  python sandbox: {sentence} (agents with run_python: analyst).")


async def test_the_tool_is_off_without_bubblewrap(no_bwrap, tmp_path: Path) -> None:
    from pluto.runtime.data import DataService
    from pluto.runtime.data_tools import DATA_TOOLS
    from pluto.runtime.tools import ToolContext

    service = DataService(tmp_path / "data", demo=False)
    ctx = ToolContext("r1", "s1", "k1", "a", service.data_dir, {"data": service}, "*")
    result = await DATA_TOOLS["run_python"](ctx, {"code": "print(1)"})
    assert result.is_error and result.content.startswith(
        "bubblewrap (bwrap) is not installed, so run_python is off")


async def test_serve_warms_a_sandbox_when_an_agent_lists_run_python(config_dir: Path,
                                                                    data_dir: Path) -> None:
    """The first code a model writes after a start does not wait for a cold sandbox: pluto serve
    starts one in the background when a routed agent lists run_python, and stops it with
    itself."""
    write_agent(config_dir, "analyst", "tools: [run_python]\n")
    (config_dir / "routes.yaml").write_text("default: analyst\n")
    sandbox.pool().close()  # (a pool an earlier test left: this gateway's own)
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), serve=True,
                       http_bind=("127.0.0.1", 0)):
        await until(lambda: sandbox.pool().idle, timeout=60)
        warmed = sandbox.pool()
        assert not warmed.closed
    assert warmed.closed and not warmed.idle
