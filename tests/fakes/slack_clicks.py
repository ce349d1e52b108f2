"""The fake Slack's interactivity: a person clicks a button of a message's ``actions`` block.

As on Slack:

- ``click(channel, ts, action_id)`` builds the ``block_actions`` payload (user, channel,
  container, message with its blocks, ``trigger_id``, ``response_url``, the action with its
  ``value``) and delivers it: over HTTP to ``interactivity_url`` (default: ``events_url``) as a
  form ``payload=<json>``, signed like events; or in Socket Mode as an ``interactive``
  envelope to be acked by ``envelope_id``.
- The app must answer within ``event_ack_timeout`` (3 s): a late or missing answer is recorded
  in ``interaction_failures`` (Slack shows the clicker an error); in Socket Mode the envelope is
  sent again (``retry_attempt`` + 1, the same payload) up to ``len(event_retry_delays)`` times.
- ``chat.postEphemeral`` records a message only ``user`` sees (``ephemerals``); a
  ``response_url`` POST with ``response_type: ephemeral`` does too, ``replace_original``
  replaces the message.
- Buttons are validated when posted (``check_actions``): at most 25 elements, a button's text
  plain_text of at most 75 characters, ``action_id`` ≤ 255, ``value`` ≤ 2000, ``style``
  primary | danger.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from .slack_state import Attempt, Delivery, SlackError

MAX_ELEMENTS = 25
MAX_BUTTON_TEXT = 75
MAX_ACTION_ID = 255
MAX_VALUE = 2000


@dataclass
class Ephemeral:
    """A message shown to one user only."""
    channel: str
    user: str
    text: str
    thread_ts: str | None
    time: float


def check_actions(i: int, block: dict) -> None:
    """Block Kit's checks of an ``actions`` block (``invalid_blocks`` as Slack says it)."""
    def bad(what: str, where: str) -> SlackError:
        return SlackError("invalid_blocks", extra={"errors": [f"{what} [json-pointer:/blocks/{i}{where}]"]})
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements:
        raise bad("must provide at least 1 element", "/elements")
    if len(elements) > MAX_ELEMENTS:
        raise bad(f"must be less than {MAX_ELEMENTS + 1} items", "/elements")
    for j, el in enumerate(elements):
        where = f"/elements/{j}"
        if not isinstance(el, dict) or el.get("type") != "button":
            continue
        text = el.get("text")
        if not isinstance(text, dict) or text.get("type") != "plain_text":
            raise bad("must be plain_text", f"{where}/text/type")
        if not 1 <= len(str(text.get("text") or "")) <= MAX_BUTTON_TEXT:
            raise bad(f"must be between 1 and {MAX_BUTTON_TEXT} characters", f"{where}/text/text")
        if len(str(el.get("action_id") or "")) > MAX_ACTION_ID:
            raise bad(f"must be at most {MAX_ACTION_ID} characters", f"{where}/action_id")
        if len(str(el.get("value") or "")) > MAX_VALUE:
            raise bad(f"must be at most {MAX_VALUE} characters", f"{where}/value")
        if "style" in el and el["style"] not in ("primary", "danger"):
            raise bad("must be one of primary, danger", f"{where}/style")


class Interactivity:
    """Mixed into FakeSlack (which provides the session, the sockets and the records)."""

    interactivity_url: str | None = None
    ephemerals: list[Ephemeral]
    interactions: list[Delivery]
    interaction_failures: list[str]  # a click Slack showed the clicker as failed, and why
    responses: list[tuple[str, dict]]  # (response_url id, body) posted back

    def _init_clicks(self) -> None:
        self.ephemerals, self.interactions, self.interaction_failures = [], [], []
        self.responses = []
        self._response_urls: dict[str, tuple[str, str, str]] = {}  # id → (channel, ts, user)

    def notes_for(self, user: str) -> list[str]:
        return [e.text for e in self.ephemerals if e.user == user]

    # Web API ---------------------------------------------------------------------------
    async def _m_chat_post_ephemeral(self, p: dict) -> dict:
        channel_id = self._conversation(p, posting=True)  # type: ignore[attr-defined]
        user = str(p.get("user") or "")
        if user not in self._users:  # type: ignore[attr-defined]
            raise SlackError("user_not_found")
        if user not in self._channels[channel_id]["members"]:  # type: ignore[attr-defined]
            raise SlackError("user_not_in_channel")
        text, _blocks = self._text_and_blocks(p, required=True)  # type: ignore[attr-defined]
        thread = str(p["thread_ts"]) if p.get("thread_ts") else None
        self.ephemerals.append(Ephemeral(channel_id, user, text or "", thread, time.monotonic()))
        return {"message_ts": self.next_ts()}  # type: ignore[attr-defined]

    async def _handle_response_url(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        target = self._response_urls.get(key)
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_json")
        if target is None or not isinstance(body, dict):
            return web.Response(status=404, text="expired_url")
        self.responses.append((key, body))
        channel, ts, user = target
        if body.get("response_type") == "ephemeral" or not (
                body.get("replace_original") or body.get("delete_original")):
            self.ephemerals.append(Ephemeral(channel, user, str(body.get("text") or ""), None,
                                             time.monotonic()))
        elif body.get("delete_original"):
            self._history.get(channel, {}).pop(ts, None)  # type: ignore[attr-defined]
        else:
            msg = self._history.get(channel, {}).get(ts)  # type: ignore[attr-defined]
            if msg is not None:
                msg["text"] = str(body.get("text") or msg.get("text") or "")
                if "blocks" in body:
                    msg["blocks"] = body["blocks"]
        self._notify()  # type: ignore[attr-defined]
        return web.Response(text="ok")

    # clicks ----------------------------------------------------------------------------
    def block_actions(self, channel: str, ts: str, action_id: str, *, user: str | None = None,
                      message: dict | None = None) -> dict:
        """The payload of a click on the button ``action_id`` of message ``ts`` (as it is now,
        or as ``message`` — a client still showing an older version)."""
        msg = copy.deepcopy(message or self._history.get(channel, {}).get(ts))  # type: ignore[attr-defined]
        if msg is None:
            raise ValueError(f"fake Slack: no message {ts} in {channel}")
        button, block_id = None, None
        for block in msg.get("blocks") or []:
            for el in block.get("elements") or [] if block.get("type") == "actions" else []:
                if el.get("action_id") == action_id:
                    button, block_id = el, block.get("block_id")
        if button is None:
            raise ValueError(f"fake Slack: message {ts} has no button {action_id}")
        user = user or self.default_user  # type: ignore[attr-defined]
        who = self._users[user]  # type: ignore[attr-defined]
        key = uuid.uuid4().hex
        self._response_urls[key] = (channel, ts, user)
        action_ts = f"{time.time():.6f}"
        ch = self._channels[channel]  # type: ignore[attr-defined]
        container = {"type": "message", "message_ts": ts, "channel_id": channel,
                     "is_ephemeral": False}
        if msg.get("thread_ts"):
            container["thread_ts"] = msg["thread_ts"]
        return {
            "type": "block_actions", "token": self.verification_token,  # type: ignore[attr-defined]
            "user": {"id": user, "username": who["name"], "name": who["name"],
                     "team_id": self.team_id},  # type: ignore[attr-defined]
            "api_app_id": self.app_id, "container": container,  # type: ignore[attr-defined]
            "trigger_id": f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}",
            "team": {"id": self.team_id, "domain": "pluto-test"},  # type: ignore[attr-defined]
            "enterprise": None, "is_enterprise_install": False,
            "channel": {"id": channel, "name": ch.get("name") or "directmessage"},
            "message": msg, "state": {"values": {}},
            "response_url": f"{self.url}/actions/{key}",  # type: ignore[attr-defined]
            "actions": [{"action_id": action_id, "block_id": block_id,
                         "text": button.get("text"), "value": button.get("value"),
                         "style": button.get("style"), "type": "button",
                         "action_ts": action_ts}],
        }

    async def click(self, channel: str, ts: str, action_id: str, *, user: str | None = None,
                    message: dict | None = None, via: str | None = None) -> Delivery:
        """A click, delivered as Slack does; returns once Slack has the app's answer (or gave
        up): see ``Delivery.acked`` and ``interaction_failures``."""
        payload = self.block_actions(channel, ts, action_id, user=user, message=message)
        return await self.deliver_interaction(payload, via=via)

    async def deliver_interaction(self, payload: dict, *, via: str | None = None) -> Delivery:
        target = self.interactivity_url or self.events_url  # type: ignore[attr-defined]
        transport = via or ("http" if target else "socket")
        delivery = Delivery(str(payload.get("trigger_id") or ""), payload, transport,
                            target if transport == "http" else None)
        self.interactions.append(delivery)
        if transport == "http":
            await self._interaction_http(delivery)
        else:
            await self._interaction_socket(delivery)
        delivery.done = True
        delivery._finished.set()
        self._notify()  # type: ignore[attr-defined]
        return delivery

    def interaction_body(self, payload: dict) -> str:
        return "payload=" + quote(json.dumps(payload), safe="")

    async def _interaction_http(self, delivery: Delivery) -> None:
        session: aiohttp.ClientSession = self._session  # type: ignore[attr-defined]
        body = self.interaction_body(delivery.payload)
        headers = self.signed_headers(body)  # type: ignore[attr-defined]
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        attempt = Attempt(0, time.monotonic(), headers)
        delivery.attempts.append(attempt)
        timeout = self.event_ack_timeout  # type: ignore[attr-defined]
        assert delivery.url is not None
        try:
            async with session.post(delivery.url, data=body.encode(), headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                attempt.status, attempt.body = resp.status, await resp.text()
                attempt.acked = 200 <= resp.status < 300
                attempt.reason = None if attempt.acked else "http_error"
        except asyncio.TimeoutError:
            attempt.reason = "http_timeout"
        except (aiohttp.ClientError, OSError):
            attempt.reason = "connection_failed"
        attempt.elapsed = time.monotonic() - attempt.started
        delivery.acked = attempt.acked
        if not attempt.acked:  # Slack does not retry interactivity over HTTP
            self.interaction_failures.append(
                f"{delivery.event_id}: {attempt.reason} ({attempt.status}) after "
                f"{attempt.elapsed:.2f} s: the clicker saw an error")

    async def _interaction_socket(self, delivery: Delivery) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.event_ack_timeout  # type: ignore[attr-defined]
        delays = self.event_retry_delays  # type: ignore[attr-defined]
        for num in range(len(delays) + 1):
            if num:
                await asyncio.sleep(delays[num - 1])
            conn = await self.wait_until(self._open_connection, timeout=10,  # type: ignore[attr-defined]
                                         what="a Socket Mode connection")
            env_id = str(uuid.uuid4())
            attempt = Attempt(num, time.monotonic(), envelope_id=env_id)
            delivery.attempts.append(attempt)
            waiter: asyncio.Future = loop.create_future()
            self._envelopes[env_id] = (delivery, attempt, waiter)  # type: ignore[attr-defined]
            envelope = {"envelope_id": env_id, "payload": delivery.payload, "type": "interactive",
                        "accepts_response_payload": True, "retry_attempt": num,
                        "retry_reason": "" if num == 0 else "timeout"}
            try:
                await self._ws_send(conn, envelope)  # type: ignore[attr-defined]
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
                attempt.acked = True
            except asyncio.TimeoutError:
                attempt.reason = "timeout"
                waiter.cancel()  # a later ack is recorded as late
            except (ConnectionError, RuntimeError):
                attempt.reason = "connection_failed"
                waiter.cancel()
            attempt.elapsed = time.monotonic() - attempt.started
            if attempt.acked:
                delivery.acked = True
                return
            self.interaction_failures.append(
                f"{delivery.event_id}: envelope {env_id} {attempt.reason} after "
                f"{attempt.elapsed:.2f} s: the clicker saw an error")
