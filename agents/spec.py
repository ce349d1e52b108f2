"""The agent format: ``agents/<name>/agent.yaml`` plus Markdown files for instructions.

```yaml
description: Answers questions about the sales data
model: default            # a model named in pluto.yaml, or any litellm model string
instructions: [instructions.md, persona.md]
tools: [current_time]
budget: {max_seconds: 120, max_tokens: 60000, max_tool_calls: 12}
history: {max_messages: 40, max_tokens: 8000}
memory:                   # optional (see pluto.runtime.memory)
  long_term: {scope: user, max_chars: 4000}   # Markdown notes the model keeps: user|chat|agent
  short_term: {max_tokens: 6000}  # past this, older turns are summarized (compaction)
mcp: {}                   # the agent's own MCP servers (see pluto.agents.toolspec)
skills: []                # its skills: folders with a SKILL.md
agents: [analyst]         # agents it may ask: a tool ask_analyst(question) (runtime/delegation)
handoff: [writer]         # agents it may hand the conversation to: a tool handoff_to(name)
delegation: {max_depth: 2, max_children: 5}   # how deep asks may nest; asks per run
approval: {run_sql: always, "files_*": first_time}  # tool calls a person approves first
approval_timeout: 300     # seconds: nobody deciding by then means denied
```

Agent files are data, never templates: ``${NAME}`` in them stays as written (only ``pluto.yaml``
expands the environment), so no field of an agent (its description is on the public A2A card)
can copy a secret out of the environment. An agent may name a key in ``api_key_env`` only when
``pluto.yaml`` allows that variable (``agents.api_key_envs``): anything else is a ConfigError.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pluto.agents.toolspec import (McpServer, McpServerSpec, Skill, check_mcp, check_tools,
                                   load_skills, skills_index)
from pluto.errors import ConfigError
from pluto.yamldoc import FileRefused, YamlDoc, read_regular_file

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")  # use with fullmatch: "evil\n" fails
MAX_INSTRUCTIONS_BYTES = 256_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    max_seconds: float = Field(default=120.0, gt=0)
    max_tokens: int = Field(default=100_000, gt=0)
    max_tool_calls: int = Field(default=16, ge=0)


class HistoryWindow(_Strict):
    max_messages: int = Field(default=40, ge=0)
    max_tokens: int = Field(default=8_000, ge=0)


class DelegationLimits(_Strict):
    """How far asking other agents may go (enforced at run time: runtime/delegation.py)."""

    max_depth: int = Field(default=2, ge=1, le=10)  # a child of a child of ... this deep
    max_children: int = Field(default=5, ge=1, le=100)  # agents asked in one run


class LongTermMemory(_Strict):
    """Markdown notes the model keeps with remember/replace/forget (one file per scope)."""

    scope: Literal["user", "chat", "agent"] = "user"
    max_chars: int = Field(default=4_000, ge=100, le=200_000)
    groups: bool = False  # scope user: a user's notes also enter group chats they write in
    # scope agent: who may add notes from a conversation ("provider:user", "*": anyone); the
    # rest only read them, and admins edit them with `pluto memory` (docs/security.md)
    writers: list[str] = Field(default_factory=list)


class ShortTermMemory(_Strict):
    """Past ``max_tokens`` of a session's history, older turns are summarized (compaction)."""

    max_tokens: int = Field(default=6_000, ge=200)
    keep_tokens: int | None = Field(default=None, ge=0)  # kept verbatim (default: a third)
    model: str | None = None  # the summarizer (default: the agent's model); may be cheaper
    timeout_seconds: float = Field(default=20.0, gt=0, le=600)
    notice: str | None = ("(Older messages of this conversation were summarized to keep it "
                          "short; the full text stays searchable with /history search.)")


class MemorySpec(_Strict):
    long_term: LongTermMemory | None = None
    short_term: ShortTermMemory | None = None


ApprovalRule = Literal["always", "first_time", "never"]
_TOOL_PATTERN = re.compile(r"[A-Za-z0-9_.\-*?\[\]!]{1,128}")


class AgentFile(_Strict):
    """What ``agent.yaml`` may say."""

    name: str | None = None
    description: str = ""
    model: str = Field(default="default", min_length=1, pattern=r"\S")
    api_base: str | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    temperature: float | None = Field(default=None, ge=0, le=2)
    instructions: list[str] | str = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    datasets: list[str] | str = Field(default_factory=list)
    budget: Budget = Budget()
    history: HistoryWindow = HistoryWindow()
    memory: MemorySpec = MemorySpec()
    mcp: dict[str, McpServer] = Field(default_factory=dict)
    skills: list[str] = Field(default_factory=list)
    agents: list[str] = Field(default_factory=list)
    handoff: list[str] = Field(default_factory=list)
    delegation: DelegationLimits = DelegationLimits()
    # tool name or pattern (fnmatch: files_*) -> always | first_time (per session) | never
    approval: dict[str, ApprovalRule] = Field(default_factory=dict)
    approval_timeout: float = Field(default=300.0, ge=1, le=7 * 86400)

    @field_validator("approval", mode="after")
    @classmethod
    def _patterns(cls, v: dict[str, ApprovalRule]) -> dict[str, ApprovalRule]:
        for pattern in v:
            if not _TOOL_PATTERN.fullmatch(pattern):
                raise ValueError(f"{pattern!r} is not a tool name or pattern (letters, digits, "
                                 "'_', '-', '.', and the wildcards * ? [ ])")
        return v

    @field_validator("api_base", mode="before")
    @classmethod
    def _empty_none(cls, v: Any) -> Any:
        return v or None

    @field_validator("instructions", mode="after")
    @classmethod
    def _as_list(cls, v: list[str] | str) -> list[str]:
        return [v] if isinstance(v, str) else v


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """A validated, loaded agent: everything the runtime needs, nothing it must read again."""

    name: str
    description: str
    model: str
    api_base: str | None
    api_key_env: str | None
    temperature: float | None
    instructions: str
    tools: tuple[str, ...]
    datasets: tuple[str, ...] | str
    budget: Budget
    history: HistoryWindow
    source: Path
    mcp: tuple[McpServerSpec, ...] = ()
    skills: tuple[Skill, ...] = ()
    memory: MemorySpec = MemorySpec()
    agents: tuple[str, ...] = ()  # agents it may ask (a tool ask_<name> each)
    handoff: tuple[str, ...] = ()  # agents it may hand the conversation to (handoff_to)
    delegation: DelegationLimits = DelegationLimits()
    approval: tuple[tuple[str, ApprovalRule], ...] = ()  # (tool or pattern, rule), as written
    approval_timeout: float = 300.0

    def approval_rule(self, tool: str) -> ApprovalRule:
        """Whether a person approves a call of ``tool`` first: its own entry, else the first
        pattern that matches it, else never."""
        for name, rule in self.approval:
            if name == tool:
                return rule
        for name, rule in self.approval:
            if fnmatch.fnmatchcase(tool, name):
                return rule
        return "never"


def load_agent(agent_dir: Path, key_envs: Collection[str] = (),
               known_tools: Collection[str] | None = None,
               is_agent: Callable[[str], bool] | None = None) -> AgentSpec:
    """Load and validate one agent directory; errors name the file, line and field.

    ``key_envs``: the environment variables the agent may name in ``api_key_env`` and in its
    MCP servers' ``*_env`` keys (from ``agents.api_key_envs`` in ``pluto.yaml``); by default
    none. ``known_tools``: the names ``tools:`` may use (None: not checked). ``is_agent``:
    whether a name in ``agents:`` or ``handoff:`` is an agent (None: not checked)."""
    name = agent_dir.name
    path = agent_dir / "agent.yaml"
    if not NAME_RE.fullmatch(name):
        raise ConfigError([(str(agent_dir), None, "name",
                            "agent directory names use a-z, 0-9, '-' and '_' (max 64)")])
    doc = YamlDoc(path)
    if doc.data is not None and not isinstance(doc.data, dict):
        raise ConfigError([(doc.name, 1, "", "expected a mapping (description, model, ...)")])
    if doc.data is None:  # empty, or only comments: a file emptied mid-edit, never applied
        # (an explicit `{}` is an agent of defaults, as the admin API may create one)
        raise ConfigError([(doc.name, 1, "", "the file is empty: write at least model: and "
                            "instructions: (an agent that says nothing is never applied)")])
    try:  # validated as written: no ${NAME} expansion in agent files
        spec = AgentFile.model_validate(doc.data if doc.data is not None else {})
    except ValidationError as e:
        raise doc.error_from(e) from None
    if spec.name is not None and spec.name != name:
        raise doc.problem(("name",), f"must match the directory name '{name}' (or be left out)")
    if spec.api_key_env is not None and spec.api_key_env not in key_envs:
        allowed = ", ".join(sorted(key_envs)) or "none"
        raise doc.problem(("api_key_env",), f"{spec.api_key_env} is not a variable agents may "
                          f"use (pluto.yaml agents.api_key_envs allows: {allowed})")
    check_tools(doc, spec.tools, known_tools)
    for field in ("agents", "handoff"):
        _check_agents(doc, name, field, getattr(spec, field), is_agent)
    mcp = check_mcp(doc, agent_dir, spec.mcp, key_envs, known_tools)
    skills = load_skills(doc, agent_dir, spec.skills)
    instructions = _read_instructions(doc, agent_dir, spec.instructions)
    if skills:
        instructions = "\n\n".join(p for p in (instructions, skills_index(skills)) if p)
    return AgentSpec(
        name=name,
        description=spec.description.strip(),
        model=spec.model,
        api_base=spec.api_base,
        api_key_env=spec.api_key_env,
        temperature=spec.temperature,
        instructions=instructions,
        tools=tuple(spec.tools),
        datasets=spec.datasets if isinstance(spec.datasets, str) else tuple(spec.datasets),
        budget=spec.budget,
        history=spec.history,
        source=agent_dir,
        mcp=mcp,
        skills=skills,
        memory=spec.memory,
        agents=tuple(spec.agents),
        handoff=tuple(spec.handoff),
        delegation=spec.delegation,
        approval=tuple(spec.approval.items()),
        approval_timeout=spec.approval_timeout,
    )


def _check_agents(doc: YamlDoc, own: str, field: str, names: list[str],
                  is_agent: Callable[[str], bool] | None) -> None:
    """The agents named in ``agents:`` or ``handoff:``: real, not the agent itself, once each
    (a cycle between agents is allowed: the depth limit stops it at run time)."""
    for i, other in enumerate(names):
        if not NAME_RE.fullmatch(other):
            raise doc.problem((field, i), "agent names use a-z, 0-9, '-' and '_' (max 64)")
        if other == own:
            raise doc.problem((field, i), f"an agent cannot list itself ('{own}')")
        if field == "agents" and len(other) > 60:  # a model's tool names stop at 64
            raise doc.problem((field, i), f"the tool ask_{other} would be too long: agents "
                              "that others ask have names of at most 60 characters")
        if other in names[:i]:
            raise doc.problem((field, i), f"'{other}' is listed twice")
        if is_agent is not None and not is_agent(other):
            raise doc.problem((field, i), f"no agent is named '{other}'")


def _read_instructions(doc: YamlDoc, agent_dir: Path, files: list[str] | str) -> str:
    if isinstance(files, str):  # (AgentFile's validator has made it a list already)
        files = [files]
    parts = []
    root = agent_dir.resolve()
    for i, rel in enumerate(files):
        path = (agent_dir / rel).resolve()
        if not path.is_relative_to(root):
            raise doc.problem(("instructions", i), "must be a file inside the agent's directory")
        try:
            data = read_regular_file(path, MAX_INSTRUCTIONS_BYTES, "256 kB")
        except FileRefused as e:
            raise doc.problem(("instructions", i), f"{rel} {e}") from None
        except OSError:
            raise doc.problem(("instructions", i), f"file not found: {rel}") from None
        try:
            parts.append(data.decode("utf-8").strip())
        except UnicodeDecodeError:
            raise doc.problem(("instructions", i), f"{rel} is not UTF-8 text") from None
    return "\n\n".join(p for p in parts if p)
