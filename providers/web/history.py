"""What a tab is shown of the conversation when it (re)connects: the messages, and how each
answer ended when that was not plainly — stopped by the visitor, or failed with the sentence
the visitor saw, or paused for the visitor's decision on a tool call (its request, ``open``
when it is the conversation's last run and has not expired: the widget shows its buttons) —
so a reload shows what the live tab showed. A visitor's message that came
with data files shows their names, not the note the agent was given about each."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from pluto.events import ApprovalRequest, RunError
from pluto.runtime.images import NOTE as IMAGE_NOTE
from pluto.storage.ports import RunReader

log = logging.getLogger(__name__)

ENDED = ("ok", "cancelled", "budget", "error", "interrupted")
LOOKUPS_AT_ONCE = 8
UNFINISHED = "This answer could not be finished."
# the note the gateway adds to a message for each data file it came with (data_commands._note)
FILE_NOTE = re.compile(r"^\[The user sent the file (.+?); it is now the dataset \S+ \(.*\)\. "
                       r"Query it as the table \S+\.\]$")


async def with_ends(runs: RunReader | None, shown: list[dict[str, Any]],
                    live: set[str]) -> list[dict[str, Any]]:
    """``shown`` (history items, oldest first) with a ``{"role": "run.end", "run_id",
    "outcome", "error"}`` item after the last item of each run that was stopped or failed.
    Runs still going (``live``) and any lookup that fails are left as they are."""
    last: dict[str, int] = {}
    for i, item in enumerate(shown):
        if item["role"] == "user":
            shown[i] = with_files(item)
        if item.get("run_id") and item["run_id"] not in live:
            last[item["run_id"]] = i
    if runs is None or not last:
        return shown
    slots = asyncio.Semaphore(LOOKUPS_AT_ONCE)
    ends = await asyncio.gather(*(_end(runs, run_id, slots) for run_id in last))
    after: dict[int, dict[str, Any]] = {last[e["run_id"]]: e for e in ends if e is not None}
    newest = max(last.values())
    for i, end in after.items():
        if end["role"] == "approval.request":  # decided or not: the last run says
            end["open"] = i == newest and not live and end["expires_at"] > time.time()
    out: list[dict[str, Any]] = []
    for i, item in enumerate(shown):
        out.append(item)
        if i in after:
            out.append(after[i])
    return out


def with_files(item: dict[str, Any]) -> dict[str, Any]:
    """A visitor's message without the notes about the files it came with, their names in
    ``files`` instead."""
    lines = item["text"].split("\n")
    files: list[str] = []
    while lines:
        if lines[-1]:  # (a blank line parts the datasets' notes from the pictures')
            if (m := FILE_NOTE.match(lines[-1]) or IMAGE_NOTE.match(lines[-1])) is None:
                break
            files.insert(0, m.group(1))
        lines.pop()
    if not files:
        return item
    return item | {"text": "\n".join(lines).rstrip("\n"), "files": files}


async def _end(runs: RunReader, run_id: str, slots: asyncio.Semaphore) -> dict[str, Any] | None:
    async with slots:
        try:
            run = await runs.run(run_id)
            if run is not None and run.status == "awaiting_approval":
                return await _request(runs, run_id)
            if run is None or run.status not in ENDED or run.status == "ok":
                return None
            error = None
            if run.status != "cancelled":  # the sentence the visitor was shown
                errors = [e for e in await runs.events(run_id) if isinstance(e, RunError)]
                error = errors[-1].message if errors else UNFINISHED
        except Exception as e:  # noqa: BLE001 - the history is shown without the mark
            log.warning("web: could not read how run %s ended: %s", run_id, e)
            return None
    end = {"role": "run.end", "run_id": run_id, "outcome": run.status, "error": error,
           "text": ""}
    if run.status == "interrupted":  # cut off, answered again: which message (not sent)
        end["source_id"] = run.source_id
    return end


async def _request(runs: RunReader, run_id: str) -> dict[str, Any] | None:
    """The request a paused run waits on, as the widget draws it (``approval.request``)."""
    found = [e for e in await runs.events(run_id) if isinstance(e, ApprovalRequest)]
    if not found:
        return None
    e = found[-1]
    return {"role": "approval.request", "run_id": run_id, "text": "",
            "approval_id": e.approval_id, "call_id": e.call_id, "name": e.name,
            "arguments": e.arguments[:4000], "approvers": e.approvers[:4000],
            "expires_at": e.expires_at, "approve": f"/approve {e.approval_id}",
            "deny": f"/deny {e.approval_id}"}
