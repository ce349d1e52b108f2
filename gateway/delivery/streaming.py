"""Showing a reply while it is written, and the typing indicator — both through the chat's sender.

Nothing reaches a chat except through its one sender in the outbox
(:meth:`~pluto.gateway.delivery.outbox.Outbox.post`): previews, edits, typing indicators and
finals of one chat go out in the order they were asked for, so the next run's preview or typing
never overtakes the previous run's reply, and a platform's flood hold delays the chat without
reordering it.

:class:`LivePreview` sends a first message as soon as the model starts writing and edits it as
deltas arrive, at most once per ``interval`` per chat (:class:`EditThrottle`, shared by every
run in the gateway, so two runs in one chat do not double the rate). It is a :class:`ChatOp`:
queued once, it shows the latest text when its turn comes and queues itself again if more came
meanwhile. The final, fully rendered reply then replaces the preview through the outbox.
:class:`Typing` asks for the platform's "typing…" indicator every few seconds while a run is in
progress; a call in flight is never cancelled (cancelling an HTTP request in flight can leak a
pooled connection), a stopped indicator simply asks no more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from pluto.errors import DeliveryRefused, ProviderError

from pluto.gateway.delivery.flood import FloodControl
from pluto.gateway.ports import Provider
from pluto.gateway.delivery.render import render_preview
from pluto.types import OutgoingMessage

log = logging.getLogger(__name__)

ChatKey = tuple[str, str]  # (provider name, chat id)


class ChatOp(Protocol):
    """A platform call that is not a recorded reply (a preview, a typing indicator), made by
    the chat's sender when its turn comes."""

    key: ChatKey
    # made even while the chat rests (its replies cannot go now): a call whose loss leaves
    # something wrong in the chat (a preview removed); a preview or a typing indicator that
    # cannot be shown now is not worth showing later
    needed: bool

    async def perform(self) -> None:
        """Make the call (or nothing, if it is no longer wanted); never raises."""
        ...


Post = Callable[[ChatOp], bool]  # queue an op behind what the chat already has; False: refused


class EditThrottle:
    """Hands out turns per chat, ``interval`` seconds apart (a platform's retry-after pushes the
    next turn back). ``interval`` may be a callable, read at each turn (live config reload)."""

    def __init__(self, interval: float | Callable[[], float]):
        self._interval = interval
        self._next: dict[ChatKey, float] = {}

    @property
    def interval(self) -> float:
        return self._interval() if callable(self._interval) else self._interval

    async def turn(self, key: ChatKey, give_up: asyncio.Event | None = None) -> bool:
        """Wait for the chat's next turn and take it; False (no turn taken) when ``give_up``
        is set first."""
        now = asyncio.get_running_loop().time()
        slot = self._next.get(key, 0.0)
        if slot > now:
            if give_up is None:
                await asyncio.sleep(slot - now)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(slot - now):
                        await give_up.wait()
                if give_up.is_set():
                    return False
            now = asyncio.get_running_loop().time()
        self._next[key] = max(now, self._next.get(key, 0.0)) + self.interval
        if len(self._next) > 1000:
            self._next = {k: t for k, t in self._next.items() if t > now}
        return True

    def hold(self, key: ChatKey, seconds: float) -> None:
        later = asyncio.get_running_loop().time() + seconds
        self._next[key] = max(self._next.get(key, 0.0), later)


class LivePreview:
    """One reply shown while it grows: sent once, then edited (throttled) with the latest text,
    each call made by the chat's sender in its turn."""

    needed = False

    def __init__(self, provider: Provider, target: OutgoingMessage, throttle: EditThrottle,
                 flood: FloodControl | None = None, *, post: Post,
                 may_send: Callable[[], bool] = lambda: True, shown: str | None = None,
                 on_shown: Callable[[str], Awaitable[None]] | None = None):
        self.provider = provider
        self.flood = flood or FloodControl()
        self.target = replace(target, kind="delta", markup=provider.capabilities.markup.name)
        self.throttle = throttle
        self.post = post
        self.may_send = may_send  # the run's fence: false once it may no longer act
        self.key: ChatKey = (provider.name, target.chat_id)
        self.text = ""
        # a preview an interrupted run of the same message left: edited, not sent again
        self.message_id: str | None = shown
        self.on_shown = on_shown  # told the id of a new preview (kept for such a rerun)
        self._shown = ""
        self._queued = False  # waiting in the chat's sender
        self._calling: asyncio.Future[None] | None = None  # a platform call in flight
        self._closed = asyncio.Event()

    def add(self, delta: str) -> None:
        if self._closed.is_set():
            return
        self.text += delta
        self._want()

    def new_turn(self) -> None:
        """The model called a tool: the text of its next turn replaces what is shown."""
        self.text = ""

    async def finish(self) -> str | None:
        """Stop showing (a call in flight completes first); the preview's message id, if any."""
        self._closed.set()
        if self._calling is not None:
            await asyncio.shield(self._calling)
        return self.message_id

    def cancel(self) -> None:
        self._closed.set()

    def _want(self) -> None:
        if not self._queued and self._calling is None:
            self._queued = self.post(self)

    async def perform(self) -> None:
        self._queued = False
        if self._closed.is_set():
            return
        if not await self.throttle.turn(self.key, self._closed):
            return
        await self.flood.wait(self.key)
        caps = self.provider.capabilities
        text = render_preview(self.text, caps.markup, caps.max_message_length)
        if self._closed.is_set() or not text.strip() or text == self._shown:
            return
        if not self.may_send():  # another instance may have this run now: show no more
            self._closed.set()
            return
        self._calling = asyncio.get_running_loop().create_future()
        try:
            await self._show(text)
        except ProviderError as e:
            if e.retry_after is not None:  # the final and every other send wait too
                await self.flood.hold(self.key, e.retry_after)
            elif isinstance(e, DeliveryRefused):
                log.info("%s: live preview stopped: %s", self.provider.name, e)
                self._closed.set()
            else:
                log.debug("%s: preview update failed: %s", self.provider.name, e)
        except Exception:  # a provider bug: the final still goes out
            log.exception("%s: live preview failed", self.provider.name)
            self._closed.set()
        finally:
            self._calling.set_result(None)
            self._calling = None
        if not self._closed.is_set() and self._shown != render_preview(
                self.text, caps.markup, caps.max_message_length):
            self._want()  # more came meanwhile: behind what the chat has now

    async def _show(self, text: str) -> None:
        message = replace(self.target, text=text)
        if self.message_id is None:
            self.message_id = await self.provider.send(message)
            if self.message_id is None:  # no id to edit later: show nothing more
                self._closed.set()
                return
            if self.on_shown is not None:
                try:
                    await self.on_shown(self.message_id)
                except Exception as e:  # noqa: BLE001 - only a rerun after a crash needs it
                    log.warning("%s: could not keep the preview's id: %s", self.provider.name, e)
            if not self.may_send():
                # the run was taken over while this went out (the instance was paused with
                # the call in flight): the run answering now may never learn of this message
                await self._withdraw()
                return
        else:
            await self.provider.edit(replace(message, edit_of=self.message_id))
        self._shown = text

    async def _withdraw(self) -> None:
        """Delete the preview this run showed (it is no longer this run's to show) and stop."""
        self._closed.set()
        shown, self.message_id = self.message_id, None
        if shown is None:
            return
        try:
            await self.provider.delete(self.target.chat_id, shown, self.target.thread_id)
        except Exception as e:  # noqa: BLE001 - a stray preview is all that is left
            log.info("%s: could not remove a preview after losing its run: %s",
                     self.provider.name, e)


class Removal:
    """A live preview an earlier run of the message left, deleted in the chat's turn. With
    several instances that run may be on an instance that was stopped, not dead: an edit it had
    begun can still land when it resumes — into a message the answer no longer lives in."""

    # made while the chat rests too: the preview may hold the whole answer, which its
    # message's next run gives again (tests/test_fencing.py)
    needed = True

    def __init__(self, provider: Provider, chat_id: str, thread_id: str | None,
                 platform_id: str, *, may_send: Callable[[], bool] = lambda: True):
        self.provider = provider
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.platform_id = platform_id
        self.may_send = may_send
        self.key: ChatKey = (provider.name, chat_id)

    async def perform(self) -> None:
        if not self.may_send():
            return
        try:
            await self.provider.delete(self.chat_id, self.platform_id, self.thread_id)
        except ProviderError as e:  # the answer still goes out, beside the old preview
            log.info("%s: could not remove an interrupted run's preview: %s",
                     self.provider.name, e)
        except Exception:  # a provider bug
            log.exception("%s: removing a preview failed", self.provider.name)


class Typing:
    """Asks for the platform's typing indicator every ``interval`` seconds until stopped; each
    call is made by the chat's sender (never cancelled in flight)."""

    needed = False

    def __init__(self, provider: Provider, chat_id: str, thread_id: str | None,
                 interval: float = 4.0, flood: FloodControl | None = None, *,
                 post: Post, may_send: Callable[[], bool] = lambda: True):
        self.provider = provider
        self.flood = flood
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.interval = interval
        self.post = post
        self.may_send = may_send
        self.key: ChatKey = (provider.name, chat_id)
        self._timer: asyncio.TimerHandle | None = None
        self._queued = False
        self._stopped = False

    def start(self) -> None:
        if self.provider.capabilities.has_typing and not self._stopped and self._timer is None:
            self._tick()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        if self._stopped:
            return
        if not self._queued:
            self._queued = self.post(self)
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    async def perform(self) -> None:
        self._queued = False
        if self._stopped or (self.flood is not None and self.flood.remaining(self.key)) or \
                not self.may_send():
            return
        try:
            await self.provider.typing(self.chat_id, self.thread_id)
        except Exception as e:  # a lost typing indicator is not worth a failed reply
            log.debug("%s: typing indicator failed: %s", self.provider.name, e)
