"""A failed model call as two sentences: one for the gateway's operators that names its cause
(litellm's reason, the endpoint that could not be reached, the variable that should hold the
key), and one for chat users that names nothing of the server.

The operators' sentence is ``str(error)``: it goes to the log (with litellm's full reason), the
terminal and the admin API. It never carries a secret: the key's value is masked, the URL loses
any user and password, and only the *name* of the key's variable is shown. A visitor of the web
widget or a chat gets ``error.public``: what happened, in plain words, and what to do.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from pluto.runtime.errors import ModelError

if TYPE_CHECKING:
    from pluto.runtime.model import ModelSettings

log = logging.getLogger("pluto.runtime.model")

MAX_REASON = 240
# litellm's wrappers: "litellm.BadRequestError: OpenAIException - <the service's words>"
_WRAPPER = re.compile(r"^(?:litellm\.)?\w+Error:\s*(?:\w+Error:\s*)?(?:\w+Exception\s*-\s*)?")

# what a chat user is told (the operators' sentence, with its cause, is in the log)
SETUP = ("This assistant cannot answer right now: its model service is not set up correctly. "
         "Please let the people who run it know.")
UNAVAILABLE = "The model service is not available right now; please try again in a moment."
SLOW = "The model service did not answer in time; please try again."
REFUSED = ("The model service refused this request; try rephrasing it, or send /new to start "
           "afresh.")


def classify_error(e: Exception, settings: ModelSettings | str) -> ModelError:
    """One plain sentence for people, and whether trying again may help; the full reason is
    logged (``pluto.log``, or stderr with ``-v``)."""
    model = settings if isinstance(settings, str) else settings.model
    key_env = None if isinstance(settings, str) else settings.api_key_env
    api_base = None if isinstance(settings, str) else settings.api_base
    secret = None if isinstance(settings, str) else settings.api_key()
    reason = service_reason(e, secret)
    error = _classify(e, model, key_env, api_base, reason)
    log.warning("model %s%s failed: %s (%s)", model, f" at {endpoint(api_base)}" if api_base
                else "", reason or type(e).__name__, type(e).__name__)
    return error


def _classify(e: Exception, model: str, key_env: str | None, api_base: str | None,
              reason: str) -> ModelError:
    status = getattr(e, "status_code", None)
    name = type(e).__name__
    text = str(e)
    where = f" at {endpoint(api_base)}" if api_base else ""
    if status in (401, 400, 500, None) and _missing_key(text):
        return ModelError(f"No API key is set for the model {model}: {_set_key(key_env)}",
                          public=SETUP)
    if "LLM Provider NOT provided" in text:
        return ModelError(f"The model name {model!r} does not say which service serves it: "
                          "write it as provider/model, e.g. openai/gpt-4o-mini or "
                          "anthropic/claude-sonnet-4-5.", public=SETUP)
    if "ContextWindow" in name:
        return ModelError("The conversation is too long for the model; send /new to start afresh.")
    if status == 429 or "RateLimit" in name:
        return ModelError("The model is rate limited right now; please try again in a moment.",
                          retryable=True, retry_after=retry_after(e))
    if "Timeout" in name or status == 408:
        return ModelError(f"The model service{where} did not answer in time.", retryable=True,
                          public=SLOW)
    if status in (401, 403) or "Authentication" in name or "PermissionDenied" in name:
        return ModelError(f"The model service{where} rejected the API key"
                          f"{f' in {key_env}' if key_env else ''}: {reason or 'no reason given'}."
                          f" {_fix_key(key_env)}", public=SETUP)
    if status == 404 or "NotFound" in name:
        return ModelError(f"The model {model!r} was not found{where}: "
                          f"{reason or 'no reason given'}. Check the model name in pluto.yaml.",
                          public=SETUP)
    if "APIConnectionError" in name or "Connection error" in text:
        target = endpoint(api_base) if api_base else f"the default endpoint of {model}"
        fix = " Check PLUTO_API_BASE (api_base in pluto.yaml) and that the server is up." \
            if api_base else ""
        return ModelError(f"Could not reach the model service at {target}.{fix}",
                          retryable=True, public=UNAVAILABLE)
    if status is not None and status >= 500 or "InternalServer" in name or "Unavailable" in name:
        return ModelError(f"The model service{where} had an error: "
                          f"{reason or 'no reason given'}.", retryable=True, public=UNAVAILABLE)
    if status == 400 or "BadRequest" in name:
        return ModelError(f"The model service{where} refused the request: "
                          f"{reason or 'no reason given'}.", public=REFUSED)
    return ModelError(f"The model call failed unexpectedly: {reason or name}.", retryable=True,
                      public=UNAVAILABLE)


def service_reason(e: Exception, secret: str | None = None) -> str:
    """What the service (or litellm) said, without litellm's wrappers, on one line, short,
    with the key masked should it be echoed."""
    text = str(getattr(e, "message", None) or e)
    text = _WRAPPER.sub("", text.strip()).split("\n")[0].strip().rstrip(".")
    text = re.sub(r"\s+", " ", text)
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    text = re.sub(r"\b(sk|xox[abp]|xapp)-[A-Za-z0-9_-]{6,}", r"\1-***", text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def endpoint(url: str | None) -> str:
    """A URL to show: scheme, host, port and path; never a user, password or query."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", "")) or url
    except ValueError:
        return "(an invalid URL)"


def retry_after(e: Exception) -> float | None:
    headers: Any = getattr(e, "litellm_response_headers", None) or getattr(
        getattr(e, "response", None), "headers", None) or {}
    try:
        value = headers.get("retry-after")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def _missing_key(text: str) -> bool:
    """litellm's words for a call made without a key (they differ by provider)."""
    text = text.lower()
    return ("missing credentials" in text or "api_key client option must be set" in text
            or "no key is set" in text or ("missing" in text and "api key" in text))


def _set_key(key_env: str | None) -> str:
    if key_env:
        return f"set the environment variable {key_env} (api_key_env in pluto.yaml)."
    return ("name the variable that holds it with api_key_env in pluto.yaml (e.g. "
            "PLUTO_API_KEY), or set the service's own variable (e.g. OPENAI_API_KEY).")


def _fix_key(key_env: str | None) -> str:
    return f"Check the value of {key_env}." if key_env else "Check api_key_env in pluto.yaml."
