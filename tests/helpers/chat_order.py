"""What is wrong with a chat as its user sees it, against the answers it should show in order."""

from __future__ import annotations

from tests.fakes.telegram_server import FakeTelegram


def shown(fake: FakeTelegram, chat: int) -> list[str]:
    """The chat as its user sees it now: the bot's messages, top to bottom, as edited."""
    out = []
    for sent in fake.messages(chat):
        now = fake.message(chat, sent.message_id)
        out.append(str((now or {}).get("text", "")))
    return out


def problems(shown: list[str], expected: list[str]) -> list[str]:
    """Out of order, twice, lost, or a stray message (a preview left behind); [] when right."""
    if shown == expected:
        return []
    notes = [f"twice: {t}" for t in sorted(set(shown)) if shown.count(t) > 1]
    notes += [f"lost: {t}" for t in expected if t not in shown]
    notes += [f"stray: {t!r}" for t in shown if t not in expected]
    kept = [t for t in shown if t in expected]
    if kept != sorted(set(kept), key=expected.index):
        notes.append(f"out of order: {kept}")
    return notes or [f"shown {shown}"]
