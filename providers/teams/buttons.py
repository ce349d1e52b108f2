"""Approval buttons on Teams: an Adaptive Card with ``Action.Execute`` buttons under the text,
and a click (an ``adaptiveCard/action`` invoke, Universal Actions) handed over as its command.

Why ``Action.Execute`` and not ``Action.Submit``: a Submit click arrives as a ``message``
activity the bot can only answer with a message the whole conversation sees — Teams has no
private (ephemeral) message from a bot in group chats and channels. An Execute click is an
``invoke`` whose HTTP answer (the "invoke response") is shown to the clicker alone: a refusal is
answered ``{"statusCode": 200, "type": "application/vnd.microsoft.activity.message", "value":
<sentence>}`` — Teams shows that sentence to that person only, nobody else sees anything. Teams
wants the answer within a few seconds (else the clicker sees "Something went wrong"), so the
check (``ProviderContext.approvals``) is bounded (:data:`CHECK_BUDGET`).

A message with buttons carries one more attachment: ``{"type": "AdaptiveCard", "version":
"1.4", "actions": [{"type": "Action.Execute", "title": "Approve", "verb": "pluto_approval",
"data": {"pluto": "/approve <id>"}, "style": "positive"}, …]}``. A click's invoke comes through
the same JWT check as any activity (``auth.py``); ``value.action.data.pluto`` is read back with
``kit.buttons.command_of`` (anything else: refused, nothing runs). An allowed click is handed
over as the clicker's command under the invoke's activity id (one decision however often it
is delivered); its answer is a card without buttons for the clicker, and the request message
is updated (``updateActivity``, best effort) so nobody sees the buttons any more.
"""

from __future__ import annotations

from typing import Any

from pluto.providers.kit.buttons import command_of, payload_of
from pluto.providers.kit.payload import dict_at
from pluto.types import Button

CARD = "application/vnd.microsoft.card.adaptive"
MESSAGE = "application/vnd.microsoft.activity.message"
INVOKE = "adaptiveCard/action"
VERB = "pluto_approval"
CHECK_BUDGET = 3.0  # seconds for the approval check: Teams wants the invoke answered in ~5
TOO_SLOW = "That took too long to check; please click again."
NOT_OURS = "This button is not one Pluto can act on."
STYLES = {"primary": "positive", "danger": "destructive"}
MAX_TITLE = 80


def buttons_card(buttons: tuple[Button, ...]) -> dict[str, Any]:
    """The attachment holding the buttons (Adaptive Card 1.4: Action.Execute)."""
    actions = []
    for button in buttons[:6]:  # Teams shows six actions on a card
        action: dict[str, Any] = {"type": "Action.Execute", "title": button.label[:MAX_TITLE]
                                  or "?", "verb": VERB, "data": {"pluto": payload_of(button)}}
        if button.style in STYLES:
            action["style"] = STYLES[button.style]
        actions.append(action)
    return {"contentType": CARD, "content": {
        "type": "AdaptiveCard", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.4", "body": [], "actions": actions}}


def is_buttons_card(attachment: Any) -> bool:
    content = dict_at(attachment, "content") if isinstance(attachment, dict) else {}
    actions = content.get("actions")
    return (isinstance(attachment, dict) and attachment.get("contentType") == CARD
            and isinstance(actions, list) and any(
                isinstance(a, dict) and a.get("verb") == VERB for a in actions))


def without_buttons(activity: dict[str, Any]) -> dict[str, Any]:
    """A sent message activity with the buttons' card taken off."""
    kept = [a for a in activity.get("attachments") or [] if not is_buttons_card(a)]
    out = {k: v for k, v in activity.items() if k != "attachments"}
    if kept:
        out["attachments"] = kept
    if not out.get("text") and not kept:
        out["text"] = " "
    return out


def click_of(raw: dict[str, Any]) -> tuple[str, str] | None:
    """(the command, the approval id) an ``adaptiveCard/action`` invoke carries, or None."""
    if raw.get("name") != INVOKE:
        return None
    action = dict_at(dict_at(raw, "value"), "action")
    if action.get("type") != "Action.Execute" or action.get("verb") != VERB:
        return None
    return command_of(dict_at(action, "data").get("pluto"))


def note(text: str) -> dict[str, Any]:
    """An invoke response Teams shows the clicker alone."""
    return {"statusCode": 200, "type": MESSAGE, "value": text}


def taken(command: str) -> dict[str, Any]:
    """The invoke response to an accepted click: the card, without buttons, for the clicker."""
    verb = "Approve" if command.startswith("/approve") else "Deny"
    return {"statusCode": 200, "type": CARD, "value": {
        "type": "AdaptiveCard", "version": "1.4",
        "body": [{"type": "TextBlock", "text": f"{verb}: sent.", "wrap": True}]}}
