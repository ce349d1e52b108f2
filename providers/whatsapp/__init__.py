"""WhatsApp: a business number on the Cloud API, by webhook on the gateway's HTTP server."""

from pluto.providers.whatsapp.provider import WhatsAppProvider
from pluto.providers.whatsapp.settings import WhatsAppSettings

__all__ = ["WhatsAppProvider", "WhatsAppSettings"]
