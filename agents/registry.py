"""The agent registry: finds agent directories, loads them lazily, keeps the recently used.

Listing reads only directory names; an agent's files are read the first time it is needed, and
again only when its ``agent.yaml`` or Markdown files change (checked by modification time).
A run holds the :class:`AgentSpec` it started with, so a reload never changes a run mid-way.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

from agents.spec import NAME_RE, AgentSpec, load_agent
from agents.yamlfile import ConfigError

log = logging.getLogger(__name__)


class UnknownAgent(LookupError):
    pass


class AgentRegistry:
    def __init__(self, *dirs: Path, cache_size: int = 256):
        self.dirs = [d for d in dirs]
        self.cache_size = cache_size
        self._cache: OrderedDict[str, tuple[float, AgentSpec]] = OrderedDict()

    def names(self) -> list[str]:
        found: set[str] = set()
        for d in self.dirs:
            if d.is_dir():
                found.update(p.name for p in d.iterdir()
                             if NAME_RE.match(p.name) and (p / "agent.yaml").is_file())
        return sorted(found)

    def __contains__(self, name: str) -> bool:
        return self._dir_of(name) is not None

    def _dir_of(self, name: str) -> Path | None:
        if not NAME_RE.match(name):
            return None
        for d in reversed(self.dirs):  # later dirs (dynamic agents) override earlier ones
            if (d / name / "agent.yaml").is_file():
                return d / name
        return None

    def get(self, name: str) -> AgentSpec:
        agent_dir = self._dir_of(name)
        if agent_dir is None:
            raise UnknownAgent(name)
        stamp = _stamp(agent_dir)
        cached = self._cache.get(name)
        if cached and cached[0] == stamp and cached[1].source == agent_dir:
            self._cache.move_to_end(name)
            return cached[1]
        spec = load_agent(agent_dir)
        self._cache[name] = (stamp, spec)
        self._cache.move_to_end(name)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return spec

    def check_all(self) -> list[ConfigError]:
        """Load every agent; return the errors (for ``pluto agents`` and config checks)."""
        errors = []
        for name in self.names():
            try:
                self.get(name)
            except ConfigError as e:
                errors.append(e)
        return errors


def _stamp(agent_dir: Path) -> float:
    try:
        return max(p.stat().st_mtime_ns for p in agent_dir.iterdir() if p.is_file())
    except (OSError, ValueError):
        return 0.0
