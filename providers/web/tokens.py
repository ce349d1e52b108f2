"""Signed tokens: a visitor's session (kept in the browser's localStorage) and file links.

A session token is ``v1.<visitor>.<issued>.<signature>``: the visitor id is random, the
signature an HMAC-SHA256 of the rest with the gateway's key. The chat a visitor sees is derived
from the verified visitor id only, never from anything else the browser says.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pluto.errors import ConfigError
from pluto.gateway.ports import SharedFileReader

log = logging.getLogger(__name__)

KEY_FILE = "web-session.key"
MIN_SECRET_CHARS = 32
_TOKEN = re.compile(r"^v1\.([A-Za-z0-9_-]{22})\.(\d{1,12})\.([A-Za-z0-9_-]{43})$")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def load_key(data_dir: Path, env_name: str) -> bytes:
    """The signing key: from the environment variable ``env_name``, else a random key made
    once and kept in the data dir, readable by the owner only."""
    secret = os.environ.get(env_name)
    if secret:
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError([("pluto.yaml", None, "providers.web.session_secret_env",
                                f"${env_name} must hold at least {MIN_SECRET_CHARS} characters")])
        return secret.encode()
    path = data_dir / KEY_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("%s was readable by others (mode %o); made it owner-only", path, mode)
            path.chmod(0o600)
        key = path.read_text().strip()
        if len(key) >= MIN_SECRET_CHARS:
            return key.encode()
        log.warning("%s held no usable key; a new one was made (old sessions end)", path)
        path.write_text(secrets.token_hex(32))
        return path.read_text().strip().encode()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    log.info("web: made a session signing key in %s", path)
    return path.read_text().strip().encode()


@dataclass(frozen=True, slots=True)
class Verified:
    visitor: str | None  # None: the token was missing, forged or expired
    problem: Literal["missing", "invalid", "expired"] | None = None


class SessionSigner:
    def __init__(self, key: bytes, *, max_age: float, clock: Callable[[], float] = time.time):
        self._key = key
        self.max_age = max_age
        self._clock = clock

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    @staticmethod
    def new_visitor() -> str:
        return _b64(secrets.token_bytes(16))

    def issue(self, visitor: str | None = None) -> str:
        """A token for ``visitor`` (a new visitor when None), issued now."""
        visitor = visitor or self.new_visitor()
        body = f"v1.{visitor}.{int(self._clock())}"
        return f"{body}.{self._sign(body)}"

    def verify(self, token: object) -> Verified:
        if token is None or token == "":
            return Verified(None, "missing")
        m = _TOKEN.fullmatch(token) if isinstance(token, str) else None
        if m is None:
            return Verified(None, "invalid")
        body = m.group(0).rsplit(".", 1)[0]
        if not hmac.compare_digest(self._sign(body), m.group(3)):
            return Verified(None, "invalid")
        age = self._clock() - int(m.group(2))
        if age > self.max_age or age < -300:
            return Verified(None, "expired")
        return Verified(m.group(1))


class FileLinks:
    """Links to files under the data dir (charts a tool drew) that only this gateway makes:
    ``/web/file/<signature>/<relative path>``. With ``files`` shared among instances (one
    signing key, ``session_secret_env``), a link is made for a chart another instance drew,
    and any instance serves it (fetching the file when it does not have it)."""

    PREFIX = "/web/file/"

    def __init__(self, key: bytes, root: Path, files: SharedFileReader | None = None):
        self._key = hashlib.sha256(b"file-links:" + key).digest()
        self.root = root.resolve()
        self.files = files

    def _sign(self, rel: str) -> str:
        return _b64(hmac.new(self._key, rel.encode(), hashlib.sha256).digest())[:32]

    def link(self, path: str) -> str | None:
        """A link to ``path`` (absolute, or relative to the data dir), or None when it is not
        an existing file under the data dir."""
        target = self.resolve_under_root(Path(path))
        if target is not None:
            rel: str | None = target.relative_to(self.root).as_posix()
        elif self.files is not None and self.files.shared:
            rel = self.files.key(path)  # made elsewhere: found in the shared file store
        else:
            rel = None
        return None if rel is None else f"{self.PREFIX}{self._sign(rel)}/{rel}"

    def signed(self, signature: str, rel: str) -> bool:
        return hmac.compare_digest(self._sign(rel), signature)

    async def fetch(self, signature: str, rel: str) -> Path | None:
        """:meth:`open`, fetching the file from the shared file store when this instance does
        not have it (storage errors raise)."""
        found = self.open(signature, rel)
        if found is not None or self.files is None or not self.signed(signature, rel):
            return found
        return await self.files.local(rel)

    def open(self, signature: str, rel: str) -> Path | None:
        """The file a link names, when its signature is right and it is still there."""
        if not hmac.compare_digest(self._sign(rel), signature):
            return None
        return self.resolve_under_root(Path(rel))

    def resolve_under_root(self, path: Path) -> Path | None:
        try:
            target = (path if path.is_absolute() else self.root / path).resolve()
            ok = target.is_relative_to(self.root) and target.is_file()
        except (OSError, ValueError):
            return None
        return target if ok else None
