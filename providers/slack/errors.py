"""Slack's errors as :class:`ProviderError`s, and credentials that never reach a log line.

The Web API answers ``{"ok": false, "error": "<code>"}``; slack_sdk raises
:class:`SlackApiError` with that response. A 429 carries ``Retry-After``: it becomes
``ProviderError(retry_after=…)`` so the outbox (the one place retries live) waits as long as
Slack asked, records the attempt, and survives a restart while waiting; the live preview pushes
its next edit back by the same amount. Codes that no retry can fix are permanent.
"""

from __future__ import annotations

from slack_sdk.errors import SlackApiError, SlackClientError

from pluto.gateway.logs import MaskSecrets
from pluto.errors import DeliveryRefused, ProviderError, ProviderUnusable, RateLimited
from pluto.providers.kit.errors import retry_after_header, transport_error

# error code → what it means for a person reading the log; all of these are permanent
PERMANENT: dict[str, str] = {
    "channel_not_found": "the channel was not found (or the bot cannot see it)",
    "not_in_channel": "the bot is not a member of the channel",
    "is_archived": "the channel is archived",
    "invalid_auth": "the bot token was rejected",
    "not_authed": "no bot token was sent",
    "account_inactive": "the bot token belongs to a deactivated app or user",
    "token_revoked": "the bot token was revoked",
    "token_expired": "the bot token expired",
    "missing_scope": "the app lacks a permission (scope) this needs",
    "not_allowed_token_type": "this token type cannot call that method",
    "restricted_action": "the workspace does not allow this action",
    "msg_too_long": "the message is too long",
    "no_text": "the message was empty",
    "invalid_blocks": "the message layout was rejected",
    "message_not_found": "the message to edit no longer exists",
    "cant_update_message": "the message cannot be edited by the bot",
    "edit_window_closed": "the message can no longer be edited",
    "file_not_found": "the file was not found",
    "channel_is_archived": "the channel is archived",
    "team_access_not_granted": "the app is not installed in that workspace",
    "ekm_access_denied": "the workspace's key management denied access",
}
# of those, the ones that no message can get past: the provider itself cannot work
CREDENTIALS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked",
                         "token_expired", "team_access_not_granted"})


def error_code(exc: SlackApiError) -> str:
    data = getattr(exc.response, "data", None)
    code = data.get("error") if isinstance(data, dict) else None
    return str(code or "unknown_error")


def retry_after(exc: SlackApiError) -> float | None:
    """Seconds Slack asked to wait (``Retry-After``), for a rate-limited call."""
    if getattr(exc.response, "status_code", 0) != 429 and error_code(exc) != "ratelimited":
        return None
    wait = retry_after_header(getattr(exc.response, "headers", None))
    return 1.0 if wait is None else wait  # Slack always sends one; if not, wait a little


def provider_error(exc: BaseException) -> ProviderError:
    """One plain sentence, and whether retrying can help."""
    if isinstance(exc, SlackApiError):
        code = error_code(exc)
        wait = retry_after(exc)
        if wait is not None:
            return RateLimited(f"Slack asked to slow down for {wait:g}s", retry_after=wait)
        if code in PERMANENT:
            cls = ProviderUnusable if code in CREDENTIALS else DeliveryRefused
            return cls(f"Slack refused: {PERMANENT[code]} ({code})")
        status = getattr(exc.response, "status_code", 200)
        return ProviderError(f"Slack answered with an error ({code}, HTTP {status})")
    if (transport := transport_error(exc, "Slack")) is not None:
        return transport
    if isinstance(exc, SlackClientError):
        return ProviderError(f"the Slack request failed ({_first_line(exc)})")
    return ProviderError(f"Slack error: {type(exc).__name__}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


_MASK = MaskSecrets(placeholder="<secret>")
_LIBRARIES = ("slack_sdk", "slack_bolt", "pluto.providers.slack")


def redact_secrets_in_logs(secrets: list[str]) -> None:
    """Mask ``secrets`` in the records of slack_sdk, slack_bolt and this provider.

    (A filter on a logger sees only records made at that logger, so it goes on each one.)
    ``pluto serve`` masks every configured secret at its handlers as well.
    """
    _MASK.add(*secrets)
    _MASK.attach(*_LIBRARIES)
