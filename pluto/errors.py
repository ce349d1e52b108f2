"""Every error Pluto raises on purpose has one root, :class:`PlutoError`.

``str(error)`` is one plain sentence a person can act on. Errors that carry data carry it as
attributes of their own class (:attr:`RateLimited.retry_after`), never as flags read with
``getattr``. Each layer adds its own subclasses (``runtime.errors``, ``runtime.data``), all
rooted here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pluto.events import RunEnd


class PlutoError(Exception):
    """The root of Pluto's errors."""


# configuration ----------------------------------------------------------------------------------

Problem = tuple[str, int | None, str, str]  # (file, line, field, message)


def format_problem(file: str, line: int | None, field: str, message: str) -> str:
    where = f"{file}:{line}" if line else file
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


class ConfigError(PlutoError):
    """A configuration file is wrong. ``problems`` lists each as (file, line, field, message)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(format_problem(*p) for p in problems))


class StartupError(PlutoError):
    """The gateway could not start (a port in use, a provider that cannot be set up)."""


class StorageError(PlutoError):
    """The database could not be opened or written."""


class StorageUnavailable(StorageError):
    """Storage could not save a change for a while (the disk is full, the database cannot be
    written or reached) and the change was given up: trying again later may work. ``reason``
    is the short cause ("the disk is full"); no path, no driver text."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"Nothing can be saved right now: {reason}.")


class RunTakenOver(StorageError):
    """Several instances: another instance took this run over (it found this one's lease run
    out), so this one must not answer it too. :attr:`end`: the run's end this instance
    recorded as it found out (its watchers here are told it: they must not wait for ever)."""

    def __init__(self, message: str, end: RunEnd | None = None):
        super().__init__(message)
        self.end = end


class UnknownAgent(PlutoError, LookupError):
    """No agent has this name."""


# chat platforms ---------------------------------------------------------------------------------

class ProviderError(PlutoError):
    """A platform call failed in a way that trying again later may fix.

    ``unsent``: the platform certainly did not take the call — it answered no, or the request
    never left (no connection). False when that is not known (a timeout after the request was
    written, a connection dropped mid-answer): the call may have been made."""

    retry_after: float | None = None
    unsent: bool = False

    def __init__(self, *args: object, unsent: bool | None = None):
        super().__init__(*args)
        if unsent is not None:
            self.unsent = unsent


class RateLimited(ProviderError):
    """The platform asked us to wait ``retry_after`` seconds before the next call."""

    retry_after: float  # always known here (a ProviderError's may be None)
    unsent = True  # (the platform answered: not now)

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = max(0.0, float(retry_after))


class DeliveryRefused(ProviderError):
    """A permanent delivery failure: the platform will never take this message (the chat is
    gone, the bot was blocked, the message is malformed). Not retried."""

    unsent = True


class ProviderUnusable(ProviderError):
    """The provider itself cannot work (its token was rejected, an intent is missing):
    restarting it cannot help, so its supervisor stops it."""

    unsent = True
