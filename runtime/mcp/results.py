"""An MCP server's tools as Pluto tools: names namespaced and checked, schemas passed on, and
results mapped to what the model reads (text) and what people see (images and files, saved as
artifacts under the data dir and sent with the answer).

Imports the ``mcp`` SDK's types: loaded in a worker thread with the connection module.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import mimetypes
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types

from pluto.agents.toolspec import RESERVED_TOOLS, McpServerSpec, clash_sentence
from pluto.runtime.mcp.connection import McpConnection, McpUnavailable
from pluto.runtime.tools import Tool, ToolContext, ToolResult

log = logging.getLogger(__name__)

TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what model APIs accept as a function name
MAX_CONTENT = 60_000  # characters of a result the model reads
MAX_DESCRIPTION = 2_000
MAX_FILE_BYTES = 20 * 2**20  # an image or file larger than this is not kept


@dataclass(frozen=True, slots=True)
class McpTool(Tool):
    """A tool of an MCP server. The server checks the arguments against its own schema (which
    may say more than ours can), so they go to it as they are."""

    async def __call__(self, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        out = await self.fn(ctx, arguments)
        return out if isinstance(out, ToolResult) else ToolResult(str(out))


def builtin_clash(name: str) -> str | None:
    """The built-in tool an MCP tool called ``name`` would replace, if any."""
    from pluto.runtime.catalog import standard_tools
    return name if name in standard_tools() or name in RESERVED_TOOLS else None


def tools_of(spec: McpServerSpec, conn: McpConnection,
             narrowed: tuple[str, ...] | None) -> dict[str, Tool]:
    """The server's tools this agent may use, by the names the model sees."""
    allow = spec.settings.tools
    out: dict[str, Tool] = {}
    if not conn.tools and conn.state == "down" and allow:
        return _unavailable(spec, conn, allow, narrowed)
    for t in conn.tools:
        if allow is not None and t.name not in allow:
            continue
        name = spec.prefix + re.sub(r"[^A-Za-z0-9_-]", "_", t.name)
        if not TOOL_NAME_RE.fullmatch(name) or name in out:
            log.warning("mcp %s: tool %r skipped: its name %r is too long or taken", spec.name,
                        t.name[:80], name[:80])
            continue
        if (clash := builtin_clash(name)) is not None:  # never a silent replacement
            if t.name not in conn.clashes:
                conn.clashes[t.name] = clash_sentence(spec.name, t.name, clash)
                log.error("mcp %s: not loaded: %s", spec.name, conn.clashes[t.name])
            continue
        if narrowed is not None and name not in narrowed and spec.name not in narrowed:
            continue
        out[name] = McpTool(name, _description(spec, t), _parameters(t.input_schema),
                            _caller(conn, t.name, spec.name))
    return out


def _unavailable(spec: McpServerSpec, conn: McpConnection, allow: list[str],
                 narrowed: tuple[str, ...] | None) -> dict[str, Tool]:
    """A server that has not started yet: the tools its allowlist names, so the model knows
    they exist and are unavailable (a call says why)."""
    out: dict[str, Tool] = {}
    for tool in allow:
        name = spec.prefix + re.sub(r"[^A-Za-z0-9_-]", "_", tool)
        if builtin_clash(name) is not None:
            continue
        if TOOL_NAME_RE.fullmatch(name) and (narrowed is None or name in narrowed
                                              or spec.name in narrowed):
            out[name] = McpTool(name, f"Unavailable right now ({conn.error}); from the "
                                f"{spec.name} server", {"type": "object", "properties": {}},
                                _caller(conn, tool, spec.name))
    return out


def _description(spec: McpServerSpec, t: types.Tool) -> str:
    text = " ".join((t.description or t.title or t.name).split())
    if len(text) > MAX_DESCRIPTION:
        text = text[:MAX_DESCRIPTION] + "…"
    return f"{text} (from the {spec.name} server)"


def _parameters(schema: Any) -> dict[str, Any]:
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema["type"] = "object"
    schema.setdefault("properties", {})
    return schema


def _caller(conn: McpConnection, tool: str, server: str) -> Any:
    async def call(ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = await conn.call(tool, arguments, ctx.progress)
        except McpUnavailable:
            raise McpUnavailable(conn.unavailable_sentence(server)) from None
        return await to_result(result, ctx.data_dir / "artifacts" / ctx.run_id, server)

    return call


async def to_result(result: types.CallToolResult, folder: Path, server: str) -> ToolResult:
    """Text for the model; images and files saved under ``folder`` for people; ``isError``
    kept, so the model can correct its call."""
    texts: list[str] = []
    files: list[tuple[str, str, str]] = []  # (kind, base64 data, mime type)
    for block in result.content:
        match block:
            case types.TextContent(text=text):
                texts.append(text)
            case types.ImageContent(data=data, mime_type=mime) | \
                    types.AudioContent(data=data, mime_type=mime):
                kind = "image" if isinstance(block, types.ImageContent) else "file"
                texts.append(_keep(files, kind, data, mime))
            case types.EmbeddedResource(resource=types.TextResourceContents(text=text, uri=uri)):
                texts.append(f"[{uri}]\n{text}")
            case types.EmbeddedResource(resource=types.BlobResourceContents(
                    blob=blob, uri=uri, mime_type=mime)):
                texts.append(f"[{uri}] " + _keep(files, "file", blob,
                                                  mime or "application/octet-stream"))
            case types.ResourceLink(uri=uri, name=name, description=description):
                texts.append(f"[link: {name} {uri}]" + (f" {description}" if description else ""))
            case _:
                texts.append(f"[{getattr(block, 'type', 'content')} not shown]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    content = "\n".join(texts).strip() or ("(no output)" if not result.is_error else "failed")
    if len(content) > MAX_CONTENT:
        content = content[:MAX_CONTENT] + f"\n[cut: the result had {len(content):,} characters]"
    if result.is_error:
        content = f"Error: {content}"
    details = await _save(files, folder, server) if files else None
    return ToolResult(content, details=details, is_error=bool(result.is_error))


def _keep(files: list[tuple[str, str, str]], kind: str, data: str, mime: str) -> str:
    if len(data) > MAX_FILE_BYTES * 4 // 3 + 4:
        return f"[a {mime} file too large to show]"
    files.append((kind, data, mime))  # decoded and saved in a worker thread
    what = "an image" if kind == "image" else f"a file ({mime})"
    return f"[{what}, sent to the user with your answer; do not link to it]"


async def _save(files: list[tuple[str, str, str]], folder: Path,
                server: str) -> dict[str, Any] | None:
    def write() -> list[dict[str, Any]]:
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for kind, data, mime in files:
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                log.warning("mcp %s: a %s file that is not valid base64 was dropped", server,
                            mime)
                continue
            ext = mimetypes.guess_extension(mime) or ".bin"
            path = folder / f"{server}-{uuid.uuid4().hex[:8]}{ext}"
            path.write_bytes(raw)
            out.append({"path": str(path), "mime_type": mime, "kind": kind, "size": len(raw)})
        return out

    saved = await asyncio.to_thread(write)
    if not saved:
        return None
    details: dict[str, Any] = {"attachments": saved}
    image = next((f for f in saved if f["kind"] == "image"), None)
    if image is not None:
        details["image"] = image["path"]  # what delivery sends today
    return details
