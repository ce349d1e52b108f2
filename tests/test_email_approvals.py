"""Approvals by email (issue 33): no buttons; a reply to the request mail decides it — the
command above the quoted mail, or just ``approve`` / ``deny`` — the real provider (IMAP, SMTP)
against the fake mail server, through the whole gateway."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.email_harness import EmailHarness
from tests.conformance.harness import Shown
from tests.conformance.test_scenarios import approving, request_shown

pytestmark = pytest.mark.slow


@pytest.fixture
async def harness(config_dir: Path, data_dir: Path) -> Any:
    h = EmailHarness(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def the_request(h: EmailHarness) -> tuple[Shown, str]:
    shown = await h.wait_shown(lambda s: (r := request_shown(s)) is not None
                               and "/approve " in r.text, what="the request mail")
    ask = request_shown(shown)
    assert ask is not None
    found = re.search(r"/approve ([a-z2-9]+)", ask.text)
    assert found is not None
    return ask, found.group(1)


def quoting(new: str, ask: Shown) -> str:
    """A reply as a mail client writes it: the new text, then the request quoted."""
    quoted = "\n".join(f"> {line}" for line in ask.raw.splitlines())
    return f"{new}\n\nOn Thu, 26 Nov 2026 at 19:40, Pluto <pluto@example.org> wrote:\n{quoted}\n"


async def test_the_command_above_the_quoted_request_approves(harness: EmailHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted by reply.")
    await h.user_says("delete the old log")
    ask, approval = await the_request(h)
    await h.user_says(quoting(f"/approve {approval}", ask), reply_to=ask)
    await h.wait_shown(lambda s: any("Deleted by reply." in m.text for m in s),
                       what="the answer after the reply")
    assert deleter.calls == ["/srv/old.log"]


async def test_a_bare_deny_answering_the_request_denies(harness: EmailHarness) -> None:
    h = harness
    deleter = await approving(h, "Understood, I left it.")
    await h.user_says("delete the old log")
    ask, approval = await the_request(h)
    await h.user_says(quoting("Deny - we still need it", ask), reply_to=ask)
    await h.wait_shown(lambda s: any("Understood, I left it." in m.text for m in s),
                       what="the answer after the denial")
    assert deleter.calls == []
    told = [str(m.get("content")) for m in h.model.calls[-1] if m["role"] == "tool"]
    assert any("denied" in t and "we still need it" in t for t in told), told
    assert h.received[-1].text == f"/deny {approval} we still need it"


async def test_a_bare_approve_elsewhere_is_a_message_like_any(harness: EmailHarness) -> None:
    h = harness
    deleter = await approving(h, "Deleted.", "Glad to help.")
    await h.user_says("delete the old log")
    ask, approval = await the_request(h)
    await h.user_says(quoting("approve", ask), reply_to=ask)
    await h.wait_shown(lambda s: any("Deleted." in m.text for m in s), what="the answer")
    assert deleter.calls == ["/srv/old.log"]
    await h.user_says("approve")  # answering the answer mail, not a request: a message
    await h.wait_shown(lambda s: any("Glad to help." in m.text for m in s),
                       what="the answer to the message")
    assert h.received[-1].text == "approve"
    assert deleter.calls == ["/srv/old.log"]
