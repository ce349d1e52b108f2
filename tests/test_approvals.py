"""A person approves risky tool calls (issue 33): agent.yaml's ``approval:`` rules, the durable
pause (a row), the decision as a chat message (a button or /approve, /deny), the sweep that
denies what nobody decided in time, and a restart in between. Through the gateway, in-process,
with a scripted model and a recording provider that has buttons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pluto.agents.spec import load_agent
from pluto.errors import ConfigError
from pluto.gateway import app
from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import Tool, ToolContext, ToolResult
from pluto.settings import PlutoConfig
from pluto.types import Capabilities, MARKDOWN, OutgoingMessage
from tests.helpers.gateway import RecordingProvider, write_agent
from tests.helpers.inspect_store import runs
from tests.helpers.served import wait_for

BUTTONS = Capabilities(max_message_length=2000, markup=MARKDOWN, has_buttons=True)


class Files:
    """A tool that 'deletes a file': it counts its calls."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def tool(self) -> Tool:
        async def delete_file(ctx: ToolContext, path: str) -> ToolResult:
            self.deleted.append(path)
            return ToolResult(f"deleted {path}")
        return Tool("delete_file", "Delete a file.", {
            "type": "object", "properties": {"path": {"type": "string"}},
            "required": ["path"], "additionalProperties": False}, delete_file)


def config(tmp_path: Path, approval: str = "{delete_file: always}", timeout: float = 300,
           routes: str = "routes: []\ndefault: default\n") -> Path:
    cfg = tmp_path / "config"
    write_agent(cfg, "default", (
        f"model: scripted\ninstructions: i.md\ntools: [delete_file, current_time]\n"
        f"approval: {approval}\napproval_timeout: {timeout}\n"))
    (cfg / "agents" / "default" / "i.md").write_text("You manage files.")
    (cfg / "routes.yaml").write_text(routes)
    return cfg


def delete(path: str, id: str = "c1") -> ToolCall:
    return ToolCall(id, "delete_file", json.dumps({"path": path}))


@pytest.fixture
def files(monkeypatch: pytest.MonkeyPatch) -> Files:
    """The tool, among the gateway's built-in ones for this test."""
    made = Files()
    monkeypatch.setitem(app.BUILTIN_TOOLS, "delete_file", made.tool())
    return made


def gateway(tmp_path: Path, model: ScriptedModel, files: Files, **kw: object) -> Gateway:
    return Gateway(config(tmp_path, **kw),  # type: ignore[arg-type]
                   config=PlutoConfig(data_dir=tmp_path / "data"), model_factory=model)


async def start(gw: Gateway, caps: Capabilities = BUTTONS) -> RecordingProvider:
    p = RecordingProvider(capabilities=caps)
    gw.add_provider(p)
    await p.running.wait()
    return p


def request_of(p: RecordingProvider) -> OutgoingMessage:
    return next(m for m in p.sent if m.buttons)


def told(model: ScriptedModel) -> str:
    """What the model read last as the tool's result."""
    return next(m["content"] for m in reversed(model.calls[-1]) if m["role"] == "tool")


async def test_approve_runs_the_tool_exactly_once_and_the_run_goes_on(tmp_path, files):
    model = ScriptedModel(Scripted(text="Deleting it.", tool_calls=[delete("/tmp/a.txt")]),
                          Scripted(text="Done: a.txt is gone."))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say("delete a.txt")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        ask = request_of(p)
        assert "**delete_file**" in ask.text and "/tmp/a.txt" in ask.text
        assert [(b.label, b.style) for b in ask.buttons] == [("Approve", "primary"),
                                                             ("Deny", "danger")]
        assert files.deleted == []  # nothing runs before a person says so
        [row] = [r for r in await runs(gw.store)]
        assert row["status"] == "awaiting_approval"
        await p.say(ask.buttons[0].command)  # the click: the button's command, as the clicker
        await wait_for(lambda: "Done: a.txt is gone." in p.finals())
        assert files.deleted == ["/tmp/a.txt"]
        assert any("✅ delete_file approved by u1." == m.text for m in p.sent)
        assert told(model) == "deleted /tmp/a.txt"
        # a second click (or a redelivered one) changes nothing
        await p.say(ask.buttons[0].command)
        await wait_for(lambda: any("already approved" in m.text for m in p.sent))
        await p.say(ask.buttons[1].command)
        await gw.settled()
        assert files.deleted == ["/tmp/a.txt"]
        statuses = sorted(r["status"] for r in await runs(gw.store))
        assert statuses == ["awaiting_approval", "ok"]
        [resumed] = [r for r in await runs(gw.store) if r["status"] == "ok"]
        kinds = [e.type for e in await gw.store.conversations.events(resumed["id"])]
        assert kinds[:2] == ["run.start", "approval.decision"]
        assert "tool.start" in kinds and kinds[-2:] == ["message.final", "run.end"]


async def test_deny_tells_the_model_and_it_answers(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/etc/passwd")]),
                          Scripted(text="OK, I left it alone."))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say("clean up")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        approval_id = request_of(p).buttons[1].command.split()[1]
        await p.say(f"/deny {approval_id} that file is needed")
        await wait_for(lambda: "OK, I left it alone." in p.finals())
        assert files.deleted == []
        assert "denied" in told(model) and "that file is needed" in told(model)
        assert any(m.text == "🚫 delete_file denied by u1." for m in p.sent)


async def test_nobody_deciding_in_time_is_a_denial_with_one_line(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/b")]),
                          Scripted(text="Nobody approved, so I did nothing."))
    async with gateway(tmp_path, model, files, timeout=1) as gw:
        p = await start(gw)
        await p.say("delete b")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        # the sweep expected the request: it looks just after its deadline, by itself
        await wait_for(lambda: "Nobody approved, so I did nothing." in p.finals(), timeout=15)
        assert files.deleted == []
        assert "nobody approved it in time" in told(model)
        assert any(m.text == "⏱ Nobody approved delete_file in time, so it was not run."
                   for m in p.sent)
        # a click after the deadline is refused and changes nothing
        await p.say(request_of(p).buttons[0].command)
        await wait_for(lambda: any("expired before anyone decided" in m.text for m in p.sent))
        await gw.settled()
        assert files.deleted == []


async def test_a_stranger_is_refused_and_changes_nothing(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/c")]), Scripted(text="Deleted."))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say("delete c", user="alice")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        approve = request_of(p).buttons[0].command
        await p.say(approve, user="mallory")
        await wait_for(lambda: any("can decide this request" in m.text for m in p.sent))
        # the pre-check a provider makes before it hands a click over: a private refusal
        approval_id = approve.split()[1]
        assert gw.pipeline.approvals is not None
        assert "Only the person who asked" in (await gw.pipeline.approvals.check(
            "test", "c1", "mallory", approval_id) or "")
        assert await gw.pipeline.approvals.check("test", "c1", "alice", approval_id) is None
        assert await gw.pipeline.approvals.check("test", "other-chat", "alice",
                                                 approval_id) is not None
        await gw.settled()
        assert files.deleted == []
        await p.say(approve, user="alice")
        await wait_for(lambda: "Deleted." in p.finals())
        assert files.deleted == ["/tmp/c"]


async def test_admins_approve_for_a_route_that_says_so(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/d")]), Scripted(text="Deleted d."))
    routes = ("admins: [\"test:boss\"]\nroutes:\n  - match: {provider: test}\n"
              "    agent: default\n    approvers: admins\n")
    async with gateway(tmp_path, model, files, routes=routes) as gw:
        p = await start(gw)
        await p.say("delete d", user="alice")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        assert "test:boss may decide" in request_of(p).text
        approve = request_of(p).buttons[0].command
        await p.say(approve, user="alice")  # the asker is no admin here
        await wait_for(lambda: any("Only test:boss can decide" in m.text for m in p.sent))
        await p.say(approve, user="boss")
        await wait_for(lambda: "Deleted d." in p.finals())
        assert files.deleted == ["/tmp/d"]


async def test_approving_after_a_restart_resumes_the_run(tmp_path, files):
    model = ScriptedModel(Scripted(text="One moment.", tool_calls=[delete("/tmp/e")]))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say("delete e")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        approve = request_of(p).buttons[0].command
    model = ScriptedModel(Scripted(text="Deleted e after the restart."))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say(approve)
        await wait_for(lambda: "Deleted e after the restart." in p.finals())
        assert files.deleted == ["/tmp/e"]
        # the model saw the whole exchange: the question, the paused call and its result
        roles = [m["role"] for m in model.calls[-1]]
        assert roles[-3:] == ["user", "assistant", "tool"]
        assert model.calls[-1][-3]["content"] == "delete e"


async def test_without_buttons_the_chat_is_told_the_commands(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/f")]), Scripted(text="Gone."))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw, Capabilities(max_message_length=2000, markup=MARKDOWN))
        await p.say("delete f")
        await wait_for(lambda: any("/approve " in m.text for m in p.sent))
        ask = next(m for m in p.sent if "/approve " in m.text)
        assert not ask.buttons and "/deny " in ask.text
        await p.say("/approve")  # without an id: the chat's newest request
        await wait_for(lambda: "Gone." in p.finals())
        assert files.deleted == ["/tmp/f"]


async def test_first_time_asks_once_per_session(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/1")]), Scripted(text="First."),
                          Scripted(tool_calls=[delete("/tmp/2", "c2")]), Scripted(text="Second."))
    async with gateway(tmp_path, model, files, approval="{\"delete_*\": first_time}") as gw:
        p = await start(gw)
        await p.say("delete 1")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        await p.say(request_of(p).buttons[0].command)
        await wait_for(lambda: "First." in p.finals())
        await p.say("delete 2")
        await wait_for(lambda: "Second." in p.finals())
        assert files.deleted == ["/tmp/1", "/tmp/2"]
        assert len([m for m in p.sent if m.buttons]) == 1


async def test_stop_cancels_a_waiting_request(tmp_path, files):
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/g")]))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say("delete g")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        await p.say("/stop")
        await wait_for(lambda: "Stopped." in p.finals())
        await p.say(request_of(p).buttons[0].command)
        await wait_for(lambda: any("was cancelled" in m.text for m in p.sent))
        await gw.settled()
        assert files.deleted == [] and len(model.calls) == 1
        assert await gw.store.approvals.unresumed(0.0) == []  # never resumed by the sweep


async def test_a_child_agent_cannot_wait_for_a_person(tmp_path, files):
    cfg = config(tmp_path)
    write_agent(cfg, "lead", "model: scripted\ninstructions: i.md\nagents: [default]\n")
    (cfg / "agents" / "lead" / "i.md").write_text("You lead.")
    (cfg / "routes.yaml").write_text("routes: []\ndefault: lead\n")
    model = ScriptedModel(
        Scripted(tool_calls=[ToolCall("a1", "ask_default", '{"question": "delete h"}')]),
        Scripted(tool_calls=[delete("/tmp/h")]),
        Scripted(text="I could not: it needs approval."),
        Scripted(text="The file manager could not delete it without an approval."))
    async with Gateway(cfg, config=PlutoConfig(data_dir=tmp_path / "data"),
                       model_factory=model) as gw:
        p = await start(gw)
        await p.say("please delete h")
        await wait_for(lambda: p.finals())
        assert files.deleted == [] and not any(m.buttons for m in p.sent)
        assert "needs a person's approval" in str(model.calls[2])


@pytest.mark.parametrize("yaml_text, problem", [
    ("approval: {delete_file: sometimes}\n", "approval.delete_file"),
    ("approval: {\"rm -rf\": always}\n", "not a tool name or pattern"),
    ("approval_timeout: 0\n", "approval_timeout"),
])
def test_bad_approval_rules_name_the_file_and_line(tmp_path, yaml_text, problem):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "agent.yaml").write_text("model: m\n" + yaml_text)
    with pytest.raises(ConfigError) as e:
        load_agent(tmp_path / "a")
    [(file, line, _field, _message)] = e.value.problems
    assert file.endswith("a/agent.yaml") and line == 2
    assert problem in str(e.value)


def test_rules_by_name_then_pattern(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "agent.yaml").write_text(
        "model: m\napproval: {\"files_*\": first_time, files_read: never, run_sql: always}\n")
    agent = load_agent(tmp_path / "a")
    assert [agent.approval_rule(t) for t in ("files_read", "files_delete", "run_sql", "x")] == [
        "never", "first_time", "always", "never"]


async def test_a_decision_whose_instance_died_before_resuming_is_handed_over_again(tmp_path,
                                                                                   files):
    """The instance decided (its statement committed) and died before the resuming run began:
    the sweep finds the decided request that no run resumed and hands it to its chat."""
    model = ScriptedModel(Scripted(tool_calls=[delete("/tmp/k")]),
                          Scripted(text="Deleted k in the end."))
    async with gateway(tmp_path, model, files) as gw:
        p = await start(gw)
        await p.say("delete k")
        await wait_for(lambda: any(m.buttons for m in p.sent))
        approval_id = request_of(p).buttons[0].command.split()[1]
        decided, fresh = await gw.store.approvals.decide(approval_id, "approved", by="u1",
                                                         message_id="click:lost")
        assert fresh and decided is not None
        gw.approval_sweep.stranded_after = 0.0
        assert await gw.approval_sweep.look() == 1
        await wait_for(lambda: "Deleted k in the end." in p.finals())
        assert files.deleted == ["/tmp/k"]
        # the lost click, redelivered late, resumes nothing more
        await p.say(f"/approve {approval_id}")
        await gw.settled()
        assert files.deleted == ["/tmp/k"] and p.finals().count("Deleted k in the end.") == 1
        assert await gw.approval_sweep.look() == 0
