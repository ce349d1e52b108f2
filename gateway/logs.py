"""Logging set-up: secrets named in the configuration never reach a log line."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactSecrets(logging.Filter):
    """Replaces the values of the given environment variables with ``***`` in every record."""

    def __init__(self, env_names: Iterable[str]):
        super().__init__()
        self.secrets = sorted({v for n in env_names if len(v := os.environ.get(n, "")) >= 6},
                              key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        exc = record.exc_text or ""
        if any(s in text or s in exc for s in self.secrets):
            for s in self.secrets:
                text, exc = text.replace(s, "***"), exc.replace(s, "***")
            record.msg, record.args, record.exc_text = text, None, exc or None
        return True


def setup_logging(level: str, *, secret_env_names: Iterable[str] = (),
                  log_file: Path | None = None, stderr_level: str | None = None) -> None:
    """Log to stderr (at ``stderr_level``, default ``level``) and, if given, to a file."""
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
        h.setFormatter(logging.Formatter(FORMAT))
        h.addFilter(redact)
        root.addHandler(h)
    root.setLevel(level)
    for noisy in ("LiteLLM", "litellm", "httpx", "httpcore", "aiosqlite", "asyncio",
                  "discord.gateway", "discord.http", "slack_sdk", "slack_bolt"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _well_known_secret_names() -> list[str]:
    return [n for n in os.environ if n.endswith(("_API_KEY", "_TOKEN", "_SECRET"))]
