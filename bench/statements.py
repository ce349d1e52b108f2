"""What a plain message costs the database: commits and statements per message, counted at
the driver (bench/drivercount.py) inside one ``pluto serve`` on SQLite and one on PostgreSQL,
while messages flow through three doors:

- the widget (WebSocket, as bench/roundtrip.py), one chat asking in turn and 20 chats at once;
- the HTTP API (``POST /api/v1/agent/tasks/{id}/steps?wait=``), one task and 10 at once;
- Telegram (long polling against the fake Bot API of tests/fakes), one chat and 20 at once.

Each conversation says one message first (not counted: a new chat's rows), then the counters
are read, the messages flow (each waits for its answer), a second passes for what follows an
answer (the run's end, the outbox marked sent), and the counters are read again; the
difference ÷ the messages is printed with the statements that make it up (the most frequent,
normalized: literals as ``?``), and what each commit (transaction) held. The model is the
instant ``echo`` (no deltas): the figures are the gateway's own; two more windows send the
widget's messages to the streaming fake model of bench/streaming.py (100 tokens over 2 s), for
what a streamed answer's previews add. The counting server is a process of its own, so the
timed sections are not slowed by the counting; an idle window (nothing sent) shows what the
instance does by itself. On PostgreSQL a transaction is a BEGIN…COMMIT block or a statement
run alone (the pool's connections autocommit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import ROOT, Figure, Report
from bench.roundtrip import connect_many
from bench.servers import Server

API_KEY = "bench-statements-key-0123456789"
TELEGRAM_TOKEN = "123456789:AAFakeTokenForPlutoBench_0123456789ab"
SETTLE = 1.0  # seconds after the last answer before the counters are read again
# seconds of the idle window: several periods of the slowest timers (every 10 s), so the rate
# does not depend on where their phase falls (a 5 s window read 0.6 or 1.4 /s of the same rate)
IDLE = 30.0
IDLE_QUICK = 15.0
TOP = 15
ECHO = "{model: echo}"  # answers at once with the user's words: the gateway's cost only
STREAMED = '{{model: openai/fake, api_base: "{url}", timeout: 60, retries: 0}}'

CONFIG = """\
data_dir: {data}
http: {{host: 127.0.0.1, port: {port}}}
models:
  default: {model}
providers:
  web:
    enabled: true
    rate_messages: 10000          # the benchmark floods on purpose
    rate_seconds: 1
    max_message_chars: 4000
  api:
    enabled: true
    keys_env: BENCH_API_KEYS
  telegram:
    enabled: true
    token_env: BENCH_TELEGRAM_TOKEN
    mode: polling
    base_url: {telegram}
    poll_timeout: 2
log_level: WARNING
"""


class CountedServer(Server):
    """``pluto serve`` with the driver counters installed; :meth:`counts` reads them."""

    def __init__(self, telegram_url: str, database_url: str | None, model: str = ECHO):
        env = {"BENCH_API_KEYS": API_KEY, "BENCH_TELEGRAM_TOKEN": TELEGRAM_TOKEN}
        if database_url:
            env["DATABASE_URL"] = database_url
        super().__init__("pluto-counted", env)
        self.telegram_url = telegram_url
        self.model = model
        self.out = Path(self._tmp.name) / "counts.json"
        self._seq = 0

    def _command(self) -> list[str]:
        tmp = Path(self._tmp.name)
        config = tmp / "config"
        shutil.copytree(ROOT / "config" / "agents", config / "agents")
        shutil.copy(ROOT / "config" / "routes.yaml", config / "routes.yaml")
        (config / "pluto.yaml").write_text(CONFIG.format(data=tmp / "data", port=self.port,
                                                         telegram=self.telegram_url,
                                                         model=self.model))
        return [sys.executable, "-m", "bench.drivercount", str(self.out), "serve", "--config",
                str(config)]

    async def counts(self) -> dict[str, Any]:
        """The totals so far (the server writes them when signalled)."""
        assert self.proc is not None
        self._seq += 1
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(self.out.read_text())
                if data["seq"] >= self._seq:
                    self._seq = data["seq"]
                    return data
            await asyncio.sleep(0.01)
        raise RuntimeError("the counting server did not write its counts")


@dataclass
class Window:
    """The counters' difference over one batch of messages."""

    label: str
    messages: int
    seconds: float
    statements: Counter[str]
    events: Counter[str]
    errors: int = 0

    def per(self, event: str) -> float:
        return self.events[event] / max(1, self.messages)


def _diff(before: dict[str, Any], after: dict[str, Any]) -> tuple[Counter[str], Counter[str]]:
    out = []
    for key in ("statements", "events"):
        c = Counter(after[key])
        c.subtract(before[key])
        out.append(Counter({k: v for k, v in c.items() if v}))
    return out[0], out[1]


async def _window(server: CountedServer, label: str, conversations: int, per: int,
                  say: Callable[[int, int], Awaitable[bool]]) -> Window:
    """``conversations`` at once, each saying ``per`` messages in turn (``say(i, k)`` sends the
    k-th message of conversation i and returns once it is answered, False on a failure)."""
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        for k in range(per):
            try:
                ok = await say(i, k)
            except (OSError, RuntimeError, TimeoutError, aiohttp.ClientError) as e:
                print(f"    {label}: a message failed: {e!r}"[:300], flush=True)
                ok = False
            if not ok:
                errors += 1
                return

    before = await server.counts()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(conversations)))
    await asyncio.sleep(SETTLE)
    after = await server.counts()
    statements, events = _diff(before, after)
    return Window(label, conversations * per - errors, time.perf_counter() - t0, statements,
                  events, errors)


# the three doors --------------------------------------------------------------------------------

async def widget(server: CountedServer, chats: int, per: int, what: str = "") -> Window:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        clients = await connect_many(session, server, chats)
        for c in clients:
            await c.ask("warm up")

        async def say(i: int, k: int) -> bool:
            await clients[i].ask(f"message {k} from widget chat {i}")
            return True

        try:
            label = f"widget{', ' + what if what else ''}, {chats} chat(s)"
            return await _window(server, label, chats, per, say)
        finally:
            await asyncio.gather(*(c.close() for c in clients))


async def api(server: CountedServer, tasks: int, per: int) -> Window:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    base = f"{server.url}/api/v1/agent/tasks"
    async with aiohttp.ClientSession(headers=headers) as session:
        ids = []
        for i in range(tasks):
            async with session.post(f"{base}?wait=30", json={"input": "warm up"}) as r:
                body = await r.json()
                if r.status != 201:
                    raise RuntimeError(f"the API did not create a task: {r.status} {body}")
                ids.append(body["task_id"])

        async def say(i: int, k: int) -> bool:
            async with session.post(f"{base}/{ids[i]}/steps?wait=30",
                                    json={"input": f"message {k} from API task {i}"}) as r:
                body = await r.json()
                return r.status == 201 and body.get("status") == "completed"

        return await _window(server, f"API, {tasks} task(s)", tasks, per, say)


async def telegram(server: CountedServer, fake: Any, chats: int, per: int,
                   first_chat: int) -> Window:
    ids = [first_chat + i for i in range(chats)]

    async def answered(chat: int, n: int) -> bool:
        await fake.wait_for_messages(chat, n, timeout=30)
        return True

    for chat in ids:
        fake.inject_message(chat, "warm up")
    for chat in ids:
        await answered(chat, 1)

    async def say(i: int, k: int) -> bool:
        fake.inject_message(ids[i], f"message {k} from Telegram chat {i}")
        return await answered(ids[i], k + 2)

    return await _window(server, f"Telegram, {chats} chat(s)", chats, per, say)


# one engine -------------------------------------------------------------------------------------

async def _engine(database_url: str | None, quick: bool,
                  model_url: str | None = None) -> tuple[list[Window], Window | None]:
    """The six windows and the idle one; with ``model_url`` (the streaming fake model of
    bench/streaming.py: 100 tokens over 2 s), the widget's two windows only."""
    from tests.fakes.telegram_server import FakeTelegram

    fake = FakeTelegram(TELEGRAM_TOKEN)
    await fake.start()
    model = STREAMED.format(url=model_url) if model_url else ECHO
    server = CountedServer(fake.url, database_url, model)
    try:
        await asyncio.to_thread(server.__enter__)
        await fake.wait_for_calls("getUpdates", 1, timeout=30, answered=False)
        one, many = (30, 3) if quick else (100, 10)
        if model_url:
            windows = [await widget(server, 1, 1 if quick else 3, "streamed answers"),
                       await widget(server, 20, 1 if quick else 2, "streamed answers")]
            return windows, None
        windows = [await widget(server, 1, one), await widget(server, 20, many),
                   await api(server, 1, one // 2), await api(server, 10, many),
                   await telegram(server, fake, 1, one // 2, 7000),
                   await telegram(server, fake, 20, many, 8000)]
        before = await server.counts()
        t0 = time.perf_counter()
        await asyncio.sleep(IDLE_QUICK if quick else IDLE)
        statements, events = _diff(before, await server.counts())
        idle = Window("idle", 0, time.perf_counter() - t0, statements, events)
    finally:
        await asyncio.to_thread(server.__exit__, None, None, None)
        await fake.stop()
    return windows, idle


def _statements(w: Window, engine: str) -> float:
    return w.per(f"{engine}|statement" if engine == "pg" else "sqlite|statement|writer") + (
        w.per("sqlite|statement|reader") if engine == "sqlite" else 0.0)


def _breakdown(w: Window, engine: str) -> list[tuple[float, str]]:
    rows = []
    for key, n in w.statements.items():
        kind, role, sql = key.split("|", 2)
        if kind == engine:
            rows.append((n / max(1, w.messages), f"{role:<7} {sql}" if kind == "sqlite" else sql))
    return sorted(rows, reverse=True)[:TOP]


def _print_breakdown(w: Window, engine: str, name: str) -> None:
    print(f"  {name}, {w.label}: {w.messages} messages, the {TOP} most frequent statements "
          "per message (normalized SQL" + ("; which connection" if engine == "sqlite" else "")
          + "):", flush=True)
    for per, text in _breakdown(w, engine):
        print(f"    {per:6.2f}  {text[:150]}", flush=True)
    prefix = "sqlite|commit of|" if engine == "sqlite" else "pg|transaction of|"
    held = sorted(((n / max(1, w.messages), k.removeprefix(prefix))
                   for k, n in w.events.items() if k.startswith(prefix)), reverse=True)
    print(f"   {'commits' if engine == 'sqlite' else 'transactions'} per message by what they "
          f"held (statements in order; {len(held)} kinds):", flush=True)
    for per, text in held[:8]:
        print(f"    {per:6.2f}  {text[:150]}", flush=True)


def _report_sqlite(report: Report, windows: list[Window], idle: Window) -> None:
    for w in windows:
        report.add(Figure(
            "statements", f"SQLite commits per message, {w.label}", w.per("sqlite|commit"),
            "commits", note=f"statements {_statements(w, 'sqlite'):.1f}/message (writer "
            f"{w.per('sqlite|statement|writer'):.1f}, reader "
            f"{w.per('sqlite|statement|reader'):.1f}); read transactions "
            f"{w.per('sqlite|read transaction'):.1f}; autocommit writes "
            f"{w.per('sqlite|autocommit write'):.2f}; errors {w.errors}",
            extra={"statements": dict(w.statements), "events": dict(w.events),
                   "messages": w.messages}))
    report.add(Figure("statements", "SQLite idle instance: statements/s",
                      sum(v for k, v in idle.events.items()
                          if k.startswith("sqlite|statement")) / idle.seconds, "stmt/s",
                      note=f"commits {idle.events['sqlite|commit'] / idle.seconds:.2f}/s",
                      extra={"statements": dict(idle.statements)}))


def _report_pg(report: Report, windows: list[Window], idle: Window,
               sqlite: list[Window]) -> None:
    for w, base in zip(windows, sqlite):
        per = w.per("pg|statement")
        plain = "streamed" not in w.label  # (the target is for a plain message)
        report.add(Figure(
            "statements", f"PostgreSQL statements per message, {w.label}", per, "stmt",
            "SQLite", _statements(base, "sqlite"), target="<= 8" if plain else None,
            met=per <= 8 if plain else None,
            note=f"round trips {w.per('pg|round trip'):.1f}; transactions "
            f"{w.per('pg|commit') + w.per('pg|autocommit'):.1f} ({w.per('pg|commit'):.1f} "
            f"BEGIN…COMMIT, {w.per('pg|autocommit'):.1f} single statements); prepares "
            f"{w.per('pg|prepare'):.1f}, pipeline syncs {w.per('pg|pipeline sync'):.1f}; "
            f"errors {w.errors}",
            extra={"statements": dict(w.statements), "events": dict(w.events),
                   "messages": w.messages}))
    rate = idle.events["pg|statement"] / idle.seconds
    report.add(Figure("statements", "PostgreSQL idle instance: statements/s", rate, "stmt/s",
                      target="<= 1 /s", met=rate <= 1,
                      extra={"statements": dict(idle.statements)}))


def run(report: Report, quick: bool = False) -> None:
    from bench.cluster import PG_URL, schema
    from bench.streaming import Process

    with Process("model") as model:
        sqlite, idle = asyncio.run(_engine(None, quick))
        assert idle is not None
        sqlite += asyncio.run(_engine(None, quick, f"{model.url}/v1"))[0]
        _report_sqlite(report, sqlite, idle)
        for w in sqlite:
            _print_breakdown(w, "sqlite", "SQLite")
        _print_idle(idle, "sqlite", "SQLite")
        try:
            with schema() as url:
                pg, pg_idle = asyncio.run(_engine(url, quick))
            assert pg_idle is not None
            with schema() as url:
                pg += asyncio.run(_engine(url, quick, f"{model.url}/v1"))[0]
        except Exception as e:  # noqa: BLE001 - the SQLite figures stand without it
            print(f"  PostgreSQL at {PG_URL} could not be measured: {e!r}"[:400], flush=True)
            return
    _report_pg(report, pg, pg_idle, sqlite)
    for w in pg:
        _print_breakdown(w, "pg", "PostgreSQL")
    _print_idle(pg_idle, "pg", "PostgreSQL")


def _print_idle(idle: Window, engine: str, name: str) -> None:
    rows = [(n, k.split("|", 2)[2]) for k, n in idle.statements.most_common()
            if k.startswith(engine + "|")][:6]
    print(f"  {name} idle, {idle.seconds:.1f} s: " + ("; ".join(
        f"{n}x {text[:90]}" for n, text in rows) or "no statements"), flush=True)
