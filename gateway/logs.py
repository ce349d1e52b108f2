"""Logging set-up: secrets named in the configuration never reach a log line, a flood of one
kind of line is cut to a few lines and a count, and ``pluto.log`` is rotated by size."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
LOG_MAX_BYTES = 10 * 2**20  # pluto.log is rotated at this size ...
LOG_BACKUPS = 5  # ... keeping pluto.log.1 … pluto.log.5


EVERY_LINE = {"rate_limit": False}  # log.warning(..., extra=EVERY_LINE): never rate-limited
_rate: RateLimit | None = None  # the one in use: its counts are logged at exit
_flush_at_exit: list[object] = []


class RateLimit(logging.Filter):
    """At most ``burst`` lines of one kind per ``interval`` seconds; the rest are counted, and
    the count is logged (``… N more like this were not logged``) once the interval is over.

    A kind is the logger, the level and the message before its arguments are filled in (its
    first line, numbers and addresses masked, for a message logged ready-made — asyncio's
    tracebacks): a flood of one error costs a few lines, not 45 MB. Put one instance on every
    handler: a record is judged once and every handler follows that judgement. A line that
    must be written every time (one an admin acts on, each naming its own item) is logged with
    ``extra=EVERY_LINE``."""

    MAX_KINDS = 2000  # beyond this many kinds in one interval, all the others share one

    def __init__(self, burst: int = 5, interval: float = 10.0,
                 clock: Any = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        # kind -> [interval start, lines passed, lines suppressed, a sample record]
        self._kinds: dict[tuple[Any, ...], list[Any]] = {}
        self._passing_summary = threading.local()
        self._next_sweep = 0.0

    @staticmethod
    def kind(record: logging.LogRecord) -> tuple[Any, ...]:
        msg = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        if not record.args:  # logged ready-made: what varies is masked
            msg = _NUMBERS.sub("#", msg.partition("\n")[0][:200])
        return (record.name, record.levelno, msg)

    def filter(self, record: logging.LogRecord) -> bool:
        judged = getattr(record, "_pluto_rate", None)
        if judged is not None:
            return bool(judged)
        if getattr(self._passing_summary, "on", False) or \
                getattr(record, "rate_limit", True) is False:
            return True  # a summary, or a line that must never be cut (extra=EVERY_LINE)
        now = self.clock()
        due: list[tuple[list[Any], float]] = []
        with self._lock:
            key = self.kind(record)
            entry = self._kinds.get(key)
            if entry is None and len(self._kinds) >= self.MAX_KINDS:
                key = ("*", record.levelno, "")
                entry = self._kinds.get(key)
            if entry is not None and now - entry[0] >= self.interval:
                if entry[2]:
                    due.append((entry, now - entry[0]))
                entry = None
            if entry is None:
                entry = self._kinds[key] = [now, 0, 0, record]
            if entry[1] < self.burst:
                entry[1] += 1
                verdict = True
            else:
                entry[2] += 1
                verdict = False
            if now >= self._next_sweep:  # (at most once a second: it looks at every kind)
                self._next_sweep = now + 1.0
                due += self._sweep(now, key)
        record._pluto_rate = verdict
        for ended, span in due:
            self._summarize(ended, span)
        return verdict

    def _sweep(self, now: float, keep: tuple[Any, ...]) -> list[tuple[list[Any], float]]:
        """Intervals that ended: their counts to report, their kinds forgotten."""
        ended = [k for k, e in self._kinds.items()
                 if k != keep and now - e[0] >= self.interval]
        out = []
        for k in ended:
            entry = self._kinds.pop(k)
            if entry[2]:
                out.append((entry, now - entry[0]))
        return out

    def flush(self) -> None:
        """Report every count now (at exit)."""
        with self._lock:
            entries = [(e, self.clock() - e[0]) for e in self._kinds.values() if e[2]]
            self._kinds.clear()
        for entry, span in entries:
            self._summarize(entry, span)

    def _summarize(self, entry: list[Any], span: float) -> None:
        sample: logging.LogRecord = entry[3]
        text = sample.getMessage().partition("\n")[0][:200]
        summary = logging.LogRecord(
            sample.name, sample.levelno, sample.pathname, sample.lineno,
            "%d more like this were not logged in %.0f s: %s", (entry[2], span, text), None)
        self._passing_summary.on = True
        try:
            logging.getLogger(sample.name).handle(summary)
        finally:
            self._passing_summary.on = False


def setup_logging(level: str, *, secret_env_names: Iterable[str] = (),
                  log_file: Path | None = None, stderr_level: str | None = None,
                  fmt: str = "text", max_bytes: int = LOG_MAX_BYTES,
                  backups: int = LOG_BACKUPS, rate: RateLimit | None = None) -> None:
    """Log to stderr (at ``stderr_level``, default ``level``) and, if given, to a file rotated
    at ``max_bytes`` (``backups`` old files kept); as text lines or (``fmt="json"``) one JSON
    object a line; at most a few lines of one kind per interval (:class:`RateLimit`)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        if isinstance(h, logging.FileHandler):
            h.close()
    redact = RedactSecrets(list(secret_env_names) + _well_known_secret_names())
    global _rate
    rate = _rate = rate or RateLimit()
    if not _flush_at_exit:
        _flush_at_exit.append(atexit.register(lambda: _rate.flush() if _rate else None))
    handlers: list[logging.Handler] = []
    stream = logging.StreamHandler(sys.stderr)
    stream.setLevel(stderr_level or level)
    handlers.append(stream)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(
            log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        h.addFilter(rate)
        h.addFilter(redact)
        root.addHandler(h)
    root.setLevel(level)
    for noisy in ("LiteLLM", "litellm", "httpx", "httpcore", "aiosqlite", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _well_known_secret_names() -> list[str]:
    return [n for n in os.environ if n.endswith(("_API_KEY", "_TOKEN", "_SECRET"))]
