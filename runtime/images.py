"""Pictures users send, for vision models (issue 32): checked, resized and re-encoded with
Pillow, kept as an artifact of the run, carried in the history as one line of text, and turned
into image content parts when a prompt is built.

Three steps, each in its own place:

- :func:`keep_images` (the gateway, before a run): each image a message came with is opened
  in a worker thread (a few at a time: :data:`PARALLEL`), refused in one sentence when it is
  not an image, damaged or too large, else EXIF-rotated, shrunk to the model's longest side
  and byte size, re-encoded without its metadata and kept as
  ``artifacts/<run>/image-<id>.jpg``. The message gets a :func:`note` line per image; no
  image bytes ever go into the database.
- :func:`with_images` (the runner, building the prompt): every note line of a user message
  becomes, for a model with ``vision``, an ``image_url`` part pointing at the kept file
  (``pluto-image:<path>``, the newest ``images_in_context`` of the conversation), else a
  one-line description. A file that is gone becomes a text placeholder.
- :func:`resolved` (the model clients, just before sending): the ``pluto-image:`` parts
  become ``data:`` URLs, read off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluto.errors import PlutoError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    from pluto.runtime.model import ModelSettings
    from pluto.types import Attachment

log = logging.getLogger(__name__)

FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")  # what Pillow may open (no others)
KINDS = "PNG, JPEG, GIF, WebP, BMP or TIFF"
SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".png", ".gif", ".webp", ".bmp", ".tif",
                      ".tiff", ".heic", ".heif", ".avif", ".svg"})
MAX_PIXELS = 50_000_000  # width × height, read from the header before any pixel is decoded
MAX_INPUT_BYTES = 64 * 2**20  # a file sent (providers cap it lower)
PARALLEL = 2  # images decoded at once (per process)
TIMEOUT = 30.0  # seconds one image may wait for and take in a worker thread
SCHEME = "pluto-image:"
NOTE = re.compile(r"^\[The user sent the image (.+) \((\d{1,6})x(\d{1,6})\); kept as "
                  r"(artifacts/[A-Za-z0-9_-]{1,64}/image-[0-9a-f]{8}\.(?:jpg|png))\]$")
NOTE_START = "[The user sent the image "
CANNOT_SEE = ("This model cannot see images, so it gets only a short description of each "
              "(its name and size).")

_slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


class ImageRefused(PlutoError):
    """An image that is not kept; the message is one sentence for the user."""


@dataclass(frozen=True, slots=True)
class KeptImage:
    filename: str  # as the user named it
    key: str  # artifacts/<run>/image-<id>.jpg (relative to the data dir)
    width: int  # as sent
    height: int
    size: tuple[int, int]  # as kept
    nbytes: int

    def note(self) -> str:
        return note(self.filename, self.width, self.height, self.key)


def note(filename: str, width: int, height: int, key: str) -> str:
    """The line a message carries for an image kept with it."""
    return f"{NOTE_START}{_name(filename)} ({width}x{height}); kept as {key}]"


def describe(filename: str, width: int | str, height: int | str, extra: str = "") -> str:
    """The line a model without vision (or a file no longer kept) gets instead."""
    return f"[the user sent an image: {filename}, {width}x{height}{extra}]"


def neutralized(text: str) -> str:
    """A user's own text, with any line that would read as a note made harmless."""
    if NOTE_START not in text:
        return text
    return "\n".join("(" + line[1:] if NOTE.match(line) else line for line in text.split("\n"))


def is_image(attachment: Attachment) -> bool:
    """Whether a file sent with a message is meant as a picture (its content decides later)."""
    return (attachment.kind == "image" or attachment.mime_type.lower().startswith("image/")
            or Path(attachment.filename).suffix.lower() in SUFFIXES)


@dataclass(frozen=True, slots=True)
class Limits:
    max_side: int = 1568
    max_bytes: int = 4 * 2**20
    per_message: int = 4

    @classmethod
    def of(cls, settings: ModelSettings) -> Limits:
        return cls(settings.image_max_side, int(settings.image_max_mb * 2**20),
                   settings.images_per_message)


# keeping (the gateway) -------------------------------------------------------------------------

Locate = Callable[["Attachment"], Awaitable[Path | None]]


async def keep_images(attachments: Sequence[Attachment], run_id: str, data_dir: Path,
                      limits: Limits, locate: Locate) -> tuple[list[KeptImage], list[str]]:
    """The images kept, and a sentence for each one refused (and for those over the count)."""
    kept: list[KeptImage] = []
    problems: list[str] = []
    folder = re.sub(r"[^A-Za-z0-9_-]", "_", run_id)[:64] or "run"
    for attachment in attachments[:limits.per_message]:
        key = f"artifacts/{folder}/image-{uuid.uuid4().hex[:8]}"
        try:
            source = await locate(attachment)
            if source is None:
                raise ImageRefused(f"I did not receive {attachment.filename}; please send it "
                                   "again.")
            kept.append(await _in_thread(prepare, source, data_dir, key, attachment.filename,
                                         limits))
        except ImageRefused as e:
            problems.append(str(e))
        except TimeoutError:
            problems.append(f"{attachment.filename} took too long to read, so I skipped it.")
        except Exception:
            log.exception("keeping the image %s failed", attachment.filename)
            problems.append(f"Could not look at {attachment.filename}: something went wrong on "
                            "our side; the error has been logged.")
    if (over := len(attachments) - limits.per_message) > 0:
        problems.append(f"I look at up to {limits.per_message} images per message, so I "
                        f"skipped the last {over}.")
    return kept, problems


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread, at most :data:`PARALLEL` at once, within
    :data:`TIMEOUT` (the thread runs on when it is over; the caller no longer waits)."""
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = asyncio.Semaphore(PARALLEL)
        for old in [other for other in _slots if other.is_closed()]:
            del _slots[old]
    async with asyncio.timeout(TIMEOUT):
        async with slots:
            return await asyncio.to_thread(fn, *args)


def prepare(source: Path, data_dir: Path, key: str, filename: str,
            limits: Limits) -> KeptImage:
    """In a worker thread: the image at ``source``, checked, rotated, shrunk, re-encoded
    without metadata and written to ``data_dir/key`` + ``.jpg`` or ``.png``."""
    from PIL import Image, UnidentifiedImageError

    if source.stat().st_size > MAX_INPUT_BYTES:
        raise ImageRefused(f"{filename} is too large ({source.stat().st_size / 2**20:.3g} MB; "
                           f"at most {MAX_INPUT_BYTES // 2**20} MB).")
    try:
        with Image.open(source, formats=FORMATS) as im:  # reads the header only
            width, height = im.size
            if width * height > MAX_PIXELS or width < 1 or height < 1:
                raise ImageRefused(f"{filename} is too large an image ({width}×{height} "
                                   f"pixels; at most {MAX_PIXELS // 1_000_000} megapixels).")
            im.draft("RGB", (limits.max_side, limits.max_side))  # JPEG: decode smaller
            im.load()
            upright = _upright(im)
            if im.size != (width, height):  # decoded smaller: the size as sent, turned
                width, height = (height, width) if _turned(upright, im) else (width, height)
            else:
                width, height = upright.size
            data, suffix, size = _encoded(upright, limits, filename)
    except ImageRefused:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # (Pillow's own cap)
        raise ImageRefused(f"{filename} is too large an image (more than "
                           f"{MAX_PIXELS // 1_000_000} megapixels).") from None
    except (UnidentifiedImageError, SyntaxError, ValueError):
        raise ImageRefused(f"{filename} is not an image I can read ({KINDS}).") from None
    except OSError as e:  # truncated, or a broken stream
        log.info("image %s unreadable: %s", filename, e)
        raise ImageRefused(f"{filename} seems to be damaged (its image data is incomplete), "
                           "so I could not look at it.") from None
    target = data_dir / (key + suffix)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return KeptImage(filename, key + suffix, width, height, size, len(data))


def _upright(im: PILImage) -> PILImage:
    """The first frame, turned as its EXIF orientation says, in RGB (RGBA if it has alpha)."""
    from PIL import ImageOps

    turned = ImageOps.exif_transpose(im) or im
    alpha = turned.mode in ("RGBA", "LA", "PA") or (
        turned.mode == "P" and "transparency" in turned.info)
    return turned.convert("RGBA" if alpha else "RGB")


def _turned(upright: PILImage, im: PILImage) -> bool:
    return upright.size != im.size


def _encoded(im: PILImage, limits: Limits, filename: str) -> tuple[bytes, str, tuple[int, int]]:
    """PNG (with alpha) or JPEG bytes within ``limits``: smaller quality, then smaller size."""
    from PIL import Image

    im.thumbnail((limits.max_side, limits.max_side), Image.Resampling.LANCZOS)
    if im.mode == "RGBA":
        data = _save(im, "PNG")
        if len(data) <= limits.max_bytes:
            return data, ".png", im.size
        flat = Image.new("RGB", im.size, (255, 255, 255))
        flat.paste(im, mask=im.getchannel("A"))
        im = flat
    while True:
        for quality in (85, 70, 55, 40):
            data = _save(im, "JPEG", quality=quality, optimize=True)
            if len(data) <= limits.max_bytes:
                return data, ".jpg", im.size
        if max(im.size) <= 64:
            raise ImageRefused(f"{filename} cannot be made small enough to look at.")
        im = im.resize((max(1, im.width * 7 // 10), max(1, im.height * 7 // 10)),
                       Image.Resampling.LANCZOS)


def _save(im: PILImage, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **options)  # a new file: no EXIF, no ICC profile, no text chunks
    return out.getvalue()


def _name(filename: str) -> str:
    return " ".join(filename.replace("]", ")").split())[:100] or "image"


# the prompt (the runner) -----------------------------------------------------------------------

async def with_images(messages: list[dict[str, Any]], settings: ModelSettings, data_dir: Path,
                      data: Any = None) -> list[dict[str, Any]]:
    """``messages`` with the notes of user messages made image parts (a model with
    ``vision``: the newest ``images_in_context``) or descriptions. ``data``: the data service,
    whose shared files bring a kept image from another instance. Never raises."""
    if not any(m.get("role") == "user" and isinstance(m.get("content"), str)
               and NOTE_START in m["content"] for m in messages):
        return messages
    left = settings.images_in_context if settings.vision else 0
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        message = out[i]
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, str) \
                or NOTE_START not in content:
            continue
        text: list[str] = []
        parts: list[dict[str, Any]] = []
        for line in reversed(content.split("\n")):  # (the newest images first)
            if (m := NOTE.match(line)) is None:
                text.append(line)
                continue
            name, width, height, key = m.groups()
            path = await _located(data_dir, key, data) if left > 0 else None
            gone = left > 0 and path is None
            text.append(describe(name, width, height, "; it is no longer kept" if gone else ""))
            if path is not None:
                left -= 1
                parts.insert(0, {"type": "image_url", "image_url": {"url": SCHEME + str(path)}})
        joined = "\n".join(reversed(text))
        out[i] = dict(message, content=[{"type": "text", "text": joined}, *parts]
                      if parts else joined)
    return out


async def _located(data_dir: Path, key: str, data: Any) -> Path | None:
    path = data_dir / key
    if path.is_file():
        return path
    files = getattr(data, "files", None)
    if files is None:
        return None
    try:
        return await files.local(key)  # type: ignore[no-any-return]
    except Exception as e:  # the shared store cannot be read now: described instead
        log.warning("image %s could not be fetched: %s", key, e)
        return None


# sending (the model clients) -------------------------------------------------------------------

async def resolved(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each ``pluto-image:`` part made a ``data:`` URL (a file gone
    meanwhile: a text part saying so); the same list when there is none."""
    for m in messages:  # (a plain loop: this runs over the whole history at every call)
        content = m.get("content")
        if isinstance(content, list) and any(_ref(p) for p in content):
            break
    else:
        return messages
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(_ref(p) for p in content):
            message = dict(message, content=[await _resolved_part(p) for p in content])
        out.append(message)
    return out


def _ref(part: Any) -> str | None:
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = (part.get("image_url") or {}).get("url")
        if isinstance(url, str) and url.startswith(SCHEME):
            return url[len(SCHEME):]
    return None


async def _resolved_part(part: dict[str, Any]) -> dict[str, Any]:
    path = _ref(part)
    if path is None:
        return part
    try:
        url = await _in_thread(data_url, Path(path))
    except (OSError, TimeoutError) as e:
        log.warning("a kept image could not be read: %s", e)
        return {"type": "text", "text": "[an image the user sent is no longer kept]"}
    return {"type": "image_url", "image_url": {"url": url}}


def data_url(path: Path) -> str:
    """A kept image as a ``data:`` URL (in a worker thread)."""
    if path.stat().st_size > MAX_INPUT_BYTES:
        raise OSError(f"{path.name} is larger than a kept image can be")
    mime = "image/png" if path.suffix == ".png" else "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


@dataclass(frozen=True, slots=True)
class SeenImage:
    """An image part a model received, decoded (for fakes and tests)."""

    mime: str
    width: int
    height: int
    nbytes: int
    format: str


def seen(part: Any) -> SeenImage | None:
    """The image of an ``image_url`` part with a ``data:`` URL, decoded; None when the part
    is not one; :class:`ValueError` when its data is not a valid image."""
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    url = str((part.get("image_url") or {}).get("url") or "")
    m = re.match(r"^data:(image/[a-z+.-]+);base64,(.*)$", url, re.S)
    if m is None:
        raise ValueError("not a base64 data URL of an image")
    from PIL import Image

    raw = base64.b64decode(m.group(2), validate=True)
    with Image.open(io.BytesIO(raw), formats=("JPEG", "PNG", "GIF", "WEBP")) as im:
        im.load()
        return SeenImage(m.group(1), im.width, im.height, len(raw), str(im.format))


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or the text parts of a list)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text") or "") for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)
