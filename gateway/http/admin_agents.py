"""Agents through the admin API: the request body, validation before anything is replaced, the
atomic swap, and the A2A Agent Card generated from an agent's definition."""

from __future__ import annotations

import asyncio
import hashlib
import re
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from pluto.agents.registry import discard_staged, load_checked, publish_agent, remove_agent, stage_agent
from pluto.agents.spec import MAX_INSTRUCTIONS_BYTES, NAME_RE, AgentSpec
from pluto.errors import ConfigError, PlutoError
from pluto import __version__

if TYPE_CHECKING:
    from pluto.gateway.app import Gateway

FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_FILES = 20
MAX_TOTAL_BYTES = 2 * MAX_INSTRUCTIONS_BYTES
BODY_KEYS = ("agent", "agent_yaml", "files")

_locks: weakref.WeakKeyDictionary[Gateway, asyncio.Lock] = weakref.WeakKeyDictionary()


class BadRequest(PlutoError):
    """A request the admin must fix; ``status`` and ``extra`` go into the JSON answer."""

    def __init__(self, message: str, status: int = 400, **extra: Any):
        super().__init__(message)
        self.status = status
        self.extra = extra


def problems_json(problems: list[tuple[str, int | None, str, str]]) -> list[dict[str, Any]]:
    return [{"file": f, "line": ln, "field": fd, "message": m} for f, ln, fd, m in problems]


@dataclass(frozen=True, slots=True)
class AgentFiles:
    name: str
    files: dict[str, bytes]  # agent.yaml and the Markdown files beside it

    @classmethod
    def from_body(cls, name: str, body: dict[str, Any]) -> AgentFiles:
        if not NAME_RE.fullmatch(name):
            raise BadRequest("agent names use a-z, 0-9, '-' and '_' (at most 64, starting "
                             "with a letter or digit)")
        unknown = sorted(set(body) - set(BODY_KEYS))
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(unknown)} (expected: "
                             f"{', '.join(BODY_KEYS)})")
        if ("agent" in body) == ("agent_yaml" in body):
            raise BadRequest("send either 'agent' (an object with the fields of agent.yaml) or "
                             "'agent_yaml' (the text of agent.yaml)")
        if "agent" in body:
            if not isinstance(body["agent"], dict):
                raise BadRequest("'agent' must be an object with the fields of agent.yaml")
            text = yaml.safe_dump(body["agent"], sort_keys=False, allow_unicode=True)
        elif isinstance(body["agent_yaml"], str):
            text = body["agent_yaml"]
        else:
            raise BadRequest("'agent_yaml' must be the text of agent.yaml")
        files = {"agent.yaml": text.encode("utf-8")} | _extra_files(body.get("files") or {})
        if sum(len(v) for v in files.values()) > MAX_TOTAL_BYTES:
            raise BadRequest(f"the agent's files are larger than {MAX_TOTAL_BYTES} bytes in all")
        return cls(name, files)


def _extra_files(files: Any) -> dict[str, bytes]:
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        raise BadRequest(f"'files' must be an object of at most {MAX_FILES} "
                         "file names and their text")
    out = {}
    for filename, text in files.items():
        if not FILE_RE.fullmatch(filename) or filename == "agent.yaml" or ".." in filename:
            raise BadRequest(f"invalid file name {filename!r}: a plain name like "
                             "'instructions.md' (no folders), not agent.yaml")
        if not isinstance(text, str):
            raise BadRequest(f"files[{filename!r}] must be text")
        out[filename] = text.encode("utf-8")
        if len(out[filename]) > MAX_INSTRUCTIONS_BYTES:
            raise BadRequest(f"{filename} is larger than {MAX_INSTRUCTIONS_BYTES} bytes")
    return out


def _lock(gw: Gateway) -> asyncio.Lock:
    lock = _locks.get(gw)
    if lock is None:
        lock = _locks[gw] = asyncio.Lock()
    return lock


async def save(gw: Gateway, agent: AgentFiles) -> bool:
    """Validate and put an agent in place; True when it is new in the dynamic dir."""
    root = gw.registry.dirs[-1]
    async with _lock(gw):
        staged = await asyncio.to_thread(stage_agent, root, agent.name, agent.files)
        try:
            spec = load_checked(staged, gw.registry.key_envs, gw.registry.known_tool_names())
            local = [s.name for s in spec.mcp if s.settings.command is not None]
            if local:  # a program on this host: only the config directory's files may say so
                raise ConfigError([(str(staged / "agent.yaml"), None, f"mcp.{local[0]}.command",
                                    "stdio MCP servers run programs on the gateway's host: "
                                    "declare them in the config directory's agent files; "
                                    "through the admin API use url (streamable HTTP)")])
        except ConfigError as e:
            discard_staged(staged)
            final = str(root / agent.name)
            problems = [(f.replace(str(staged), final), ln, fd, m) for f, ln, fd, m in e.problems]
            raise BadRequest("the agent definition has errors", 422,
                             problems=problems_json(problems)) from None
        created = not (root / agent.name).is_dir()
        publish_agent(root, staged)  # no await in between: atomic for this process
    gw.registry.forget(agent.name)
    await gw.watcher.reload_now_async()
    return created


async def delete(gw: Gateway, name: str) -> None:
    registry = gw.registry
    if name not in registry:
        raise BadRequest(f"no agent named {name!r}", 404)
    if not registry.is_dynamic(name):
        raise BadRequest(f"the agent {name!r} is defined by files in "
                         f"{registry.dir_of(name)}; remove it there", 409)
    still_defined = any((d / name / "agent.yaml").is_file() for d in registry.dirs[:-1])
    table = gw.routes
    rules = [table.label(i) for i, r in enumerate(table.spec.routes) if r.agent == name]
    rules += ["default"] if table.spec.default == name else []
    if rules and not still_defined:
        raise BadRequest(f"{table.source} routes messages to {name!r} (rules: "
                         f"{', '.join(rules)}); change the routes first", 409)
    async with _lock(gw):
        remove_agent(registry.dirs[-1], name)
    registry.forget(name)
    await gw.watcher.reload_now_async()


def agent_view(gw: Gateway, name: str, *, full: bool) -> dict[str, Any]:
    """An agent as the admin API shows it; ``full`` adds its files."""
    registry = gw.registry
    agent_dir = registry.dir_of(name)
    view: dict[str, Any] = {"name": name, "source": "api" if registry.is_dynamic(name)
                            else "config", "path": str(agent_dir),
                            "card": f"/agents/{name}/.well-known/agent.json"}
    try:
        spec = registry.load_fresh(name)
        view |= {"valid": True, "description": spec.description, "model": spec.model,
                 "tools": list(spec.tools)}
    except ConfigError as e:
        view |= {"valid": False, "problems": problems_json(e.problems)}
    if full and agent_dir is not None:
        files = {}
        for p in sorted(agent_dir.iterdir()):
            if p.is_file() and p.stat().st_size <= MAX_INSTRUCTIONS_BYTES:
                files[p.name] = p.read_bytes().decode("utf-8", errors="replace")
        view["agent_yaml"] = files.pop("agent.yaml", "")
        view["files"] = files
    return view


def agent_card(spec: AgentSpec, url: str) -> dict[str, Any]:
    """The A2A Agent Card (protocol 0.3) of an agent, from its definition. ``url`` answers
    A2A's JSON-RPC (``message/send``, ``message/stream``, ``tasks/get``, ``tasks/cancel``):
    the HTTP API serves it, with its keys as bearer tokens."""
    digest = hashlib.sha256("\0".join([spec.description, spec.instructions, spec.model,
                                       *spec.tools]).encode()).hexdigest()[:12]
    description = spec.description or f"The Pluto agent '{spec.name}'."
    return {
        "protocolVersion": "0.3.0",
        "name": spec.name,
        "description": description,
        "url": url,
        "preferredTransport": "JSONRPC",
        "additionalInterfaces": [{"url": url, "transport": "JSONRPC"}],
        "version": f"{__version__}+{digest}",
        "provider": {"organization": "Pluto", "url": url.rsplit("/agents/", 1)[0]},
        "capabilities": {"streaming": True, "pushNotifications": False,
                         "stateTransitionHistory": False},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "text/markdown"],
        "skills": [{"id": spec.name, "name": spec.name, "description": description,
                    "tags": ["pluto", *spec.tools]}],
        "securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "An API key of this gateway (the HTTP API's, PLUTO_API_KEYS)."}},
        "security": [{"bearer": []}],
    }


def a2a_refusal(gw: Gateway, name: str) -> str | None:
    """Why the agent's card would advertise a URL that cannot answer it (None: it can). Its
    URL is served by the HTTP API, whose messages routes.yaml must send to that agent."""
    from pluto.types import IncomingMessage

    api = gw.config.providers.get("api")
    if api is None or not api.enabled:
        return ("this gateway does not serve A2A: enable providers.api in pluto.yaml (and "
                "set its keys, PLUTO_API_KEYS) to let other agents talk to its agents")
    route = gw.directory.route(IncomingMessage(provider="api", chat_id="a2a", user_id="a2a",
                                               text="", guild_id=name, is_direct=True))
    if route is None or route.agent != name:
        to = f"'{route.agent}'" if route is not None else "no agent"
        return (f"routes.yaml sends the HTTP API's messages to {to}, not {name!r}; add a "
                f"route matching {{provider: api, guild: {name}}} to serve it over A2A")
    return None
