"""The Graph API's errors as :class:`ProviderError`s.

The Cloud API answers a refused call with ``{"error": {"code": N, "message": …,
"error_data": {"details": …}}}``. The codes that matter to delivery:

- **131047** re-engagement: more than 24 hours since the person last wrote; only a template
  may be sent until they write again (permanent for this message: the provider logs it and tells
  the admin);
- **131056** pair rate limit: too many messages to the same person in a short time;
- **130429** throughput: the number's messages-per-second limit; **4**, **80007**, **131048**:
  the app's or account's rate limits. These become :class:`RateLimited` with the wait of the
  settings (the Graph API names none; a ``Retry-After`` header, where a proxy sends one, wins);
- **190** (an expired or wrong token), **10**/**200** (a missing permission): no message gets
  through, the provider cannot work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pluto.errors import (DeliveryRefused, PlutoError, ProviderError, ProviderUnusable,
                          RateLimited)
from pluto.providers.kit.errors import by_status, retry_after_header, transport_error
from pluto.gateway.logs import MaskSecrets

OUTSIDE_WINDOW = 131047
PAIR_RATE = 131056
THROUGHPUT = 130429
CREDENTIALS = {190: "the access token was rejected (expired or wrong)",
               10: "the app lacks a permission this needs",
               200: "the app lacks a permission this needs"}
RATE_LIMITS = {4: "the app's call rate", 80007: "the account's rate limit",
               131048: "the spam rate limit", PAIR_RATE: "the pair rate limit (one person)",
               THROUGHPUT: "the number's throughput"}
PERMANENT = {OUTSIDE_WINDOW: "more than 24 hours have passed since the person last wrote (only "
                             "a template message can reach them now)",
             131026: "the message cannot be delivered to this person",
             131021: "the recipient is the sender",
             131051: "this message type is not supported",
             131052: "the media could not be downloaded",
             131053: "the media could not be uploaded",
             131009: "a parameter value is not valid",
             131008: "a required parameter is missing",
             100: "a parameter is not valid",
             133010: "the phone number is not registered",
             # the window template (providers.whatsapp.window_template)
             132000: "the message template expects another number of variables (the window "
                     "template's body must have exactly one, {{1}})",
             132001: "the message template does not exist in that language (the window "
                     "template must be approved in WhatsApp Manager)",
             132018: "the message template's variable was refused"}


class GraphError(PlutoError):
    """One refused Graph API call, as the platform said it (turned into a ProviderError by
    :func:`provider_error` before it leaves the provider)."""

    def __init__(self, status: int, code: int, message: str, details: str = "",
                 retry_after: float | None = None):
        super().__init__(f"{message} (code {code}, HTTP {status})")
        self.status, self.code, self.message = status, code, message
        self.details = details
        self.retry_after = retry_after  # a Retry-After header, if one came


def graph_error(status: int, body: Any, headers: Any = None) -> GraphError:
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    data = found if isinstance(found := err.get("error_data"), dict) else {}
    try:
        code = int(err.get("code") or 0)
    except (TypeError, ValueError):
        code = 0
    return GraphError(status, code, str(err.get("message") or f"HTTP {status}")[:300],
                      str(data.get("details") or "")[:300], retry_after_header(headers))


@dataclass(frozen=True, slots=True)
class Waits:
    pair_rate: float
    throughput: float


def provider_error(exc: BaseException, waits: Waits) -> ProviderError:
    """One plain sentence, and whether retrying can help."""
    if isinstance(exc, GraphError):
        if exc.code in RATE_LIMITS or exc.status == 429:
            default = waits.pair_rate if exc.code in (PAIR_RATE, 131048) else waits.throughput
            wait = exc.retry_after if exc.retry_after is not None else default
            what = RATE_LIMITS.get(exc.code, "a rate limit")
            return RateLimited(f"WhatsApp asked to slow down ({what}, code {exc.code}); "
                               f"waiting {wait:g}s", retry_after=wait)
        if exc.code in CREDENTIALS or exc.status == 401:
            return ProviderUnusable(f"WhatsApp refused: {CREDENTIALS.get(exc.code, exc.message)} "
                                    f"(code {exc.code})")
        if exc.code in PERMANENT:
            return DeliveryRefused(f"WhatsApp refused: {PERMANENT[exc.code]} (code {exc.code})")
        return by_status(exc.status, refused=f"WhatsApp refused the message: {exc}",
                         failed=f"WhatsApp answered with an error: {exc}")
    return transport_error(exc, "WhatsApp") or ProviderError(
        f"WhatsApp error: {type(exc).__name__}")


_MASK = MaskSecrets(placeholder="<secret>")


def redact_secrets_in_logs(secrets: list[str]) -> None:
    """Mask ``secrets`` in this provider's log records (``pluto serve`` masks every configured
    secret at its handlers as well)."""
    _MASK.add(*secrets)
    _MASK.attach("pluto.providers.whatsapp", "aiohttp.client")
