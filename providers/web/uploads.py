"""Files a visitor sends with a message, over the chat socket itself (so the file and its
message reach the same instance, as on every other platform).

The tab announces a file (``{"type": "file", "id", "name", "mime", "size"}``); it is refused
in one sentence (too large, not a kind the chat reads, too many waiting) or accepted
(``file.accept``); the tab then sends its bytes as binary frames, and once they are all here
gets ``file.received``. The file is saved where every provider saves what users send
(``<data dir>/uploads/web/<chat>/``) and goes with the next message that names it, as an
attachment: from there the gateway's usual path takes it (a data file becomes a dataset of the
conversation, within ``data.max_upload_mb``). Files never sent with a message are deleted when
the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import mimetypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pluto.ids import new_id
from pluto.providers.web import protocol
from pluto.runtime.data.filetypes import SPREADSHEETS
from pluto.runtime.data.service import is_data_file
from pluto.runtime.voice import is_audio
from pluto.types import Attachment

log = logging.getLogger(__name__)

MAX_WAITING = 10  # files received (or coming) and not yet sent with a message, per socket
FLUSH_BYTES = 1 << 20  # bytes gathered before one write (in a thread)
# Pictures go to the model as images (runtime/images.py; a model without vision gets a
# description of each, and the visitor is told so).
ACCEPTS_IMAGES = True
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
KINDS = "CSV, TSV, JSON or Parquet"  # (what a dataset is made of: runtime/data/filetypes.py)
# Voice notes and audio files (the widget's microphone records WebM/Opus, or what the browser
# has) go to the gateway's voice hook (runtime/voice.py): heard, and their words the message.
ACCEPTS_AUDIO = True


@dataclass(slots=True)
class _File:
    id: str
    name: str
    mime: str
    size: int
    path: Path
    received: int = 0
    buffer: bytearray = field(default_factory=bytearray)
    handle: BinaryIO | None = None

    @property
    def complete(self) -> bool:
        return self.received >= self.size

    def attachment(self) -> Attachment:
        return Attachment(filename=self.name, mime_type=self.mime, size=self.size,
                          path=self.path, kind="image" if self.mime in IMAGE_TYPES else "file")


def human(size: float) -> str:
    return f"{size / 2**20:.3g} MB" if size >= 2**20 else f"{size / 1024:.3g} kB"


def kind_refusal(name: str, mime: str) -> str | None:
    """Why the chat does not take a file of this kind (None: it does)."""
    if is_data_file(name, mime) or Path(name).suffix.lower() in SPREADSHEETS:
        return None  # (a spreadsheet is told by the gateway how to send it instead)
    if mime in IMAGE_TYPES and ACCEPTS_IMAGES:
        return None
    if ACCEPTS_AUDIO and is_audio(Attachment(filename=name, mime_type=mime)):
        return None  # (its content is checked when it is heard: ffprobe, then ffmpeg)
    if mime.startswith("image/"):
        return f"Pictures like {name} cannot be read in this chat; send PNG, JPEG, GIF or WebP."
    return (f"Files like {name} cannot be read in this chat yet; send data as {KINDS}, or "
            "audio (a voice note).")


class Uploads:
    """The files of one chat socket."""

    def __init__(self, root: Path, max_bytes: int):
        self.root = root  # <data dir>/uploads/web
        self.max_bytes = max_bytes
        self._files: dict[str, _File] = {}
        self._current: _File | None = None  # the file whose bytes are coming

    @property
    def receiving(self) -> bool:
        return self._current is not None

    async def announce(self, frame: protocol.FileStart, chat_id: str) -> dict[str, Any]:
        """``file.accept``, or an ``error`` saying in one sentence why the file is refused."""
        if self._current is not None:  # the one before was not finished: it is given up
            await self._drop(self._current)
        name, size = frame.name, frame.size
        mime = (frame.mime or mimetypes.guess_type(name)[0] or "application/octet-stream")
        mime = mime.split(";")[0].strip() or "application/octet-stream"  # (audio/webm;codecs=opus)
        refusal = kind_refusal(name, mime.lower())
        if refusal is None and size > self.max_bytes:
            refusal = (f"{name} is too large to send here ({human(size)}; the limit is "
                       f"{human(self.max_bytes)}).")
        if refusal is None and size == 0:
            refusal = f"{name} is empty."
        if refusal is None and (frame.id in self._files or len(self._files) >= MAX_WAITING):
            refusal = (f"Too many files are waiting to be sent (at most {MAX_WAITING}); send "
                       "your message first." if frame.id not in self._files else
                       f"A file with the id {frame.id} was already sent.")
        if refusal is not None:
            return protocol.error("file_refused", refusal, reply_to=frame.id)
        folder = self.root / _folder(chat_id)
        path = folder / f"{new_id()[:12]}-{_safe(name)}"  # (never a name the tab chose)
        upload = _File(frame.id, name, mime.lower(), size, path)
        try:
            upload.handle = await asyncio.to_thread(_open, upload.path)
        except OSError as e:
            log.error("web: cannot save a file a visitor sent in %s: %s", folder, e)
            return protocol.error("file_refused", f"{name} could not be saved (a problem on "
                                  "our side); please try again later.", reply_to=frame.id)
        self._files[frame.id] = self._current = upload
        return protocol.frame("file.accept", reply_to=frame.id)

    async def chunk(self, data: bytes) -> dict[str, Any] | None:
        """Bytes of the file being sent: ``file.received`` once it is whole, an ``error`` if
        more came than announced, else None."""
        upload = self._current
        assert upload is not None
        upload.received += len(data)
        if upload.received > upload.size:
            await self._drop(upload)
            return protocol.error("file_refused", f"{upload.name} was longer than announced; "
                                  "it was not kept.", reply_to=upload.id)
        upload.buffer += data
        try:
            if len(upload.buffer) >= FLUSH_BYTES or upload.complete:
                await asyncio.to_thread(_write, upload.handle, bytes(upload.buffer),
                                        upload.complete)
                upload.buffer.clear()
        except OSError as e:
            log.error("web: saving a file a visitor sent failed: %s", e)
            await self._drop(upload)
            return protocol.error("file_refused", f"{upload.name} could not be saved (a "
                                  "problem on our side); please try again later.",
                                  reply_to=upload.id)
        if not upload.complete:
            return None
        upload.handle = None
        self._current = None
        return protocol.frame("file.received", reply_to=upload.id, name=upload.name,
                              size=upload.size)

    def take(self, ids: tuple[str, ...]) -> tuple[Attachment, ...] | str:
        """The files a message names, as attachments, or one sentence saying which one is
        not here."""
        for file_id in ids:
            upload = self._files.get(file_id)
            if upload is None or not upload.complete:
                what = upload.name if upload is not None else "A file"
                return (f"{what} did not arrive (it was refused, or the connection dropped); "
                        "please attach it again.")
        return tuple(self._files[file_id].attachment() for file_id in dict.fromkeys(ids))

    def sent(self, ids: tuple[str, ...]) -> None:
        """The message that named these files was recorded: they are no longer this
        socket's to delete (until then a message sent again names them again)."""
        for file_id in ids:
            self._files.pop(file_id, None)

    async def discard(self) -> None:
        """Delete what no message took (the socket is closing)."""
        for upload in list(self._files.values()):
            await self._drop(upload)

    async def _drop(self, upload: _File) -> None:
        self._files.pop(upload.id, None)
        if self._current is upload:
            self._current = None
        handle, upload.handle = upload.handle, None
        await asyncio.to_thread(_remove, handle, upload.path)


def _open(path: Path) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("xb")


def _write(handle: BinaryIO | None, data: bytes, last: bool) -> None:
    assert handle is not None
    handle.write(data)
    if last:
        handle.close()


def _remove(handle: BinaryIO | None, path: Path) -> None:
    with contextlib.suppress(OSError):
        if handle is not None:
            handle.close()
        path.unlink(missing_ok=True)


def _folder(chat_id: str) -> str:
    """A folder name for a chat id (a visitor id, maybe ``:agent``): readable and unique."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", chat_id)[:60]
    return f"{readable}-{hashlib.sha256(chat_id.encode()).hexdigest()[:8]}"


def _safe(name: str) -> str:
    stem, dot, suffix = Path(name.replace("\\", "/")).name.rpartition(".")
    stem, suffix = (stem, suffix) if dot else (suffix, "")
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip("._")[:80] or "file"
    suffix = re.sub(r"[^A-Za-z0-9]", "", suffix)[:10]
    return f"{clean}.{suffix}" if suffix else clean

