"""A store that fails during hand-over, on every provider.

The inbox cannot record (its ``accept`` raises as SQLite does on a full disk) for a while, then
works again. Meanwhile nothing is confirmed to the platform (no offset past the message, no 2xx,
no ack, no sync token beyond it — each harness reads that from its fake platform's view), and
the platform delivers the messages again or the provider tries again itself; once storage
works, every message is answered exactly once, without a restart. The outage is logged as two
lines (an error, then an info line on recovery), not once per message, and nobody is shown a
stack trace.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import Counter
from typing import Any

import pytest

from tests.conformance.conftest import harnesses
from tests.conformance.harness import Harness, UserMessage

MESSAGES = ["the first message", "the second message", "the third message"]


class FailingInbox:
    """Patches an inbox: ``accept`` raises like a full disk until :meth:`heal`."""

    def __init__(self, inbox: Any):
        self.inbox = inbox
        self.real = inbox.accept
        self.tries: Counter[str] = Counter()  # message text → refused hand-overs
        self.healed = False
        self.accepted: list[str] = []
        inbox.accept = self.accept

    async def accept(self, provider: str, message_id: str, payload: dict[str, Any]) -> bool:
        if not self.healed:
            self.tries[str(payload.get("text"))] += 1  # (an API retry is a new step id)
            raise sqlite3.OperationalError("database or disk is full")
        fresh = await self.real(provider, message_id, payload)
        if fresh:
            self.accepted.append(message_id)
        return fresh

    def retried(self) -> bool:
        """Some message was refused, then handed over again (redelivered or retried)."""
        return any(n >= 2 for n in self.tries.values())

    def heal(self) -> None:
        self.healed = True


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


async def until(predicate: Any, what: str, timeout: float = 15) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.02)
    try:
        await asyncio.wait_for(wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@pytest.mark.parametrize("harness", harnesses(), indirect=True)
async def test_a_store_that_fails_during_hand_over(harness: Harness) -> None:
    lines = Lines()
    logger = logging.getLogger("pluto.providers.handover")
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    try:
        await _scenario(harness, lines)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(logging.NOTSET)


async def _scenario(harness: Harness, lines: Lines) -> None:
    gateway = await harness.start()
    store = FailingInbox(gateway.store.inbound)
    said: list[UserMessage] = [await harness.user_says(text) for text in MESSAGES]
    await until(lambda: store.retried() and sum(store.tries.values()) >= len(MESSAGES),
                "the platform to deliver a refused message again (or the provider to retry)")
    # nothing was confirmed to the platform while the inbox could not record
    assert not any(harness.confirmed(m) for m in said), \
        f"{harness.name}: confirmed while storage failed"
    assert not harness.shown(), f"{harness.name}: answered what was never recorded"
    assert not harness.received
    store.heal()  # storage works again: everything resumes by itself, no restart

    expected = sorted(f"echo: {text}" for text in MESSAGES)
    await harness.wait_shown(lambda s: sorted(m.text for m in s) == expected, timeout=20,
                             what="one answer to each message")
    await until(lambda: all(harness.confirmed(m) is not False for m in said),
                "the platform to see every message confirmed")
    await harness.settled()  # nothing more is on its way
    assert sorted(m.text for m in harness.shown()) == expected  # each once
    assert sorted(m.text for m in harness.received) == sorted(MESSAGES)
    assert len(harness.model.calls) == len(MESSAGES)
    assert len(store.accepted) == len(MESSAGES)
    errors, infos = lines.at(logging.ERROR), lines.at(logging.INFO)
    assert len(errors) == 1 and "cannot be recorded" in errors[0], errors  # once per outage
    assert len(infos) == 1 and "recorded again" in infos[0], infos
    assert not [m.text for m in harness.shown() if "Traceback" in m.text]
