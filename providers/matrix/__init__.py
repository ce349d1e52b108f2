"""Matrix: a bot account on any homeserver (mautrix's client API), by ``/sync``."""

from pluto.providers.matrix.provider import MatrixProvider
from pluto.providers.matrix.settings import MatrixSettings

__all__ = ["MatrixProvider", "MatrixSettings"]
