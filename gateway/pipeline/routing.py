"""The routing table (``routes.yaml``): an ordered list of rules, first match wins.

```yaml
defaults:                        # optional: for every rule that does not say otherwise
  rate_limit: {user: 20/minute}
routes:
  - name: support-group          # optional; shown by explain and in logs
    match: {provider: telegram, chat: "-100123", direct: false}
    agent: support
    session: chat                # chat | user | thread | shared
    tools: [current_time]        # narrows the agent's own tools
    memory_in_groups: false      # a user's long-term notes in this group (default: the agent's
                                 # memory.long_term.groups, itself false)
    require_mention: true        # in groups, answer only when the bot is mentioned
    rate_limit: {user: 5/minute, chat: 30/minute}
    approvers: admins            # who approves the agent's risky tool calls: asker (default),
                                 # admins (the list below) or a list of user ids
  - match: {provider: telegram, direct: true}
    agent: default
    access: pairing              # unknown users get a code an admin approves
  - match: {provider: telegram}
    deny: true                   # nobody else on Telegram
default: default                 # the agent for messages no rule matched; null: drop them
admins: ["telegram:42", "U024BE7LH"]   # approvers: admins (a user id, or provider:user id)
```

:meth:`RoutingTable.decide` says what happens to a message and which rule decided it;
:mod:`gateway.access` acts on that (mention, pairing, rate limits), :mod:`gateway.explain` shows
why, rule by rule.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pluto.errors import ConfigError, PlutoError
from pluto.yamldoc import YamlDoc, paused_gc
from pluto.gateway.pipeline.ratelimit import Rate, parse_rate
from pluto.types import IncomingMessage, Route, SessionScope

log = logging.getLogger(__name__)

AccessMode = Literal["open", "pairing"]
Outcome = Literal["route", "deny", "unmatched", "needs_mention"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _str_list(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, (str, int)) and not isinstance(v, bool):
        return [str(v)]
    if isinstance(v, list):
        return [str(x) if isinstance(x, (str, int)) and not isinstance(x, bool) else x for x in v]
    return v


# A text_regex runs on the event loop, on text anyone can send, so it runs with a time bound:
# the `regex` module (Python's syntax) stops a search after its timeout — a pattern that
# backtracks exponentially (``^(a|a)+$``, ``^(a+)+$``, backreferences) costs at most this, and
# the message is then refused (denied), never routed by the rules after it.
REGEX_BUDGET_SECONDS = 0.02  # for all the text_regex searches of one message together


class RegexTimeout(PlutoError):
    """A text_regex did not finish within its time budget on a message's text."""


@functools.lru_cache(maxsize=4096)
def _regex(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern)


def _search(pattern: str, text: str, deadline: float) -> bool:
    left = deadline - time.monotonic()
    if left <= 0:
        raise RegexTimeout(pattern)
    try:
        return _regex(pattern).search(text, timeout=left) is not None
    except TimeoutError:
        raise RegexTimeout(pattern) from None


def _either(values: list[str]) -> str:
    return " or ".join(repr(v) for v in values[:5]) + (" …" if len(values) > 5 else "")


class Match(_Strict):
    provider: list[str] | None = None
    chat: list[str] | None = None  # a chat, channel or group id
    user: list[str] | None = None
    guild: list[str] | None = None  # a Discord guild, a Slack team
    thread: list[str] | None = None
    direct: bool | None = None  # true: direct messages only; false: groups only
    mention: bool | None = None
    text_prefix: list[str] | None = None
    text_regex: str | None = None

    @field_validator("provider", "chat", "user", "guild", "thread", "text_prefix", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        if v == []:
            raise ValueError("an empty list matches nothing; leave the condition out to match "
                             "any value")
        return _str_list(v)

    @field_validator("text_regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                _regex(v)
            except (regex.error, RecursionError, OverflowError, ValueError) as e:
                raise ValueError(f"not a valid regular expression: {e}") from None
        return v

    def matches(self, m: IncomingMessage, deadline: float | None = None) -> bool:
        """Raises :class:`RegexTimeout` when the text_regex ran out of time (by ``deadline``,
        a ``time.monotonic()``; by default :data:`REGEX_BUDGET_SECONDS` from now)."""
        # (a rule that does not take a message is the common case: no reasons spelled out)
        for allowed, value in ((self.provider, m.provider), (self.chat, m.chat_id),
                               (self.user, m.user_id), (self.guild, m.guild_id),
                               (self.thread, m.thread_id)):
            if allowed is not None and value not in allowed:
                return False
        if (self.direct is not None and m.is_direct != self.direct
                or self.mention is not None and m.mentions_bot != self.mention
                or self.text_prefix is not None
                and not m.text.startswith(tuple(self.text_prefix))):
            return False
        return self.text_regex is None or _search(
            self.text_regex, m.text,
            time.monotonic() + REGEX_BUDGET_SECONDS if deadline is None else deadline)

    def failures(self, m: IncomingMessage) -> list[str]:
        """Why this match does not take the message: one reason per failing condition."""
        try:
            return list(self._failures(m))
        except RegexTimeout:
            return [f"the text_regex /{self.text_regex}/ took longer than "
                    f"{REGEX_BUDGET_SECONDS * 1000:.0f} ms on this text: the message is refused"]

    def _failures(self, m: IncomingMessage, deadline: float | None = None) -> Iterator[str]:
        for field, allowed, value in (
                ("provider", self.provider, m.provider), ("chat", self.chat, m.chat_id),
                ("user", self.user, m.user_id), ("guild", self.guild, m.guild_id),
                ("thread", self.thread, m.thread_id)):
            if allowed is not None and value not in allowed:
                has = f"is {value!r}" if value is not None else "is not set"
                yield f"{field} {has}, the rule wants {_either(allowed)}"
        if self.direct is not None and m.is_direct != self.direct:
            yield ("it is a group message, the rule wants direct messages" if self.direct
                   else "it is a direct message, the rule wants group messages")
        if self.mention is not None and m.mentions_bot != self.mention:
            yield ("the bot is not mentioned, the rule wants a mention" if self.mention
                   else "the bot is mentioned, the rule wants no mention")
        if self.text_prefix is not None and not m.text.startswith(tuple(self.text_prefix)):
            yield f"the text does not start with {_either(self.text_prefix)}"
        if self.text_regex is not None and not _search(
                self.text_regex, m.text,
                time.monotonic() + REGEX_BUDGET_SECONDS if deadline is None else deadline):
            yield f"the text does not match /{self.text_regex}/"


class RateLimitSpec(_Strict):
    user: str | None = None  # per user (on one provider)
    chat: str | None = None  # per chat, everyone in it together

    @field_validator("user", "chat", mode="before")
    @classmethod
    def _valid(cls, v: Any) -> Any:
        if v is None:
            return None
        parse_rate(v)
        return str(v)

    def rates(self) -> list[tuple[Literal["user", "chat"], Rate]]:
        out: list[tuple[Literal["user", "chat"], Rate]] = []
        if self.user is not None:
            out.append(("user", parse_rate(self.user)))
        if self.chat is not None:
            out.append(("chat", parse_rate(self.chat)))
        return out

    def __str__(self) -> str:
        return ", ".join(f"{rate} per {scope}" for scope, rate in self.rates()) or "none"


Approvers = Literal["asker", "admins"] | list[str]


def _approvers(v: Any) -> Any:
    if isinstance(v, list):
        if not v:
            raise ValueError("an empty list lets nobody approve: write asker, admins or ids")
        return _str_list(v)
    return v


class RuleDefaults(_Strict):
    """Settings every rule (and the default route) gets unless it says otherwise."""

    approvers: Approvers = "asker"
    rate_limit: RateLimitSpec | None = None
    require_mention: bool = False
    access: AccessMode = "open"


class Rule(_Strict):
    name: str | None = None
    match: Match = Match()
    agent: str | None = None
    deny: bool = False
    session: SessionScope = "chat"
    tools: list[str] | None = None
    memory_in_groups: bool | None = None  # None: the agent's memory.long_term.groups decides
    rate_limit: RateLimitSpec | None = None
    require_mention: bool | None = None
    access: AccessMode | None = None
    approvers: Approvers | None = None

    _approvers_list = field_validator("approvers", mode="before")(
        classmethod(lambda cls, v: _approvers(v)))

    @model_validator(mode="after")
    def _agent_or_deny(self) -> Rule:
        if not self.deny and not self.agent:
            raise ValueError("a rule needs an 'agent' (or 'deny: true')")
        if self.deny and self.agent:
            raise ValueError("a deny rule answers nobody: remove 'agent' or 'deny'")
        return self

    @field_validator("agent")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        known = (info.context or {}).get("agents")
        if v is not None and known is not None and v not in known:
            shown = sorted(known)
            listed = ", ".join(shown[:20]) + (f", … ({len(shown)} in all)" if len(shown) > 20
                                              else "")
            raise ValueError(f"unknown agent '{v}' (known: {listed or 'none'})")
        return v


class RoutesFile(_Strict):
    defaults: RuleDefaults = RuleDefaults()
    routes: list[Rule] = Field(default_factory=list)
    default: str | None = "default"
    admins: list[str] = Field(default_factory=list)  # approvers: admins (user ids)

    @field_validator("admins", mode="before")
    @classmethod
    def _ids(cls, v: Any) -> Any:
        return _str_list(v) if v is not None else []

    @field_validator("default")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        return Rule._known(v, info)



@dataclass(frozen=True, slots=True)
class Policy:
    """What a rule asks of a message once it matched."""

    access: AccessMode = "open"
    require_mention: bool = False
    rate_limit: RateLimitSpec | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the table says about a message: the outcome, the rule that decided (None: the
    default route, or no rule at all), and the route when an agent answers."""

    outcome: Outcome
    label: str  # the rule's name, ``routes[i]``, ``default`` or ``no rule``
    index: int | None = None
    rule: Rule | None = None
    route: Route | None = None
    policy: Policy = Policy()


class RoutingTable:
    def __init__(self, spec: RoutesFile, *, path: Path | None = None,
                 lines: list[int | None] | None = None, default_line: int | None = None):
        self.spec = spec
        self.path = path  # the file the rules were written in; None: built-in or derived
        # each rule's line, and the default's: all a table keeps of its YAML. The parsed node
        # tree (a few objects per value) would stay for the collector to walk at every full
        # collection: 280k objects, 0.2 s with the GIL held, for a 7,000-rule file.
        self._lines = lines or [None] * len(spec.routes)
        self._default_line = default_line

    @classmethod
    def load(cls, path: Path, agents: set[str] | None = None) -> RoutingTable:
        """``path`` parsed and validated (blocking work: async code runs it in a thread). The
        collector is paused until the parse's temporaries are gone: its first collection
        after the pause walks what the pause let pile up, with the GIL held."""
        with paused_gc():
            return cls._load(path, agents)

    @classmethod
    def _load(cls, path: Path, agents: set[str] | None) -> RoutingTable:
        if not path.exists():
            return cls(RoutesFile.model_validate({}, context={"agents": agents}))
        doc = YamlDoc(path)
        if doc.data is not None and not isinstance(doc.data, dict):
            raise ConfigError([(doc.name, 1, "", "expected 'routes:' (a list) and 'default:'")])
        spec = doc.validate(RoutesFile, context={"agents": agents})
        if not doc.data or not {"routes", "default"} & set(doc.data):
            # empty, blank, comments only, or half-written: applying it as "no rules" would
            # drop every deny, pairing and rate limit at once
            raise ConfigError([(doc.name, None, "", "the file says neither 'routes:' nor "
                                "'default:' (empty, or still being written?); write "
                                "'routes: []' for a table without rules")])
        seen: set[str] = set()
        for i, rule in enumerate(spec.routes):
            if rule.name is not None and rule.name in seen:
                raise ConfigError([(doc.name, doc.line_of(("routes", i, "name")),
                                    f"routes[{i}].name",
                                    f"another rule is already named '{rule.name}'")])
            seen.add(rule.name or f"routes[{i}]")
        lines = [doc.line_of(("routes", i)) for i in range(len(spec.routes))]
        default = doc.line_of(("default",)) if "default" in doc.data else None  # else built in
        return cls(spec, path=path, lines=lines, default_line=default)

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else "(built-in defaults)"

    def line_of(self, index: int | None) -> int | None:
        """The line of rule ``index`` (None: of ``default:``) in the file, when written in one."""
        return self._default_line if index is None else self._lines[index]

    def agents(self) -> list[str]:
        """Every agent the table can route to."""
        names = [r.agent for r in self.spec.routes if r.agent] + [self.spec.default or ""]
        return sorted({n for n in names if n})

    def label(self, index: int) -> str:
        return self.spec.routes[index].name or f"routes[{index}]"

    def pinned(self, provider: str, agent: str) -> RoutingTable:
        """A copy where every message from ``provider`` goes to ``agent`` (``--agent NAME``)."""
        rule = Rule(name="--agent", match=Match(provider=[provider]), agent=agent,
                    access="open", rate_limit=RateLimitSpec(), require_mention=False)
        kept = [i for i, r in enumerate(self.spec.routes) if r.name != "--agent"]
        routes = [rule, *(self.spec.routes[i] for i in kept)]
        return RoutingTable(self.spec.model_copy(update={"routes": routes}), path=self.path,
                            lines=[None, *(self._lines[i] for i in kept)],
                            default_line=self._default_line)

    def policy(self, rule: Rule | None) -> Policy:
        d = self.spec.defaults
        if rule is None:
            return Policy(d.access, d.require_mention, d.rate_limit)
        return Policy(rule.access or d.access,
                      d.require_mention if rule.require_mention is None else rule.require_mention,
                      rule.rate_limit if rule.rate_limit is not None else d.rate_limit)

    def approvers(self, rule: Rule | None) -> tuple[str, ...]:
        """Who may approve a tool call for a rule's chats: "asker", and user ids."""
        chosen = rule.approvers if rule is not None and rule.approvers is not None \
            else self.spec.defaults.approvers
        names = [chosen] if isinstance(chosen, str) else chosen
        out: list[str] = []
        for name in names:
            out += self.spec.admins if name == "admins" else [name]
        return tuple(dict.fromkeys(out))

    def decide(self, m: IncomingMessage) -> Decision:
        """What happens to a message, and which rule decided it. A text_regex that runs out
        of time denies the message (by that rule): it never falls through to later rules."""
        deadline = time.monotonic() + REGEX_BUDGET_SECONDS
        for i, rule in enumerate(self.spec.routes):
            try:
                matched = rule.match.matches(m, deadline)
            except RegexTimeout:
                log.warning("routes: the text_regex of %s ran out of time (%.0f ms) on a "
                            "message from %s chat %s; the message is refused", self.label(i),
                            REGEX_BUDGET_SECONDS * 1000, m.provider, m.chat_id)
                return Decision("deny", self.label(i), i, rule, policy=self.policy(rule))
            if matched:
                return self._decided(m, i, rule)
        return self._decided(m, None, None)

    def _decided(self, m: IncomingMessage, i: int | None, rule: Rule | None) -> Decision:
        label = self.label(i) if i is not None else "default"
        policy = self.policy(rule)
        if rule is not None and rule.deny:
            return Decision("deny", label, i, rule, policy=policy)
        agent = rule.agent if rule is not None else self.spec.default
        if agent is None:
            return Decision("unmatched", "no rule", policy=policy)
        scope: SessionScope = rule.session if rule is not None else "chat"
        route = Route(agent=agent, session_key=session_key(agent, scope, m),
                      tools=tuple(rule.tools) if rule and rule.tools is not None else None,
                      rule=label,
                      memory_in_groups=rule.memory_in_groups if rule is not None else None,
                      approvers=self.approvers(rule))
        if policy.require_mention and not m.is_direct and not m.mentions_bot:
            return Decision("needs_mention", label, i, rule, route, policy)
        return Decision("route", label, i, rule, route, policy)

    def route(self, m: IncomingMessage) -> Route | None:
        """The route for a message, or None when it must get nothing."""
        decision = self.decide(m)
        return decision.route if decision.outcome == "route" else None


def session_key(agent: str, scope: SessionScope, m: IncomingMessage) -> str:
    match scope:
        case "shared":
            return f"{agent}/shared"
        case "user":
            return f"{agent}/{m.provider}/{m.chat_id}/u/{m.user_id}"
        case "thread" if m.thread_id:
            return f"{agent}/{m.provider}/{m.chat_id}/t/{m.thread_id}"
        case _:
            return f"{agent}/{m.provider}/{m.chat_id}"
