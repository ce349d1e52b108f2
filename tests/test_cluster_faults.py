"""Three ``pluto serve`` on one PostgreSQL and the fake Telegram, under the faults of issue 30:
each answer names its message; every scenario must end with every message answered once,
each chat in order, and no stray partial answer.

- ``outage``: four times every PostgreSQL backend is terminated (``pg_terminate_backend``),
  then connections to the database are refused for 10 s (a TCP proxy stands in front of it),
  while answers stream: no instance may take another's live chats afterwards (the outage was
  everyone's), and ``/readyz`` says 503 while the database cannot be reached;
- ``slow``: every answer takes longer than a lease (8 s against 5 s): renewals keep the chats
  their holders', nothing is answered twice;
- ``clock``: one instance's wall clock is 400 s ahead (tests/helpers/skewed_clock): every
  decision between instances is on the database's clock, so nothing changes;
- ``rolling``: each instance in turn is stopped with SIGTERM and started again during traffic
  (Telegram by webhook behind a load balancer): what a stopping instance holds is answered or
  handed back before its chat is claimed elsewhere — no reply out of order.

PostgreSQL: ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py); without it the tests fail.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest
import yaml

from tests.conformance.test_kill import Serve
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.balancer import Balancer
from tests.helpers.inspect_store import opened, until_nothing_left_to_deliver
from tests.helpers.pg import _connect, fresh_schema
from tests.helpers.tcp_proxy import TcpProxy
from tests.test_cluster import answer_to, free_port, last_user_text, wait_ready

TOKEN_ENV, SECRET_ENV = "PLUTO_FAULTS_TELEGRAM_TOKEN", "PLUTO_FAULTS_TELEGRAM_SECRET"
SKEWED = Path(__file__).parent / "helpers" / "skewed_clock"


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@127.0.0.1:{port}" if auth
                                     else f"127.0.0.1:{port}"))


def terminate_backends(ports: list[int]) -> int:
    """pg_terminate_backend on every connection the instances hold (those through the
    proxy: other tests' connections to the server are left alone)."""
    if not ports:
        return 0
    with _connect() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
            " current_database() AND client_port = ANY(%s)", (ports,)).fetchall()
    return len(rows)


class Cluster:
    def __init__(self, tmp_path: Path, config_dir: Path, scenario: str, *,
                 proxied: bool | None = None):
        self.tmp_path, self.config_dir, self.scenario = tmp_path, config_dir, scenario
        # the database behind a TCP proxy (cuts, refusals): the outage's, or as asked
        self.proxied = scenario == "outage" if proxied is None else proxied
        self.model = FakeOpenAI()
        self.telegram = FakeTelegram()
        self.ports = [free_port() for _ in range(3)]
        self.balancer = Balancer([f"http://127.0.0.1:{p}" for p in self.ports])
        self.instances: list[Serve] = []
        self.proxy: TcpProxy | None = None

    async def start(self, db_url: str, *, chats: list[int], delay: float,
                    mode: str = "polling", web: dict[str, Any] | None = None) -> None:
        """``web``: the chat widget's settings too (one signing key on every instance, as the
        docker-compose layout has it)."""
        await self.model.start()
        self.model.respond_with(lambda body: Reply(text=answer_to(last_user_text(body)),
                                                   chunk_size=6, chunk_delay=delay))
        await self.telegram.start()
        await self.balancer.start()
        for chat in chats:
            self.telegram.add_chat(chat, first_name=f"User{chat}")
        if self.proxied:
            host = urlsplit(db_url)
            self.proxy = TcpProxy(host.hostname or "127.0.0.1", host.port or 5432)
            db_url = through(db_url, await self.proxy.start())
        config = yaml.safe_load((self.config_dir / "pluto.yaml").read_text())
        config["providers"] = {"telegram": {
            "enabled": True, "token_env": TOKEN_ENV, "base_url": self.telegram.url,
            "poll_timeout": 2, "mode": mode, "public_url": self.balancer.url,
            "secret_env": SECRET_ENV}}
        if web is not None:
            config["providers"]["web"] = {"enabled": True, **web}
        config["storage"] = {"lease_seconds": 5}
        # (to read what each instance did when a run fails: TEST_INSTANCE_LOG_LEVEL=DEBUG)
        config["log_level"] = os.environ.get("TEST_INSTANCE_LOG_LEVEL", "INFO").upper()
        config["gateway"]["stream_edit_interval_seconds"] = 0.2
        config["gateway"]["shutdown_grace_seconds"] = 30
        (self.config_dir / "pluto.yaml").write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")} | {
            "DATABASE_URL": db_url, "PLUTO_MODEL": "openai/fake",
            "PLUTO_API_BASE": self.model.base_url, "PLUTO_API_KEY": "sk-faults-test",
            TOKEN_ENV: self.telegram.token, SECRET_ENV: "faults-webhook-secret",
            "PLUTO_WEB_SECRET": "faults-web-secret-0123456789-0123456789",
            "PYTHONUNBUFFERED": "1"}
        for i, port in enumerate(self.ports):
            extra = {}
            if self.scenario == "clock" and i == 0:
                extra = {"PYTHONPATH": os.pathsep.join(
                    [str(SKEWED), *filter(None, [env.get("PYTHONPATH")])]),
                    "PLUTO_TEST_CLOCK_SKEW": "400"}
            serve = Serve(self.config_dir, env | extra | {
                "PLUTO_DATA_DIR": str(self.tmp_path / f"data{i}"),
                "PLUTO_INSTANCE_ID": f"instance-{i}"}, self.tmp_path / f"serve{i}.log")
            self.instances.append(serve)
        for serve, port in zip(self.instances, self.ports):
            await serve.start("--port", str(port))
        for port in self.ports:
            await wait_ready(port)

    def shown(self, chat: int) -> list[str]:
        """The text of each message the bot has in the chat now, in order (a preview it
        deleted — withdrawn by a run that lost its claim — is no longer there)."""
        return [text for text, _ in self.shown_with_ids(chat)]

    def shown_with_ids(self, chat: int) -> list[tuple[str, str]]:
        """(text, platform id) of each message :meth:`shown` lists."""
        return [(str(m.get("text") or ""), str(s.message_id))
                for s in self.telegram.messages(chat)
                if (m := self.telegram.message(chat, s.message_id)) is not None]

    async def stop(self) -> None:
        for serve in self.instances:
            if serve.proc is not None and serve.proc.returncode is None:
                serve.proc.kill()
                await serve.proc.wait()
        if self.proxy is not None:
            await self.proxy.stop()
        await self.balancer.stop()
        await self.telegram.stop()
        await self.model.stop()


async def readyz(port: int) -> int:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                return resp.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def outage(cluster: Cluster, db_url: str) -> dict[str, object]:
    assert cluster.proxy is not None
    terminated = []
    for _ in range(4):
        terminated.append(terminate_backends(cluster.proxy.upstream_ports()))
        await asyncio.sleep(1.0)  # connections killed once a second: the fault's own pace
    refusing = asyncio.create_task(cluster.proxy.refuse(10.0))
    during = [await readyz(p) for p in cluster.ports]
    while not refusing.done() and not all(status == 503 for status in during):
        await asyncio.sleep(0.2)  # (a renewal every lease / 3: each instance meets the outage)
        during = [await readyz(p) for p in cluster.ports]
    await refusing
    return {"terminated": terminated, "readyz during the outage": during}


async def rolling(cluster: Cluster, db_url: str) -> dict[str, object]:
    lasted = []
    for serve, port in zip(cluster.instances, cluster.ports):
        started = time.monotonic()
        assert await serve.stop(signal.SIGTERM) == 0
        await serve.start("--port", str(port))
        await wait_ready(port)
        lasted.append(round(time.monotonic() - started, 1))
    return {"restart seconds": lasted}


SCENARIOS = {  # name: (chats, rounds, seconds per answer's stream, telegram mode, fault)
    "outage": (12, 8, 0.05, "polling", outage),
    "slow": (6, 3, 0.6, "polling", None),  # ~13 chunks x 0.6 s: about 8 s an answer
    "clock": (12, 8, 0.05, "polling", None),
    "rolling": (12, 10, 0.05, "webhook", rolling),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_three_instances_under_a_fault_answer_every_message_once_in_order(
        tmp_path: Path, config_dir: Path, scenario: str) -> None:
    n_chats, rounds, delay, mode, fault = SCENARIOS[scenario]
    chats = [7000 + i for i in range(n_chats)]
    expected = {c: [answer_to(f"tg{c} m{r}") for r in range(rounds)] for c in chats}
    cluster = Cluster(tmp_path, config_dir, scenario)
    with fresh_schema() as db_url:
        try:
            await cluster.start(db_url, chats=chats, delay=delay, mode=mode)

            async def traffic() -> None:
                for r in range(rounds):
                    for c in chats:
                        cluster.telegram.inject_message(c, f"tg{c} m{r}")
                    await asyncio.sleep(1.0)  # a round a second: the traffic's pace

            sending = asyncio.create_task(traffic())
            seen: dict[str, object] = {}
            if fault is not None:
                await cluster.model.wait_for_requests(n_chats, timeout=60)
                seen = await fault(cluster, db_url)
            await sending

            def complete(c: int) -> list[str]:
                want = set(expected[c])
                return [t for t in cluster.shown(c) if t in want]

            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not all(
                    len(complete(c)) >= rounds for c in chats):
                await asyncio.sleep(0.5)
            async with opened(db_url) as store:  # nothing left that could be sent twice later
                await until_nothing_left_to_deliver(store)
            missing = {c: rounds - len(complete(c)) for c in chats if len(complete(c)) < rounds}
            assert not missing, f"chats still missing answers: {missing}"
            duplicated = sum(len(complete(c)) - len(set(complete(c))) for c in chats)
            disordered = [c for c in chats if complete(c) != expected[c]]
            strays = {c: [t for t in cluster.shown(c) if t not in expected[c]] for c in chats}
            strays = {c: s for c, s in strays.items() if s}
            print(f"faults ({scenario}): {n_chats * rounds} messages; duplicated {duplicated},"
                  f" out of order in {len(disordered)} chat(s), stray messages {strays},"
                  f" previews withdrawn {len(cluster.telegram.deleted)};"
                  f" {seen}")
            assert duplicated == 0 and not disordered, {c: cluster.shown(c) for c in disordered}
            assert not strays, strays
            if scenario == "outage":
                assert all(status == 503 for status in seen["readyz during the outage"]), seen
            for i, serve in enumerate(cluster.instances):
                assert await serve.stop() == 0
                log = serve.log.read_text(errors="replace")
                assert "Traceback" not in log, log[-3000:]
                assert cluster.telegram.token not in log
        except BaseException:
            for i, serve in enumerate(cluster.instances):
                print(f"--- instance {i} ---\n{serve.tail()}")
            raise
        finally:
            await cluster.stop()
