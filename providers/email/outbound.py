"""Sending a reply by SMTP (aiosmtplib): one mail, text and HTML, in its thread.

The text the gateway hands over is Markdown (the dialect the provider declares): it goes out
as the ``text/plain`` part as written, and rendered to simple HTML (markdown-it, raw HTML in
the text escaped) as the ``text/html`` alternative. Threading: ``In-Reply-To`` the mail it
answers, ``References`` its chain plus that mail, the subject with one ``Re:``. Replies are
marked ``Auto-Submitted: auto-replied`` (RFC 3834), so well-behaved responders on the other
side do not answer them either.

Errors: an SMTP 4xx (greylisting, "try again later", 421 closing) is a
:class:`RateLimited` with the wait the server names ("try again in 2 seconds"), else
``retry_seconds``; a 5xx is a :class:`DeliveryRefused`, recorded and not retried; a connection
that fails is a plain :class:`ProviderError` (retried with backoff).
"""

from __future__ import annotations

import re
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate
from functools import lru_cache

import aiosmtplib
from markdown_it import MarkdownIt

from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable, RateLimited
from pluto.providers.email.settings import EmailSettings
from pluto.providers.kit.files import read_outgoing
from pluto.providers.email.threads import MAX_REFERENCES, Origin
from pluto.types import Attachment

_WAIT = re.compile(r"(?:again|retry|wait)\D{0,20}?(\d{1,5})\s*(s|sec|second|m|min|minute)",
                   re.I)
HTML_PAGE = ('<!DOCTYPE html><html><body style="font-family: sans-serif; font-size: 14px; '
             'line-height: 1.45">\n{}</body></html>\n')


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table")


def to_html(markdown: str) -> str:
    return HTML_PAGE.format(_markdown().render(markdown))


def reply_subject(subject: str) -> str:
    base = re.sub(r"^(\s*(re|aw|sv|fwd?)\s*(\[\d+\])?\s*:\s*)+", "", subject, flags=re.I)
    return f"Re: {base.strip() or '(no subject)'}"


def compose(settings: EmailSettings, origin: Origin, message_id: str, text: str,
            files: list[tuple[Attachment, bytes]]) -> EmailMessage:
    """One reply: text/plain (Markdown) and text/html, then the files."""
    mail = EmailMessage()
    mail["From"] = Address(settings.display_name or "", addr_spec=settings.from_address)
    mail["To"] = origin.to
    mail["Subject"] = reply_subject(origin.subject)
    mail["Date"] = formatdate(localtime=False, usegmt=True)
    mail["Message-ID"] = f"<{message_id}>"
    mail["In-Reply-To"] = f"<{origin.message_id}>"
    chain = [*origin.references, origin.message_id]
    if len(chain) > MAX_REFERENCES:
        chain = chain[:1] + chain[-(MAX_REFERENCES - 1):]
    mail["References"] = " ".join(f"<{i}>" for i in chain)
    mail["Auto-Submitted"] = "auto-replied"
    if text:
        mail.set_content(text)
        mail.add_alternative(to_html(text), subtype="html")
    for attachment, data in files:
        maintype, _, subtype = attachment.mime_type.partition("/")
        if not subtype:
            maintype, subtype = "application", "octet-stream"
        mail.add_attachment(data, maintype=maintype, subtype=subtype,
                            filename=attachment.filename,
                            disposition="inline" if attachment.kind == "image" else "attachment")
    return mail


async def read_files(attachments: tuple[Attachment, ...],
                     limit: int) -> list[tuple[Attachment, bytes]]:
    """The files a reply carries (each at most ``limit`` bytes, else DeliveryRefused)."""
    return [(a, await read_outgoing(a, limit)) for a in attachments]


async def submit(settings: EmailSettings, password: str, mail: EmailMessage) -> None:
    """Hand ``mail`` to the SMTP server; errors as :class:`ProviderError`s."""
    try:
        await aiosmtplib.send(
            mail, hostname=settings.smtp_host, port=settings.smtp_port,
            username=(settings.smtp_username or settings.username) if settings.smtp_login
            else None, password=password if settings.smtp_login else None,
            use_tls=settings.smtp_security == "ssl",
            start_tls=True if settings.smtp_security == "starttls" else False,
            timeout=settings.timeout_seconds)
    except aiosmtplib.SMTPRecipientsRefused as e:
        first = e.recipients[0] if e.recipients else None
        raise smtp_error(first.code if first else 550, first.message if first else "",
                         settings) from None
    except aiosmtplib.SMTPAuthenticationError:
        raise ProviderUnusable("the SMTP server refused the login (check "
                               f"{settings.smtp_password_env or settings.password_env})") \
            from None
    except aiosmtplib.SMTPResponseException as e:
        raise smtp_error(e.code, e.message, settings) from None
    except (aiosmtplib.SMTPException, OSError) as e:
        raise ProviderError(f"could not reach the SMTP server ({type(e).__name__})") from None


def smtp_error(code: int, text: str, settings: EmailSettings) -> ProviderError:
    """A reply code as an error: 4xx try again later, 5xx never."""
    said = " ".join(str(text).split())[:200]
    if 400 <= code < 500:
        found = _WAIT.search(said)
        wait = settings.retry_seconds
        if found:
            wait = float(found.group(1)) * (60 if found.group(2).lower().startswith("m") else 1)
        return RateLimited(f"the mail server deferred the message ({code} {said})",
                           retry_after=wait)
    return DeliveryRefused(f"the mail server refused the message ({code} {said})")
