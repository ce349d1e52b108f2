"""A recording provider and helpers to drive a Gateway in-process."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from gateway.provider import Inbox, Provider
from gateway.types import Capabilities, IncomingMessage, OutgoingMessage

_ids = itertools.count(1)


class RecordingProvider(Provider):
    """A provider whose platform is a list: what the gateway sends is recorded."""

    name = "test"
    capabilities = Capabilities(max_message_length=200, streams_deltas=False)

    def __init__(self, name: str = "test", *, streams: bool = False):
        self.name = name  # type: ignore[misc]
        if streams:
            self.capabilities = Capabilities(streams_deltas=True)  # type: ignore[misc]
        self.sent: list[OutgoingMessage] = []
        self.inbox: Inbox | None = None
        self._changed = asyncio.Event()
        self.running = asyncio.Event()

    async def run(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.running.set()
        await asyncio.Event().wait()

    async def send(self, message: OutgoingMessage) -> str | None:
        self.sent.append(message)
        self._changed.set()
        return str(len(self.sent))

    def msg(self, text: str, *, chat: str = "c1", user: str = "u1", **kw: object) -> IncomingMessage:
        return IncomingMessage(provider=self.name, chat_id=chat, user_id=user, text=text,
                               message_id=str(next(_ids)), **kw)  # type: ignore[arg-type]

    async def say(self, text: str, **kw: object) -> None:
        await self.running.wait()
        assert self.inbox is not None
        await self.inbox(self.msg(text, **kw))

    def finals(self, chat: str | None = None) -> list[str]:
        return [m.text for m in self.sent if m.kind in ("reply", "error")
                and (chat is None or m.chat_id == chat)]

    async def wait_finals(self, n: int, chat: str | None = None, timeout: float = 10) -> list[str]:
        async def until() -> list[str]:
            while len(self.finals(chat)) < n:
                self._changed.clear()
                await self._changed.wait()
            return self.finals(chat)
        return await asyncio.wait_for(until(), timeout)


def write_agent(config_dir: Path, name: str, yaml_text: str, instructions: str = "Be brief.") -> Path:
    d = config_dir / "agents" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "agent.yaml").write_text(yaml_text)
    (d / "instructions.md").write_text(instructions)
    return d
