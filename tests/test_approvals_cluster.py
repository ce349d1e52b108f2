"""Approvals with several instances on PostgreSQL (issue 33): a run paused on one instance is
resumed, once, by a click that reaches another; a click that reaches two instances at once (a
redelivery, or two people) decides once; a request nobody decided expires once though every
instance sweeps; an instance that stops while a request waits leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pluto.gateway import app
from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig, StorageConfig
from pluto.storage.postgres import PostgresStore
from pluto.types import Accepted, IncomingMessage
from tests.helpers.gateway import RecordingProvider
from tests.helpers.pg import fresh_schema
from tests.helpers.served import wait_for
from tests.test_approvals import BUTTONS, Files, config

pytestmark = pytest.mark.slow


def answers(messages: list[dict]) -> Scripted:
    """Asks to delete what the user names; once the tool answered, says what it read."""
    last = messages[-1]
    if last["role"] == "tool":
        return Scripted(text=f"after the tool: {last['content']}")
    return Scripted(tool_calls=[ToolCall("c1", "delete_file",
                                         '{"path": "' + str(last["content"]) + '"}')])


@pytest.fixture
def files(monkeypatch: pytest.MonkeyPatch) -> Files:
    made = Files()
    monkeypatch.setitem(app.BUILTIN_TOOLS, "delete_file", made.tool())
    return made


@pytest.fixture
async def two(tmp_path: Path, files: Files
              ) -> AsyncIterator[list[tuple[Gateway, RecordingProvider]]]:
    cfg_dir = config(tmp_path, timeout=2)
    with fresh_schema() as url:
        started: list[tuple[Gateway, RecordingProvider]] = []
        try:
            for i in range(2):
                gw = Gateway(cfg_dir, config=PlutoConfig(
                    data_dir=tmp_path / f"data{i}", storage=StorageConfig(lease_seconds=5)),
                    model_factory=ScriptedModel(fallback=answers), store=PostgresStore(url))
                await gw.start()
                p = RecordingProvider(capabilities=BUTTONS)
                gw.add_provider(p)
                await p.running.wait()
                started.append((gw, p))
            yield started
        finally:
            for gw, _ in started:
                await gw.stop()


def sent(instances: list[tuple[Gateway, RecordingProvider]]) -> list[str]:
    """What the chat saw, from any instance (one platform behind them)."""
    return [m.text for _, p in instances for m in p.sent]


def click(p: RecordingProvider, command: str, click_id: str,
          user: str = "u1") -> IncomingMessage:
    return IncomingMessage(provider=p.name, chat_id="c1", user_id=user, text=command,
                           message_id=f"click:{click_id}", mentions_bot=True)


async def test_a_click_on_another_instance_resumes_the_paused_run_once(two, files):
    (a, pa), (b, pb) = two
    await pa.say("/srv/a.log")
    await wait_for(lambda: any(m.buttons for _, p in two for m in p.sent))
    ask = next(m for _, p in two for m in p.sent if m.buttons)
    approve = ask.buttons[0].command
    # the same click reaches both instances (a load balancer, a redelivery), and a second
    # person's click at once: one decision, one resumed run
    assert pb.intake is not None and pa.intake is not None
    tickets = await asyncio.gather(
        pb.intake.submit(click(pb, approve, "k1")), pa.intake.submit(click(pa, approve, "k1")),
        pa.intake.submit(click(pa, approve, "k2")))
    outcomes = await asyncio.gather(*(t.outcome() for t in tickets))
    assert sum(isinstance(o, Accepted) for o in outcomes) == 1, outcomes
    await wait_for(lambda: "after the tool: deleted /srv/a.log" in sent(two), timeout=20)
    await asyncio.gather(a.settled(), b.settled())
    assert files.deleted == ["/srv/a.log"]
    assert sent(two).count("after the tool: deleted /srv/a.log") == 1
    rows = await a.store.approvals.of_run(ask.run_id or "")
    assert [(r.status, r.resumed_run is not None) for r in rows] == [("approved", True)]


async def test_nobody_deciding_expires_once_with_every_instance_sweeping(two, files):
    (a, pa), (b, _) = two
    await pa.say("/srv/b.log")
    await wait_for(lambda: any(m.buttons for _, p in two for m in p.sent))

    async def swept() -> bool:
        await asyncio.gather(a.approval_sweep.look(), b.approval_sweep.look())
        return "after the tool: The call to delete_file was not run: nobody approved it " \
               "in time. Tell the user it was not done, and do not call it again unless " \
               "they ask." in sent(two)

    await wait_for(swept, timeout=20)
    await asyncio.gather(a.settled(), b.settled())
    assert files.deleted == []
    lines = [t for t in sent(two) if t.startswith("⏱")]
    assert lines == ["⏱ Nobody approved delete_file in time, so it was not run."]


async def test_a_stopped_instance_leaves_the_request_to_the_other(two, files):
    (a, pa), (b, pb) = two
    await pa.say("/srv/c.log")
    await wait_for(lambda: any(m.buttons for m in pa.sent))
    approve = next(m for m in pa.sent if m.buttons).buttons[0].command
    await a.stop()  # (the fixture's stop of it is a no-op then)
    assert pb.intake is not None
    outcome = await (await pb.intake.submit(click(pb, approve, "k3"))).outcome()
    assert isinstance(outcome, Accepted)
    await wait_for(lambda: "after the tool: deleted /srv/c.log" in [m.text for m in pb.sent],
                   timeout=20)
    assert files.deleted == ["/srv/c.log"]
