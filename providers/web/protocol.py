"""The chat socket's JSON protocol: client frames checked strictly, server frames built here.

Client → server (the first frame must be ``hello``)::

    {"type": "hello", "token": "<session token or null>", "agent": "default"}
    {"type": "message", "id": "<client id, optional>", "text": "…", "files": ["<file id>"]}
    {"type": "file", "id": "<file id>", "name": "sales.csv", "mime": "text/csv", "size": 1234}
    {"type": "stop"}
    {"type": "ping"}

A ``file`` is answered ``file.accept`` (then its bytes follow as binary frames, and
``file.received`` says they all came) or an ``error`` (``file_refused``, one sentence); a
message names the files received that go with it (its text may then be empty). See
:mod:`pluto.providers.web.uploads`.

Server → client: ``ready``, ``history``, ``ack``, ``pong``, ``file.accept``, ``file.received``,
``message.user`` (sent from another tab), ``run.start``, ``message.delta``, ``tool.start``,
``tool.progress``, ``tool.end``, ``approval.request``, ``approval.decision``, ``message.final``,
``run.end``, ``notice``, ``error``. Every frame has an ``id``; frames of a run carry ``run_id``
and ``seq``.

A tool call waiting for a person (docs/approvals.md) is ``approval.request`` {approval_id,
call_id, name, arguments (JSON text, cut short), approvers (words), expires_at (epoch s),
approve, deny (the commands its buttons send)}; the run then ends (``run.end`` outcome
``awaiting_approval``). The decision — the visitor sends ``approve`` / ``deny`` as a message, or
it expires — resumes it in a new run whose first frame after ``run.start`` is
``approval.decision`` {approval_id, name, verdict approved|denied|expired|cancelled, by,
reason}; that run's frames follow as any run's.

A tool call that asks another agent (``ask_<agent>``, docs/agents.md) has ``child_run_id`` and
``question`` on its ``tool.start``: the run answering it. That child run's frames follow (its
``run.start``, deltas, tools, ``message.final``, ``run.end``), each with its own ``run_id`` and
``seq`` and marked ``parent_run_id`` (the run whose call asked) and ``parent_call_id`` (that
call): the widget draws them inside the parent's bubble, as a collapsed block. A child's child
nests the same way under it.

A message is acknowledged (``ack``) once it is recorded; one
that could not be (storage failed) gets ``error`` with code ``not_received``, its ``reply_to``
and a ``retry_after`` in seconds: the tab keeps it and sends it again (same id) after that.
Messages sent after it on that socket get the same answer until it is received (sent again in
order, none is answered ahead of it).

A tab knows its connection lives by what it hears: ``ready`` says ``ping_seconds``; after that
long with no frame the tab sends ``ping`` (answered ``pong``), and when nothing at all comes
that long after a frame that expects an answer (its ``hello``, a message, a ping), it drops the
connection and opens another — an instance stopped (SIGSTOP, a frozen VM) keeps its TCP
connections open and says nothing. A few pings per ``ping_seconds`` are not counted against the
message rate limit; more are.
See the README for the full description.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from pluto import jsonlimits
from pluto.errors import PlutoError
from pluto.ids import new_id, ordered_id
from pluto.jsonlimits import JsonTooDeep
from pluto.types import (
    ApprovalDecision,
    ApprovalRequest,
    MessageDelta,
    MessageFinal,
    RunEnd,
    RunError,
    RunEvent,
    RunStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
)

CLIENT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_TABLE_ROWS, MAX_TABLE_COLUMNS, MAX_CELL_CHARS = 200, 50, 500
MAX_DETAIL_TEXT = 4000
MAX_QUESTION = 300  # of an asked agent, shown on its nested block
MAX_IMAGE_URL = 2048
MAX_FILES = 10  # named by one message
MAX_FILE_NAME = 255


def encode(frame: dict[str, Any]) -> str:
    """A server frame as the text of a WebSocket message (orjson: a few µs per frame, each
    streamed delta is one). What orjson refuses (an integer past 64 bits in a tool's
    arguments) is still sent, by the standard library."""
    try:
        return orjson.dumps(frame).decode()
    except TypeError:
        return json.dumps(frame, default=str)


class ProtocolError(PlutoError):
    """A client frame we refuse; ``message`` is one sentence for the visitor."""

    def __init__(self, code: str, message: str, *, reply_to: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reply_to = reply_to


@dataclass(frozen=True, slots=True)
class Hello:
    token: str | None
    agent: str | None


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    text: str
    files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FileStart:
    id: str
    name: str
    mime: str | None
    size: int


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Ping:
    """Is anyone there? Answered ``pong`` (the tab's liveness check)."""


ClientFrame = Hello | Message | FileStart | Stop | Ping
PING_FRAME_BYTES = 64  # a ping is short: longer frames are not looked at as one


def is_ping(raw: str) -> bool:
    """Whether ``raw`` is a ping (checked before the rate limit: a short frame only)."""
    if len(raw) > PING_FRAME_BYTES or "ping" not in raw:
        return False
    try:
        return isinstance(parse_frame(raw, PING_FRAME_BYTES), Ping)
    except ProtocolError:
        return False


def _field(data: dict[str, Any], name: str, kind: type, *, optional: bool = True) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names: dict[type, str] = {str: "a string", dict: "an object"}
        wanted = names.get(kind, kind.__name__)
        raise ProtocolError("bad_frame", f"'{name}' must be {wanted}.")
    return value


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")  # lone surrogates (from JSON escapes) cannot be stored
    except UnicodeEncodeError:
        return False
    return True


def parse_frame(raw: str, max_chars: int) -> ClientFrame:
    """One client frame, or :class:`ProtocolError` saying what is wrong with it."""
    try:
        data = jsonlimits.loads(raw)
    except JsonTooDeep:
        raise ProtocolError("bad_json", "That frame nests too deeply to be one of ours.") from None
    except ValueError:
        raise ProtocolError("bad_json", "That frame was not valid JSON.") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_frame", "A frame must be a JSON object with a 'type'.")
    kind = _field(data, "type", str, optional=False)
    client_id = data.get("id")
    if client_id is not None and (not isinstance(client_id, str) or not CLIENT_ID.fullmatch(client_id)):
        raise ProtocolError("bad_frame", "'id' must be up to 64 letters, digits or _.:-")
    match kind:
        case "hello":
            agent = _field(data, "agent", str)
            if agent is not None and not AGENT_NAME.fullmatch(agent):
                raise ProtocolError("bad_frame", "'agent' is not a valid agent name.")
            token = _field(data, "token", str)
            return Hello(token=token[:512] if token else None, agent=agent or None)
        case "message":
            files = _files(data.get("files"), client_id)
            text = _field(data, "text", str, optional=bool(files)) or ""
            if not text.strip() and not files:
                raise ProtocolError("empty", "The message is empty.", reply_to=client_id)
            if not _is_text(text):
                raise ProtocolError("bad_frame", "The message is not valid Unicode text.",
                                    reply_to=client_id)
            if len(text) > max_chars:
                raise ProtocolError("too_long", f"The message is too long ({len(text):,} "
                                    f"characters; the limit is {max_chars:,}).",
                                    reply_to=client_id)
            return Message(id=client_id or ordered_id(), text=text, files=files)
        case "file":
            return _file_start(data, client_id)
        case "stop":
            return Stop()
        case "ping":
            return Ping()
        case _:
            shown = kind if len(kind) <= 40 else kind[:40] + "…"
            raise ProtocolError("unknown_type", f"Unknown frame type '{shown}'; expected hello, "
                                "message, file, stop or ping.")


def _files(value: Any, client_id: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_FILES or not all(
            isinstance(v, str) and CLIENT_ID.fullmatch(v) for v in value):
        raise ProtocolError("bad_frame", f"'files' must list at most {MAX_FILES} file ids.",
                            reply_to=client_id)
    return tuple(value)


def _file_start(data: dict[str, Any], client_id: str | None) -> FileStart:
    if client_id is None:
        raise ProtocolError("bad_frame", "A file needs an 'id'.")
    name = _field(data, "name", str, optional=False).strip()
    if not name or len(name) > MAX_FILE_NAME or not _is_text(name) or any(
            ord(c) < 32 for c in name):
        raise ProtocolError("bad_frame", f"A file's 'name' must be 1 to {MAX_FILE_NAME} "
                            "printable characters.", reply_to=client_id)
    mime = _field(data, "mime", str)
    if mime is not None and not re.fullmatch(r"[\w.+-]{1,60}/[\w.+-]{1,60}", mime):
        mime = None  # (what the browser guessed: the name tells as much)
    size = data.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ProtocolError("bad_frame", "A file's 'size' must be its length in bytes.",
                            reply_to=client_id)
    return FileStart(id=client_id, name=name, mime=mime, size=size)


class TokenBucket:
    """``count`` frames, refilled evenly over ``seconds``: the per-connection rate limit."""

    def __init__(self, count: int, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.count, self.seconds, self.clock = count, seconds, clock
        self.tokens = float(count)
        self.updated = clock()

    def take(self) -> float:
        """0 when a frame may pass now; else the seconds until one may."""
        now = self.clock()
        refill = (now - self.updated) * self.count / self.seconds
        self.tokens = min(self.count, self.tokens + refill)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) * self.seconds / self.count


# server frames ---------------------------------------------------------------------------------

def frame(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "id": fields.pop("id", None) or new_id(), **fields}


def error(code: str, message: str, *, reply_to: str | None = None,
          **extra: Any) -> dict[str, Any]:
    return frame("error", code=code, message=message, reply_to=reply_to, **extra)


Linker = Callable[[str], str | None]


def run_frame(seq: int, event: RunEvent, link: Linker) -> dict[str, Any] | None:
    """The frame that shows one run event to the visitor (None for events they don't see)."""
    base = {"id": f"{event.run_id}:{seq}", "run_id": event.run_id, "seq": seq}
    match event:
        case RunStart():
            return frame("run.start", **base)
        case MessageDelta(text=text):
            return frame("message.delta", text=text, **base)
        case ToolStart(name=name, call_id=call_id, child_run_id=None):
            return frame("tool.start", name=name, call_id=call_id, **base)
        case ToolStart(name=name, call_id=call_id, child_run_id=child, arguments=arguments):
            question = arguments.get("question")  # (what the asked agent was asked)
            return frame("tool.start", name=name, call_id=call_id, child_run_id=child,
                         question=question[:MAX_QUESTION] if isinstance(question, str)
                         else None, **base)
        case ToolProgress(name=name, call_id=call_id, progress=progress, total=total,
                          message=message):
            return frame("tool.progress", name=name, call_id=call_id, progress=progress,
                         total=total, message=message, **base)
        case ToolEnd(name=name, call_id=call_id, is_error=is_error, details=details):
            return frame("tool.end", name=name, call_id=call_id, is_error=is_error,
                         details=display_details(details, link), **base)
        case MessageFinal(text=text):
            return frame("message.final", text=text, **base)
        case RunError(message=message, kind=kind):
            return frame("error", code=f"run_{kind}", message=message, reply_to=None, **base)
        case ApprovalRequest():
            return frame("approval.request", approval_id=event.approval_id,
                         call_id=event.call_id, name=event.name,
                         arguments=event.arguments[:MAX_DETAIL_TEXT],
                         approvers=event.approvers[:MAX_DETAIL_TEXT],
                         expires_at=event.expires_at,
                         approve=f"/approve {event.approval_id}",
                         deny=f"/deny {event.approval_id}", **base)
        case ApprovalDecision():
            return frame("approval.decision", approval_id=event.approval_id,
                         call_id=event.call_id, name=event.name, verdict=event.verdict,
                         by=event.by[:200], reason=event.reason[:MAX_DETAIL_TEXT], **base)
        case RunEnd(outcome=outcome):
            return frame("run.end", outcome=outcome, **base)
    return None


def _cell(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, bool | int | float):
        return value
    text = str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 1] + "…"


def _table(table: Any) -> dict[str, Any] | None:
    if not isinstance(table, dict) or not isinstance(table.get("columns"), list):
        return None
    columns = [str(c)[:MAX_CELL_CHARS] for c in table["columns"][:MAX_TABLE_COLUMNS]]
    rows = []
    for row in table.get("rows") or []:
        if isinstance(row, dict):
            row = [row.get(c) for c in columns]
        if isinstance(row, list | tuple):
            rows.append([_cell(v) for v in list(row)[:len(columns)]])
        if len(rows) >= MAX_TABLE_ROWS:
            break
    total = table.get("total_rows")
    total = total if isinstance(total, int) and not isinstance(total, bool) else len(
        table.get("rows") or [])
    total = max(total, len(rows))
    numeric = table.get("numeric")
    numeric = [v is True for v in numeric[:len(columns)]] if isinstance(numeric, list) else []
    shown = {"columns": columns, "rows": rows, "total_rows": total,
             "truncated": bool(table.get("truncated")) or total > len(rows)}
    return shown | ({"numeric": numeric} if any(numeric) else {})  # right-aligned columns


def _image(value: Any, link: Linker) -> str | None:
    if not isinstance(value, str) or len(value) > 5_000_000:
        return None
    if value.startswith(("https://", "http://")) and len(value) <= MAX_IMAGE_URL:
        return value
    if re.match(r"^data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]+$", value):
        return value
    if ":" in value.split("/", 1)[0]:
        return None  # another scheme: not shown
    return link(value)


def display_details(details: Any, link: Linker) -> dict[str, Any] | None:
    """What a tool's ``details`` may show in the widget: a table, an image, a CSV to download,
    a text, a title — checked, capped, file paths turned into signed links. None when nothing
    is left."""
    if not isinstance(details, dict):
        return None
    out: dict[str, Any] = {}
    if (table := _table(details.get("table"))) is not None:
        out["table"] = table
    if (image := _image(details.get("image"), link)) is not None:
        out["image"] = image
    if isinstance(details.get("csv"), str) and (csv := link(details["csv"])) is not None:
        out["csv"] = csv  # the whole result, to download
    for key in ("text", "title"):
        if isinstance(details.get(key), str) and details[key].strip():
            out[key] = details[key][:MAX_DETAIL_TEXT]
    return out or None
