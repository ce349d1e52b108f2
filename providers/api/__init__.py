"""The HTTP API under ``/api/v1`` (Agent Protocol tasks and steps, live run events as SSE)."""

from pluto.providers.api.provider import ApiProvider

__all__ = ["ApiProvider"]
