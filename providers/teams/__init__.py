"""Microsoft Teams: an Azure Bot on the Bot Framework protocol, by its messaging endpoint on the
gateway's HTTP server."""

from pluto.providers.teams.provider import TeamsProvider
from pluto.providers.teams.settings import TeamsSettings

__all__ = ["TeamsProvider", "TeamsSettings"]
