"""Records, errors and test controls of the fake WhatsApp Cloud API (whatsapp_server.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.changes import Changes


MAX_TEXT = 4096
MAX_CAPTION = 1024
WINDOW = 24 * 3600.0

# the Graph API's error codes the fake answers with, and their titles
TITLES = {
    190: "Invalid OAuth access token - Cannot parse access token",
    100: "Invalid parameter",
    131009: "Parameter value is not valid",
    131047: "Re-engagement message",
    131056: "(Business Account, Consumer Account) pair rate limit hit",
    130429: "Rate limit hit",
    131026: "Message undeliverable",
    131053: "Media upload error",
    132000: "Number of parameters does not match the expected number of params",
    132001: "Template name does not exist in the translation",
    132018: "There was an issue with the parameters in your template.",
}


class GraphFailure(Exception):
    """An error the fake answers with: ``{"error": {...}}`` and an HTTP status."""

    def __init__(self, code: int, details: str = "", status: int | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.details = details
        self.status = status or (401 if code == 190 else 400)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        title = TITLES.get(self.code, "Unknown error")
        return {"error": {"message": f"(#{self.code}) {title}",
                          "type": "OAuthException", "code": self.code,
                          "error_data": {"messaging_product": "whatsapp",
                                         "details": self.details or title},
                          "fbtrace_id": "AfakeTrace0123"}}

    def as_status_error(self) -> dict[str, Any]:
        title = TITLES.get(self.code, "Unknown error")
        return {"code": self.code, "title": title, "message": title,
                "error_data": {"details": self.details or title}}


@dataclass
class Call:
    method: str
    path: str
    payload: Any
    status: int = 0
    time: float = field(default_factory=time.monotonic)


@dataclass
class Sent:
    """A message the business number sent (accepted by the API)."""

    id: str
    to: str
    type: str  # text | image | document | audio | template
    text: str  # the body, the caption, or a template's variable
    media_id: str | None
    file_bytes: bytes | None
    filename: str | None
    context: str | None
    payload: dict[str, Any]
    time: float = field(default_factory=time.monotonic)


@dataclass
class Delivery:
    """One webhook post (and its retries)."""

    payload: dict[str, Any]
    statuses: list[int] = field(default_factory=list)  # HTTP status of each attempt (0: failed)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def delivered(self) -> bool:
        return bool(self.statuses) and self.statuses[-1] == 200


@dataclass
class Said:
    """What a user sent: its wamid and the delivery that carried it (to redeliver)."""

    wa_id: str
    id: str
    delivery: Delivery


class Controls(Changes):
    """Test controls, records and waits shared by the fake."""

    FAKE = "WhatsApp"

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.sent: list[Sent] = []
        self.reads: list[tuple[str, bool]] = []  # (wamid, with typing indicator)
        self.deliveries: list[Delivery] = []
        self.users: dict[str, str] = {}  # wa_id → profile name
        self.last_inbound: dict[str, float] = {}  # wa_id → when they last wrote (time.time())
        # the message templates the business has approved: name → language code
        self.templates: dict[str, str] = {"pluto_update": "en"}
        self.inbound_ids: dict[str, str] = {}  # wamid → wa_id
        self.media: dict[str, tuple[bytes, str, str]] = {}  # id → (bytes, mime, filename)
        self._failures: list[tuple[Callable[[dict[str, Any]], bool], GraphFailure]] = []
        self._seq = itertools.count(1)
        self._changed = asyncio.Event()

    def wamid(self) -> str:
        return f"wamid.HBgLFAKE{next(self._seq):08d}=="

    def add_user(self, wa_id: str, name: str = "Alice") -> None:
        self.users[wa_id] = name

    def age_window(self, wa_id: str, seconds: float) -> None:
        """Pretend the user last wrote ``seconds`` ago."""
        self.last_inbound[wa_id] = time.time() - seconds

    def fail_next(self, code: int, *, when: Callable[[dict[str, Any]], bool] = lambda p: True,
                  details: str = "", status: int | None = None,
                  headers: dict[str, str] | None = None) -> None:
        """The next send whose payload matches ``when`` is refused with ``code``."""
        self._failures.append((when, GraphFailure(code, details, status, headers)))

    def _take_failure(self, payload: dict[str, Any]) -> GraphFailure | None:
        for i, (when, failure) in enumerate(self._failures):
            if when(payload):
                del self._failures[i]
                return failure
        return None

    def messages_to(self, wa_id: str) -> list[Sent]:
        return [s for s in self.sent if s.to == wa_id]

    def calls_to(self, method: str, path_part: str = "") -> list[Call]:
        return [c for c in self.calls if c.method == method and path_part in c.path]
