"""Why a message goes where it goes (``pluto routes explain``, the admin API).

:func:`explain` walks the table like :meth:`RoutingTable.decide` does, but keeps, for every rule
before the one that decided, each condition that failed — so an admin sees at once that rule 2
wanted ``direct: true`` and rule 3 another chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pluto.gateway.pipeline.routing import Decision, Match, RoutingTable
from pluto.types import IncomingMessage


@dataclass(frozen=True, slots=True)
class Step:
    label: str
    line: int | None
    matched: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    source: str
    message: IncomingMessage
    steps: tuple[Step, ...]
    decision: Decision
    line: int | None  # where the deciding rule (or ``default:``) is written

    @property
    def answered(self) -> bool:
        return self.decision.outcome == "route"

    def as_dict(self) -> dict[str, Any]:
        d, route = self.decision, self.decision.route
        return {
            "outcome": d.outcome, "rule": d.label, "line": self.line, "source": self.source,
            "agent": route.agent if route else None,
            "session_key": route.session_key if route else None,
            "tools": list(route.tools) if route and route.tools is not None else None,
            "access": d.policy.access, "require_mention": d.policy.require_mention,
            "rate_limit": str(d.policy.rate_limit) if d.policy.rate_limit else None,
            "steps": [{"rule": s.label, "line": s.line, "matched": s.matched,
                       "failed": list(s.reasons)} for s in self.steps],
            "summary": self.summary(),
        }

    def summary(self) -> str:
        d, route = self.decision, self.decision.route
        at = f" ({self.source}:{self.line})" if self.line else ""
        match d.outcome:
            case "route" if d.rule is None:
                return f"no rule matched: the default agent '{route.agent}' answers{at}"  # type: ignore[union-attr]
            case "route":
                return f"rule '{d.label}' matched{at}: agent '{route.agent}' answers"  # type: ignore[union-attr]
            case "deny":
                return f"rule '{d.label}' matched{at} and denies it: the message gets nothing"
            case "needs_mention":
                return (f"rule '{d.label}' matched{at} but answers groups only when the bot is "
                        "mentioned: the message gets nothing")
            case _:
                return "no rule matched and there is no default agent: the message gets nothing"

    def text(self, *, approved: bool | None = None, refusal: str | None = None) -> str:
        m = self.message
        kind = "direct message" if m.is_direct else "group message"
        extras = [f"thread {m.thread_id}" if m.thread_id else "",
                  f"guild {m.guild_id}" if m.guild_id else "",
                  "mentions the bot" if m.mentions_bot else "", f"text {m.text!r}"]
        lines = [f"message: {m.provider} chat {m.chat_id} user {m.user_id}, {kind}, "
                 + ", ".join(e for e in extras if e), f"table: {self.source}"]
        for s in self.steps:
            at = f" (line {s.line})" if s.line else ""
            if s.matched:
                lines.append(f"  {s.label}{at}: matches")
            else:
                lines += [f"  {s.label}{at}: no — {s.reasons[0]}"]
                lines += [f"  {' ' * len(s.label + at)}  and {r}" for r in s.reasons[1:]]
        lines.append(f"→ {self.summary()}")
        lines += self._details(approved, refusal)
        return "\n".join(lines)

    def _details(self, approved: bool | None, refusal: str | None) -> list[str]:
        d, route = self.decision, self.decision.route
        if d.outcome in ("deny", "unmatched"):
            said = f"the refusal {refusal!r}" if refusal else "nothing (no access.refusal set)"
            return [f"  a direct message gets {said}"] if self.message.is_direct else []
        if route is None:
            return []
        tools = ", ".join(route.tools) if route.tools is not None else "the agent's own"
        out = [f"  agent: {route.agent}", f"  session key: {route.session_key}",
               f"  tools: {tools}", f"  rate limit: {d.policy.rate_limit or 'none'}",
               f"  mention required in groups: {'yes' if d.policy.require_mention else 'no'}"]
        if d.policy.access == "pairing":
            state = {True: "this user is approved", False: "this user is NOT approved yet: "
                     "a direct message gets a pairing code, a group message nothing",
                     None: "approval not checked (no data dir)"}[approved]
            out.append(f"  access: pairing — {state}")
        else:
            out.append("  access: open")
        return out


def explain(table: RoutingTable, m: IncomingMessage) -> Explanation:
    decision = table.decide(m)
    last = decision.index if decision.index is not None else len(table.spec.routes) - 1
    steps = []
    for i, rule in enumerate(table.spec.routes[:last + 1]):
        reasons = tuple(rule.match.failures(m))
        steps.append(Step(table.label(i), table.line_of(i), not reasons, reasons))
    line = table.line_of(decision.index) if decision.outcome != "unmatched" else None
    return Explanation(table.source, m, tuple(steps), decision, line)


def message_from(provider: str, chat: str, user: str, *, group: bool = False,
                 mention: bool = False, thread: str | None = None, guild: str | None = None,
                 text: str = "") -> IncomingMessage:
    return IncomingMessage(provider=provider, chat_id=str(chat), user_id=str(user), text=text,
                           is_direct=not group, mentions_bot=mention, thread_id=thread,
                           guild_id=guild)


def unreachable(table: RoutingTable) -> list[str]:
    """Rules that can never match because an earlier rule matches every message."""
    for i, rule in enumerate(table.spec.routes):
        if rule.match == Match():
            return [f"{table.label(j)} can never match: {table.label(i)} (line {table.line_of(i)})"
                    f" matches every message" for j in range(i + 1, len(table.spec.routes))]
    return []
