"""Skills, by progressive disclosure: only each skill's description is in the prompt (the agent
loader puts it there); the model reads a skill's body, or one of the files beside it, with the
``load_skill`` tool when it needs it.

A skill's scripts are never run: a file is only ever read, as text, from inside the skill's own
folder, until a sandboxed runner exists.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from pluto.agents.spec import AgentSpec
from pluto.agents.toolspec import MAX_SKILL_BYTES, Skill, read_skill
from pluto.runtime.tools import Tool, ToolContext, ToolError, ToolResult, tool
from pluto.yamldoc import FileRefused, read_regular_file

MAX_LISTED_FILES = 200


def skill_tools(agent: AgentSpec) -> dict[str, Tool]:
    """``load_skill``, bound to the agent's skills (none when it has no skills)."""
    skills: tuple[Skill, ...] = getattr(agent, "skills", ())
    return dict(_loader(skills)) if skills else {}


@functools.lru_cache(maxsize=256)
def _loader(skills: tuple[Skill, ...]) -> dict[str, Tool]:
    """(Made once for a set of skills: a tool's schema is read from its signature, work that
    every run of the agent would otherwise do again.)"""
    by_name = {s.name: s for s in skills}

    @tool(name="load_skill")
    async def load_skill(ctx: ToolContext, name: str, file: str | None = None) -> ToolResult:
        """Read one of your skills: its instructions, or one of the files it refers to.

        Args:
            name: The skill's name, as listed under Skills.
            file: A file of the skill's folder to read, as the skill names it
                (e.g. reference/style.md); leave out to read the skill's instructions.
        """
        skill = by_name.get(name)
        if skill is None:
            raise ToolError(f"there is no skill named '{name}'; yours: {', '.join(by_name)}")
        if file is None:
            return await asyncio.to_thread(_body, skill)
        return await asyncio.to_thread(_file, skill, file)

    return {"load_skill": load_skill}


def _body(skill: Skill) -> ToolResult:
    try:
        _, body = read_skill(skill.path / "SKILL.md")
    except ValueError as e:
        raise ToolError(f"the skill '{skill.name}' cannot be read now: {e}") from None
    others = _files(skill.path)
    listing = ("\n\nFiles of this skill (read one with load_skill and file=...; scripts are "
               "not run):\n" + "\n".join(f"- {f}" for f in others)) if others else ""
    return ToolResult(body + listing, details={"text": f"Read the skill {skill.name}"})


def _files(folder: Path) -> list[str]:
    out: list[str] = []
    for path in sorted(folder.rglob("*")):
        if len(out) >= MAX_LISTED_FILES:
            out.append("…")
            break
        rel = path.relative_to(folder)
        if path.is_file() and rel.parts[0][:1] != "." and str(rel) != "SKILL.md":
            out.append(rel.as_posix())
    return out


def _file(skill: Skill, rel: str) -> ToolResult:
    root = skill.path.resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or path == root:
        raise ToolError(f"'{rel}' is not a file of the skill '{skill.name}'")
    try:
        data = read_regular_file(path, MAX_SKILL_BYTES, "256 kB")
    except FileRefused as e:
        raise ToolError(f"{rel} {e}") from None
    except OSError:
        raise ToolError(f"the skill '{skill.name}' has no file '{rel}'; its files: "
                        f"{', '.join(_files(root)[:50]) or 'none'}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{rel} is not text; only text files of a skill can be read") from None
    return ToolResult(text, details={"text": f"Read {rel} of the skill {skill.name}"})
