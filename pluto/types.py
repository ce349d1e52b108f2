"""The core types that cross layer boundaries. Small, frozen, typed; no project imports but events.

A provider turns a platform event into an :class:`IncomingMessage`; the routing table turns that
into a :class:`Route`; the runtime yields :class:`RunEvent`s; the gateway asks a provider to send
:class:`OutgoingMessage`s. Capabilities are data a provider declares, never branches on its name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pluto.events import (  # re-exported: the one place to import core types from
    ApprovalDecision,
    ApprovalRequest,
    MessageDelta,
    MessageFinal,
    RunEnd,
    RunError,
    RunEvent,
    RunStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
)

__all__ = [
    "Attachment", "Capabilities", "Dialect", "IncomingMessage", "OutgoingMessage", "Route",
    "PLAIN", "MARKDOWN", "Outcome", "Accepted", "Answered", "Refused", "Duplicate", "Dropped",
    "RunEvent", "RunStart", "MessageDelta", "ToolStart", "ToolProgress", "ToolEnd",
    "MessageFinal", "RunEnd", "RunError", "ApprovalRequest", "ApprovalDecision", "Button",
]



@dataclass(frozen=True, slots=True)
class Dialect:
    """A markup dialect a chat platform reads.

    ``name`` goes with every outgoing message (``OutgoingMessage.markup``): the provider reads
    it to choose how to send the text. ``emitter`` writes the dialect: a subclass of
    :class:`pluto.gateway.delivery.render.emit.Emitter` that the provider brings along (its own
    package, e.g. ``providers/telegram/markup.py``); None for the renderer's own ``plain`` and
    ``markdown``.
    """

    name: str
    emitter: type | None = None


PLAIN = Dialect("plain")
MARKDOWN = Dialect("markdown")


@dataclass(frozen=True, slots=True, kw_only=True)
class Attachment:
    """A file that came with a message or goes out with a reply.

    Inbound, a provider downloads the file into the data dir and sets ``path``; outbound, the
    runtime sets ``path`` to an artifact (a chart PNG, a CSV).
    """

    filename: str
    mime_type: str = "application/octet-stream"
    size: int = 0
    path: Path | None = None
    url: str | None = None  # where the platform serves it, if the provider fetches lazily
    kind: Literal["file", "image"] = "file"


@dataclass(frozen=True, slots=True, kw_only=True)
class IncomingMessage:
    provider: str
    chat_id: str
    user_id: str
    text: str
    message_id: str | None = None  # the platform's own id, the dedupe key
    user_name: str | None = None
    attachments: tuple[Attachment, ...] = ()
    thread_id: str | None = None
    reply_to_id: str | None = None
    is_direct: bool = True
    mentions_bot: bool = False
    guild_id: str | None = None  # Discord guild / Slack team, for routing rules
    timestamp: float = field(default_factory=time.time)
    # A message answered again after its run was cut off (a crash, an instance that died): the
    # platform id of the preview that run had shown, which the new answer replaces
    shown: str | None = None
    # A message the gateway made itself for a schedule's firing (the firing's id): it enters
    # its chat's inbox like any message, so the chat's holder answers it in its turn — never
    # beside a person's message in that chat. No provider sets it.
    firing: int | None = None
    # A message the gateway made itself to resume a run after its approval was decided without
    # a person's message (the id of the approval: it expired). No provider sets it.
    approval: str | None = None


SessionScope = Literal["chat", "user", "thread", "shared"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Where a message goes: which agent, which session, which tools, and why."""

    agent: str
    session_key: str
    tools: tuple[str, ...] | None = None  # None: the agent's own list; else narrowed to these
    rule: str = "default"  # a human-readable name of the rule that matched
    # whether a user's long-term notes may enter this group chat; None: the agent decides
    memory_in_groups: bool | None = None
    # who may approve a tool call the agent asks a person about (docs/approvals.md): user ids
    # ("123" or "telegram:123"), and "asker" for whoever wrote the message being answered
    approvers: tuple[str, ...] = ("asker",)


@dataclass(frozen=True, slots=True)
class Button:
    """A button under a message (an approval's Approve / Deny). Clicking it is the same as
    writing ``command`` in the chat (``/approve a1b2c3``), as the clicker; a platform without
    buttons shows the commands in the text instead."""

    label: str
    command: str
    style: Literal["primary", "danger", "default"] = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutgoingMessage:
    """What the gateway asks a provider to send (or, with ``edit_of``, to edit)."""

    chat_id: str
    text: str = ""
    kind: Literal["reply", "delta", "notice", "error"] = "reply"
    thread_id: str | None = None
    reply_to: str | None = None  # the platform message to quote (group chats), if any
    answers: str | None = None  # the platform id of the message this answers (always set)
    run_id: str | None = None
    seq: int = 0  # with ``run_id``: the run event this shows (its message.final or run.error)
    attachments: tuple[Attachment, ...] = ()
    edit_of: str | None = None  # the platform message id to replace, when the platform can edit
    markup: str = "plain"  # the name of the dialect ``text`` is already rendered in
    buttons: tuple[Button, ...] = ()  # shown under the text (``Capabilities.has_buttons``)


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a chat platform can do, declared by its provider as data."""

    max_message_length: int = 4000
    markup: Dialect = PLAIN  # the dialect the platform reads (see Dialect)
    # the provider shows a run's progress itself, from the run feed (terminal, web, API); the
    # others get a live preview by edits (``can_edit``) or nothing until the final reply
    streams_deltas: bool = False
    # a run's reply (its final text or error) is shown from the run feed too, its run events
    # being the durable record (the web widget, the API): delivery records no outbox row for it
    answers_from_feed: bool = False
    can_edit: bool = False  # the provider can edit a sent message (streaming by edits)
    # the person at this surface runs the gateway (the terminal): errors are shown in full
    # (``RunError.detail``), where a chat user gets one plain sentence
    operator: bool = False
    can_send_images: bool = False
    can_send_files: bool = False
    has_typing: bool = False
    # the provider shows ``OutgoingMessage.buttons`` and turns a click into a message with the
    # button's command from the clicker (else the commands are written in the text)
    has_buttons: bool = False


# what intake says became of a message ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Accepted:
    """The message will be answered by run ``run_id`` (its events: the run feed). ``queued``:
    it waits behind earlier messages of its session."""

    run_id: str
    queued: bool = False
    type: Literal["accepted"] = "accepted"


@dataclass(frozen=True, slots=True)
class Answered:
    """The gateway answered at once, without a run (a command such as /help, /stop, /sql);
    ``text`` is the answer, which also goes to the chat through delivery."""

    text: str
    failed: bool = False
    type: Literal["answered"] = "answered"


@dataclass(frozen=True, slots=True)
class Refused:
    """Not admitted: no rule routes it, a rule denies it, pairing, a mention is required, or a
    rate limit. ``notice`` is what the chat was told, if anything."""

    reason: str
    notice: str | None = None
    type: Literal["refused"] = "refused"


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A redelivery of a message already handled: nothing more happens."""

    type: Literal["duplicate"] = "duplicate"


@dataclass(frozen=True, slots=True)
class Dropped:
    """Taken but not run: the session's queue is full, or the gateway is stopping. ``notice``
    is what the chat was told, if anything."""

    reason: str
    notice: str | None = None
    type: Literal["dropped"] = "dropped"


Outcome = Accepted | Answered | Refused | Duplicate | Dropped


def outcome_to_dict(outcome: Outcome) -> dict[str, Any]:
    """An outcome as JSON-able data (kept with the message in the inbox, so the instance that
    received a message learns what another instance decided)."""
    return {f: getattr(outcome, f) for f in outcome.__dataclass_fields__}


def outcome_from_dict(d: dict[str, Any]) -> Outcome:
    kinds: dict[str, type[Outcome]] = {"accepted": Accepted, "answered": Answered, "refused": Refused,
                              "duplicate": Duplicate, "dropped": Dropped}
    kind = kinds.get(str(d.get("type")))
    if kind is None:  # handled, with nothing more said
        return Duplicate()
    fields = {k: v for k, v in d.items() if k in kind.__dataclass_fields__ and k != "type"}
    try:
        return kind(**fields)
    except TypeError:
        return Duplicate()
