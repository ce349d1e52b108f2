"""The Mattermost WebSocket (``/api/v4/websocket``): authenticate, then read events.

The client sends ``{"seq": 1, "action": "authentication_challenge", "data": {"token": …}}``;
the server answers ``{"status": "OK", "seq_reply": 1}`` and a ``hello`` event. Every event has
a ``seq`` that grows by one on a connection: a gap means events were lost, and the provider
fetches what it missed. The client's own actions (``user_typing``) carry the client's ``seq``.
A frame is capped in size; a frame that is not JSON is logged and skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

import aiohttp

from pluto.errors import ProviderError, ProviderUnusable

log = logging.getLogger(__name__)

MAX_FRAME = 4 * 1024 * 1024
HELLO_TIMEOUT = 30.0
HEARTBEAT = 30.0


class Socket:
    """One authenticated connection."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self._seq = itertools.count(2)  # 1 was the authentication challenge
        self.last_event: int | None = None  # the seq of the last event read

    @classmethod
    async def open(cls, session: aiohttp.ClientSession, url: str, token: str) -> Socket:
        ws = await session.ws_connect(url, heartbeat=HEARTBEAT, max_msg_size=MAX_FRAME,
                                      timeout=aiohttp.ClientWSTimeout(ws_close=5))
        sock = cls(ws)
        try:
            await ws.send_json({"seq": 1, "action": "authentication_challenge",
                                "data": {"token": token}})
            async with asyncio.timeout(HELLO_TIMEOUT):  # (3.11's wait_for can lose a cancel)
                await sock._hello()
        except BaseException:
            await ws.close()
            raise
        return sock

    async def _hello(self) -> None:
        while True:
            event = await self.next_event()
            if event is None:
                raise ProviderUnusable("Mattermost closed the WebSocket at login (the token "
                                       "was refused)")
            if event.get("seq_reply") == 1 and event.get("status") == "FAIL":
                raise ProviderUnusable("Mattermost refused the WebSocket login (the token)")
            if event.get("event") == "hello":
                self.gap(event)
                return

    async def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next JSON frame (an event or a reply); None once the socket closed."""
        while True:
            msg = await self.ws.receive(timeout=timeout)
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                            aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                return None
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                frame = json.loads(msg.data)
            except ValueError:
                log.warning("mattermost: a WebSocket frame that is not JSON was skipped")
                continue
            if isinstance(frame, dict):
                return frame
            log.warning("mattermost: a WebSocket frame that is not an object was skipped")

    def gap(self, event: dict[str, Any]) -> bool:
        """Note the event's ``seq``; True when events came before it that were never read."""
        seq = event.get("seq")
        if not isinstance(seq, int):
            return False
        missed = self.last_event is not None and seq > self.last_event + 1
        self.last_event = seq
        return missed

    async def typing(self, channel_id: str, parent_id: str | None) -> None:
        if self.ws.closed:
            raise ProviderError("the Mattermost WebSocket is not connected")
        await self.ws.send_json({"seq": next(self._seq), "action": "user_typing",
                                 "data": {"channel_id": channel_id,
                                          "parent_id": parent_id or ""}})

    async def close(self) -> None:
        await self.ws.close()
