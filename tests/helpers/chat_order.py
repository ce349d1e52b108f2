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


def problems(shown: list[str], expected: list[str], *, partial_ok: bool = False) -> list[str]:
    """Out of order, twice, lost, or a stray message (a preview left behind); [] when right.
    ``partial_ok``: a stray that is the beginning of one of the answers (a preview a killed
    process had sent without keeping its id) is no problem."""
    if partial_ok:
        shown = [t for t in shown if t in expected or not any(
            a.startswith(t) for a in expected)]
    if shown == expected:
        return []
    notes = [f"twice: {t}" for t in sorted(set(shown)) if shown.count(t) > 1]
    notes += [f"lost: {t}" for t in expected if t not in shown]
    notes += [f"stray: {t!r}" for t in shown if t not in expected]
    kept = [t for t in shown if t in expected]
    if kept != sorted(set(kept), key=expected.index):
        notes.append(f"out of order: {kept}")
    return notes or [f"shown {shown}"]
