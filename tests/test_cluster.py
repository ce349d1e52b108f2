"""Three ``pluto serve`` processes on one PostgreSQL database, one of them killed with SIGKILL
while it is answering: every message is answered once, each chat in order.

The real processes talk to the fake Telegram (long polling — one poller at a time, held by a
lease — or a webhook behind a load balancer) and to the fake Slack (the Events API behind the
same load balancer), and to a fake OpenAI-compatible model that streams each answer over about
half a second, so the kill lands in the middle of replies. 300 messages across 30 chats (15 on
each platform, 10 messages each). After the kill:

- every message has exactly one complete answer, and each chat's answers come in the order its
  messages were sent (a reply that was being streamed when its instance died may leave its
  partial preview behind — a message that stopped mid-sentence; its answer then comes once,
  complete, from a survivor);
- with long polling, the Telegram poller moved to a survivor.

PostgreSQL: ``PLUTO_TEST_DATABASE_URL`` (tests/helpers/pg.py); without it the test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from pluto.storage.sql.store import SqlStore
from tests.conformance.test_kill import Serve
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.balancer import Balancer
from tests.helpers.inspect_store import opened, platform_messages, until_nothing_left_to_deliver
from tests.helpers.pg import fresh_schema

CHATS = 15  # per platform
ROUNDS = 10  # messages per chat
TELEGRAM_TOKEN_ENV = "PLUTO_CLUSTER_TELEGRAM_TOKEN"
TELEGRAM_SECRET_ENV = "PLUTO_CLUSTER_TELEGRAM_SECRET"
SLACK_BOT_ENV, SLACK_SECRET_ENV = "PLUTO_CLUSTER_SLACK_BOT", "PLUTO_CLUSTER_SLACK_SECRET"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answer_to(text: str) -> str:
    return f"Answer to {text}."


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return ""


class Chats:
    """The 30 conversations and what the bot shows in each."""

    def __init__(self, telegram: FakeTelegram, slack: FakeSlack):
        self.telegram, self.slack = telegram, slack
        self.tg_ids = [5000 + i for i in range(CHATS)]
        self.slack_ids = [f"D0CLUSTER{i:02d}" for i in range(CHATS)]
        for chat in self.tg_ids:
            telegram.add_chat(chat, first_name=f"User{chat}")
        for i, chat in enumerate(self.slack_ids):
            slack.add_dm(f"U0CLUSTER{i:02d}", channel_id=chat)

    def names(self) -> list[str]:
        return [f"tg{c}" for c in self.tg_ids] + [f"sl{c}" for c in self.slack_ids]

    async def say(self, name: str, text: str) -> None:
        if name.startswith("tg"):
            self.telegram.inject_message(int(name[2:]), text)
        else:
            await self.slack.user_message(name[2:], text)

    def shown_with_ids(self, name: str) -> list[tuple[str, str]]:
        """(text, platform id) of each message the bot has in the chat now, in order."""
        if not name.startswith("tg"):
            return [(text, "") for text in self.shown(name)]
        chat = int(name[2:])
        return [(str(m.get("text") or ""), str(s.message_id)) for s in self.telegram.messages(chat)
                if (m := self.telegram.message(chat, s.message_id)) is not None]

    def shown(self, name: str) -> list[str]:
        """The text of each message the bot has in the chat now (after edits; one it deleted is
        gone), in order."""
        if name.startswith("tg"):
            chat = int(name[2:])
            return [str(m.get("text") or "") for s in self.telegram.messages(chat)
                    if (m := self.telegram.message(chat, s.message_id)) is not None]
        found: list[dict[str, Any]] = []
        for top in self.slack.history(name[2:]):
            found.append(top)
            if top.get("reply_count"):  # replies in a thread
                found += self.slack.history(name[2:], top["ts"])[1:]
        msgs = [m for m in found if m.get("bot_id") == self.slack.bot_id]
        return [str(m.get("text") or "") for m in sorted(msgs, key=lambda m: float(m["ts"]))]


async def wait_ready(port: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"the instance on port {port} did not become ready")


async def lease_holder(store: SqlStore, name: str) -> str | None:
    lease = await store.leases.holder(name)
    return lease.owner if lease is not None else None


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("telegram_mode", "fault"), [("polling", "kill"), ("webhook", "kill"),
                                                     ("polling", "pause")])
async def test_three_instances_one_killed_every_message_answered_once_in_order(
        tmp_path: Path, config_dir: Path, telegram_mode: str, fault: str) -> None:
    """``pause``: the victim is stopped (SIGSTOP) for 25 s, five leases, then continued: it
    must not overwrite the answers its chats got meanwhile (its previews and sends are
    fenced), nor answer anything twice."""
    with fresh_schema() as db_url:
        model = FakeOpenAI()
        await model.start()
        model.respond_with(lambda body: Reply(text=answer_to(last_user_text(body)),
                                              chunk_size=6, chunk_delay=0.05))
        telegram = FakeTelegram()
        await telegram.start()
        slack = FakeSlack()
        await slack.start()
        chats = Chats(telegram, slack)
        ports = [free_port() for _ in range(3)]
        balancer = Balancer([f"http://127.0.0.1:{p}" for p in ports])
        await balancer.start()
        slack.events_url = f"{balancer.url}/slack/events"

        config = yaml.safe_load((config_dir / "pluto.yaml").read_text())
        config["providers"] = {
            "telegram": {"enabled": True, "token_env": TELEGRAM_TOKEN_ENV,
                         "base_url": telegram.url, "poll_timeout": 2, "mode": telegram_mode,
                         "public_url": balancer.url, "secret_env": TELEGRAM_SECRET_ENV},
            "slack": {"enabled": True, "mode": "http", "api_base": slack.api_url,
                      "bot_token_env": SLACK_BOT_ENV, "signing_secret_env": SLACK_SECRET_ENV}}
        config["storage"] = {"lease_seconds": 5}
        config["gateway"]["stream_edit_interval_seconds"] = 0.2
        (config_dir / "pluto.yaml").write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")} | {
            "DATABASE_URL": db_url, "PLUTO_MODEL": "openai/fake",
            "PLUTO_API_BASE": model.base_url, "PLUTO_API_KEY": "sk-cluster-test",
            TELEGRAM_TOKEN_ENV: telegram.token, TELEGRAM_SECRET_ENV: "cluster-webhook-secret",
            SLACK_BOT_ENV: slack.bot_token, SLACK_SECRET_ENV: slack.signing_secret,
            "PYTHONUNBUFFERED": "1"}
        instances = []
        for i, port in enumerate(ports):
            serve = Serve(config_dir, env | {"PLUTO_DATA_DIR": str(tmp_path / f"data{i}"),
                                             "PLUTO_INSTANCE_ID": f"instance-{i}"},
                          tmp_path / f"serve{i}.log")
            instances.append(serve)
        expected = {name: [answer_to(f"{name} m{r}") for r in range(ROUNDS)]
                    for name in chats.names()}
        closing = AsyncExitStack()
        try:
            for serve, port in zip(instances, ports):
                await serve.start("--port", str(port))
            for port in ports:
                await wait_ready(port)
            # the database as the instances share it, opened once (a look at it is one query)
            store = await closing.enter_async_context(opened(db_url))

            async def one_round(r: int) -> None:
                await asyncio.gather(*(chats.say(name, f"{name} m{r}")
                                       for name in chats.names()))

            # rounds a second apart: a chat's order is the order its messages reach the inbox,
            # and two sent 0.3 s apart to different instances swapped on a saturated 2-core CI
            # machine (a limit docs/instances.md states)
            for r in range(4):
                await one_round(r)
                await asyncio.sleep(1.0)
            # mid-reply: answers are streaming; kill the instance holding the Telegram poller
            # (with a webhook every instance takes updates: kill the first)
            await model.wait_for_requests(60, timeout=60)
            victim = 0
            if telegram_mode == "polling":
                holder = await lease_holder(store, "provider:telegram")
                assert holder is not None and holder.startswith("instance-")
                victim = int(holder.removeprefix("instance-").partition(".")[0])
            killed_at = dead_at = time.monotonic()
            if fault == "kill":
                assert await instances[victim].stop(signal.SIGKILL) == -signal.SIGKILL
                dead_at = time.monotonic()
            else:
                assert instances[victim].proc is not None
                instances[victim].proc.send_signal(signal.SIGSTOP)
            for r in range(4, ROUNDS):
                await one_round(r)
                await asyncio.sleep(1.0)  # the rounds' spacing (above) is the scenario
            if fault == "pause":  # 25 s after it stopped, it goes on where it was
                # (the 25 s the process stays stopped is the fault itself, not a wait)
                await asyncio.sleep(max(0.0, killed_at + 25 - time.monotonic()))
                assert instances[victim].proc is not None
                instances[victim].proc.send_signal(signal.SIGCONT)

            orphans: set[tuple[str, str]] = set()

            def complete(name: str) -> list[str]:
                want = set(expected[name])
                return [t for t, mid in chats.shown_with_ids(name)
                        if t in want and (name, mid) not in orphans]

            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if all(len(complete(n)) >= ROUNDS for n in chats.names()):
                    break
                await asyncio.sleep(0.5)
            await until_nothing_left_to_deliver(store)  # nothing left to send twice later
            if fault == "kill":
                # A preview the killed instance had shown but not yet recorded (killed between
                # the platform's answer and the commit of its id) is known to nobody: the chat's
                # taker answers in a message of its own, and the preview stays as it was. It
                # may hold the whole answer (its last edit before the kill). Such a message —
                # no recorded reply made or edited it, and it did not change after the kill —
                # is counted as a leftover preview, not as an answer.
                known = await platform_messages(store, "telegram")
                orphans = {(n, mid) for n in chats.names() if n.startswith("tg")
                           for _, mid in chats.shown_with_ids(n)
                           if (n[2:], mid) not in known
                           and telegram.last_change(int(n[2:]), int(mid)) <= dead_at}
            missing = {n: ROUNDS - len(complete(n)) for n in chats.names()
                       if len(complete(n)) < ROUNDS}
            assert not missing, f"chats still missing answers: {missing}"
            leftovers = late = resent = 0
            twice: list[tuple[str, list[str]]] = []
            flagged = sum(serve.log.read_text(errors="replace").count(
                "may have been delivered") for i, serve in enumerate(instances) if i != victim)
            for name in chats.names():
                if fault == "pause" and len(complete(name)) > ROUNDS:
                    # a send the stopped instance had in flight: the platform took it, the
                    # instance could not record so, and a survivor sent it again — said in its
                    # log ("may have been delivered"); no bot API tells which (docs/delivery.md)
                    once = list(dict.fromkeys(complete(name)))
                    resent += len(complete(name)) - len(once)
                    twice.append((name, chats.shown(name)))
                    assert once == expected[name] or (name.startswith("sl") and sorted(
                        once) == sorted(expected[name])), (name, chats.shown(name))
                    continue
                if fault == "pause" and name.startswith("sl") and \
                        complete(name) != expected[name]:
                    # a Slack event posted to the stopped instance waits there until Slack
                    # gives up on it and posts it again (3 s), to another: it reaches the
                    # inbox after later ones, and is answered after them — once all the same
                    assert sorted(complete(name)) == sorted(expected[name]), name
                    late += 1
                    continue
                assert complete(name) == expected[name], (name, chats.shown(name))  # once, in order
                for text, mid in chats.shown_with_ids(name):
                    if (name, mid) in orphans:  # the killed instance's unrecorded preview
                        assert any(a.startswith(text) for a in expected[name]), (name, text)
                        leftovers += 1
                    elif text not in expected[name]:  # a preview cut off by the kill
                        assert any(a.startswith(text) for a in expected[name]), (name, text)
                        leftovers += 1
            if resent > flagged:
                for name, texts in twice:
                    print(f"sent twice in {name}: {texts}")
            assert resent <= flagged, (resent, flagged)
            assert sum(len(v) for v in expected.values()) == 2 * CHATS * ROUNDS == 300
            if telegram_mode == "polling":
                holder = await lease_holder(store, "provider:telegram")
                assert holder is not None and not holder.startswith(f"instance-{victim}.")
                polls = [c for c in telegram.calls_to("getUpdates") if c.time > killed_at]
                assert polls, "nobody polls Telegram after the kill"
            for i, serve in enumerate(instances):
                if i != victim or fault == "pause":
                    assert await serve.stop() == 0
                    log = serve.log.read_text(errors="replace")
                    assert "Traceback" not in log, log[-3000:]
                    for secret in (telegram.token, slack.bot_token, slack.signing_secret):
                        assert secret not in log
            print(f"cluster ({telegram_mode}, {fault}): 300 answered, in order but in {late} "
                  f"Slack chat(s) whose event reached the stopped instance; {resent} sent "
                  f"again after an unknown outcome ({flagged} flagged); {leftovers} partial "
                  f"preview(s) left by the stopped instance, {len(orphans)} of them never "
                  f"recorded (shown, then killed before the commit of its id)")
        except BaseException:
            for i, serve in enumerate(instances):
                print(f"--- instance {i} ---\n{serve.tail()}")
            raise
        finally:
            await closing.aclose()
            for serve in instances:
                if serve.proc is not None and serve.proc.returncode is None:
                    serve.proc.kill()
                    await serve.proc.wait()
            await balancer.stop()
            await slack.stop()
            await telegram.stop()
            await model.stop()
