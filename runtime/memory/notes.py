"""Long-term memory: Markdown files of notes, edited one line at a time, every change kept.

A memory file is plain Markdown under ``<data dir>/memory/<agent>/`` — ``agent.md`` for the
agent's own notes, ``users/<provider>/<user>.md`` or ``chats/<provider>/<chat>.md`` — that a
person can read and edit. Each note is one line starting with ``- ``; other lines (a title, a
paragraph written by hand) are kept as they are. Nothing rewrites a whole file: a write adds,
replaces or removes one note line, under a file lock, so two writes at once both land.

Every write is a revision, appended to ``<file>.revisions.jsonl`` beside it: when, by whom
(which run, or a person), why, the unified diff, and the whole new text (so a restore gives an
earlier revision back exactly). A file changed by hand since the last revision is recorded as
a ``hand-edit`` revision before the next write; a file that cannot be read as memory (not
UTF-8, binary, far too large) is reported and never written over.
"""

from __future__ import annotations

import asyncio
import difflib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal
from urllib.parse import quote

from pluto.errors import PlutoError

Scope = Literal["user", "chat", "agent"]
MAX_NOTE_CHARS = 500
MAX_FILE_BYTES = 256_000  # beyond this a file is not read as memory (reported instead)
HEADER = ("<!-- Kept by Pluto: one note per line, starting with \"- \". You may edit this file;"
          " every change is kept as a revision (pluto memory diff). -->")
_NOTE = re.compile(r"^- (.*?\S)\s*(?:<!-- by (\S+) -->)?\s*$")  # a note, and who wrote it


class MemoryRefused(PlutoError):
    """A write that was not made, with the reason (for the model, or for a person)."""


class MemoryUnreadable(MemoryRefused):
    """The file is there but is not readable memory: reported, never overwritten."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose notes: an agent's own, one user's (on one platform), or one chat's."""

    agent: str
    scope: Scope
    provider: str = ""
    id: str = ""

    def relpath(self) -> Path:
        if self.scope == "agent":
            return Path(_safe(self.agent), "agent.md")
        folder = "users" if self.scope == "user" else "chats"
        return Path(_safe(self.agent), folder, _safe(self.provider), _safe(self.id) + ".md")

    def label(self) -> str:
        if self.scope == "agent":
            return f"agent {self.agent}"
        return f"{self.scope} {self.provider}:{self.id} (agent {self.agent})"


def _safe(part: str) -> str:
    """One path component from any id: no separators, no dot names, no control characters."""
    return quote(part, safe="-_@+").replace(".", "%2E") or "_"


@dataclass(frozen=True, slots=True)
class Revision:
    rev: int
    at: float
    by: str  # "run <id>", "user", "admin", "hand-edit"
    op: str  # remember, replace, forget, restore, hand-edit
    why: str
    diff: str
    content: str
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"rev": self.rev, "at": self.at, "by": self.by, "op": self.op, "why": self.why,
                "diff": self.diff, "content": self.content, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Memory:
    """What a memory file holds now."""

    owner: Owner
    text: str  # the whole file ("" when there is none)
    notes: tuple[str, ...]
    problem: str | None = None  # the file is unreadable: why (text and notes are empty)
    writers: tuple[str, ...] = ()  # who wrote each note ("provider:user"; "" by hand, admin)

    @property
    def chars(self) -> int:
        return sum(len(n) for n in self.notes)


# guards --------------------------------------------------------------------------------------

_SECRETS = [
    (re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_-]{16,}"), "an API key"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "a GitHub token"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "a chat-platform token"),
    (re.compile(r"\b\d{6,12}:[A-Za-z0-9_-]{30,}"), "a bot token"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\."), "a signed token (JWT)"),
    (re.compile(r"(?i)\b(password|passwd|passphrase|secret|api[_ -]?key|token)\s*[:=]\s*\S{4,}"),
     "a password or key"),
    (re.compile(r"\b(?:\d[ -]?){13,19}\b"), "what looks like a card number"),
]
_INJECTION = [
    re.compile(r"(?i)\b(ignore|disregard|forget)\b.{0,30}\b(previous|prior|above|earlier|all)\b"
               r".{0,30}\b(instructions?|rules|prompts?|messages)\b"),
    re.compile(r"(?i)\b(system prompt|developer message|you are now|new instructions)\b"),
    re.compile(r"(?i)<\|?/?(system|im_start|im_end|endoftext)\|?>|\[/?INST\]|</?system>"),
]


def check_note(text: str, before: str = "") -> str:
    """The note as it will be kept (one line), or MemoryRefused with the reason. ``before``:
    the note it will follow (a secret split across two notes is caught joined)."""
    note = " ".join(str(text).split())
    if not note:
        raise MemoryRefused("a note cannot be empty")
    if len(note) > MAX_NOTE_CHARS:
        raise MemoryRefused(f"a note is at most {MAX_NOTE_CHARS} characters ({len(note)} given);"
                            f" keep only what matters")
    if "<!--" in note or "-->" in note:
        raise MemoryRefused("not saved: a note cannot hold HTML comments")
    problem = screen(note) or (screen(before + note) or screen(f"{before} {note}")
                               if before else None)
    if problem is not None:
        raise MemoryRefused(problem)
    return note


_ZERO_WIDTH = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\ufeff"))
_HOMOGLYPHS = str.maketrans(  # Cyrillic and Greek letters that look Latin
    "аеорсухіјѕкмтнвАЕОРСХІЈЅКМТНВУαεορκντιυχΑΕΟΡΚΝΤΙΥΧΒΜΗΖ",
    "aeopcyxijskmthbAEOPCXIJSKMTHBYaeopkvtiuxAEOPKNTIYXBMHZ")
_B64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX = re.compile(r"\b(?:[0-9a-fA-F]{2}[ :]?){8,}\b")


def _decoded(text: str) -> list[str]:
    """What base64 and hex runs in ``text`` decode to, when that is text."""
    import base64
    import binascii
    out = []
    for m in _B64.finditer(text):
        run = m.group(0)
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                out.append(decode(run + "=" * (-len(run) % 4)).decode("utf-8"))
                break
            except (binascii.Error, ValueError):
                continue
    for m in _HEX.finditer(text):
        try:
            out.append(bytes.fromhex(re.sub(r"[ :]", "", m.group(0))).decode("utf-8"))
        except ValueError:
            continue
    return [d for d in out if d.isprintable()]


def screen(text: str) -> str | None:
    """Why ``text`` must not be kept or shown as memory (a secret or an injection, also
    base64- or hex-encoded, spelled with look-alike letters or zero-width characters, or spaced
    out), or None when it may."""
    import unicodedata
    plain = unicodedata.normalize("NFKC", text).translate(_ZERO_WIDTH).translate(_HOMOGLYPHS)
    squashed = re.sub(r"[\s.·•|]+", "", plain)
    variants = [text, plain, *_decoded(plain), *_decoded(squashed)]
    for variant in variants:
        for pattern, what in _SECRETS:
            if pattern.search(variant):
                return (f"not saved: the note contains {what}, and secrets are never kept in "
                        f"memory")
        if any(p.search(variant) for p in _INJECTION):
            return ("not saved: the note reads like instructions to the assistant (a "
                    "prompt-injection marker); memory keeps facts, not orders")
    if any(p.search(squashed) for p, _ in _SECRETS[:7]):  # key-shaped, even when spaced out
        return "not saved: the note contains what looks like a key, and secrets are never kept"
    return None


# the file ------------------------------------------------------------------------------------

def parse(owner: Owner, raw: bytes) -> Memory:
    if len(raw) > MAX_FILE_BYTES:
        return Memory(owner, "", (), f"the file is {len(raw):,} bytes, over the "
                                     f"{MAX_FILE_BYTES:,}-byte limit of a memory file")
    if b"\x00" in raw:
        return Memory(owner, "", (), "the file holds binary data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Memory(owner, "", (), f"the file is not UTF-8 text (byte {e.start})")
    found = [m for line in text.splitlines() if (m := _NOTE.match(line))]
    return Memory(owner, text, tuple(m.group(1) for m in found),
                  writers=tuple(_unquote(m.group(2) or "") for m in found))


def _new_file(owner: Owner) -> str:
    return f"# Memory: {owner.label()}\n{HEADER}\n\n"


def _find(memory: Memory, match: str, writer: str | None = None) -> int:
    """The line number of the one note containing ``match`` (case-insensitive); with
    ``writer``, only that writer's notes count."""
    needle = " ".join(match.split()).casefold()
    if not needle:
        raise MemoryRefused("say which note: a few words it contains")
    lines = memory.text.splitlines()
    notes = {i: m.group(1) for i, line in enumerate(lines) if (m := _NOTE.match(line))
             and (writer is None or _unquote(m.group(2) or "") == writer)}
    if writer is not None and not notes:
        raise MemoryRefused("there is no note of yours (each person changes only the notes "
                            "they wrote)")
    hits = [i for i, note in notes.items() if needle in note.casefold()]
    exact = [i for i in hits if notes[i].casefold() == needle]
    if len(exact) == 1:
        return exact[0]
    if not hits:
        raise MemoryRefused(f"no note contains '{match}'" + (
            "; the notes are: " + " | ".join(memory.notes[:20]) if memory.notes
            else "; memory is empty"))
    if len(hits) > 1:
        shown = " | ".join(notes[i] for i in hits[:5])
        raise MemoryRefused(f"{len(hits)} notes contain '{match}': {shown}; quote more of the "
                            f"one you mean")
    return hits[0]


def _with_lines(text: str, lines: list[str]) -> str:
    return "\n".join(lines) + ("\n" if lines else "")


def _line(note: str, writer: str | None) -> str:
    """A note's line, with its writer when known (an HTML comment: hidden when rendered)."""
    return f"- {note} <!-- by {quote(writer, safe=':@+_-')} -->" if writer else f"- {note}"


def remember(memory: Memory, note: str, max_chars: int, writer: str | None = None) -> str:
    """The text with ``note`` added, written by ``writer`` (None: an admin, by hand)."""
    note = check_note(note, memory.notes[-1] if memory.notes else "")
    if note.casefold() in (n.casefold() for n in memory.notes):
        raise MemoryRefused("already remembered: " + note)
    if memory.chars + len(note) > max_chars:
        raise MemoryRefused(f"memory is full ({memory.chars:,} of {max_chars:,} characters): "
                            f"replace or forget a note first")
    text = memory.text or _new_file(memory.owner)
    if not text.endswith("\n"):
        text += "\n"
    return text + _line(note, writer) + "\n"


def replace(memory: Memory, old: str, new: str, max_chars: int,
            writer: str | None = None) -> str:
    """The text with one note changed (with ``writer``: one of theirs only)."""
    lines = memory.text.splitlines()
    i = _find(memory, old, writer)
    earlier = [m.group(1) for ln in lines[:i] if (m := _NOTE.match(ln))]
    note = check_note(new, earlier[-1] if earlier else "")
    before = _NOTE.match(lines[i]).group(1)  # type: ignore[union-attr]
    if memory.chars - len(before) + len(note) > max_chars:
        raise MemoryRefused(f"memory is full ({memory.chars:,} of {max_chars:,} characters): "
                            f"forget a note first")
    lines[i] = _line(note, writer or _unquote(_NOTE.match(lines[i]).group(2) or ""))  # type: ignore[union-attr]
    return _with_lines(memory.text, lines)


def forget(memory: Memory, match: str, writer: str | None = None) -> str:
    """The text without one note, or all (with ``writer``: of their own notes only)."""
    lines = memory.text.splitlines()
    if match.strip().casefold() in ("all", "everything", "*"):
        kept = [ln for ln in lines if not (m := _NOTE.match(ln)) or (
            writer is not None and _unquote(m.group(2) or "") != writer)]
        if writer is not None and len(kept) == len(lines) and memory.notes:
            raise MemoryRefused("there is no note of yours (each person changes only the "
                                "notes they wrote)")
        return _with_lines(memory.text, kept)
    del lines[_find(memory, match, writer)]
    return _with_lines(memory.text, lines)


# the store -----------------------------------------------------------------------------------

Edit = Callable[[Memory], str]


class NoteBook:
    """What both kinds of memory book do the same way."""

    async def read(self, owner: Owner) -> Memory:
        raise NotImplementedError

    async def edit(self, owner: Owner, edit: Edit, *, op: str, by: str, why: str) -> Memory:
        """Apply one edit (a function of the current memory → the new text) as one revision;
        MemoryRefused (nothing written) when the edit or the file does not allow it."""
        raise NotImplementedError

    async def revisions(self, owner: Owner) -> list[Revision]:
        raise NotImplementedError

    async def restore(self, owner: Owner, rev: int, *, by: str = "admin") -> Memory:
        revisions = await self.revisions(owner)
        wanted = next((r for r in revisions if r.rev == rev), None)
        if wanted is None:
            raise MemoryRefused(f"there is no revision {rev} of {owner.label()} "
                                f"(revisions: 1..{len(revisions)})")
        return await self.edit(owner, lambda m: wanted.content, op="restore", by=by,
                               why=f"restored revision {rev}")

    def where(self, owner: Owner) -> str:
        """Where the notes are kept, for people."""
        raise NotImplementedError


def _owner_of(parts: tuple[str, ...]) -> Owner | None:
    """The owner of a memory file from its path below the memory folder."""
    name = _unquote(parts[0])
    if len(parts) == 2 and parts[1] == "agent.md":
        return Owner(name, "agent")
    if len(parts) == 4 and parts[1] in ("users", "chats") and parts[3].endswith(".md"):
        return Owner(name, "user" if parts[1] == "users" else "chat", _unquote(parts[2]),
                     _unquote(parts[3][:-3]))
    return None


class MemoryBook(NoteBook):
    """The memory files under one folder (``<data dir>/memory``). Every method that touches a
    file runs it in a worker thread, under the file's lock."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, owner: Owner) -> Path:
        return self.root / owner.relpath()

    def where(self, owner: Owner) -> str:
        return str(self.path(owner))

    async def read(self, owner: Owner) -> Memory:
        return await asyncio.to_thread(self._read, owner)

    async def edit(self, owner: Owner, edit: Edit, *, op: str, by: str, why: str) -> Memory:
        return await asyncio.to_thread(self._edit, owner, edit, op, by, why)

    async def revisions(self, owner: Owner) -> list[Revision]:
        return await asyncio.to_thread(self._revisions, self.path(owner))

    async def owners(self, agent: str | None = None) -> list[Owner]:
        """Every memory file there is (for ``pluto memory``)."""
        def find() -> list[Owner]:
            found = []
            for path in sorted(self.root.glob("*/**/*.md")):
                owner = _owner_of(path.relative_to(self.root).parts)
                if owner is not None and (agent is None or owner.agent == agent):
                    found.append(owner)
            return found
        return await asyncio.to_thread(find)

    # in the worker thread -------------------------------------------------------------------

    def _read(self, owner: Owner) -> Memory:
        try:
            raw = self.path(owner).read_bytes()
        except FileNotFoundError:
            return Memory(owner, "", ())
        except OSError as e:
            return Memory(owner, "", (), f"the file cannot be read ({e.strerror})")
        return parse(owner, raw)

    def _edit(self, owner: Owner, edit: Edit, op: str, by: str, why: str) -> Memory:
        path = self.path(owner)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            memory = self._read(owner)
            if memory.problem:
                raise MemoryUnreadable(f"{owner.label()}: {memory.problem}; it is left as it is "
                                       f"— fix or restore it (pluto memory restore)")
            revisions = self._revisions(path)
            last = revisions[-1] if revisions else None
            if memory.text and (last is None or last.sha256 != _sha(memory.text)):
                last = self._append(path, last, memory.text, "hand-edit", "hand-edit",
                                    "the file was changed outside Pluto")
            text = edit(memory)
            if text == memory.text:
                return memory
            _write_atomic(path, text)
            self._append(path, last, text, by, op, why)
            return parse(owner, text.encode())

    @staticmethod
    def _revisions(path: Path) -> list[Revision]:
        log = path.with_suffix(".revisions.jsonl")
        out = []
        try:
            with log.open(encoding="utf-8") as f:
                for line in f:
                    try:
                        out.append(Revision(**json.loads(line)))
                    except (ValueError, TypeError):
                        continue  # a torn last line (a crash mid-append): skipped
        except FileNotFoundError:
            pass
        return out

    @staticmethod
    def _append(path: Path, last: Revision | None, text: str, by: str, op: str,
                why: str) -> Revision:
        rev = _revision(last.rev if last else 0, last.content if last else "", text, by, op,
                        why)
        with path.with_suffix(".revisions.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(rev.as_dict(), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return rev


class SharedMemoryBook(NoteBook):
    """The same memory, kept in the database that several gateway instances share
    (``store.notes``, PostgreSQL): the Markdown text of each owner and its revisions. A write
    is a compare-and-set on the revision number, retried when another write came first — so
    two writes at once both land. ``pluto memory show`` prints the Markdown."""

    RETRIES = 20

    def __init__(self, notes: Any):
        self.notes = notes  # storage.sql.memory.SqlNotes

    def where(self, owner: Owner) -> str:
        return f"database: {owner.relpath()}"

    async def _current(self, owner: Owner) -> tuple[Memory, int]:
        row = await self.notes.read(str(owner.relpath()))
        if row is None:
            return Memory(owner, "", ()), 0
        return parse(owner, row[0].encode()), row[1]

    async def read(self, owner: Owner) -> Memory:
        return (await self._current(owner))[0]

    async def edit(self, owner: Owner, edit: Edit, *, op: str, by: str, why: str) -> Memory:
        for _ in range(self.RETRIES):
            memory, rev = await self._current(owner)
            if memory.problem:
                raise MemoryUnreadable(f"{owner.label()}: {memory.problem}; it is left as it is")
            text = edit(memory)
            if text == memory.text:
                return memory
            revision = _revision(rev, memory.text, text, by, op, why)
            if await self.notes.write(str(owner.relpath()), rev, revision.as_dict()):
                return parse(owner, text.encode())
        raise MemoryRefused("memory is being changed by many writers at once; try again")

    async def revisions(self, owner: Owner) -> list[Revision]:
        return [Revision(**r) for r in await self.notes.revisions(str(owner.relpath()))]

    async def owners(self, agent: str | None = None) -> list[Owner]:
        found = []
        for key in await self.notes.owners():
            owner = _owner_of(tuple(Path(key).parts))
            if owner is not None and (agent is None or owner.agent == agent):
                found.append(owner)
        return found


def _revision(last_rev: int, before: str, text: str, by: str, op: str, why: str) -> Revision:
    diff = "".join(difflib.unified_diff(before.splitlines(True), text.splitlines(True),
                                        "before", "after"))
    return Revision(last_rev + 1, time.time(), by, op, why[:300], diff, text, _sha(text))


def _unquote(part: str) -> str:
    from urllib.parse import unquote
    return unquote(part)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file (across threads and processes), held while editing it."""
    with open(path.with_suffix(".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
