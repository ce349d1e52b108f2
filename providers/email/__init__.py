"""Email: a mailbox read over IMAP (IDLE) and answered over SMTP, a thread per conversation."""

from pluto.providers.email.provider import EmailProvider
from pluto.providers.email.settings import EmailSettings

__all__ = ["EmailProvider", "EmailSettings"]
