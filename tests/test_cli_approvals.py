"""Approvals in the terminal (issue 33, docs/approvals.md), in-process on a real gateway: the
request is printed with its arguments and the terminal asks ``Approve? [y/N]`` before the next
prompt; ``y`` approves (the tool runs once, the answer is printed), anything else denies
(the model is told), a typed ``/deny <id> <reason>`` at the question goes as typed, and with
nobody to ask the printed commands, typed, decide it."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import yaml

from pluto.gateway.app import Gateway
from pluto.gateway.ports import Intake
from pluto.providers.cli import CliProvider
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import ToolContext, ToolResult, tool
from pluto.settings import PlutoConfig


class Answers:
    """The keyboard at the question: the lines the person types, and the questions asked."""

    def __init__(self, *lines: str):
        self.lines = list(lines)
        self.asked: list[str] = []

    async def read(self, prompt: str, err: object = None) -> str:
        self.asked.append(prompt)
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


class Terminal(CliProvider):
    def __init__(self, gw: Gateway, answers: Answers | None):
        super().__init__(gw.feed, chat_id="terminal", out=io.StringIO(), err=io.StringIO(),
                         markdown=False, data_dir=gw.data_dir)
        self.reader = answers
        self.intake: Intake | None = None
        self.ready = asyncio.Event()

    async def run(self, intake: Intake) -> None:
        self.intake = intake
        self.ready.set()
        await asyncio.Event().wait()

    async def type(self, text: str) -> str:
        assert self.intake is not None
        await self.ask(self.intake, text)
        return self.out.getvalue()  # type: ignore[attr-defined]

    @property
    def told(self) -> str:
        return self.err.getvalue()  # type: ignore[attr-defined]


class Deleter:
    def __init__(self) -> None:
        self.calls: list[str] = []

        @tool
        async def delete_file(ctx: ToolContext, path: str) -> ToolResult:
            """Delete a file.

            Args:
                path: The file.
            """
            self.calls.append(path)
            return ToolResult(f"deleted {path}")

        self.tool = delete_file


def gateway(config_dir: Path, data_dir: Path, deleter: Deleter, *answers: str,
            ) -> tuple[Gateway, ScriptedModel]:
    agent = config_dir / "agents" / "default" / "agent.yaml"
    spec = yaml.safe_load(agent.read_text())
    agent.write_text(yaml.safe_dump({**spec, "tools": [*spec.get("tools", []), "delete_file"],
                                     "approval": {"delete_file": "always"}}))
    model = ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "delete_file",
                                                        '{"path": "/srv/old.log"}')]),
                          *(Scripted(text=a) for a in answers))
    return Gateway(config_dir, config=PlutoConfig(data_dir=data_dir), model_factory=model,
                   tools={"delete_file": deleter.tool}), model


async def terminal(gw: Gateway, answers: Answers | None) -> Terminal:
    term = Terminal(gw, answers)
    gw.add_provider(term)
    await term.ready.wait()
    return term


def told_model(model: ScriptedModel) -> str:
    """What the model read of the call's result in its last turn."""
    return " ".join(str(m.get("content")) for m in model.calls[-1] if m["role"] == "tool")


async def test_y_approves_and_the_answer_comes_before_the_next_prompt(config_dir, data_dir):
    deleter = Deleter()
    answers = Answers("y")
    gw, model = gateway(config_dir, data_dir, deleter, "Deleted old.log.")
    async with gw:
        term = await terminal(gw, answers)
        shown = await term.type("delete the old log")
        assert answers.asked == ["Approve? [y/N] "]
        request = shown.index("delete_file")
        assert "/srv/old.log" in shown[request:] and shown.index("Deleted old.log.") > request
        assert deleter.calls == ["/srv/old.log"]
        assert "delete_file approved by" in term.told
        await gw.outbox.idle()
        assert term.out.getvalue().count("Deleted old.log.") == 1  # type: ignore[attr-defined]


async def test_anything_else_denies(config_dir, data_dir):
    deleter = Deleter()
    answers = Answers("nope")
    gw, model = gateway(config_dir, data_dir, deleter, "Understood, I left it.")
    async with gw:
        term = await terminal(gw, answers)
        shown = await term.type("delete the old log")
        assert "Understood, I left it." in shown and deleter.calls == []
        assert "denied" in told_model(model) and "delete_file denied by" in term.told


async def test_a_command_typed_at_the_question_goes_as_typed(config_dir, data_dir):
    deleter = Deleter()
    answers = Answers()
    gw, model = gateway(config_dir, data_dir, deleter, "OK, kept.")
    async with gw:
        term = await terminal(gw, answers)
        answers.lines.append("/deny that file is still needed")  # (no id: this chat's latest)
        shown = await term.type("delete the old log")
        assert "OK, kept." in shown and deleter.calls == []
        assert "that file is still needed" in told_model(model)


async def test_end_of_input_at_the_question_denies(config_dir, data_dir):
    deleter = Deleter()
    gw, model = gateway(config_dir, data_dir, deleter, "Not done.")
    async with gw:
        term = await terminal(gw, Answers())
        shown = await term.type("delete the old log")
        assert "Not done." in shown and deleter.calls == []


async def test_with_nobody_to_ask_the_printed_command_decides(config_dir, data_dir):
    deleter = Deleter()
    gw, model = gateway(config_dir, data_dir, deleter, "Deleted by command.")
    async with gw:
        term = await terminal(gw, None)
        shown = await term.type("delete the old log")
        found = re.search(r"/approve [a-z2-9]+", shown)
        assert found is not None and deleter.calls == [], shown
        shown = await term.type(found.group(0))
        assert "Deleted by command." in shown and deleter.calls == ["/srv/old.log"]
