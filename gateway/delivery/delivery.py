"""Where the reply leaves: from a run's events to what a provider is asked to send.

Every reply — a run's final answer or error, a command's answer, a notice — goes the same way
for every provider: rendered in the provider's markup dialect, split at its length limit, and
recorded in the :class:`~pluto.gateway.delivery.outbox.Outbox`, which sends it exactly once, in
order per chat, behind the pipeline (:meth:`Delivery.reply`, the end of :meth:`Delivery.run`) —
except a run's reply to a provider that takes it from the run feed (``answers_from_feed``).

While a run is in progress:

- a provider that shows progress itself (``streams_deltas``: the terminal, the web widget, the
  API) follows the run feed; delivery only hands it the final reply, which carries the run id
  and the ``seq`` of the event it shows — or nothing of the run, when it takes the reply from
  the feed too (``answers_from_feed``: the web widget, the API; the run's committed events are
  the durable record a reconnecting watcher replays, so a second record in the outbox would
  only cost commits). Its answers without a run (a command's reply, a notice) have no run
  events to replay: they still go through the outbox, in order behind the pipeline;
- a provider that can edit (``can_edit``) gets a live preview sent early and edited as the
  model writes (:class:`~pluto.gateway.delivery.streaming.LivePreview`); the first chunk of the
  final reply then replaces the preview;
- a typing indicator is kept on where the platform has one.

Previews and typing go through the chat's one sender in the outbox, like the replies: nothing
of a chat's next run reaches the platform before the previous reply was accepted by it.

Images and files a tool produced (``ToolResult.details = {"image": path}``, or
``{"attachments": [{"path": ..., "kind": "image" | "file"}]}``, under the data dir) go out after
the text, as images or files where the platform can show them.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pluto.gateway.delivery.outbox import Outbox
from pluto.gateway.delivery.render import render_chunks, split_text
from pluto.gateway.delivery.streaming import EditThrottle, LivePreview, Removal, Typing
from pluto.gateway.ports import Provider
from pluto.ids import new_id
from pluto.runtime.approvals import decision_line, request_text
from pluto.types import (PLAIN, ApprovalDecision, ApprovalRequest, Attachment, Button,
                         IncomingMessage, MessageDelta, MessageFinal, OutgoingMessage, RunError,
                         RunEvent, ToolEnd, ToolStart)

log = logging.getLogger(__name__)

NO_ANSWER = "(no answer)"
MAX_TOOL_ATTACHMENTS = 10  # files one tool result may send with the answer
KEPT_PREVIEWS = 1000  # previews of unanswered runs remembered for their message's next run
Kind = Literal["reply", "delta", "notice", "error"]


def reply_to(msg: IncomingMessage, text: str, *, kind: Kind = "reply", run_id: str | None = None,
             seq: int = 0) -> OutgoingMessage:
    """A message back to where ``msg`` came from (quoting it in group chats)."""
    return OutgoingMessage(chat_id=msg.chat_id, thread_id=msg.thread_id, text=text, kind=kind,
                           run_id=run_id, seq=seq, answers=msg.message_id,
                           reply_to=None if msg.is_direct else msg.message_id)


def render_for(provider: Provider, markdown: str) -> list[str]:
    """The chunks of a Markdown text in the provider's dialect and length limit. A provider
    that streams shows the model's own Markdown as it comes; its reply is that same text."""
    caps = provider.capabilities
    if caps.streams_deltas:
        return split_text(markdown, caps.max_message_length)
    try:
        return render_chunks(markdown, caps.markup, caps.max_message_length)
    except Exception:
        log.exception("rendering for %s failed; sending plain text", provider.name)
        return render_chunks(markdown, PLAIN, caps.max_message_length)


@dataclass(slots=True)
class _Run:
    """What one run's delivery has collected so far."""

    preview: LivePreview | None
    typing: Typing
    images: list[Attachment] = field(default_factory=list)
    delivered: bool = False  # its reply is recorded in the outbox


class Delivery:
    def __init__(self, outbox: Outbox, *, data_dir: Path, throttle: EditThrottle,
                 typing_interval: float = 4.0,
                 keep_preview: Callable[[IncomingMessage, str], Awaitable[None]] | None = None,
                 replace_left: bool = False):
        self.outbox = outbox
        # the id of a live preview, kept with its message: if the run is cut off (a crash, a
        # dead instance), the message's next answer replaces that preview instead of leaving
        # a half-written message behind and saying it all again
        self.keep_preview = keep_preview
        # several instances: a preview kept with the message may be another instance's, one
        # that is stopped, not dead, with an edit under way — the answer goes out as a new
        # message and that preview is deleted, rather than edited (a late edit would cut the
        # answer short). One instance: a preview left by a crash is edited into the answer.
        self.replace_left = replace_left
        self.data_dir = data_dir
        self.throttle = throttle
        self.typing_interval = typing_interval
        # the previews of runs that recorded no reply, by message (provider, id): bounded
        self._previews: OrderedDict[tuple[str, str], str] = OrderedDict()

    async def reply(self, provider: Provider, msg: IncomingMessage, text: str, *,
                    kind: Kind = "reply") -> asyncio.Future[bool]:
        """A gateway answer (a command's reply, a notice, an error) to ``msg``'s chat: recorded,
        then sent behind the caller. The future settles once it is out."""
        base = reply_to(msg, text, kind=kind)
        return await self.outbox.deliver(provider, f"answer:{new_id()}",
                                         self._chunks(provider, base, text, []))

    async def run(self, provider: Provider, msg: IncomingMessage,
                  events: AsyncIterator[RunEvent], *,
                  fence: Callable[[], bool] | None = None) -> RunEvent | None:
        """Consume a run's events (this drives the run) and deliver its reply to the chat it
        came from; returns the last event. ``fence``: whether the run may still act (several
        instances: false once another may have taken it over); its previews and typing stop
        then (its answer is fenced in storage)."""
        caps = provider.capabilities
        live = caps.can_edit and not caps.streams_deltas
        flood = self.outbox.flood  # one flood-control state per chat, for every send
        keep = self.keep_preview
        post = self.outbox.post  # every call to the chat goes through its one sender
        may_send = fence or self.outbox.may_send
        shown = self._left(provider, msg, may_send) or \
            self._previews.get((msg.provider, msg.message_id or ""))
        state = _Run(LivePreview(provider, reply_to(msg, ""), self.throttle, flood, post=post,
                                 may_send=may_send, shown=shown,
                                 on_shown=(lambda pid: keep(msg, pid))
                                 if keep is not None and msg.message_id else None)
                     if live else None,
                     Typing(provider, msg.chat_id, msg.thread_id, self.typing_interval, flood,
                            post=post, may_send=may_send))
        state.typing.start()
        last: RunEvent | None = None
        try:
            async with aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    last = event
                    await self._on_event(provider, msg, state, event)
        finally:
            state.typing.stop()
            if state.preview is not None:
                state.preview.cancel()
                self._remember(msg, state)
        return last

    def _left(self, provider: Provider, msg: IncomingMessage,
              may_send: Callable[[], bool]) -> str | None:
        """The preview an earlier run of ``msg`` left, to be edited into this answer; with
        several instances, None: it is removed first, in the chat's turn."""
        if msg.shown is None or not self.replace_left:
            return msg.shown
        self.outbox.post(Removal(provider, msg.chat_id, msg.thread_id, msg.shown,
                                 may_send=may_send))
        return None

    def _remember(self, msg: IncomingMessage, state: _Run) -> None:
        """A run that showed a preview but recorded no reply (storage failed, it was handed
        back): the message's next run here edits that preview, even when storage could not
        keep its id — it is not left beside the answer, looking like a second one."""
        key = (msg.provider, msg.message_id or "")
        shown = state.preview.message_id if state.preview is not None else None
        if state.delivered or shown is None or not msg.message_id:
            self._previews.pop(key, None)
            return
        self._previews[key] = shown
        self._previews.move_to_end(key)
        while len(self._previews) > KEPT_PREVIEWS:
            self._previews.popitem(last=False)

    async def _on_event(self, provider: Provider, msg: IncomingMessage, state: _Run,
                        event: RunEvent) -> None:
        match event:
            case MessageDelta(text=text) if state.preview is not None:
                state.preview.add(text)
            case ToolStart() if state.preview is not None:
                state.preview.new_turn()
            case ToolEnd(details=details):
                state.images.extend(self._images(details))
            case MessageFinal(text=text):
                await self._final(provider, msg, state, event, text, "reply")
            case RunError(message=message, detail=detail):
                full = detail if detail and provider.capabilities.operator else message
                await self._final(provider, msg, state, event, full, "error")
            case ApprovalRequest():
                await self._ask(provider, msg, state, event)
            case ApprovalDecision(verdict=verdict, name=name, by=by):
                if not provider.capabilities.answers_from_feed:
                    await self.outbox.deliver(provider, f"{event.run_id}:decision", self._chunks(
                        provider, reply_to(msg, "", kind="notice"),
                        decision_line(verdict, name, by), []))

    async def _ask(self, provider: Provider, msg: IncomingMessage, state: _Run,
                   event: ApprovalRequest) -> None:
        """A tool call waiting for a person: its request, with Approve / Deny buttons where the
        platform has them, else the commands to write (docs/approvals.md)."""
        state.typing.stop()
        if provider.capabilities.answers_from_feed:
            return  # the widget, the API: shown from the run feed
        if state.preview is not None:
            await state.preview.finish()
        approve, deny = f"/approve {event.approval_id}", f"/deny {event.approval_id}"
        text = request_text(event)
        buttons: tuple[Button, ...] = ()
        if provider.capabilities.has_buttons:
            buttons = (Button("Approve", approve, "primary"), Button("Deny", deny, "danger"))
        else:
            text += f"\n\nReply `{approve}` or `{deny}`."
        messages = self._chunks(provider, reply_to(msg, text, run_id=event.run_id,
                                                   seq=event.seq), text, [])
        if messages:
            messages[-1] = replace(messages[-1], buttons=buttons)
        await self.outbox.deliver(provider, f"{event.run_id}:approval", messages)
        state.delivered = True

    async def _final(self, provider: Provider, msg: IncomingMessage, state: _Run,
                     event: RunEvent, text: str, kind: Kind) -> None:
        state.typing.stop()
        if provider.capabilities.answers_from_feed:
            return  # shown from the run feed; its run events are the durable record
        preview_id = await state.preview.finish() if state.preview is not None else None
        base = reply_to(msg, text, kind=kind, run_id=event.run_id, seq=event.seq)
        messages = self._chunks(provider, base, text, state.images if kind == "reply" else [])
        if preview_id is not None and kind == "reply" and messages and \
                not messages[0].attachments:
            messages[0] = replace(messages[0], edit_of=preview_id, reply_to=None)
        await self.outbox.deliver(provider, event.run_id, messages)
        state.delivered = True

    async def resend_final(self, provider: Provider, msg: IncomingMessage,
                           event: RunEvent) -> None:
        """Deliver a run's committed answer that never reached the outbox (its instance died
        in between): as its own reply, under the run's id, so it goes out once. A provider
        that takes answers from the run feed has it there already."""
        if provider.capabilities.answers_from_feed:
            return
        text = getattr(event, "text", "") or ""
        base = reply_to(msg, text, kind="reply", run_id=event.run_id, seq=event.seq)
        messages = self._chunks(provider, base, text, [])
        shown = self._left(provider, msg, self.outbox.may_send) or \
            self._previews.pop((msg.provider, msg.message_id or ""), None)
        if shown is not None and messages and provider.capabilities.can_edit:
            messages[0] = replace(messages[0], edit_of=shown, reply_to=None)
        await self.outbox.deliver(provider, event.run_id, messages)

    def withdraw_left(self, provider: Provider, msg: IncomingMessage) -> bool:
        """Several instances: the preview a run of ``msg`` showed here, which recorded no
        reply (storage cut it short) and whose message is answered again — by any instance,
        which may never learn of this preview (its id may not have been kept, storage being
        away) — is deleted, in the chat's turn; whether there was one. Unfenced: it is this
        instance's own message of a run no longer anyone's, and nobody edits it into an answer
        (with several instances a left preview is deleted, never edited)."""
        shown = self._previews.pop((msg.provider, msg.message_id or ""), None)
        if shown is None:
            return False
        self.outbox.post(Removal(provider, msg.chat_id, msg.thread_id, shown))
        return True

    def _chunks(self, provider: Provider, base: OutgoingMessage, text: str,
                images: list[Attachment]) -> list[OutgoingMessage]:
        caps = provider.capabilities
        dialect = caps.markup.name
        texts = render_for(provider, text) or ([] if images else render_for(provider, NO_ANSWER))
        out = [replace(base, text=t, markup=dialect, reply_to=base.reply_to if i == 0 else None)
               for i, t in enumerate(texts)]
        for image in images:
            kind: Literal["file", "image"] | None = None
            if image.kind == "image" and (caps.can_send_images or caps.can_send_files):
                kind = "image" if caps.can_send_images else "file"
            elif image.kind == "file" and caps.can_send_files:
                kind = "file"
            if kind is not None:
                out.append(replace(base, text="", markup=dialect, reply_to=None,
                                   attachments=(replace(image, kind=kind),)))
            else:
                out += [replace(base, text=t, markup=dialect, reply_to=None)
                        for t in render_for(provider, f"({image.kind}: {image.filename})")]
        return out

    def _images(self, details: Any) -> list[Attachment]:
        """The images and files a tool made (``details["attachments"]``: [{path, kind}],
        else ``details["image"]``), those under the data dir that exist."""
        if not isinstance(details, dict):
            return []
        listed = details.get("attachments")
        wanted = [(a.get("path"), a.get("kind")) for a in listed if isinstance(a, dict)] \
            if isinstance(listed, list) else [(details.get("image"), "image")]
        found = (self._attachment(path, "file" if kind == "file" else "image")
                 for path, kind in wanted[:MAX_TOOL_ATTACHMENTS])
        return [a for a in found if a is not None]

    def _attachment(self, name: Any, kind: Literal["file", "image"]) -> Attachment | None:
        if not isinstance(name, str):
            return None
        path = Path(name)
        if not path.is_absolute():
            path = self.data_dir / path
        try:
            path = path.resolve()
            inside = path.is_relative_to(self.data_dir.resolve()) and path.is_file()
        except OSError:
            inside = False
        if not inside:
            log.warning("a tool named a file outside the data dir or missing: %s", path)
            return None
        mime = mimetypes.guess_type(path.name)[0] or (
            "image/png" if kind == "image" else "application/octet-stream")
        return Attachment(filename=path.name, mime_type=mime, size=path.stat().st_size,
                          path=path, kind=kind)
