"""From a Cloud API webhook post to :class:`IncomingMessage`s.

A post is ``{"object": "whatsapp_business_account", "entry": [{"changes": [{"field":
"messages", "value": {...}}]}]}``; a value holds ``messages`` (what people wrote, with
``contacts`` naming them) and ``statuses`` (what became of the bot's messages: sent, delivered,
read, failed). The post is signed: ``X-Hub-Signature-256: sha256=<HMAC-SHA256 of the raw body
with the app secret>``. Every chat is a person's own (their ``wa_id``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pluto.providers.kit.files import safe_filename
from pluto.providers.kit.payload import dict_at, text_at
from pluto.types import Attachment, IncomingMessage

log = logging.getLogger(__name__)

PROVIDER = "whatsapp"
READABLE = ("text", "document", "image", "audio")  # audio: a voice note (docs/voice.md)


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message a person wrote to the bot's number."""

    raw: dict[str, Any]
    wa_id: str
    name: str | None

    @property
    def id(self) -> str:
        return text_at(self.raw, "id")

    @property
    def kind(self) -> str:
        return text_at(self.raw, "type")

    @property
    def timestamp(self) -> float:
        try:
            return float(self.raw.get("timestamp") or 0)
        except (TypeError, ValueError):
            return 0.0


@dataclass(frozen=True, slots=True)
class Status:
    """What became of one of the bot's messages."""

    message_id: str
    recipient: str
    status: str
    errors: list[dict[str, Any]] = field(default_factory=list)


def parse(payload: Any, phone_number_id: str) -> tuple[list[Inbound], list[Status]]:
    """The messages and statuses of a webhook post for this number (others are ignored)."""
    messages: list[Inbound] = []
    statuses: list[Status] = []
    if not isinstance(payload, dict):
        raise ValueError("not a JSON object")
    for entry in _dicts(payload.get("entry")):
        for change in _dicts(entry.get("changes")):
            value = change.get("value")
            if change.get("field") != "messages" or not isinstance(value, dict):
                continue
            if text_at(dict_at(value, "metadata"), "phone_number_id") != phone_number_id:
                continue
            names = {str(c.get("wa_id")): (c.get("profile") or {}).get("name")
                     for c in _dicts(value.get("contacts"))}
            for msg in _dicts(value.get("messages")):
                sender = str(msg.get("from") or "")
                if sender and msg.get("id"):
                    messages.append(Inbound(msg, sender, names.get(sender)))
            for st in _dicts(value.get("statuses")):
                statuses.append(Status(str(st.get("id") or ""), str(st.get("recipient_id") or ""),
                                       str(st.get("status") or ""), list(_dicts(st.get("errors")))))
    return messages, statuses


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def text_of(inbound: Inbound) -> str:
    raw = inbound.raw
    if inbound.kind == "text":
        return str((raw.get("text") or {}).get("body") or "")
    media = raw.get(inbound.kind)
    return str(media.get("caption") or "") if isinstance(media, dict) else ""


def media_of(inbound: Inbound) -> tuple[str, str, str, Literal["file", "image"]] | None:
    """(media id, file name, MIME type, kind) of a document, an image or audio."""
    media = inbound.raw.get(inbound.kind)
    if inbound.kind not in ("document", "image", "audio") or not isinstance(media, dict):
        return None
    mime = str(media.get("mime_type") or "application/octet-stream")
    if inbound.kind == "audio":  # a voice note (OGG/Opus, ``voice: true``) or an audio file
        ext = {"audio/mpeg": "mp3", "audio/mp4": "m4a", "audio/aac": "aac",
               "audio/amr": "amr"}.get(mime.split(";")[0].strip(), "ogg")
        return str(media.get("id") or ""), f"voice-{_short(inbound.id)}.{ext}", mime, "file"
    if inbound.kind == "image":
        ext = {"image/png": "png", "image/webp": "webp"}.get(mime, "jpg")
        return str(media.get("id") or ""), f"photo-{_short(inbound.id)}.{ext}", mime, "image"
    name = str(media.get("filename") or f"document-{_short(inbound.id)}")
    return str(media.get("id") or ""), name, mime, "file"


def to_incoming(inbound: Inbound, attachments: tuple[Attachment, ...] = ()) -> IncomingMessage:
    context = dict_at(inbound.raw, "context")
    return IncomingMessage(
        provider=PROVIDER, chat_id=inbound.wa_id, user_id=inbound.wa_id, user_name=inbound.name,
        text=text_of(inbound).strip(), message_id=inbound.id, attachments=attachments,
        reply_to_id=str(context["id"]) if context.get("id") else None,
        is_direct=True, mentions_bot=True, timestamp=inbound.timestamp or time.time())


def _short(message_id: str) -> str:
    return hashlib.sha256(message_id.encode()).hexdigest()[:12]


def upload_path(root: Path, inbound: Inbound, filename: str) -> Path:
    return root / safe_part(inbound.wa_id) / f"{_short(inbound.id)}-{safe_filename(filename)}"


def safe_part(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_-]", "_", text)[:40] or "unknown"
