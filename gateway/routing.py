"""The routing table (``routes.yaml``): an ordered list of rules, first match wins.

```yaml
routes:
  - name: support-group          # optional; shown by explain and in logs
    match: {provider: telegram, chat: "-100123", direct: false}
    agent: support
    session: chat                # chat | user | thread | shared
    tools: [current_time]        # narrows the agent's own tools
  - match: {provider: telegram}
    deny: true                   # nobody else on Telegram
default: default                 # the agent for messages no rule matched; null: drop them
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agents.yamlfile import ConfigError, YamlDoc
from gateway.types import IncomingMessage, Route, SessionScope


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _str_list(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, (str, int)):
        return [str(v)]
    if isinstance(v, list):
        return [str(x) for x in v]
    return v


class Match(_Strict):
    provider: list[str] | None = None
    chat: list[str] | None = None
    user: list[str] | None = None
    guild: list[str] | None = None
    thread: list[str] | None = None
    direct: bool | None = None
    mention: bool | None = None
    text_prefix: str | None = None
    text_regex: str | None = None

    @field_validator("provider", "chat", "user", "guild", "thread", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _str_list(v)

    @field_validator("text_regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regular expression: {e}") from None
        return v

    def matches(self, m: IncomingMessage) -> bool:
        checks = (
            (self.provider, m.provider), (self.chat, m.chat_id), (self.user, m.user_id),
            (self.guild, m.guild_id), (self.thread, m.thread_id),
        )
        if any(allowed is not None and value not in allowed for allowed, value in checks):
            return False
        if self.direct is not None and m.is_direct != self.direct:
            return False
        if self.mention is not None and m.mentions_bot != self.mention:
            return False
        if self.text_prefix is not None and not m.text.startswith(self.text_prefix):
            return False
        if self.text_regex is not None and not re.search(self.text_regex, m.text):
            return False
        return True


class Rule(_Strict):
    name: str | None = None
    match: Match = Match()
    agent: str | None = None
    deny: bool = False
    session: SessionScope = "chat"
    tools: list[str] | None = None

    @model_validator(mode="after")
    def _agent_or_deny(self) -> Rule:
        if not self.deny and not self.agent:
            raise ValueError("a rule needs an 'agent' (or 'deny: true')")
        return self

    @field_validator("agent")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        known = (info.context or {}).get("agents")
        if v is not None and known is not None and v not in known:
            raise ValueError(f"unknown agent '{v}' (known: {', '.join(sorted(known)) or 'none'})")
        return v


class RoutesFile(_Strict):
    routes: list[Rule] = Field(default_factory=list)
    default: str | None = "default"

    @field_validator("default")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        return Rule._known(v, info)


class RoutingTable:
    def __init__(self, spec: RoutesFile):
        self.spec = spec

    @classmethod
    def load(cls, path: Path, agents: set[str] | None = None) -> RoutingTable:
        if not path.exists():
            return cls(RoutesFile.model_validate({}, context={"agents": agents}))
        doc = YamlDoc(path)
        if doc.data is not None and not isinstance(doc.data, dict):
            raise ConfigError([(doc.name, 1, "", "expected 'routes:' (a list) and 'default:'")])
        return cls(doc.validate(RoutesFile, context={"agents": agents}))

    def pinned(self, provider: str, agent: str) -> RoutingTable:
        """A copy where every message from ``provider`` goes to ``agent`` (``--agent NAME``)."""
        rule = Rule(name="--agent", match=Match(provider=[provider]), agent=agent)
        return RoutingTable(self.spec.model_copy(update={"routes": [rule, *self.spec.routes]}))

    def route(self, m: IncomingMessage) -> Route | None:
        """The route for a message, or None when it must get nothing."""
        for i, rule in enumerate(self.spec.routes):
            if rule.match.matches(m):
                if rule.deny:
                    return None
                assert rule.agent is not None
                return Route(
                    agent=rule.agent,
                    session_key=session_key(rule.agent, rule.session, m),
                    tools=tuple(rule.tools) if rule.tools is not None else None,
                    rule=rule.name or f"routes[{i}]",
                )
        if self.spec.default is None:
            return None
        return Route(agent=self.spec.default, session_key=session_key(self.spec.default, "chat", m),
                     rule="default")


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
