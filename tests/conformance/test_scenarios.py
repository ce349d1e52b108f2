"""The same scenarios against every provider, each through its fake platform.

A scenario runs on the harnesses whose capabilities or platform features it needs (see
``conftest.harnesses``); nothing is skipped.
"""

from __future__ import annotations

import asyncio
import re
import struct
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from pluto.gateway.delivery.render import render_chunks
from pluto.runtime.model import ModelTurn, ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.runtime.tools import ToolContext, ToolResult, tool
from tests.conformance.conftest import harnesses
from tests.conformance.harness import Harness

MARKDOWN = """Here is **the result**:

```python
x = 1 < 2
```

| city | people |
|------|--------|
| Oslo | 700000 |
"""


def long_text(paragraphs: int = 28) -> str:
    return "\n\n".join(f"Paragraph {i}: " + " ".join(f"word{i}x{j}" for j in range(40))
                       for i in range(paragraphs))


def png(width: int = 4, height: int = 3) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    rows = b"".join(b"\x00" + b"\x10\x20\x30" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                             0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


class SteppedModel(ScriptedModel):
    """Writes its reply one piece per :meth:`step`, so a test sees each stage."""

    def __init__(self, pieces: list[str]):
        super().__init__()
        self.pieces = pieces
        self._permits: asyncio.Queue[None] = asyncio.Queue()

    def step(self) -> None:
        self._permits.put_nowait(None)

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     settings: Any) -> AsyncIterator[str | ModelTurn]:
        self.calls.append(messages)
        for piece in self.pieces:
            await self._permits.get()
            yield piece
        await self._permits.get()
        yield ModelTurn("".join(self.pieces), [], {"prompt_tokens": 1, "completion_tokens": 1},
                        "stop")


def texts(h: Harness, chat: str | None = None) -> list[str]:
    return [s.text for s in h.shown(chat)]


@pytest.mark.parametrize("harness", harnesses(), indirect=True)
async def test_plain_reply(harness: Harness) -> None:
    await harness.start()
    await harness.user_says("hello there")
    await harness.wait_texts(["echo: hello there"])


@pytest.mark.parametrize("harness", harnesses(), indirect=True)
async def test_long_reply_is_split_at_the_limit(harness: Harness) -> None:
    reply = long_text()
    await harness.start(ScriptedModel(Scripted(text=reply, chunk=500)))
    await harness.user_says("tell me everything")
    expected = render_chunks(reply, harness.caps.markup, harness.caps.max_message_length)
    assert len(expected) >= 3 or harness.caps.max_message_length > len(reply)
    await harness.wait_texts(expected, raw=True)
    await harness.settled()  # nothing more is on its way
    shown = harness.shown()
    assert [s.raw for s in shown] == expected
    assert all(len(s.raw) <= harness.caps.max_message_length for s in shown)
    assert " ".join(s.text for s in shown).split() == reply.split()


@pytest.mark.parametrize("harness", harnesses(), indirect=True)
async def test_markdown_with_code_and_a_table(harness: Harness) -> None:
    await harness.start(ScriptedModel(Scripted(text=MARKDOWN)))
    await harness.user_says("show me")
    [shown] = await harness.wait_shown(
        lambda s: bool(s) and "700000" in s[0].text, what="the rendered reply")
    assert "x = 1 < 2" in shown.code  # a code block, with "<" intact
    lines = shown.text.splitlines()
    assert any("city" in line and "people" in line for line in lines)
    assert any("Oslo" in line and "700000" in line for line in lines)  # a table row stays a row
    if harness.caps.markup.name != "markdown":
        assert "**" not in shown.text and "```" not in shown.text
        assert any("Oslo" in block and "700000" in block for block in shown.code)  # monospaced


@pytest.mark.parametrize("harness", harnesses(lambda h: h.caps.can_edit
                                              or h.caps.streams_deltas), indirect=True)
async def test_reply_streams_into_one_message(harness: Harness) -> None:
    model = SteppedModel(["Hello", " brave", " new world"])
    await harness.start(model)
    await harness.user_says("stream please")
    model.step()
    await harness.wait_shown(lambda s: bool(s) and s[0].text.startswith("Hello"),
                             what="the first words")
    model.step()
    await harness.wait_shown(lambda s: bool(s) and s[0].text.startswith("Hello brave"),
                             what="the reply growing")
    model.step()
    model.step()
    shown = await harness.wait_shown(lambda s: bool(s) and s[0].text == "Hello brave new world",
                                     what="the final text")
    assert len(shown) == 1
    if harness.caps.can_edit:
        assert shown[0].edits >= 1


@pytest.mark.parametrize("harness", harnesses(lambda h: "redelivery" in h.features),
                         indirect=True)
async def test_redelivered_message_gets_one_reply(harness: Harness) -> None:
    await harness.start()
    first = await harness.user_says("hello once")
    await harness.wait_texts(["echo: hello once"])
    await harness.redeliver(first)
    await harness.user_says("and again")  # handled after the redelivery
    await harness.wait_texts(["echo: hello once", "echo: and again"])
    await harness.settled()
    assert texts(harness) == ["echo: hello once", "echo: and again"]
    assert len(harness.model.calls) == 2


@pytest.mark.parametrize("harness", harnesses(lambda h: not h.caps.streams_deltas
                                              and "flood_control" in h.features),
                         indirect=True)
async def test_restart_delivers_the_unsent_outbox_exactly_once(harness: Harness) -> None:
    reply = long_text()
    expected = render_chunks(reply, harness.caps.markup, harness.caps.max_message_length)
    assert len(expected) >= 3
    harness.rate_limit_sends(harness.direct_chat, after=1, retry_after=2)
    await harness.start(ScriptedModel(Scripted(text=reply, chunk=len(reply))))
    await harness.user_says("a long answer please")
    await harness.wait_shown(lambda s: bool(harness.refused_sends()), what="a refused send")
    assert len(harness.shown()) == 1  # the first chunk went out; the others wait
    await harness.restart()  # the reply is still being delivered: its delivery is cancelled
    shown = await harness.wait_texts(expected, raw=True)  # every chunk once, in order
    await harness.settled()
    assert [s.raw for s in harness.shown()] == expected
    assert len(harness.accepted_sends()) == len(expected)  # and none twice
    [refused] = harness.refused_sends()  # the restarted gateway kept the platform's window
    assert [t for t in harness.accepted_sends() if t > refused][0] - refused >= 1.95
    assert len(harness.model.calls) == 1
    assert shown[0].text.startswith("Paragraph 0:")


@pytest.mark.parametrize("harness", harnesses(lambda h: "flood_control" in h.features),
                         indirect=True)
async def test_retry_after_is_honoured(harness: Harness) -> None:
    reply = long_text()
    expected = render_chunks(reply, harness.caps.markup, harness.caps.max_message_length)
    harness.rate_limit_sends(harness.direct_chat, after=1, retry_after=1)
    await harness.start(ScriptedModel(Scripted(text=reply, chunk=len(reply))))
    await harness.user_says("a long answer please")
    await harness.wait_texts(expected, raw=True)
    [refused] = harness.refused_sends()
    later = [t for t in harness.accepted_sends() if t > refused]
    assert later and later[0] - refused >= 0.95  # waited as long as the platform asked
    assert [s.raw for s in harness.shown()] == expected


@pytest.mark.parametrize("harness", harnesses(lambda h: "groups" in h.features), indirect=True)
async def test_groups_answer_mentions_and_replies_only(harness: Harness) -> None:
    await harness.start()
    group = harness.group_chat
    await harness.user_says("just chatting among ourselves", chat=group)
    await harness.user_says("hello bot", chat=group, mention=True)
    [answer] = await harness.wait_texts(["echo: hello bot"], chat=group)
    await harness.user_says("not for you either", chat=group)
    await harness.user_says("tell me more", chat=group, reply_to=answer)
    await harness.wait_texts(["echo: hello bot", "echo: tell me more"], chat=group)
    await harness.settled()
    assert texts(harness, group) == ["echo: hello bot", "echo: tell me more"]
    assert [call[-1]["content"] for call in harness.model.calls] == ["hello bot",
                                                                      "tell me more"]
    assert [(m.is_direct, m.mentions_bot) for m in harness.received] == [(False, True)] * 2


@pytest.mark.parametrize("harness", harnesses(lambda h: "files_in" in h.features),
                         indirect=True)
async def test_a_file_sent_by_a_user_reaches_the_gateway(harness: Harness) -> None:
    data = b"city,people\nOslo,700000\n"
    await harness.start()
    await harness.user_says("what is in here?", document=("cities.csv", data))
    await harness.wait_shown(lambda s: any("what is in here?" in m.text for m in s),
                             what="the answer")  # the gateway makes the file a dataset first
    [message] = harness.received
    [attachment] = message.attachments
    assert attachment.filename == "cities.csv" and attachment.path is not None
    assert attachment.path.read_bytes() == data
    assert attachment.path.is_relative_to(harness.data_dir / "uploads")
    assert message.text == "what is in here?"


@pytest.mark.parametrize("harness", harnesses(lambda h: h.caps.can_send_images), indirect=True)
async def test_an_image_made_by_a_tool_is_sent_as_an_image(harness: Harness) -> None:
    image = png()

    @tool
    async def draw_chart(ctx: ToolContext) -> ToolResult:
        """Draw the chart."""
        path = ctx.data_dir / "artifacts" / "chart.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image)
        return ToolResult("chart drawn", details={"image": str(path)})

    agent = harness.config_dir / "agents" / "default" / "agent.yaml"
    spec = yaml.safe_load(agent.read_text())
    agent.write_text(yaml.safe_dump({**spec, "tools": [*spec.get("tools", []), "draw_chart"]}))
    model = ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "draw_chart", "{}")]),
                          Scripted(text="Here is the chart."))
    await harness.start(model, tools={"draw_chart": draw_chart})
    await harness.user_says("chart it")
    shown = await harness.wait_shown(lambda s: len(s) == 2 and s[0].text == "Here is the chart.",
                                     what="the reply and the image")
    assert [(s.kind, s.text) for s in shown] == [("text", "Here is the chart."), ("image", "")]
    assert shown[1].data == image


@pytest.mark.parametrize("harness", harnesses(lambda h: {"flood_control", "groups"}
                                              <= h.features), indirect=True)
async def test_a_flood_controlled_chat_never_delays_another(harness: Harness) -> None:
    """The platform answers the reply in chat A with "retry after 3 s": chat B is answered
    within a second all the same, and A gets its reply once the wait is over."""
    a, b = harness.direct_chat, harness.group_chat
    harness.rate_limit_sends(a, after=0, retry_after=3)
    await harness.start()
    await harness.user_says("/help", chat=a)
    await harness.wait_shown(lambda s: bool(harness.refused_sends()), chat=a,
                             what="the platform refusing the reply in chat A")
    asked = time.monotonic()
    await harness.user_says("hello from B", chat=b, mention=True)
    await harness.wait_shown(lambda s: any("hello from B" in m.text for m in s), chat=b,
                             timeout=1, what="the answer in chat B within a second")
    assert time.monotonic() - asked < 1
    [refused] = harness.refused_sends()
    shown = await harness.wait_shown(lambda s: bool(s), chat=a, timeout=10,
                                     what="chat A's reply after its wait")
    assert "/help" in shown[0].text or "/new" in shown[0].text
    assert harness.accepted_sends(a)[0] - refused >= 2.9  # it waited as long as it was asked


@pytest.mark.parametrize("harness", harnesses(lambda h: "flood_control" in h.features
                                              and h.caps.can_edit), indirect=True)
async def test_a_429_on_the_first_preview_holds_the_final_reply(harness: Harness) -> None:
    """The platform refuses the live preview's first message with a retry-after: the final
    reply (a new message: there is no preview to edit) waits the window out too."""
    harness.rate_limit_sends(harness.direct_chat, after=0, retry_after=2)
    model = SteppedModel(["Thinking", " it over."])
    await harness.start(model)
    await harness.user_says("stream please")
    model.step()  # the first words: the preview's send is refused
    await harness.wait_shown(lambda s: bool(harness.refused_sends()), what="a refused send")
    model.step()
    model.step()
    shown = await harness.wait_shown(lambda s: bool(s) and s[-1].text == "Thinking it over.",
                                     what="the final text")
    [refused] = harness.refused_sends()
    assert harness.accepted_sends()[0] - refused >= 1.95
    assert [s.text for s in shown] == ["Thinking it over."]


# approvals (issue 33, docs/approvals.md) ---------------------------------------------------------

class Deleter:
    """A tool behind an approval: it counts its calls."""

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


async def approving(harness: Harness, *answers: str) -> Deleter:
    """The default agent calls delete_file behind ``approval: always``; ``answers`` follow."""
    deleter = Deleter()
    agent = harness.config_dir / "agents" / "default" / "agent.yaml"
    spec = yaml.safe_load(agent.read_text())
    agent.write_text(yaml.safe_dump({**spec, "tools": [*spec.get("tools", []), "delete_file"],
                                     "approval": {"delete_file": "always"}}))
    model = ScriptedModel(Scripted(tool_calls=[ToolCall("c1", "delete_file",
                                                        '{"path": "/srv/old.log"}')]),
                          *(Scripted(text=a) for a in answers))
    await harness.start(model, tools={"delete_file": deleter.tool})
    return deleter


def request_shown(shown: list[Any]) -> Any | None:
    return next((s for s in shown if "delete_file" in s.text and "/srv/old.log" in s.text),
                None)


@pytest.mark.parametrize("harness", harnesses(lambda h: h.caps.has_buttons), indirect=True)
async def test_an_approval_click_runs_the_tool_exactly_once(harness: Harness) -> None:
    deleter = await approving(harness, "Deleted old.log.")
    await harness.user_says("delete the old log")
    shown = await harness.wait_shown(lambda s: (r := request_shown(s)) is not None and
                                     r.buttons == ("Approve", "Deny"),
                                     what="the request with Approve / Deny")
    ask = request_shown(shown)
    assert deleter.calls == []  # nothing runs before a person says so
    await harness.click(ask, "Approve")
    await harness.wait_shown(lambda s: any(m.text == "Deleted old.log." for m in s),
                             what="the answer after the approval")
    assert deleter.calls == ["/srv/old.log"]
    await harness.click(ask, "Approve")  # a second click (or a redelivered one): no effect
    await harness.settled()
    assert deleter.calls == ["/srv/old.log"]
    assert [m.text for m in harness.shown()].count("Deleted old.log.") == 1


@pytest.mark.parametrize("harness", harnesses(lambda h: h.caps.has_buttons), indirect=True)
async def test_a_deny_click_tells_the_model_and_it_answers(harness: Harness) -> None:
    deleter = await approving(harness, "Understood, I left it.")
    await harness.user_says("delete the old log")
    shown = await harness.wait_shown(lambda s: request_shown(s) is not None,
                                     what="the request")
    await harness.click(request_shown(shown), "Deny")
    await harness.wait_shown(lambda s: any(m.text == "Understood, I left it." for m in s),
                             what="the answer after the denial")
    assert deleter.calls == []
    assert any("denied" in str(m.get("content")) for m in harness.model.calls[-1]
               if m["role"] == "tool")


@pytest.mark.parametrize("harness", harnesses(lambda h: h.caps.has_buttons
                                              and "strangers" in h.features), indirect=True)
async def test_a_strangers_click_is_refused_privately(harness: Harness) -> None:
    deleter = await approving(harness, "Deleted.")
    chat = harness.group_chat or harness.direct_chat
    await harness.user_says("delete the old log", chat=chat, mention=True)
    shown = await harness.wait_shown(lambda s: request_shown(s) is not None, chat=chat,
                                     what="the request")
    before = len(harness.shown(chat))
    await harness.click(request_shown(shown), "Approve", chat=chat, user=harness.stranger)
    notes = harness.private_notes(harness.stranger)
    assert notes and "can decide" in notes[-1]
    await harness.settled()
    assert deleter.calls == [] and len(harness.shown(chat)) == before  # nothing in the chat
    await harness.click(request_shown(shown), "Approve", chat=chat)  # the asker may
    await harness.wait_shown(lambda s: any(m.text == "Deleted." for m in s), chat=chat,
                             what="the answer once the asker approved")
    assert deleter.calls == ["/srv/old.log"]


@pytest.mark.parametrize("harness", harnesses(lambda h: not h.caps.has_buttons), indirect=True)
async def test_without_buttons_an_approval_is_a_command_to_write(harness: Harness) -> None:
    deleter = await approving(harness, "Deleted by command.")
    await harness.user_says("delete the old log")
    shown = await harness.wait_shown(lambda s: (r := request_shown(s)) is not None and
                                     "/approve " in r.text, what="the request and its commands")
    found = re.search(r"/approve [a-z2-9]+", request_shown(shown).text)
    assert found is not None, request_shown(shown).text
    command = found.group(0)
    await harness.user_says(command)
    await harness.wait_shown(lambda s: any("Deleted by command." in m.text for m in s),
                             what="the answer after /approve")
    assert deleter.calls == ["/srv/old.log"]
