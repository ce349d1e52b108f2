"""What an agent may use beyond the built-in tools: its own MCP servers and its skills.

```yaml
mcp:
  notes:                          # the server's name: its tools are called notes_<tool>
    command: python3              # stdio: a program the gateway starts when first needed;
                                  # python/python3: the Python Pluto runs in
    args: [notes_server.py]
    cwd: .                        # relative to the agent's directory
    env: {NOTES_TOKEN_env: PLUTO_NOTES_TOKEN}   # the server's NOTES_TOKEN, read from ours
    tools: [search, read]         # only these of its tools (default: all)
    call_timeout: 60
  wiki:
    url: https://wiki.example.com/mcp           # streamable HTTP
    headers: {Authorization_env: PLUTO_WIKI_AUTH}
    prefix: wiki_                 # the default is the server's name and "_"
skills: [report-style]            # folders with a SKILL.md: the agent's own skills/ folder,
                                  # then the skills/ folder beside the agents' folder
```

Secrets never sit in the files: a server's environment and headers come only from variables
named by ``*_env`` keys, and only variables ``pluto.yaml`` lets agents name
(``agents.api_key_envs``). A stdio server gets that and the harmless basics (PATH, HOME, ...),
never the gateway's whole environment.

Checked when the agent loads, so a mistake is a ConfigError naming file, line and field: a
command that is not there, a ``cwd`` that is no directory, a skill folder without a valid
``SKILL.md``, a tool name that no tool has.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pluto.errors import ConfigError
from pluto.yamldoc import FileRefused, YamlDoc, read_regular_file

SERVER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
SKILL_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEADER_RE = re.compile(r"[A-Za-z0-9-]{1,64}")
PREFIX_RE = re.compile(r"[A-Za-z0-9_-]{0,32}")
MAX_SKILL_BYTES = 256_000
MAX_SKILL_DESCRIPTION = 1024


class McpServer(BaseModel):
    """One MCP server of an agent, as ``agent.yaml`` says it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[str] | None = None  # the allowlist, by the server's own tool names
    prefix: str | None = None
    connect_timeout: float = Field(default=15.0, gt=0, le=300)
    call_timeout: float = Field(default=60.0, gt=0, le=3600)
    # a stdio server runs inside bubblewrap (its own PID namespace: the gateway's /proc is out
    # of its reach) when bwrap is installed; false runs it as a plain child (docs/security.md)
    sandbox: bool = True

    @field_validator("env", "headers")
    @classmethod
    def _by_env_names(cls, v: dict[str, str], info: Any) -> dict[str, str]:
        key_re = ENV_NAME_RE if info.field_name == "env" else HEADER_RE
        what = "variable" if info.field_name == "env" else "header"
        for key, value in v.items():
            if not key.endswith("_env") or not key_re.fullmatch(key[:-4]):
                raise ValueError(f"'{key}': write <{what}>_env: <the gateway's variable that "
                                 "holds the value> (values are never written in the file)")
            if not isinstance(value, str) or not ENV_NAME_RE.fullmatch(value):
                raise ValueError(f"'{key}' must name an environment variable, e.g. PLUTO_TOKEN")
        return v

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", v):
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is not None and not PREFIX_RE.fullmatch(v):
            raise ValueError("use letters, digits, '_' and '-' (at most 32)")
        return v

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (streamable HTTP)")
        if self.url is not None and (self.args or self.cwd or self.env):
            raise ValueError("args, cwd and env are for a stdio server (command)")
        if self.command is not None and self.headers:
            raise ValueError("headers are for an HTTP server (url)")
        return self

    def executable(self) -> str | None:
        """The program a stdio server runs: ``python``, ``python3`` (or this Python's
        ``python3.X``) mean the gateway's own interpreter, which has the ``mcp`` package
        wherever Pluto is installed — not whichever Python comes first on PATH."""
        if self.command in gateway_python_names():
            return sys.executable or self.command
        return self.command

    def env_vars(self) -> dict[str, str]:
        """{the server's variable: the gateway's variable it is read from}."""
        return {k[:-4]: v for k, v in self.env.items()}

    def header_vars(self) -> dict[str, str]:
        """{header: the gateway's variable it is read from}."""
        return {k[:-4]: v for k, v in self.headers.items()}


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """A checked MCP server of an agent: its settings, with ``cwd`` resolved."""

    name: str
    settings: McpServer
    cwd: Path | None = None

    @property
    def prefix(self) -> str:
        return self.settings.prefix if self.settings.prefix is not None else f"{self.name}_"

    def connection_key(self) -> str:
        """What makes two servers the same process or session: everything but the allowlist
        and the prefix, which each agent applies for itself."""
        s = self.settings
        return repr((s.command, tuple(s.args), str(self.cwd) if self.cwd else None,
                     tuple(sorted(s.env.items())), s.url, tuple(sorted(s.headers.items())),
                     s.connect_timeout, s.call_timeout, s.sandbox))


@dataclass(frozen=True, slots=True)
class Skill:
    """A folder with a ``SKILL.md``: only ``description`` enters the prompt; the body and the
    folder's other files are read by a tool when the model asks for them."""

    name: str
    description: str
    path: Path  # the folder


def check_mcp(doc: YamlDoc, agent_dir: Path, servers: dict[str, McpServer],
              key_envs: Collection[str],
              known_tools: Collection[str] | None = None) -> tuple[McpServerSpec, ...]:
    """The servers, checked; an allowlisted tool that would take a built-in tool's name (the
    ``known_tools``, and :data:`RESERVED_TOOLS`) is an error naming both."""
    out = []
    for name, server in servers.items():
        if not SERVER_NAME_RE.fullmatch(name):
            raise doc.problem(("mcp", name), "server names use a-z, 0-9, '-' and '_' (max 32)")
        for field, names in (("env", server.env), ("headers", server.headers)):
            for key, var in names.items():
                if var not in key_envs:
                    allowed = ", ".join(sorted(key_envs)) or "none"
                    raise doc.problem(("mcp", name, field, key),
                                      f"{var} is not a variable agents may use (pluto.yaml "
                                      f"agents.api_key_envs allows: {allowed})")
        cwd = None
        if server.command is not None:
            cwd = (agent_dir / (server.cwd or ".")).resolve()
            if not cwd.is_dir():
                raise doc.problem(("mcp", name, "cwd"), f"not a directory: {server.cwd}")
            if _find_command(server.executable() or server.command, cwd) is None:
                raise doc.problem(("mcp", name, "command"),
                                  f"command not found: {server.command}")
        spec = McpServerSpec(name, server, cwd)
        taken = {*(known_tools or ()), *RESERVED_TOOLS}
        for tool in server.tools or ():
            if spec.prefix + tool in taken:
                raise doc.problem(("mcp", name, "tools"),
                                  clash_sentence(name, tool, spec.prefix + tool))
        out.append(spec)
    return tuple(out)


# tools the runtime adds itself (memory, history search, skills): never an MCP tool's name
RESERVED_TOOLS = ("memory_remember", "memory_replace", "memory_forget", "search_history",
                  "load_skill")


def clash_sentence(server: str, tool: str, builtin: str) -> str:
    return (f"the MCP server {server}'s tool {tool!r} would be called {builtin}, the name of "
            f"the built-in tool {builtin}: give the server a prefix (prefix: {server}_)")


def gateway_python_names() -> tuple[str, ...]:
    """The commands that mean "the Python Pluto runs in" (:meth:`McpServer.executable`)."""
    return ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")


def _find_command(command: str, cwd: Path) -> str | None:
    if os.sep in command:
        path = Path(command) if os.path.isabs(command) else cwd / command
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(command)


def check_tools(doc: YamlDoc, tools: list[str], known: Collection[str] | None) -> None:
    """Every tool the agent names exists (``known``: the gateway's tools; None: not checked)."""
    if known is None:
        return
    for i, name in enumerate(tools):
        if name not in known:
            raise doc.problem(("tools", i), f"no tool is named '{name}' (known: "
                              f"{', '.join(sorted(known)) or 'none'}); an MCP server's tools "
                              "come with it, under mcp:")


def skill_dirs(agent_dir: Path) -> tuple[Path, ...]:
    """Where an agent's skills are looked for: its own ``skills/``, then the shared one."""
    return (agent_dir / "skills", agent_dir.parent.parent / "skills")


def load_skills(doc: YamlDoc, agent_dir: Path, names: list[str]) -> tuple[Skill, ...]:
    out: list[Skill] = []
    for i, name in enumerate(names):
        if not SKILL_NAME_RE.fullmatch(name):
            raise doc.problem(("skills", i), "skill names use a-z, 0-9, '-' and '_' (max 64)")
        folder = next((d / name for d in skill_dirs(agent_dir) if (d / name).is_dir()), None)
        if folder is None:
            where = " or ".join(str(d) for d in skill_dirs(agent_dir))
            raise doc.problem(("skills", i), f"no skill '{name}' (a folder with a SKILL.md "
                              f"in {where})")
        try:
            meta, _ = read_skill(folder / "SKILL.md")
        except ValueError as e:
            raise doc.problem(("skills", i), f"{folder / 'SKILL.md'}: {e}") from None
        if meta.get("name", name) != name:
            raise doc.problem(("skills", i), f"{folder / 'SKILL.md'}: its name "
                              f"'{meta.get('name')}' must be the folder's name '{name}'")
        out.append(Skill(name, meta["description"], folder.resolve()))
    return tuple(out)


def read_skill(path: Path) -> tuple[dict[str, str], str]:
    """A ``SKILL.md``'s front matter (``name``, ``description``) and its body.

    Raises ValueError with a sentence about what is wrong."""
    try:
        text = read_regular_file(path, MAX_SKILL_BYTES, "256 kB").decode("utf-8")
    except FileRefused as e:
        raise ValueError(str(e)) from None
    except FileNotFoundError:
        raise ValueError("file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read it ({e})") from None
    m = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", text, re.S)
    if m is None:
        raise ValueError("must start with YAML front matter between '---' lines "
                         "(name, description)")
    try:
        meta = YamlDoc(path, text=m.group(1)).data  # aliases and nesting bounded
    except ConfigError as e:
        raise ValueError(f"invalid front matter: {e.problems[0][3]}") from None
    if not isinstance(meta, dict):
        raise ValueError("the front matter must be a mapping (name, description)")
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("the front matter needs a description: what the skill is for")
    if len(description) > MAX_SKILL_DESCRIPTION:
        raise ValueError(f"the description is longer than {MAX_SKILL_DESCRIPTION} characters")
    if "name" in meta and not isinstance(meta["name"], str):
        raise ValueError("the front matter's name must be text")
    clean = {"description": " ".join(description.split())}
    if "name" in meta:
        clean["name"] = meta["name"]
    return clean, text[m.end():].strip()


def skills_index(skills: tuple[Skill, ...]) -> str:
    """The part of the prompt that lists the skills (their descriptions only)."""
    if not skills:
        return ""
    lines = [f"- {s.name}: {s.description}" for s in skills]
    return ("## Skills\nYou have these skills. When one fits the request, read it first with "
            "the load_skill tool (its name), then follow it.\n" + "\n".join(lines))
