"""What a reply needs to know about the mail it answers, kept in the data dir.

An outgoing message names its chat (the thread's root Message-ID) and the message it answers;
an email reply also needs the address to write to, the subject and the ``References`` chain.
They are written here when a mail arrives — before intake records it, so a reply the outbox
takes up after a crash finds them — one small JSON file per thread under
``<data_dir>/email/threads/``. The bot's own Message-IDs carry the thread's file key
(:meth:`ThreadBook.new_message_id`), so a reply to one of them finds its thread even when the
mail client sent ``In-Reply-To`` alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KEPT_MESSAGES = 50  # per thread, the latest
CACHED = 512  # threads kept in memory
MAX_REFERENCES = 20  # ids in a References header (the root and the latest)
_OURS = re.compile(r"^pluto\.([0-9a-f]{32})\.[0-9a-z]+@")


@dataclass(frozen=True, slots=True)
class Origin:
    """A received mail as its reply needs it."""

    message_id: str
    to: str  # Reply-To, else From
    subject: str
    references: tuple[str, ...] = ()


@dataclass(slots=True)
class Thread:
    chat: str
    messages: OrderedDict[str, Origin] = field(default_factory=OrderedDict)

    def latest(self) -> Origin | None:
        return next(reversed(self.messages.values()), None)


def thread_key(chat: str) -> str:
    return hashlib.sha256(chat.encode("utf-8", "surrogateescape")).hexdigest()[:32]


class ThreadBook:
    def __init__(self, root: Path):
        self.root = root
        self._cache: OrderedDict[str, Thread] = OrderedDict()
        self._lock = asyncio.Lock()

    def new_message_id(self, chat: str, domain: str) -> str:
        """A Message-ID (without brackets) for a mail of the bot in ``chat``."""
        return f"pluto.{thread_key(chat)}.{secrets.token_hex(8)}@{domain}"

    async def chat_of(self, message_id: str) -> str | None:
        """The chat of one of the bot's own Message-IDs, if its thread is known here."""
        found = _OURS.match(message_id)
        if found is None:
            return None
        thread = await self._load(found.group(1))
        return thread.chat if thread is not None else None

    async def note(self, chat: str, origin: Origin) -> None:
        """Remember a received mail of ``chat`` (written before the mail is handed over)."""
        async with self._lock:
            key = thread_key(chat)
            thread = await self._load(key) or Thread(chat)
            thread.messages[origin.message_id] = origin
            thread.messages.move_to_end(origin.message_id)
            while len(thread.messages) > KEPT_MESSAGES:
                thread.messages.popitem(last=False)
            await asyncio.to_thread(self._write, key, thread)
            self._remember(key, thread)

    async def origin(self, chat: str, answers: str | None) -> Origin | None:
        """The mail a reply in ``chat`` answers: ``answers`` if known, else the latest."""
        thread = await self._load(thread_key(chat))
        if thread is None:
            return None
        if answers and answers in thread.messages:
            return thread.messages[answers]
        return thread.latest()

    async def _load(self, key: str) -> Thread | None:
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        thread = await asyncio.to_thread(self._read, key)
        if thread is not None:
            self._remember(key, thread)
        return thread

    def _remember(self, key: str, thread: Thread) -> None:
        self._cache[key] = thread
        self._cache.move_to_end(key)
        while len(self._cache) > CACHED:
            self._cache.popitem(last=False)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def _read(self, key: str) -> Thread | None:
        try:
            data = json.loads(self._path(key).read_text("utf-8"))
            thread = Thread(str(data["chat"]))
            for item in data["messages"]:
                item["references"] = tuple(item.get("references") or ())
                origin = Origin(**item)
                thread.messages[origin.message_id] = origin
            return thread
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("email: the thread record %s cannot be read (%s)", key, e)
            return None

    def _write(self, key: str, thread: Thread) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {"chat": thread.chat,
                                "messages": [asdict(o) for o in thread.messages.values()]}
        path = self._path(key)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), "utf-8")
        os.replace(tmp, path)
