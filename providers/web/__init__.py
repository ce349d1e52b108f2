"""The web chat: an embeddable widget over a WebSocket (see :mod:`providers.web.provider`)."""

from pluto.providers.web.provider import WebProvider

__all__ = ["WebProvider"]
