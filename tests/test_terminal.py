"""The terminal (``pluto chat``, ``pluto run``) in-process, on a real gateway and the fake
OpenAI-compatible server: an answer is printed once — also after a compaction notice and after
Ctrl+C — a chart's path comes before the next prompt, and a streamed answer taller than the
window is not drawn again and again (checked on a small terminal emulator)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
from pathlib import Path

import pytest

from pluto.gateway.app import Gateway
from pluto.gateway.ports import Intake
from pluto.providers.cli import CliProvider
from pluto.providers.cli.screen import Screen
from pluto.settings import PlutoConfig
from pluto.types import OutgoingMessage
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.helpers.gateway import write_agent

KEY = "sk-terminal"


# a terminal, as far as rich uses one ------------------------------------------------------------

_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


def emulate(data: str, height: int) -> list[str]:
    """What a terminal of ``height`` rows shows, scrollback included, after ``data``: the
    cursor moves up at most to the window's top row (what scrolled off stays as printed)."""
    lines, row, col, i = [""], 0, 0, 0
    while i < len(data):
        if data[i] == "\x1b":
            m = _CSI.match(data, i)
            assert m is not None, repr(data[i:i + 10])
            params, command = m.groups()
            i = m.end()
            if command == "A":
                row = max(len(lines) - height, row - int(params or 1))
            elif command == "B":
                row = min(len(lines) - 1, row + int(params or 1))
            elif command == "K":
                lines[row] = "" if params == "2" else lines[row][:col]
            elif command == "G":
                col = int(params or 1) - 1
            continue  # colours, cursor shown or hidden
        ch = data[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + ch + line[col + 1:]
            col += 1
    while lines and not lines[-1].strip():
        lines.pop()
    return [line.rstrip() for line in lines]


def screen_on(out: io.StringIO, height: int, width: int = 60) -> Screen:
    from rich.console import Console

    console = Console(file=out, width=width, height=height, force_terminal=True,
                      color_system=None, soft_wrap=False, highlight=False, emoji=False)
    return Screen(out, markdown=True, console=console, refresh_per_second=0)


STORY = "\n\n".join(f"Paragraph {n} of the story." for n in range(1, 41))


def test_a_streamed_answer_taller_than_the_window_is_printed_once() -> None:
    out = io.StringIO()
    screen = screen_on(out, height=10)
    for i in range(0, len(STORY), 9):
        assert screen.stream("r1", STORY[i:i + 9])
    assert screen.end("r1")
    shown = [line for line in emulate(out.getvalue(), 10) if line]
    assert shown == [f"Paragraph {n} of the story." for n in range(1, 41)]


def test_a_short_answer_is_redrawn_in_place() -> None:
    out = io.StringIO()
    screen = screen_on(out, height=24)
    for word in "A **short** answer, drawn as it comes.".split(" "):
        screen.stream("r1", word + " ")
    screen.end("r1")
    assert emulate(out.getvalue(), 24) == ["A short answer, drawn as it comes."]


# the terminal on a real gateway ----------------------------------------------------------------


class Terminal(CliProvider):
    """The terminal provider, typed at by the test (what run() reads from the keyboard)."""

    def __init__(self, gw: Gateway, screen_height: int | None = None):
        super().__init__(gw.feed, chat_id="terminal", out=io.StringIO(), err=io.StringIO(),
                         markdown=False, data_dir=gw.data_dir)
        if screen_height is not None:
            self.screen = screen_on(self.out, screen_height)  # type: ignore[arg-type]
        self.intake: Intake | None = None
        self.ready = asyncio.Event()
        # the parts of a reply after its text (files) reach the terminal when this is set:
        # the outbox commits between parts, which can take a while on a busy disk
        self.later_parts = asyncio.Event()
        self.later_parts.set()

    async def send(self, message: OutgoingMessage) -> str | None:
        if message.attachments:
            await self.later_parts.wait()
        return await super().send(message)

    async def run(self, intake: Intake) -> None:
        self.intake = intake
        self.ready.set()
        await asyncio.Event().wait()

    async def type(self, text: str) -> str:
        """Ask, as at the prompt; what was printed by the time the next prompt would show."""
        assert self.intake is not None
        await self.ask(self.intake, text)
        return self.out.getvalue()  # type: ignore[attr-defined]


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch):
    from pluto.runtime.openai_compat import close_sessions

    monkeypatch.setenv("PLUTO_API_KEY", KEY)
    async with FakeOpenAI(api_key=KEY) as server:
        yield server
    await close_sessions()


def config(data_dir: Path, fake: FakeOpenAI) -> PlutoConfig:
    return PlutoConfig(data_dir=data_dir, models={"default": {
        "model": "openai/fake", "api_base": fake.base_url, "api_key_env": "PLUTO_API_KEY",
        "retries": 0, "timeout": 10}})


async def terminal(gw: Gateway, screen_height: int | None = None) -> Terminal:
    term = Terminal(gw, screen_height)
    gw.add_provider(term)
    await term.ready.wait()
    return term


async def test_after_a_compaction_notice_each_answer_is_printed_once(config_dir, data_dir, fake):
    write_agent(config_dir, "helper", "model: default\nmemory:\n"
                "  short_term: {max_tokens: 300, timeout_seconds: 10}\n")
    (config_dir / "routes.yaml").write_text("routes: []\ndefault: helper\n")
    asked = iter(range(1, 1000))

    def respond(body: dict) -> Reply:
        if body["messages"][0]["content"].startswith("You compact"):
            return Reply(text="They talked about the weather.")
        return Reply(text=f"Answer {next(asked)}: " + "fine weather " * 12, chunk_size=7)

    fake.respond_with(respond)
    async with Gateway(config_dir, config=config(data_dir, fake)) as gw:
        term = await terminal(gw)
        for turn in range(1, 9):
            shown = await term.type(f"Turn {turn}: " + "we talk about the weather " * 6)
            assert f"Answer {turn}: " in shown  # before the next prompt
        await gw.outbox.idle()
        printed = term.out.getvalue()  # type: ignore[attr-defined]
        told = term.err.getvalue()  # type: ignore[attr-defined]
    assert "summarized" in told  # compactions happened, and were said
    for n in range(1, 9):
        assert printed.count(f"Answer {n}: ") == 1, printed
    assert len(printed.splitlines()) == 8


async def test_a_charts_path_comes_with_its_answer_before_the_next_prompt(config_dir, data_dir,
                                                                          fake):
    sql = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 2 DESC"
    fake.script(Reply(tool_calls=[ToolCall("make_chart", {"sql": sql, "kind": "bar",
                                                          "x": "region", "y": ["total"]})]),
                Reply(text="Here is the chart."), Reply(text="Anything else?"))
    async with Gateway(config_dir, config=config(data_dir, fake)) as gw:
        term = await terminal(gw)
        term.later_parts.clear()
        shown = await term.type("chart sales by region")
        term.later_parts.set()
        lines = shown.splitlines()
        assert lines[0] == "Here is the chart." and lines[1].startswith("[image: ")
        png = Path(lines[1].removeprefix("[image: ").removesuffix("]"))
        assert png.is_relative_to(data_dir) and png.read_bytes().startswith(b"\x89PNG")
        await gw.outbox.idle()  # what delivery sends after the text: nothing more printed
        assert term.out.getvalue() == shown  # type: ignore[attr-defined]
        assert (await term.type("thanks")).splitlines()[2:] == ["Anything else?"]


async def test_ctrl_c_leaves_the_partial_answer_once_then_stopped(config_dir, data_dir, fake):
    long = "\n\n".join(f"Line {n} of a long answer." for n in range(1, 200))
    fake.script(Reply(text=long, chunk_size=4, chunk_delay=0.01), Reply(text="fast"))
    async with Gateway(config_dir, config=config(data_dir, fake)) as gw:
        term = await terminal(gw, screen_height=12)
        asking = asyncio.create_task(term.type("tell me a long story"))
        while "Line 30 " not in term.out.getvalue():  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)  # (the answer streams: wait for enough of it)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C, as the terminal sends it
        await asyncio.wait_for(asking, 30)
        await term.type("again")
        await gw.outbox.idle()
        screen = [line for line in emulate(term.out.getvalue(), 12) if line]  # type: ignore[attr-defined]
    assert term.interrupted
    stopped = screen.index("Stopped.")
    partial = screen[:stopped]
    expected = [f"Line {n} of a long answer." for n in range(1, len(partial) + 1)]
    assert len(partial) >= 30 and partial[:-1] == expected[:-1]  # in order, each once
    assert expected[-1].startswith(partial[-1])  # where it was stopped
    assert screen[stopped + 1:] == ["fast"]
    assert json.dumps(screen).count("Line 1 of") == 1
