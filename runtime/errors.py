"""The runtime's exceptions: one root, and errors that carry what a person needs to know."""

from __future__ import annotations
from pluto.errors import PlutoError


class RuntimeFailure(PlutoError):
    """Root of the runtime's errors. ``str(e)`` is one plain sentence for a chat user."""


class ModelError(RuntimeFailure):
    """A failed model call. ``str(e)`` says exactly what failed, for the gateway's operators
    (the log, the terminal, the admin API): it may name the endpoint or the key's variable.
    ``public`` is the sentence for a chat user, which names nothing of the server."""

    def __init__(self, message: str, *, retryable: bool = False,
                 retry_after: float | None = None, public: str | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.public = public or message


class BudgetExceeded(RuntimeFailure):
    def __init__(self, message: str, budget: str):
        super().__init__(message)
        self.budget = budget  # "seconds" | "tokens" | "tool_calls"
