"""The runtime's exceptions: one root, and errors that carry what a person needs to know."""

from __future__ import annotations
from pluto.errors import PlutoError


class RuntimeFailure(PlutoError):
    """Root of the runtime's errors. ``str(e)`` is one plain sentence for a chat user."""


class ModelError(RuntimeFailure):
    def __init__(self, message: str, *, retryable: bool = False,
                 retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class BudgetExceeded(RuntimeFailure):
    def __init__(self, message: str, budget: str):
        super().__init__(message)
        self.budget = budget  # "seconds" | "tokens" | "tool_calls"
