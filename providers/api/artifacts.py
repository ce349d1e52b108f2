"""A run's files (charts, query results) as the HTTP API's artifacts, in the Agent Protocol's
shape: each step lists those its run made, each with a URL under its task that serves the
file to the key that made the task (or an admin key), and nothing else.

A tool says which files it made in its ``tool.end`` details (``image``, ``csv``,
``attachments: [{path, kind}]``), as server paths. The API never shows those: only files under
the data dir's ``artifacts/`` are artifacts, known by an id derived from their path there, and
the event stream carries their URLs instead of the paths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pluto.events import RunEvent, ToolEnd
from pluto.gateway.ports import SharedFileReader

PREFIX = "/api/v1/agent/tasks"
MAX_PER_RUN = 100
# what is served, and how: images inline, the rest as downloads
MEDIA = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".webp": "image/webp", ".svg": "image/svg+xml", ".csv": "text/csv",
         ".json": "application/json", ".txt": "text/plain", ".pdf": "application/pdf",
         ".parquet": "application/vnd.apache.parquet"}
INLINE = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


@dataclass(frozen=True, slots=True)
class Artifact:
    id: str  # 32 hex digits, from the file's path under the data dir
    key: str  # that path: artifacts/<run>/<file>
    name: str  # the file's name
    media_type: str

    def view(self, task_id: str) -> dict[str, Any]:
        """The Agent Protocol's artifact, with where to fetch it and what it is."""
        return {"artifact_id": self.id, "agent_created": True, "file_name": self.name,
                "relative_path": None, "media_type": self.media_type,
                "url": url(task_id, self.id)}


def url(task_id: str, artifact_id: str) -> str:
    return f"{PREFIX}/{task_id}/artifacts/{artifact_id}"


def artifact_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def paths_in(details: Any) -> list[str]:
    """The server paths of the files a tool's ``details`` name."""
    if not isinstance(details, dict):
        return []
    found = [details.get("image"), details.get("csv")]
    listed = details.get("attachments")
    if isinstance(listed, list):
        found += [a.get("path") for a in listed if isinstance(a, dict)]
    return [p for p in found if isinstance(p, str) and p]


def artifact_at(path: str, files: SharedFileReader) -> Artifact | None:
    """The artifact a server path names, or None when it is not a file under ``artifacts/``
    of a type the API serves."""
    key = files.key(path)
    if key is None or not key.startswith("artifacts/"):
        return None
    name = PurePosixPath(key).name
    media = MEDIA.get(PurePosixPath(name).suffix.lower())
    if media is None:
        return None
    return Artifact(artifact_id(key), key, name, media)


def artifacts_of(events: Iterable[RunEvent], files: SharedFileReader | None) -> list[Artifact]:
    """The files a run's tools made, in order, each once."""
    if files is None:
        return []
    found: dict[str, Artifact] = {}
    for event in events:
        if isinstance(event, ToolEnd):
            for path in paths_in(event.details):
                artifact = artifact_at(path, files)
                if artifact is not None and len(found) < MAX_PER_RUN:
                    found.setdefault(artifact.id, artifact)
    return list(found.values())


def linked_details(details: Any, link: Callable[[str], str | None]) -> Any:
    """A tool's details as an API client sees them: each file's server path replaced by its
    artifact's URL (dropped when it has none)."""
    if not isinstance(details, dict):
        return details
    out = dict(details)
    for name in ("image", "csv"):
        if isinstance(out.get(name), str):
            if (found := link(out[name])) is not None:
                out[name] = found
            else:
                del out[name]
    listed = out.get("attachments")
    if isinstance(listed, list):
        kept = []
        for item in listed:
            if isinstance(item, dict) and isinstance(item.get("path"), str):
                if (found := link(item["path"])) is not None:
                    kept.append({k: v for k, v in item.items() if k != "path"} | {"url": found})
        out["attachments"] = kept
    return out


def content_disposition(artifact: Artifact) -> str:
    kind = "inline" if artifact.media_type in INLINE else "attachment"
    return f'{kind}; filename="{re.sub(r"[^A-Za-z0-9._-]", "_", artifact.name)[:100]}"'
