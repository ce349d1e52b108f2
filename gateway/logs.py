"""Logging set-up: secrets named in the configuration never reach a log line."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from pluto.runtime.tracing import current_trace
from pluto.redaction import redact_urls

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """:data:`FORMAT`; a line logged while a run is answered ends with ``trace=<its trace id>``."""

    def __init__(self) -> None:
        super().__init__(FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace = current_trace.get()
        return f"{line} trace={trace}" if trace else line


class JsonFormatter(logging.Formatter):
    """One JSON object a line (``log_format: json``): ts, level, logger, message, trace_id,
    exception."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if trace := current_trace.get():
            out["trace_id"] = trace
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def mask_record(record: logging.LogRecord, secrets: Iterable[str], placeholder: str) -> None:
    """Replace each secret in a record's message and traceback (longest first)."""
    text = record.getMessage()
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    exc = record.exc_text or ""
    found = [s for s in secrets if s in text or s in exc]
    for secret in sorted(found, key=len, reverse=True):
        text, exc = text.replace(secret, placeholder), exc.replace(secret, placeholder)
    text, exc = redact_urls(text), redact_urls(exc)  # a URL's password, ?password=…
    if found or text != record.getMessage() or exc != (record.exc_text or ""):
        record.msg, record.args, record.exc_text = text, None, exc or None


class MaskSecrets(logging.Filter):
    """A filter that masks known secret values (too short ones, under 6 characters, are not
    treated as secrets: they would mask ordinary words)."""

    def __init__(self, secrets: Iterable[str] = (), placeholder: str = "***"):
        super().__init__()
        self.placeholder = placeholder
        self.secrets: set[str] = set()
        self.add(*secrets)

    def add(self, *secrets: str) -> None:
        self.secrets.update(s for s in secrets if s and len(s) >= 6)

    def filter(self, record: logging.LogRecord) -> bool:
        mask_record(record, self.secrets, self.placeholder)
        return True

    def attach(self, *prefixes: str) -> None:
        """Put the filter on every logger under these names (a filter on a logger sees only
        the records made at that very logger, so it goes on each one)."""
        names = [n for n in logging.root.manager.loggerDict
                 if n in prefixes or n.startswith(tuple(f"{p}." for p in prefixes))]
        for name in {*names, *prefixes}:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)


class RedactSecrets(MaskSecrets):
    """Masks the values of the given environment variables with ``***`` in every record."""

    def __init__(self, env_names: Iterable[str]):
        super().__init__(os.environ.get(n, "") for n in env_names)


def setup_logging(level: str, *, secret_env_names: Iterable[str] = (),
                  log_file: Path | None = None, stderr_level: str | None = None,
                  fmt: str = "text") -> None:
    """Log to stderr (at ``stderr_level``, default ``level``) and, if given, to a file; as
    text lines or (``fmt="json"``) one JSON object a line."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    redact = RedactSecrets(list(secret_env_names) + _well_known_secret_names())
    handlers: list[logging.Handler] = []
    stream = logging.StreamHandler(sys.stderr)
    stream.setLevel(stderr_level or level)
    handlers.append(stream)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        h.addFilter(redact)
        root.addHandler(h)
    root.setLevel(level)
    for noisy in ("LiteLLM", "litellm", "httpx", "httpcore", "aiosqlite", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _well_known_secret_names() -> list[str]:
    return [n for n in os.environ if n.endswith(("_API_KEY", "_TOKEN", "_SECRET"))]
